"""The warm runner (default): one long-lived Ray + Data-Juicer process per worker, reused per shard.

The expensive part of a `dj-process` run is starting Ray and its workers (12–15 s here); the warm
runtime pays it once per worker. It lives in a child process (`warm_server`) so that whatever
goes wrong in it — a crash, a hang, Ray dying, memory growing — costs the current attempt only
(normal retry rules) and the runtime is started afresh for the next one. A stop request kills
the runtime at once, as the process runner kills its child.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from .. import fsops
from ..errors import AttemptFailed
from .base import AttemptContext, NodeRuntime
from .process import last_error_line, start_child, stop_process_group

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECS = 300.0
QUIT_GRACE_SECS = 15.0
# A driver process that grew past this much resident memory is replaced between shards.
RECYCLE_RSS_FRACTION = 0.25
RECYCLE_RSS_CAP_MB = 8192


def _recycle_rss_mb() -> float:
    try:
        total_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return RECYCLE_RSS_CAP_MB
    return min(RECYCLE_RSS_CAP_MB, total_kb / 1024 * RECYCLE_RSS_FRACTION)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


class _Server:
    """One warm_server child: its process, its event pipe, and the log of its own output."""

    def __init__(self, runtime: NodeRuntime, log_path: Path, number: int):
        self.log_path = log_path
        self.number = number
        self.shards = 0
        read_fd, write_fd = os.pipe()
        command = [
            sys.executable,
            "-m",
            "elastic_sharding.runners.warm_server",
            "--events-fd",
            str(write_fd),
            *runtime.entry_args(),
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.proc, self._lifeline = start_child(
                command, runtime.env, log_path=log_path, cwd=log_path.parent, stdin=subprocess.PIPE, pass_fds=(write_fd,)
            )
        finally:
            os.close(write_fd)
        self._events = read_fd
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, **request: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(orjson.dumps(request) + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise AttemptFailed(f"warm runtime pid {self.pid} is gone: {exc}") from None

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next event, None if none came within `timeout`; EOFError once the pipe closed."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._events], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._events, 65536)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return orjson.loads(line)

    def rss_mb(self) -> float | None:
        return _rss_mb(self.pid)

    def close(self, graceful: bool) -> None:
        if graceful and self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=QUIT_GRACE_SECS)
            except (AttemptFailed, OSError, subprocess.TimeoutExpired):
                pass
        # Ray's helpers live in the server's session; none may outlive it.
        stop_process_group(self.proc, grace=2.0)
        self._lifeline.close()
        os.close(self._events)


class WarmRunner:
    name = "warm"

    def __init__(self, runtime: NodeRuntime):
        self.runtime = runtime
        self._server: _Server | None = None
        self._started = 0
        self._recycle_mb = _recycle_rss_mb()

    # -- runtime lifecycle ---------------------------------------------------------------------

    def _runtime_log(self) -> Path:
        base = self.runtime.log_dir or Path.cwd()
        return base / f"warm-{os.uname().nodename}-{os.getpid()}-{self._started}.log"

    def _discard(self, why: str, graceful: bool = False) -> None:
        server, self._server = self._server, None
        if server is not None:
            log.warning("warm runtime pid %d is replaced: %s (its log: %s)", server.pid, why, server.log_path)
            server.close(graceful)

    def _start(self, ctx: AttemptContext) -> _Server:
        self._started += 1
        ctx.set_phase("starting warm runtime")
        began = time.monotonic()
        server = _Server(self.runtime, self._runtime_log(), self._started)
        log.info("starting warm runtime pid %d (ray address %s; log %s)", server.pid, self.runtime.ray_address, server.log_path)
        deadline = began + STARTUP_TIMEOUT_SECS
        try:
            while True:
                event = self._await(server, ctx, deadline, "starting")
                if event["event"] == "pulse":
                    continue
                if event["event"] == "ready":
                    log.info("warm runtime pid %d ready in %.1fs: %s", server.pid, event["secs"], event.get("ray"))
                    ctx.setup_secs += time.monotonic() - began
                    self._server = server
                    return server
                if event["event"] == "fatal":
                    raise AttemptFailed(f"warm runtime failed to start: {event['error']} (log: {server.log_path})")
        except BaseException:
            server.close(graceful=False)
            raise

    def _await(self, server: _Server, ctx: AttemptContext, deadline: float, doing: str) -> dict[str, Any]:
        """The next event of `server`, watching for a stop request, its death, and silence."""
        silent_since = time.monotonic()
        while True:
            reason = ctx.stop_reason()
            if reason is not None:
                raise AttemptFailed(f"stopped: {reason}")
            try:
                event = server.next_event(timeout=0.5)
            except EOFError:
                code = server.proc.wait()
                raise AttemptFailed(
                    f"warm runtime pid {server.pid} died (exit code {code}) while {doing}: {last_error_line(server.log_path)}"
                ) from None
            now = time.monotonic()
            if event is not None:
                return event
            if now > deadline:
                raise AttemptFailed(f"warm runtime pid {server.pid} did not start within {STARTUP_TIMEOUT_SECS:.0f}s")
            if now - silent_since > self.runtime.hang_secs:
                raise AttemptFailed(
                    f"warm runtime pid {server.pid} sent no pulse for {now - silent_since:.0f}s while {doing}: hung"
                )

    # -- one attempt ---------------------------------------------------------------------------

    def run(self, ctx: AttemptContext) -> None:
        if self._server is not None and self._server.proc.poll() is not None:
            self._discard(f"it exited with code {self._server.proc.returncode} between shards")
        server = self._server or self._start(ctx)
        server.shards += 1
        with fsops.open_append(ctx.log_path) as log_file:
            log_file.write(
                f"# warm runtime pid {server.pid} #{server.number}, shard {server.shards} in it; "
                f"runtime log {server.log_path}\n".encode()
            )
        ctx.set_phase("processing")
        try:
            server.send(
                op="run", shard=ctx.shard_id, recipe=str(ctx.recipe_path), log=str(ctx.log_path), cwd=str(ctx.attempt_dir)
            )
            while True:
                event = self._await(server, ctx, float("inf"), f"processing {ctx.shard_id}")
                if event["event"] == "fatal":
                    raise AttemptFailed(f"{event['error']} (processing {ctx.shard_id})")
                if event["event"] == "result":
                    break
        except AttemptFailed:
            self._discard(f"attempt of {ctx.shard_id} ended abnormally")
            raise
        if not event["ok"]:
            self._discard(f"attempt of {ctx.shard_id} failed")
            raise AttemptFailed(f"Data-Juicer failed: {last_error_line(ctx.log_path)}")
        rss = server.rss_mb()
        if rss is not None and rss > self._recycle_mb:
            self._discard(f"its driver grew to {rss:.0f} MB (limit {self._recycle_mb:.0f} MB)", graceful=True)

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close(graceful=True)
