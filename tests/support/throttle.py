"""Slow one simulated node down while it stays alive: a straggler, for backup-attempt tests.

Two ways, both on one process tree only (the worker, its warm runtime and the Ray processes it
started, found again at every step so late children are caught too):

- `CpuThrottle`: the cgroup v1 `cpu` controller (root) caps the tree at a share of one core, as
  a noisy neighbour or thermal throttling would; what burns CPU slows down, sleeping does not.
- `DutyCycle`: SIGSTOP/SIGCONT in turns, so the tree runs only `on` seconds of every period; this
  slows sleeping too (the fake processor), and its heartbeat still moves between the stops.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from pathlib import Path

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


def cgroup_throttle_available() -> bool:
    return os.geteuid() == 0 and (CPU_CGROUP / "cgroup.procs").exists()


def descendants(root: int) -> list[int]:
    """`root` and every process below it (by parent pid), at this moment."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


class CpuThrottle:
    """Caps the process tree of `root` at `share` of one core while the context is open."""

    def __init__(self, root: int, share: float, period_us: int = 100_000):
        self.root = root
        self.quota = max(1000, int(share * period_us))
        self.period = period_us
        self.group = CPU_CGROUP / f"elastic-test-{uuid.uuid4().hex[:8]}"
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> CpuThrottle:
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text(str(self.period))
        (self.group / "cpu.cfs_quota_us").write_text(str(self.quota))
        self._move_tree()
        self._thread.start()
        return self

    def _move_tree(self) -> None:
        for pid in descendants(self.root):
            with contextlib.suppress(OSError):  # gone meanwhile
                (self.group / "cgroup.procs").write_text(str(pid))

    def _follow(self) -> None:
        # Children forked inside the group stay in it; this catches any started from outside.
        while not self._halt.wait(0.5):
            self._move_tree()

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join()
        for pid in (self.group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.group.rmdir()


class DutyCycle(threading.Thread):
    """Lets the process tree of `root` run `on` seconds of every `period` until `stop()`."""

    def __init__(self, root: int, slowdown: float, period: float = 0.5):
        super().__init__(daemon=True)
        self.root = root
        self.on = period / slowdown
        self.off = period - self.on
        self._halt = threading.Event()

    def _signal(self, sig: int) -> None:
        for pid in descendants(self.root):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self._signal(signal.SIGSTOP)
                if self._halt.wait(self.off):
                    break
                self._signal(signal.SIGCONT)
                self._halt.wait(self.on)
        finally:
            self._signal(signal.SIGCONT)

    def stop(self) -> None:
        self._halt.set()
        self.join()
