"""The lifeline: a runner child's whole process group dies with the worker, however it dies."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from support.jobs import REPO

# A stand-in worker: starts a child in its own session that holds the lifeline and has a
# grandchild in its group (as Ray's helpers are), reports both pids, then waits to be killed.
WORKER = r"""
import os, subprocess, sys, time
from elastic_sharding.work.runners.lifeline import Lifeline
from elastic_sharding.children import child_env
CHILD = (
    "import subprocess, sys, time\n"
    "from elastic_sharding.work.runners.lifeline import hold_group\n"
    "hold_group()\n"
    "grandchild = subprocess.Popen(['sleep', '300'], stdout=subprocess.DEVNULL)\n"
    "print(grandchild.pid, flush=True)\n"
    "time.sleep(300)\n"
)
lifeline = Lifeline()
child = subprocess.Popen(
    [sys.executable, "-c", CHILD], env=child_env(lifeline.env()), stdout=subprocess.PIPE,
    pass_fds=(lifeline.fd,), start_new_session=True,
)
lifeline.child_started()
print(child.pid, child.stdout.readline().decode().strip(), flush=True)
if sys.argv[1] == "exit-child":
    os.kill(child.pid, 9)
    child.wait()
    print("eof" if child.stdout.read() == b"" else "open", flush=True)
time.sleep(300)
"""


def _start(mode: str) -> tuple[subprocess.Popen, int, int]:
    worker = subprocess.Popen([sys.executable, "-c", WORKER, mode], cwd=REPO, stdout=subprocess.PIPE, text=True, env=_env())
    child, grandchild = (int(pid) for pid in worker.stdout.readline().split())  # type: ignore[union-attr]
    return worker, child, grandchild


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src")}


def _cleanup(worker: subprocess.Popen, *pids: int) -> None:
    worker.kill()
    worker.wait()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ")[1].startswith("Z"):
                return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_takes_the_childs_whole_group_with_it():
    worker, child, grandchild = _start("hold")
    try:
        assert not _gone(grandchild, within=0.5), "nothing may die while the worker lives"
        worker.kill()
        worker.wait()
        assert _gone(child) and _gone(grandchild), "the child's group outlived its worker"
    finally:
        _cleanup(worker, child, grandchild)


def test_the_watcher_keeps_no_pipe_of_the_child_open():
    """The worker learns of a crashed warm runtime from EOF on its pipe; the watcher, which
    outlives the child in its group, must not hold that pipe open."""
    worker, child, grandchild = _start("exit-child")
    try:
        assert worker.stdout.readline().strip() == "eof"  # type: ignore[union-attr]
    finally:
        _cleanup(worker, child, grandchild)
