"""Run `elastic-shard` (dlc/local/mpi...) in its own process with the fake runner in place of
Data-Juicer, for fast multi-process tests of the launchers' coordination.

FAKE_FAIL_SHARDS=part-00001-of-00003,... makes those shards fail; FAKE_DELAY=secs slows each one;
FAKE_KEEP_MOD7=1 drops rows as `fakes.fake_recipe_keep` says.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes import FakeRunner, fake_recipe_keep  # noqa: E402

import elastic_sharding.worker  # noqa: E402
from elastic_sharding.cli import main  # noqa: E402

failing = set(filter(None, os.environ.get("FAKE_FAIL_SHARDS", "").split(",")))
delay = float(os.environ.get("FAKE_DELAY", "0"))
keep = fake_recipe_keep if os.environ.get("FAKE_KEEP_MOD7") else None
elastic_sharding.worker.get_runner = lambda name, runtime=None: FakeRunner(
    delay=delay, fail=lambda shard: shard in failing, keep=keep
)
sys.exit(main(sys.argv[1:]))
