"""Run `elastic-shard` (dlc/local/mpi...) in its own process with the fake runner in place of
Data-Juicer, for fast multi-process tests of the launchers' coordination. The worker processes
`local` and `mpi` start are `fake_worker.py` (the real `worker` command with the fake runner).

FAKE_FAIL_SHARDS=part-00001-of-00003,... makes those shards fail; FAKE_DELAY=secs slows each one;
FAKE_KEEP_MOD7=1 drops rows as `fakes.fake_recipe_keep` says. A first argument `--two-node`
runs the commands as `two_node_test.py` does (its defaults added, `dlc_job.py`'s profile).
"""

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from fakes import FakeRunner, fake_recipe_keep  # noqa: E402

import elastic_sharding.launch.local  # noqa: E402
import elastic_sharding.launch.mpi  # noqa: E402
import elastic_sharding.work.worker  # noqa: E402
from elastic_sharding.cli import main  # noqa: E402
from elastic_sharding.launch.two_node import with_two_node_defaults  # noqa: E402

failing = set(filter(None, os.environ.get("FAKE_FAIL_SHARDS", "").split(",")))
delay = float(os.environ.get("FAKE_DELAY", "0"))
keep = fake_recipe_keep if os.environ.get("FAKE_KEEP_MOD7") else None
elastic_sharding.work.worker.get_runner = lambda name, runtime=None: FakeRunner(
    delay=delay, fail=lambda shard: shard in failing, keep=keep
)


def fake_worker_command(job_dir: Path, *options: str) -> list[str]:
    return [sys.executable, str(TESTS / "fake_worker.py"), str(job_dir), *options]


elastic_sharding.launch.local.worker_command = fake_worker_command
elastic_sharding.launch.mpi.worker_command = fake_worker_command

argv = sys.argv[1:]
if argv[:1] == ["--two-node"]:
    sys.exit(main(with_two_node_defaults(argv[1:]), prog="two_node_test.py", profile="dlc"))
sys.exit(main(argv))
