"""Run one worker with the fake runner in its own process (for multi-process tests)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes import FakeRunner  # noqa: E402

from elastic_sharding.cli import setup_logging  # noqa: E402
from elastic_sharding.worker import WorkerOptions, run_worker  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("job_dir", type=Path)
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--max-shards", type=int)
parser.add_argument("--fail-shard", action="append", default=[])
parser.add_argument("--lock-timeout-secs", type=float)
parser.add_argument("--heartbeat-interval-secs", type=float)
args = parser.parse_args()
setup_logging("INFO")
runner = FakeRunner(delay=args.delay, fail=lambda shard: shard in args.fail_shard)
options = WorkerOptions(
    max_shards=args.max_shards,
    lock_timeout_secs=args.lock_timeout_secs,
    heartbeat_interval_secs=args.heartbeat_interval_secs,
)
sys.exit(run_worker(args.job_dir, options, runner))
