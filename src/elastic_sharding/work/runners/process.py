"""The process runner: one fresh `dj-process` (Ray executor, node-local Ray) per attempt.

Maximal isolation at the price of Ray start-up per attempt. The child runs in its own session
so the whole process tree (driver, raylet, Ray workers) can be stopped at once, and it dies with
the worker (PR_SET_PDEATHSIG) so a killed worker never leaves an orphan still writing output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from elastic_sharding import confined
from elastic_sharding.children import child_env, set_parent_death_signal
from elastic_sharding.errors import AttemptFailed
from elastic_sharding.vocabulary import Phase
from elastic_sharding.work.runners import stats_only
from elastic_sharding.work.runners.base import AttemptContext, NodeRuntime
from elastic_sharding.work.runners.lifeline import Lifeline

log = logging.getLogger(__name__)

STOP_GRACE_SECS = 10.0


def _die_with_parent() -> None:
    set_parent_death_signal(signal.SIGKILL)


def start_child(
    command: list[str],
    extra_env: dict[str, str],
    *,
    log_path: Path,
    cwd: Path,
    stdin: int = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
) -> tuple[subprocess.Popen[bytes], Lifeline]:
    """Start a runner child that leads its own session (so its whole tree can be stopped at once)
    and dies with the worker: PR_SET_PDEATHSIG for the child itself, the lifeline for the rest of
    its group. Its output is appended to `log_path` after the command line. Close the returned
    lifeline once the group has been stopped."""
    lifeline = Lifeline()
    try:
        with confined.open_append(log_path) as log_file:
            log_file.write(f"# {' '.join(command)}\n".encode())
            log_file.flush()
            proc = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(cwd),
                env=child_env({**extra_env, **lifeline.env()}),
                pass_fds=(*pass_fds, lifeline.fd),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
    except BaseException:
        lifeline.close()
        raise
    lifeline.child_started()
    return proc, lifeline


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE_SECS) -> None:
    """SIGTERM the child's whole process group, then SIGKILL what is left after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        _signal_group(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    _signal_group(proc.pid, signal.SIGKILL)


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): \S")
_NOISE = ("ray.exceptions.", "_pickle.", "pickle.", "KeyboardInterrupt")


def last_error_line(log_path: Path) -> str:
    """The root cause of a failed run, for status and failure records.

    Ray wraps an operator's exception in several layers and loguru adds a pickling error on
    top, so the last exception line of the log is the one that matters only after skipping
    those wrappers.
    """
    try:
        with confined.open_read(log_path) as handle:
            handle.seek(max(0, os.path.getsize(log_path) - 256 * 1024))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return "no log"
    fallback = None
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION_LINE.match(text):
            if not text.startswith(_NOISE):
                return text[:500]
            fallback = fallback or text
    if fallback:
        return fallback[:500]
    for line in reversed(lines):
        if line.strip():
            return line.strip()[:500]
    return "no output"


class ProcessRunner:
    name = "process"

    def __init__(self, runtime: NodeRuntime | None = None):
        self.runtime = runtime or NodeRuntime()

    def _command(self, recipe: Path) -> list[str]:
        entry = ["-m", "elastic_sharding.work.runners.process_entry", *self.runtime.entry_args(), "--"]
        return [sys.executable, *entry, "--config", str(recipe)]

    def close(self) -> None:
        pass

    def run(self, ctx: AttemptContext) -> None:
        command = self._command(ctx.recipe_path)
        env = {**ctx.env, stats_only.ENV: "1"} if ctx.stats_only else ctx.env
        proc, lifeline = start_child(command, env, log_path=ctx.log_path, cwd=ctx.attempt_dir)
        ctx.set_phase(Phase.PROCESSING)
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    reason = ctx.stop_reason()
                    if reason is not None:
                        log.warning("stopping %s child pid=%d: %s", ctx.shard_id, proc.pid, reason)
                        stop_process_group(proc)
        finally:
            if proc.poll() is None:
                log.warning("stopping %s child pid=%d: worker is leaving", ctx.shard_id, proc.pid)
                stop_process_group(proc)
            else:
                # Ray helpers may outlive the driver briefly; the group must not leak.
                _signal_group(proc.pid, signal.SIGKILL)
            lifeline.close()
        if ctx.stop_reason() is not None:
            raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
        if code != 0:
            # Killed by a signal (the kernel's OOM killer sends SIGKILL): the node, not the shard.
            raise AttemptFailed(f"dj-process exited with code {code}: {last_error_line(ctx.log_path)}", node_local=code < 0)
