"""What every measurement shares: the work directory, timed child processes, job records, results.

Every child runs in its own session so that a failed or interrupted bench can stop exactly the
process groups it started (never anything else), and dies with the bench (PR_SET_PDEATHSIG).
Child output goes to one log file per run under `<work>/logs/`; progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
VENV_BIN = Path(PYTHON).parent
RESOURCE_FLAGS = ("--ray-num-cpus", "--ray-num-gpus", "--ray-object-store-mb", "--ray-temp-dir")

_T0 = time.monotonic()


def progress(message: str) -> None:
    sys.stderr.write(f"[bench +{time.monotonic() - _T0:6.1f}s] {message}\n")
    sys.stderr.flush()


class BenchError(RuntimeError):
    """A run the bench depends on failed; the message names its log."""


@dataclass
class Result:
    """One printed ratio. `value` is what the target is judged on (a ratio, s/shard or claims/s)."""

    name: str
    label: str
    ours_secs: float | None
    baseline_secs: float | None
    ratio: float | None  # ours / baseline, where there is a baseline
    value: float | None
    unit: str
    target: str
    met: bool | None
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def times(
        cls,
        name: str,
        label: str,
        ours: float,
        baseline: float,
        limit: str | None,
        details: dict[str, Any],
        of: str = "",
    ) -> Result:
        """ours / baseline, judged against `limit` times (as printed, e.g. "1.10"; None: reported
        only); `of` names the baseline in the target text ("ideal")."""
        ratio = ours / baseline
        target = "(reported)" if limit is None else f"<= {limit}x" + (f" {of}" if of else "")
        met = None if limit is None else ratio <= float(limit)
        return cls(name, label, ours, baseline, ratio, ratio, "x", target, met, details)

    @classmethod
    def speedup(
        cls, name: str, label: str, ours: float, baseline: float, at_least: str | None, details: dict[str, Any]
    ) -> Result:
        """baseline / ours (how many times faster ours is), judged against `at_least` times
        (None: reported only). The one kind of row whose `ratio` is baseline / ours."""
        ratio = baseline / ours
        target = "(reported)" if at_least is None else f">= {at_least}x"
        met = None if at_least is None else ratio >= float(at_least)
        return cls(name, label, ours, baseline, ratio, ratio, "x", target, met, {"ratio_is": "baseline / ours", **details})

    @classmethod
    def skipped(cls, name: str, label: str, why: str, details: dict[str, Any] | None = None) -> Result:
        """A row this checkout cannot measure (a flag or feature it lacks): no value, no verdict,
        not an error."""
        return cls(name, label, None, None, None, None, "", "(not measured)", None, {"skipped": why, **(details or {})})


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Bench:
    """The run's work directory and the child processes it started."""

    def __init__(self, work: Path, our_runner: str, timeout: float):
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.our_runner = our_runner
        self.timeout = timeout
        # Ray's socket paths must stay under 108 bytes, so its temp dirs live under a short path
        # even when --work-dir is long.
        self.ray_root = Path(tempfile.mkdtemp(prefix="ebray-", dir="/tmp"))
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._help: dict[str, str] = {}
        self._ray_dirs = 0
        # What one measurement leaves for a later one (e2e's finished job for job_dir_bytes).
        self.shared: dict[str, Any] = {}

    # -- commands -------------------------------------------------------------------------------

    def elastic(self, *args: str) -> list[str]:
        return [PYTHON, "-m", "elastic_sharding", *args]

    def dj_process(self, recipe: Path) -> list[str]:
        return [str(VENV_BIN / "dj-process"), "--config", str(recipe)]

    def help_text(self, command: str) -> str:
        """`elastic-shard <command> --help`, once per command."""
        if command not in self._help:
            proc = subprocess.run(self.elastic(command, "--help"), capture_output=True, text=True, timeout=120)
            self._help[command] = proc.stdout
        return self._help[command]

    def supports(self, command: str, flag: str) -> bool:
        """Whether `elastic-shard <command> --help` lists `flag` (checked at run time, so the bench
        works before and after new flags land)."""
        return flag in self.help_text(command).split()

    def resource_flags(self, command: str, num_cpus: int | None = None, object_store_mb: int | None = None) -> list[str]:
        """Node-resource flags for `command`, only those it lists; a private Ray temp dir always."""
        flags: list[str] = []
        if num_cpus is not None and self.supports(command, "--ray-num-cpus"):
            flags += ["--ray-num-cpus", str(num_cpus)]
        if object_store_mb is not None and self.supports(command, "--ray-object-store-mb"):
            flags += ["--ray-object-store-mb", str(object_store_mb)]
        if self.supports(command, "--ray-temp-dir"):
            self._ray_dirs += 1
            path = self.ray_root / str(self._ray_dirs)
            path.mkdir()
            flags += ["--ray-temp-dir", str(path)]
        return flags

    def available_resource_flags(self) -> list[str]:
        return [flag for flag in RESOURCE_FLAGS if self.supports("worker", flag)]

    # -- child processes ------------------------------------------------------------------------

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(log, "ab") as handle:
            handle.write(f"# {' '.join(argv)}\n".encode())
            handle.flush()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=str(cwd or self.work),
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        proc.log_path = log  # type: ignore[attr-defined]
        self._children[proc.pid] = proc
        return proc

    def wait(self, procs: Iterable[subprocess.Popen[bytes]], what: str) -> dict[int, float]:
        """Wait for all; return each one's exit time (monotonic). Any failure stops the rest."""
        pending = {proc.pid: proc for proc in procs}
        ended: dict[int, float] = {}
        deadline = time.monotonic() + self.timeout
        while pending:
            for pid, proc in list(pending.items()):
                code = proc.poll()
                if code is None:
                    continue
                ended[pid] = time.monotonic()
                del pending[pid]
                self._children.pop(pid, None)
                # Ray helpers may outlive their driver briefly; the group must not leak.
                _signal_group(pid, signal.SIGKILL)
                if code != 0:
                    self.stop_all()
                    raise BenchError(
                        f"{what}: {Path(proc.args[0]).name} exited {code}; see {proc.log_path}\n{_tail(proc.log_path)}"
                    )  # type: ignore[attr-defined]
            if time.monotonic() > deadline:
                self.stop_all()
                raise BenchError(f"{what}: still running after {self.timeout:.0f}s; stopped")
            time.sleep(0.02)
        return ended

    def run(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
        """Run one command to completion; return its wall time in seconds."""
        t0 = time.monotonic()
        proc = self.start(name, argv, env, cwd)
        ended = self.wait([proc], name)
        return ended[proc.pid] - t0

    def run_with_memory(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> tuple[float, TreeMemory, int]:
        """Run one command to completion while `TreeMemory` samples its process tree; return (its
        wall time, the samples, the kernel's `ru_maxrss` of it in bytes: from `wait4`, the largest
        peak RSS of the command's process and of every descendant that was waited for, i.e. the
        largest single process, exact)."""
        t0 = time.monotonic()
        proc = self.start(name, argv, env, cwd)
        tree = TreeMemory(proc.pid)
        tree.start()
        deadline = t0 + self.timeout
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    self.stop_all()
                    raise BenchError(f"{name}: still running after {self.timeout:.0f}s; stopped")
                time.sleep(0.02)
        finally:
            tree.stop()
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.stop(proc)  # its group's leftovers, if any
        if proc.returncode != 0:
            self.stop_all()
            log: Path = proc.log_path  # type: ignore[attr-defined]
            raise BenchError(f"{name}: {Path(argv[0]).name} exited {proc.returncode}; see {log}\n{_tail(log)}")
        return wall, tree, usage.ru_maxrss * 1024

    def run_until(
        self, name: str, argv: Sequence[str], pattern: re.Pattern[str], cwd: Path | None = None, grace: float = 0.3
    ) -> tuple[float, str, int | None]:
        """Start one command and stop it once its log has a complete line matching `pattern`
        (then `grace` seconds more, for lines that come together); return (seconds from the
        start until the line, the log, its exit code: None if it had to be stopped). It may also
        end by itself first: with code 0 the log is still searched, any other code fails."""
        t0 = time.monotonic()
        proc = self.start(name, argv, cwd=cwd)
        log: Path = proc.log_path  # type: ignore[attr-defined]
        deadline = t0 + self.timeout
        while True:
            code = proc.poll()
            text = log.read_text(errors="replace")
            if any(pattern.search(line) for line in text.splitlines(keepends=True) if line.endswith("\n")):
                seen = time.monotonic() - t0
                break
            if code is not None:
                self.wait([proc], name)  # raises unless it succeeded
                raise BenchError(f"{name}: ended without a line matching {pattern.pattern!r}; see {log}\n{_tail(log)}")
            if time.monotonic() > deadline:
                self.stop_all()
                raise BenchError(f"{name}: no line matching {pattern.pattern!r} after {self.timeout:.0f}s; stopped")
            time.sleep(0.02)
        time.sleep(grace)
        code = self.stop(proc)
        return seen, log.read_text(errors="replace"), code

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 60.0) -> int | None:
        """Stop one child this bench started: SIGTERM to it alone (a launcher then drains its own
        workers), SIGKILL to its whole process group after `grace` seconds or once it exited.
        Returns its exit code if it had already ended by itself, else None."""
        code = proc.poll()
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        _signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        self._children.pop(proc.pid, None)
        return code

    def stop_all(self) -> None:
        """Stop every process group this bench started and that is still running."""
        for pid, proc in list(self._children.items()):
            if proc.poll() is None:
                _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for pid, proc in list(self._children.items()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(pid, signal.SIGKILL)
            self._children.pop(pid, None)

    def close(self, keep: bool) -> None:
        self.stop_all()
        shutil.rmtree(self.ray_root, ignore_errors=True)
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)


class TreeMemory(threading.Thread):
    """Samples the resident memory of a process and all its descendants every `interval` seconds
    (found by parent pid in /proc, so a process re-parented away from the tree is lost).

    For every process it keeps the kernel's own high-water mark, `VmHWM` of /proc/<pid>/status:
    the largest resident set the process ever had, not a sample of it, so a short spike between
    two samples is not missed; only growth in a process's last `interval` before it exits is.
    `VmRSS` at each sample gives what a group of processes held at once (`peak_sum`): a sampled
    figure, which can miss a spike shorter than `interval`. RSS counts a page shared between
    processes (fork's copy-on-write pages, Ray's shared-memory object store) once per process.
    """

    def __init__(self, root: int, interval: float = 0.25):
        super().__init__(name=f"tree-memory-{root}", daemon=True)
        self.root = root
        self.interval = interval
        self._halt = threading.Event()
        # (pid, start time) -> {"parent": key or None, "argv": [...], "hwm": bytes}
        self.procs: dict[tuple[int, int], dict[str, Any]] = {}
        self.samples: list[dict[tuple[int, int], int]] = []  # key -> VmRSS bytes, per sample
        self.root_key: tuple[int, int] | None = None

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def sample(self) -> None:
        stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, start time)
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            pid = int(entry)
            stats[pid] = (int(fields[1]), int(fields[19]))
            children.setdefault(int(fields[1]), []).append(pid)
        if self.root not in stats:
            return
        now: dict[tuple[int, int], int] = {}
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            ppid, started = stats[pid]
            key = (pid, started)
            memory = _status_memory(pid)
            if memory is None:
                continue
            hwm, rss = memory
            info = self.procs.get(key)
            if info is None:
                parent = (ppid, stats[ppid][1]) if pid != self.root and ppid in stats else None
                info = self.procs[key] = {"parent": parent, "argv": _argv(pid), "hwm": 0}
                if pid == self.root:
                    self.root_key = key
            info["hwm"] = max(info["hwm"], hwm)
            now[key] = rss
        self.samples.append(now)

    def subtree(self, top: tuple[int, int]) -> set[tuple[int, int]]:
        """`top` and every process seen below it."""
        below: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for key, info in self.procs.items():
            if info["parent"] is not None:
                below.setdefault(info["parent"], []).append(key)
        found, todo = set(), [top]
        while todo:
            key = todo.pop()
            found.add(key)
            todo += below.get(key, [])
        return found

    def peak_sum(self, keys: set[tuple[int, int]]) -> int:
        """The largest sampled total VmRSS of `keys` at one instant, bytes."""
        return max((sum(rss for key, rss in sample.items() if key in keys) for sample in self.samples), default=0)

    def peak_one(self, keys: set[tuple[int, int]]) -> int:
        """The largest VmHWM among `keys`, bytes."""
        return max((self.procs[key]["hwm"] for key in keys if key in self.procs), default=0)


def _status_memory(pid: int) -> tuple[int, int] | None:
    """(VmHWM, VmRSS) of a live process in bytes; None when it is gone or has no memory (a zombie)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            text = handle.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        if line.startswith((b"VmHWM:", b"VmRSS:")):
            values[line[:5]] = int(line.split()[1]) * 1024
    return (values[b"VmHWM"], values[b"VmRSS"]) if len(values) == 2 else None


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- job records ------------------------------------------------------------------------------------


def completions(job_dir: Path) -> list[dict[str, Any]]:
    """Every completion record (`state/done/*.json`): started_at/finished_at/pid/rows per shard."""
    return [orjson.loads(path.read_bytes()) for path in sorted((job_dir / "state" / "done").glob("*.json"))]


def shard_seconds(records: list[dict[str, Any]]) -> list[float]:
    """Each shard's attempt duration, in the order the attempts started."""
    return [r["finished_at"] - r["started_at"] for r in sorted(records, key=lambda r: r["started_at"])]


def effective_seconds(records: list[dict[str, Any]]) -> list[float]:
    """Each shard's processing time, in the order the attempts started.

    A worker may claim its next shard ahead while the current one still runs (its `started_at`
    is the claim time), but it processes one shard at a time: a shard's processing begins at
    its claim or at the end of the same worker's previous shard, whichever is later.
    """
    ordered = sorted(records, key=lambda r: r["started_at"])
    by_worker: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(ordered):
        by_worker.setdefault((r["host"], r["pid"]), []).append(i)
    effective = [0.0] * len(ordered)
    for indexes in by_worker.values():
        previous_end = float("-inf")
        for i in sorted(indexes, key=lambda i: ordered[i]["finished_at"]):
            effective[i] = ordered[i]["finished_at"] - max(ordered[i]["started_at"], previous_end)
            previous_end = ordered[i]["finished_at"]
    return effective


def span(records: list[dict[str, Any]]) -> float:
    """From the first attempt's start to the last completion: the processing makespan."""
    return max(r["finished_at"] for r in records) - min(r["started_at"] for r in records)


def median(values: list[float]) -> float:
    return statistics.median(values)


def _parts(path: Path) -> list[Path]:
    """A JSONL file, or the part files of a Ray output directory."""
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


def count_lines(path: Path) -> int:
    """Rows of a JSONL file, or of a Ray output directory of part files."""
    total = 0
    for part in _parts(path):
        with open(part, "rb") as handle:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda h=handle: h.read(1 << 20), b""))
    return total


def rows_by_id(path: Path) -> list[bytes]:
    """Every row of a JSONL output (file or Ray part files), sorted by `id`: outputs of
    different executors and shard counts compared row for row, byte for byte."""
    lines = [line for part in _parts(path) for line in part.read_bytes().splitlines()]
    return sorted(lines, key=lambda line: orjson.loads(line)["id"])


# -- the machine ------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram_gib = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = int(line.split()[1]) / 1024 / 1024
                break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO, capture_output=True, text=True).stdout)
    return {
        "cores": os.cpu_count(),
        "ram_gib": round(ram_gib, 1),
        "cpu_model": model or platform.processor() or "unknown",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "git_commit": commit + ("+dirty-src" if dirty else ""),
    }
