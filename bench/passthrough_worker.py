"""One `elastic-shard worker` whose runner copies the shard input to the output, without Data-Juicer.

It isolates the cost of coordination (claim, heartbeat thread, attempt records, collect, publish)
from processing, for the claim-throughput measure, and completes jobs cheaply for the merge
measure. The shard input already carries each row's ordering field, which is exactly what
`output.collect` expects of a runner's output.

Usage: passthrough_worker.py JOB_DIR [--lock-timeout-secs S] [--poll-interval-secs S]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from elastic_sharding.cli import setup_logging
from elastic_sharding.layout import JobLayout
from elastic_sharding.work.runners import AttemptContext
from elastic_sharding.work.worker import WorkerOptions, run_worker


class PassthroughRunner:
    """A no-op processor: output rows = input rows, one part file."""

    name = "passthrough"

    def run(self, ctx: AttemptContext) -> None:
        # attempts/<shard>/<attempt>: the job directory is three levels up.
        layout = JobLayout(ctx.attempt_dir.parents[2])
        ctx.set_phase("processing")
        shutil.copyfile(layout.shard_input(ctx.shard_id), ctx.ray_output)

    def close(self) -> None:
        """Nothing is kept between attempts."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--lock-timeout-secs", type=float)
    parser.add_argument("--poll-interval-secs", type=float)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    setup_logging(args.log_level)
    options = WorkerOptions(lock_timeout_secs=args.lock_timeout_secs, poll_interval_secs=args.poll_interval_secs)
    return run_worker(args.job_dir, options, PassthroughRunner())


if __name__ == "__main__":
    sys.exit(main())
