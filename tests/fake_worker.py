"""Run `elastic-shard worker` with the fake runner in its own process (for multi-process tests).

`fake_worker.py JOB [--delay S] [--fail-shard ID ...] [--keep-fake-recipe] [worker flags...]`:
the fake runner's options come first; every other flag goes to the real `worker` command, so
errors, signals and exit codes take the same path as in production.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes import FakeRunner, fake_recipe_keep  # noqa: E402

import elastic_sharding.work.worker  # noqa: E402
from elastic_sharding.cli import main  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("job_dir", type=Path)
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--fail-shard", action="append", default=[])
parser.add_argument("--keep-fake-recipe", action="store_true", help="drop rows as fakes.fake_recipe_keep says")
args, worker_flags = parser.parse_known_args()
keep = fake_recipe_keep if args.keep_fake_recipe else None
elastic_sharding.work.worker.get_runner = lambda name, runtime=None: FakeRunner(
    delay=args.delay, fail=lambda shard: shard in args.fail_shard, keep=keep
)
sys.exit(main(["worker", "--job-dir", str(args.job_dir), *worker_flags]))
