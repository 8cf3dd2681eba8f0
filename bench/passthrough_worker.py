"""One `elastic-shard worker` whose runner copies the shard input to the output, without Data-Juicer.

It isolates the cost of coordination (claim, heartbeat thread, attempt records, collect, publish)
from processing, for the claim-throughput measure, and completes jobs cheaply for the merge
measure. The shard input already carries each row's ordering field, which is exactly what
`output.collect` expects of a runner's output.

`--sleep` stands in for processing time (the coordination rows: many nodes, ~0.5 s a shard), so
that a shard costs the same wall time on every node whatever the box's load. `--ready-file` and
`--go-file` line the workers of one run up after their imports: on a 2-core box that starts 32
Python processes at once, start-up would otherwise stagger the claims by tens of seconds, which a
real cluster (a CPU per node) does not; both files are on the local disk, never on the job's
filesystem, so waiting costs that filesystem nothing.

Usage: passthrough_worker.py JOB_DIR [--lock-timeout-secs S] [--poll-interval-secs S] [--sleep S]
       [--max-shards N] [--backup-after F] [--ready-file PATH --go-file PATH]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from elastic_sharding.cli import setup_logging
from elastic_sharding.layout import JobLayout
from elastic_sharding.work.runners import AttemptContext
from elastic_sharding.work.worker import WorkerOptions, run_worker

GO_POLL_SECS = 0.02


class PassthroughRunner:
    """A no-op processor: output rows = input rows, one part file, after `sleep` seconds of "work"."""

    name = "passthrough"

    def __init__(self, sleep: float = 0.0):
        self.sleep = sleep

    def run(self, ctx: AttemptContext) -> None:
        # attempts/<shard>/<attempt>: the job directory is three levels up.
        layout = JobLayout(ctx.attempt_dir.parents[2])
        ctx.set_phase("processing")
        if self.sleep > 0:
            time.sleep(self.sleep)
        shutil.copyfile(layout.shard_input(ctx.shard_id), ctx.ray_output)

    def close(self) -> None:
        """Nothing is kept between attempts."""


def _line_up(ready: Path | None, go: Path | None) -> None:
    """Say this worker is started, then wait for the bench to start them all at once."""
    if ready is not None:
        ready.touch()
    while go is not None and not go.exists():
        time.sleep(GO_POLL_SECS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--lock-timeout-secs", type=float)
    parser.add_argument("--poll-interval-secs", type=float)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds of simulated work per shard, before the copy")
    parser.add_argument("--max-shards", type=int, help="stop after claiming this many shards")
    parser.add_argument("--backup-after", type=float, help="override the job's backup trigger (0: no backup attempts)")
    parser.add_argument("--ready-file", type=Path, help="touched once started (a local path, not on the job's filesystem)")
    parser.add_argument("--go-file", type=Path, help="wait until this local file exists before joining the job")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    setup_logging(args.log_level)
    options = WorkerOptions(
        lock_timeout_secs=args.lock_timeout_secs,
        poll_interval_secs=args.poll_interval_secs,
        backup_after=args.backup_after,
        max_shards=args.max_shards,
    )
    _line_up(args.ready_file, args.go_file)
    return run_worker(args.job_dir, options, PassthroughRunner(args.sleep))


if __name__ == "__main__":
    sys.exit(main())
