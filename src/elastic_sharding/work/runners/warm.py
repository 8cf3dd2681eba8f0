"""The warm runner (default): one long-lived Ray + Data-Juicer process per worker, reused per shard.

The expensive part of a `dj-process` run is starting Ray and its workers (12–15 s here), and for
an actor-mode operator (every GPU operator) building its actors and loading its model; the warm
runtime pays both once per worker (`warm_ops`). It lives in a child process (`warm_server`) so
that whatever goes wrong in it — a crash, a hang, Ray dying, memory growing — costs the attempts
in it only (normal retry rules) and the runtime is started afresh for the next one.

Attempts overlap: `begin` sends a claimed-ahead attempt to the runtime at once, so its rows
queue behind the current shard's tail; `run` then waits for it. A stop request cancels one
attempt in the runtime and leaves it, and its warm operators, to the others; only if the attempt
does not end within CANCEL_GRACE_SECS is the runtime killed. An attempt that was in a runtime
killed because of another attempt is handed back without counting as a failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from elastic_sharding import confined
from elastic_sharding.errors import AttemptFailed, AttemptInterrupted
from elastic_sharding.vocabulary import Phase
from elastic_sharding.work.runners.base import AttemptContext, NodeRuntime
from elastic_sharding.work.runners.process import last_error_line, start_child, stop_process_group

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECS = 300.0
QUIT_GRACE_SECS = 15.0
CANCEL_GRACE_SECS = 5.0
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
        self.warm = False  # it has run a shard, or a shard reached its warm operators
        read_fd, write_fd = os.pipe()
        command = [
            sys.executable,
            "-m",
            "elastic_sharding.work.runners.warm_server",
            "--events-fd",
            str(write_fd),
            "--hang-secs",
            str(runtime.hang_secs),
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
        try:  # the runner sends under its lock, from the main and the claim-ahead thread
            self.proc.stdin.write(orjson.dumps(request) + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise AttemptFailed(f"warm runtime pid {self.pid} is gone: {exc}", node_local=True) from None

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


@dataclass
class _InFlight:
    """An attempt sent to (or waiting to be sent to) a warm runtime."""

    ctx: AttemptContext
    server: _Server | None = None
    result: dict[str, Any] | None = None
    cancelled_at: float | None = None
    replaced: str | None = None  # why the runtime it was in was replaced


class WarmRunner:
    name = "warm"

    def __init__(self, runtime: NodeRuntime):
        self.runtime = runtime
        self._server: _Server | None = None
        self._started = 0
        self._recycle_mb = _recycle_rss_mb()
        self._lock = threading.RLock()
        self._inflight: dict[str, _InFlight] = {}

    # -- runtime lifecycle ---------------------------------------------------------------------

    def _runtime_log(self) -> Path:
        base = self.runtime.log_dir or Path.cwd()
        return base / f"warm-{os.uname().nodename}-{os.getpid()}-{self._started}.log"

    def _discard(self, why: str, graceful: bool = False, culprit: str | None = None) -> None:
        """Replace the runtime; the other attempts in it are interrupted (or, if the runtime
        failed by itself, `culprit` is None and they fail with it)."""
        with self._lock:
            server, self._server = self._server, None
            if server is None:
                return
            for attempt_id, entry in self._inflight.items():
                if entry.server is server and entry.result is None and attempt_id != culprit:
                    entry.replaced = why
        log.warning("warm runtime pid %d is replaced: %s (its log: %s)", server.pid, why, server.log_path)
        server.close(graceful)

    def _start(self, ctx: AttemptContext) -> _Server:
        self._started += 1
        ctx.set_phase(Phase.STARTING_WARM_RUNTIME)
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
                    with self._lock:
                        self._server = server
                    return server
                if event["event"] == "fatal":
                    raise AttemptFailed(
                        f"warm runtime failed to start: {event['error']} (log: {server.log_path})", node_local=True
                    )
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
            if self._cancel_stopped(server):
                raise AttemptInterrupted(
                    f"warm runtime pid {server.pid} was replaced while {doing}: a cancelled attempt in it did not end"
                )
            try:
                event = server.next_event(timeout=0.5)
            except EOFError:
                code = server.proc.wait()
                raise AttemptFailed(
                    f"warm runtime pid {server.pid} died (exit code {code}) while {doing}: {last_error_line(server.log_path)}",
                    node_local=True,
                ) from None
            now = time.monotonic()
            if event is not None:
                self._route(event)
                return event
            if now > deadline:
                raise AttemptFailed(
                    f"warm runtime pid {server.pid} did not start within {STARTUP_TIMEOUT_SECS:.0f}s", node_local=True
                )
            if now - silent_since > self.runtime.hang_secs:
                raise AttemptFailed(
                    f"warm runtime pid {server.pid} sent no pulse for {now - silent_since:.0f}s while {doing}: hung",
                    node_local=True,
                )

    def _route(self, event: dict[str, Any]) -> None:
        """Results of other attempts wait in their entries; figures ride on every heartbeat."""
        with self._lock:
            if event["event"] in ("result", "feeding") and self._server is not None and not self._server.warm:
                self._server.warm = True
                for waiting in self._inflight.values():
                    if waiting.server is None and waiting.ctx.stop_reason() is None:
                        self._send_run(self._server, waiting)
            if event["event"] == "result":
                entry = self._inflight.get(event["attempt"])
                if entry is not None:
                    entry.result = event
                    entry.ctx.operators = event.get("operators") or None
                    if entry.cancelled_at is not None:
                        del self._inflight[event["attempt"]]
            if event.get("operators"):
                # The latest figures stay with every attempt in flight, so one that fails or is
                # outrun records the instances (and model loads) its runtime had by then too.
                for entry in self._inflight.values():
                    if entry.result is None:
                        entry.ctx.operators = event["operators"]
                    entry.ctx.note(operators=event["operators"])

    def _cancel_stopped(self, server: _Server) -> bool:
        """Cancel in-flight attempts that were told to stop; kill the runtime if one of them
        does not end within the grace (its thread is stuck where it cannot be interrupted).
        True if the runtime was killed."""
        now = time.monotonic()
        with self._lock:
            for attempt_id, entry in list(self._inflight.items()):
                if entry.server is not server or entry.result is not None:
                    continue
                if entry.cancelled_at is None and entry.ctx.stop_reason() is not None:
                    self._send_cancel(entry)
                elif entry.cancelled_at is not None and now - entry.cancelled_at > CANCEL_GRACE_SECS:
                    del self._inflight[attempt_id]
                    self._discard(
                        f"cancelled attempt {attempt_id} did not end within {CANCEL_GRACE_SECS:.0f}s", culprit=attempt_id
                    )
                    return True
        return False

    def _send_run(self, server: _Server, entry: _InFlight) -> None:
        ctx = entry.ctx
        entry.server = server
        server.shards += 1
        with confined.open_append(ctx.log_path) as log_file:
            log_file.write(
                f"# warm runtime pid {server.pid} #{server.number}, shard {server.shards} in it; "
                f"runtime log {server.log_path}\n".encode()
            )
        server.send(
            op="run",
            attempt=ctx.attempt_id,
            shard=ctx.shard_id,
            recipe=str(ctx.recipe_path),
            log=str(ctx.log_path),
            stats_only=ctx.stats_only,
        )
        ctx.set_phase(Phase.PROCESSING)

    def _send_cancel(self, entry: _InFlight) -> None:
        entry.cancelled_at = time.monotonic()
        if entry.server is not None and entry.server.proc.poll() is None:
            with contextlib.suppress(AttemptFailed):  # a runtime that is gone has nothing to cancel
                entry.server.send(op="cancel", attempt=entry.ctx.attempt_id)

    # -- attempts ------------------------------------------------------------------------------

    def begin(self, ctx: AttemptContext) -> None:
        """Start a claimed-ahead attempt now (from the claim-ahead thread); `run` collects it.

        A runtime's first shard runs alone through its cold part: two shards through a cold
        runtime at once (the recipe parsed, Ray's workers started, Data-Juicer imported in them)
        took 2.5 s longer here than one after the other. So the attempt waits until the runtime
        has finished a shard or a shard's rows reached its warm operators (whose model load the
        next shard's cold part then overlaps), and is sent at that moment."""
        with self._lock:
            if ctx.attempt_id in self._inflight:
                return
            entry = self._inflight[ctx.attempt_id] = _InFlight(ctx)
            server = self._server
            if server is not None and server.proc.poll() is None and server.warm:
                self._send_run(server, entry)

    def cancel(self, ctx: AttemptContext) -> None:
        """A begun attempt that will not be run: stop it in the runtime and forget its result."""
        with self._lock:
            entry = self._inflight.get(ctx.attempt_id)
            if entry is None:
                return
            if entry.server is None or entry.result is not None:
                del self._inflight[ctx.attempt_id]
            elif entry.cancelled_at is None:
                self._send_cancel(entry)

    def run(self, ctx: AttemptContext) -> None:
        if self._server is not None and self._server.proc.poll() is not None:
            self._discard(f"it exited with code {self._server.proc.returncode} between shards")
        with self._lock:
            entry = self._inflight.get(ctx.attempt_id)
            if entry is None:
                entry = self._inflight[ctx.attempt_id] = _InFlight(ctx)
        try:
            self._run(ctx, entry)
        finally:
            with self._lock:
                if entry.result is not None or entry.replaced or entry.server is None:
                    self._inflight.pop(ctx.attempt_id, None)

    def _run(self, ctx: AttemptContext, entry: _InFlight) -> None:
        if entry.replaced:
            raise AttemptInterrupted(f"the warm runtime it was running in was replaced: {entry.replaced}")
        server = self._server or self._start(ctx)
        with self._lock:
            if entry.server is None:
                self._send_run(server, entry)
            elif entry.server is not server:
                raise AttemptInterrupted("the warm runtime it was running in was replaced")
        try:
            while entry.result is None:
                event = self._await(server, ctx, float("inf"), f"processing {ctx.shard_id}")
                if event["event"] == "fatal":
                    raise AttemptFailed(f"{event['error']} (processing {ctx.shard_id})")
                if entry.replaced:
                    raise AttemptInterrupted(f"the warm runtime it was running in was replaced: {entry.replaced}")
        except AttemptInterrupted:
            raise
        except AttemptFailed as exc:
            if ctx.stop_reason() is not None and self._cancelled_in_time(server, entry):
                raise
            self._discard(f"attempt of {ctx.shard_id} ended abnormally: {exc}", culprit=ctx.attempt_id)
            raise
        if not entry.result["ok"]:
            raise AttemptFailed(f"Data-Juicer failed: {last_error_line(ctx.log_path)}")
        rss = server.rss_mb()
        if rss is not None and rss > self._recycle_mb and not self._others_in(server, ctx):
            self._discard(f"its driver grew to {rss:.0f} MB (limit {self._recycle_mb:.0f} MB)", graceful=True)

    def _cancelled_in_time(self, server: _Server, entry: _InFlight) -> bool:
        """Cancel a stopped attempt in the runtime and wait for it to end; False if it did not."""
        self._send_cancel(entry)
        deadline = time.monotonic() + CANCEL_GRACE_SECS
        while entry.result is None and time.monotonic() < deadline:
            try:
                event = server.next_event(timeout=0.5)
            except EOFError:
                return False
            if event is not None:
                self._route(event)
        return entry.result is not None

    def _others_in(self, server: _Server, ctx: AttemptContext) -> bool:
        with self._lock:
            return any(e.server is server and e.ctx is not ctx and e.result is None for e in self._inflight.values())

    def close(self) -> None:
        with self._lock:
            busy = any(e.result is None and e.server is not None for e in self._inflight.values())
            server, self._server = self._server, None
            self._inflight.clear()
        if server is not None:
            server.close(graceful=not busy)
