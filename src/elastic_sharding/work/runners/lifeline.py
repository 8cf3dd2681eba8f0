"""A lifeline from the worker to a runner child's process group.

PR_SET_PDEATHSIG reaches only the direct child. Ray's helpers (raylet, gcs, dashboard and
runtime-env agents) notice their parent's death by polling, which took 11 s idle and over 60 s on
a loaded CI box. So the worker keeps the write end of a pipe open for as long as it lives; the
child forks, before anything else, a tiny watcher into its own process group that blocks reading
the other end. Whatever kills the worker — even SIGKILL — closes that end, and the watcher kills
the whole group at once.
"""

from __future__ import annotations

import contextlib
import os
import signal

LIFELINE_ENV = "ELASTIC_SHARD_LIFELINE_FD"


class Lifeline:
    """The worker's end: hand `env()` and `fd` to the child, `close()` once the child's group is gone."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()

    def env(self) -> dict[str, str]:
        return {LIFELINE_ENV: str(self.fd)}

    def child_started(self) -> None:
        """The child has its copy of the read end; ours would keep the watcher from seeing EOF."""
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def close(self) -> None:
        self.child_started()
        with contextlib.suppress(OSError):
            os.close(self._write_fd)


def hold_group() -> None:
    """In the child, first thing: fork the watcher if the worker passed a lifeline.

    Must run before any thread starts. The watcher closes every other descriptor so it never
    keeps a pipe (the warm runtime's events, a log) open on the worker's behalf.
    """
    value = os.environ.pop(LIFELINE_ENV, None)
    if value is None:
        return
    fd = int(value)
    if os.fork() == 0:
        try:
            for other in os.listdir("/proc/self/fd"):
                if int(other) != fd:
                    with contextlib.suppress(OSError):
                        os.close(int(other))
            while os.read(fd, 4096):
                pass
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(fd)
