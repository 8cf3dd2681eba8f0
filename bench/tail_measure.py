"""The `tail` rows: backup attempts against a straggler that stays alive.

Three warm workers run one job of `tail_shards` equal shards of a recipe whose custom operator
sleeps per row (`bench_ops`), so the three nodes sharing this box's two cores do not slow each
other. Four runs, in this order: no straggler with backups on (the *ideal makespan*: what the job
takes when no node is slow), no straggler with backups off, then a straggler with backups off and
with backups on. The straggler: once every shard is claimed, the worker holding the last shard is
slowed `tail_slowdown` times by SIGSTOP/SIGCONT duty cycles on its process tree (its warm runtime
and Ray included: it keeps heartbeating, so its claim never goes stale), the process-tree
throttle the fault matrix uses (`tests/support/throttle.py`). Each run's time is its makespan:
from the first attempt's start to the last completion (`bench_lib.span`).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from bench_data import sleep_ops, write_recipe
from bench_lib import Bench, BenchError, Result, completions, progress, span
from bench_measures import JOB_SETTINGS, Sizes, _uniform_dataset, _worker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.throttle import DutyCycle  # noqa: E402

NAMES = ("tail_backups", "tail_no_backups", "tail_idle_cost")
BACKUPS_TARGET, IDLE_TARGET = "1.15", "1.02"
WORKERS = 3


def _backups(job: Path) -> list[dict[str, Any]]:
    records = [json.loads(path.read_bytes()) for path in job.glob("attempts/*/*/attempt.json")]
    return [r for r in records if r.get("backup_of")]


def _slow_the_last_holder(job: Path, shards: int, slowdown: float, pids: set[int], done: threading.Event) -> list[DutyCycle]:
    """Once every shard is claimed, slow the worker holding the last one; returns its duty cycle
    (in a list the caller stops), found from a thread so that the run is timed as usual."""
    cycles: list[DutyCycle] = []
    last = job / "state" / "locks" / f"part-{shards - 1:05d}-of-{shards:05d}.json"

    def watch() -> None:
        while not done.wait(0.05):
            if not last.exists() or len(list((job / "state" / "locks").glob("*.json"))) < shards:
                continue
            try:
                pid = json.loads(last.read_bytes())["pid"]
            except (OSError, ValueError):
                continue
            if pid in pids:
                cycle = DutyCycle(pid, slowdown)
                cycle.start()
                cycles.append(cycle)
                progress(f"tail: slowed worker pid {pid} {slowdown:g}x on its last shard")
            return

    threading.Thread(target=watch, daemon=True).start()
    return cycles


def measure_tail(b: Bench, s: Sizes) -> list[Result]:
    label = f"tail: {WORKERS} workers, {s.tail_shards} shards, one {s.tail_slowdown:g}x slower on its last shard"
    if not b.supports("prepare", "--backup-after"):
        why = "this checkout has no backup attempts (prepare --backup-after)"
        return [Result.skipped(name, label, why) for name in NAMES]
    d = b.work / "tail"
    d.mkdir(parents=True)
    rows = s.tail_shards * s.tail_rows_per_shard
    data = _uniform_dataset(d / "input.jsonl", rows)
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", sleep_ops(s.tail_ms_per_row), custom_ops=True)
    runs = {
        "ideal": (False, []),
        "idle_off": (False, ["--backup-after", "0"]),
        "straggler_off": (True, ["--backup-after", "0"]),
        "straggler_on": (True, []),
    }
    times: dict[str, float] = {}
    started: dict[str, int] = {}
    for name, (straggler, flags) in runs.items():
        job = d / f"job-{name}"
        argv = ["prepare", "--config", str(recipe), "--dataset-path", str(data), "--job-dir", str(job)]
        b.run(f"tail-prepare-{name}", b.elastic(*argv, "--num-shards", str(s.tail_shards), *flags, *JOB_SETTINGS))
        progress(f"tail {name}: {WORKERS} workers, {s.tail_shards} shards x {s.tail_rows_per_shard} rows")
        procs = [
            b.start(f"tail-{name}-worker{k}", _worker(b, job, b.our_runner, num_cpus=1, object_store_mb=512))
            for k in range(WORKERS)
        ]
        done = threading.Event()
        cycles = _slow_the_last_holder(job, s.tail_shards, s.tail_slowdown, {p.pid for p in procs}, done) if straggler else []
        try:
            b.wait(procs, f"tail {name}")
        finally:
            done.set()
            for cycle in cycles:
                cycle.stop()
        if straggler and not cycles:
            raise BenchError(f"tail {name}: the holder of the last shard was never slowed")
        times[name] = span(completions(job))
        started[name] = len(_backups(job))
    details = {
        "shards": s.tail_shards,
        "rows_per_shard": s.tail_rows_per_shard,
        "ms_per_row": s.tail_ms_per_row,
        "slowdown": s.tail_slowdown,
        "makespan_secs": times,
        "backups_started": started,
        "notes": [
            f"backups started: {started['straggler_on']} with a straggler, {started['ideal']} without one (expect 0)",
        ],
    }
    ideal = times["ideal"]
    return [
        Result.times(
            "tail_backups", f"{label}: backups on vs ideal", times["straggler_on"], ideal, BACKUPS_TARGET, details, of="ideal"
        ),
        Result.times("tail_no_backups", f"{label}: backups off vs ideal", times["straggler_off"], ideal, None, details),
        Result.times(
            "tail_idle_cost", "tail: no straggler, backups on vs off", times["ideal"], times["idle_off"], IDLE_TARGET, details
        ),
    ]
