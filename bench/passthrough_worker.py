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

With `--overlap` the runner has the warm runner's `begin`: the worker claims the next shard
ahead and it is processed while the current one is collected and published, as in production
(`OverlappingRunner`); without it, the claim, collect and publish of each shard come between two
shards' work, as with the process runner.

With `ES_BENCH_COUNT_CALLS=DIR` in its environment the worker counts the filesystem calls it makes
on names in the job directory, by call, by the directory they name (`state/locks`, `attempts`, ...)
and by outcome, and writes them to `DIR/<host>-<pid>.json` when it exits: what a shard costs the
filesystem, attributed (issue 44's lookups).

Usage: passthrough_worker.py JOB_DIR [--lock-timeout-secs S] [--poll-interval-secs S] [--sleep S] [--overlap]
       [--max-shards N] [--backup-after F] [--ready-file PATH --go-file PATH]
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import queue
import shutil
import socket
import sys
import threading
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
        ctx.set_phase("processing")
        self.work(ctx)

    def work(self, ctx: AttemptContext) -> None:
        if self.sleep > 0:
            time.sleep(self.sleep)
        # attempts/<shard>/<attempt>: the job directory is three levels up.
        layout = JobLayout(ctx.attempt_dir.parents[2])
        shutil.copyfile(layout.shard_input(ctx.shard_id), ctx.ray_output)

    def close(self) -> None:
        """Nothing is kept between attempts."""


class OverlappingRunner(PassthroughRunner):
    """The passthrough runner with the warm runner's overlap (`--overlap`): a claimed-ahead attempt
    is begun at once and queued on the node's one "processor" (a thread that works one attempt at
    a time, in order), so the next shard is processed while the worker collects and publishes the
    current one, as Data-Juicer's warm runtime does in production. `run` waits for its attempt's
    turn to end; a cancelled attempt is skipped."""

    def __init__(self, sleep: float = 0.0):
        super().__init__(sleep)
        self._queue: queue.Queue[AttemptContext | None] = queue.Queue()
        self._ended: dict[str, threading.Event] = {}
        self._errors: dict[str, BaseException] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._processor = threading.Thread(target=self._process, name="processor", daemon=True)
        self._processor.start()

    def _process(self) -> None:
        while (ctx := self._queue.get()) is not None:
            with self._lock:
                if ctx.attempt_id in self._cancelled:
                    continue
                ended = self._ended[ctx.attempt_id]
            try:
                self.work(ctx)
            except BaseException as exc:  # noqa: BLE001 - handed to `run`, which raises it
                self._errors[ctx.attempt_id] = exc
            ended.set()

    def begin(self, ctx: AttemptContext) -> None:
        with self._lock:
            if ctx.attempt_id in self._ended:
                return
            self._ended[ctx.attempt_id] = threading.Event()
        self._queue.put(ctx)

    def cancel(self, ctx: AttemptContext) -> None:
        with self._lock:
            self._cancelled.add(ctx.attempt_id)
            self._ended.pop(ctx.attempt_id, None)

    def run(self, ctx: AttemptContext) -> None:
        self.begin(ctx)
        ctx.set_phase("processing")
        with self._lock:
            ended = self._ended[ctx.attempt_id]
        ended.wait()
        with self._lock:
            self._ended.pop(ctx.attempt_id, None)
        error = self._errors.pop(ctx.attempt_id, None)
        if error is not None:
            raise error

    def close(self) -> None:
        self._queue.put(None)


HELPERS = ("elastic_sharding.confined", "elastic_sharding.fsops")
COUNTED_CALLS = ("open", "stat", "link", "unlink", "rename", "replace", "mkdir", "rmdir", "scandir", "fsync")


def count_calls(job_dir: Path, out_dir: Path) -> None:
    """Wrap the os calls the tool makes so that each one on a name in `job_dir` is counted."""
    root = str(job_dir.resolve())
    counts: collections.Counter[str] = collections.Counter()

    def where(name: object, dir_fd: int | None) -> str | None:
        if isinstance(name, int):
            name, dir_fd = "", name
        if dir_fd is not None:
            try:
                name = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), str(name))
            except OSError:
                return None
        text = os.path.normpath(os.fspath(name)) if name != "" else ""
        if not text.startswith(root + "/"):
            return None
        parts = text[len(root) + 1 :].split("/")
        top = parts[0]
        if top in ("state", "stages") and len(parts) > 2:
            return "/".join(parts[:2])
        return top if len(parts) > 1 else f"{top} (itself)" if parts[0] else "job (itself)"

    def caller() -> str:
        """The tool's functions that made the call, below the filesystem helpers (with ES_BENCH_COUNT_CALLERS)."""
        if not by_caller:
            return ""
        frame, names = sys._getframe(2), []
        while frame is not None and len(names) < 3:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("elastic_sharding.") and module not in HELPERS:
                names.append(f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}")
            frame = frame.f_back
        return " <- " + " < ".join(names)

    by_caller = bool(os.environ.get("ES_BENCH_COUNT_CALLERS"))

    def wrap(call_name: str) -> None:
        real = getattr(os, call_name)

        def counted(*args, **kwargs):
            fd = kwargs.get("dir_fd", kwargs.get("src_dir_fd"))
            place = where(args[0], fd) if args else None
            try:
                result = real(*args, **kwargs)
            except OSError as exc:
                if place is not None:
                    counts[f"{call_name} {place} {exc.__class__.__name__}{caller()}"] += 1
                raise
            if place is not None:
                counts[f"{call_name} {place} ok{caller()}"] += 1
            return result

        setattr(os, call_name, counted)

    for call_name in COUNTED_CALLS:
        wrap(call_name)

    def dump() -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{socket.gethostname()}-{os.getpid()}.json").write_text(json.dumps(dict(counts)))

    atexit.register(dump)


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
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="process a claimed-ahead shard while the current one publishes (the warm runner's way)",
    )
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
    if os.environ.get("ES_BENCH_COUNT_CALLS"):
        count_calls(args.job_dir, Path(os.environ["ES_BENCH_COUNT_CALLS"]))
    _line_up(args.ready_file, args.go_file)
    runner = OverlappingRunner(args.sleep) if args.overlap else PassthroughRunner(args.sleep)
    return run_worker(args.job_dir, options, runner)


if __name__ == "__main__":
    sys.exit(main())
