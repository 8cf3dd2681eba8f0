"""The measurements. Each runs its own baseline side by side with ours in the same invocation and
returns `Result`s; absolute seconds on a shared 2-core box are noise, the ratios are the result.

Every job of ours uses a short lease and poll interval (`JOB_SETTINGS`) so that waiting for work
never shows up as cost, and the node-resource flags only where `elastic-shard` lists them.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import stat
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from bench_data import (
    CPU_OPS,
    CUSTOM_OPS,
    TRIVIAL_OPS,
    model_ops,
    sleep_ops,
    write_dataset,
    write_prose_dataset,
    write_recipe,
    write_tiny_dataset,
)
from bench_lib import (
    PYTHON,
    Bench,
    BenchError,
    Result,
    completions,
    count_lines,
    effective_seconds,
    median,
    progress,
    rows_by_id,
    shard_seconds,
    span,
)

JOB_SETTINGS = ["--lock-timeout-secs", "120", "--poll-interval-secs", "0.2"]
PASSTHROUGH = Path(__file__).resolve().parent / "passthrough_worker.py"
SLOWDOWN_ENV = "ELASTIC_BENCH_SLOWDOWN"  # read by bench_ops.BenchSleepMapper


@dataclass
class Sizes:
    """How big each measurement is; `--quick` and the default differ only here."""

    rows: int  # end-to-end input (and prepare/merge input unless io_rows is set)
    io_rows: int  # prepare and merge input (rows of prose, ~1.3 KB each)
    io_shards: int  # shards of the prepare/merge jobs
    overhead_shards: int
    overhead_rows_per_shard: int
    e2e_shards: int
    hetero_shards: int  # a multiple of 3: the static baseline gives each worker a third
    hetero_rows_per_shard: int
    hetero_ms_per_row: float
    hetero_slowdown: float
    claim_shards: int
    claim_workers: int
    many_shards: tuple[int, int]  # the smaller (baseline) and larger shard counts of many_shards
    repeats: int  # prepare and merge are short: median of this many interleaved runs
    warm_ops_shards: int
    warm_ops_rows_per_shard: int
    warm_ops_process_shards: int  # the process-runner side: a model load and a dj-process per shard
    shard_cost_rows: int
    shard_cost_shards: int  # ours: T(this many shards) vs T(1 shard), same rows
    shard_cost_baseline_shards: int  # the process runner's side, fewer (each shard is a dj-process)
    dedup_rows: int = 500_000  # the dedup rows' input (prose with planted duplicates); half of it for the second size
    dedup_shards: int = 16  # shards of the dedup jobs at dedup_rows (half as many at half the rows)
    tail_shards: int = 48  # the tail rows: 3 workers, one of them 10x slower on its last shard
    tail_rows_per_shard: int = 200  # short sleeps, so that a duty cycle slows them evenly
    tail_ms_per_row: float = 10.0
    tail_slowdown: float = 10.0
    analyze_rows: int = 500_000  # the analyze rows' input (prose); its first half for the finish's second size
    analyze_shards: int = 16  # shards of every analyze job of ours, at both sizes


def _prepare_argv(recipe: Path, dataset: Path, job: Path, shards: int) -> list[str]:
    argv = ["prepare", "--config", str(recipe), "--dataset-path", str(dataset), "--job-dir", str(job)]
    return [*argv, "--num-shards", str(shards), *JOB_SETTINGS]


def _prepare(b: Bench, name: str, recipe: Path, dataset: Path, job: Path, shards: int) -> float:
    return b.run(name, b.elastic(*_prepare_argv(recipe, dataset, job, shards)))


def _prepare_all(b: Bench, name: str, jobs: list[tuple[Path, Path, Path, int]]) -> None:
    """Set-up, not measured: prepare several jobs at once (each prepare is mostly imports)."""
    procs = [b.start(f"{name}-{k}", b.elastic(*_prepare_argv(*job))) for k, job in enumerate(jobs)]
    b.wait(procs, f"{name}")


def _worker(b: Bench, job: Path, runner: str, num_cpus: int | None = None, object_store_mb: int | None = None) -> list[str]:
    flags = b.resource_flags("worker", num_cpus, object_store_mb)
    return b.elastic("worker", "--job-dir", str(job), "--runner", runner, *JOB_SETTINGS, *flags)


def _local(b: Bench, recipe: Path, data: Path, job: Path, shards: int, output: Path, runner: str, workers: int = 1) -> list[str]:
    """`local --workers N` (default 1): prepare, the workers, verify and merge into `output`.
    Several workers split the machine's CPUs between their Ray runtimes (`local` does that)."""
    argv = b.elastic("local", "--workers", str(workers), "--config", str(recipe), "--dataset-path", str(data))
    argv += ["--job-dir", str(job)]
    argv += ["--num-shards", str(shards), "--output", str(output), "--runner", runner, *JOB_SETTINGS]
    return argv + b.resource_flags("local")


def _passthrough(job: Path) -> list[str]:
    return [PYTHON, str(PASSTHROUGH), str(job), *JOB_SETTINGS]


# -- per-shard overhead ----------------------------------------------------------------------------


def measure_overhead(b: Bench, s: Sizes) -> list[Result]:
    """The same small shards through one worker, once per runner: what a shard costs beyond its rows."""
    d = b.work / "overhead"
    data = write_dataset(d / "input.jsonl", s.overhead_shards * s.overhead_rows_per_shard)
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
    per_runner: dict[str, dict[str, float]] = {}
    _prepare_all(b, "overhead-prepare", [(recipe, data, d / f"job-{label}", s.overhead_shards) for label in ("baseline", "ours")])
    for label, runner in (("baseline", "process"), ("ours", b.our_runner)):
        job = d / f"job-{label}"
        progress(f"overhead: {s.overhead_shards} shards x {s.overhead_rows_per_shard} rows, one worker, runner={runner}")
        wall = b.run(f"overhead-worker-{label}", _worker(b, job, runner))
        records = completions(job)
        secs = effective_seconds(records)
        per_runner[label] = {
            "runner": runner,
            "median_secs_per_shard": median(secs),
            "median_claim_to_finish_secs": median(shard_seconds(records)),
            "mean_secs_per_shard_incl_startup": wall / len(secs),
            "min_secs": min(secs),
            "max_secs": max(secs),
            "first_shard_secs": secs[0],
            "worker_wall_secs": wall,
        }
    ours = per_runner["ours"]["median_secs_per_shard"]
    base = per_runner["baseline"]["median_secs_per_shard"]
    return [
        Result(
            name="overhead",
            label=f"per-shard overhead, {b.our_runner} vs process runner",
            ours_secs=ours,
            baseline_secs=base,
            ratio=ours / base,
            value=ours,
            unit="s/shard",
            target="<= 1 s/shard",
            met=ours <= 1.0,
            details={"shards": s.overhead_shards, "rows_per_shard": s.overhead_rows_per_shard, **per_runner},
        )
    ]


# -- one node, end to end --------------------------------------------------------------------------


def measure_e2e(b: Bench, s: Sizes, baselines: tuple[str, ...]) -> list[Result]:
    """`local` with one worker (prepare, work, verify, merge) vs plain `dj-process` on the whole input."""
    d = b.work / "e2e"
    data = write_dataset(d / "input.jsonl", s.rows)
    recipe = write_recipe(d / "ours.yaml", data, d / "unused.jsonl", CPU_OPS)
    executors = {"e2e_ray": "ray", "e2e_partitioned": "ray_partitioned"}
    walls: dict[str, float] = {}
    rows: dict[str, int] = {}
    for name in baselines:
        out = d / f"{name}-out.jsonl"
        dj_recipe = write_recipe(d / f"{name}.yaml", data, out, CPU_OPS, executor=executors[name])
        progress(f"{name}: dj-process --executor_type {executors[name]} over {s.rows} rows")
        walls[name] = b.run(f"{name}-dj-process", b.dj_process(dj_recipe), cwd=d)
        rows[name] = count_lines(out)
        if name == baselines[0]:
            # Ours runs between the baselines, so slow drift of the shared box hits both sides.
            job, merged = d / "job", d / "merged.jsonl"
            argv = _local(b, recipe, data, job, s.e2e_shards, merged, b.our_runner)
            progress(f"e2e ours: local --workers 1, {s.e2e_shards} shards, runner={b.our_runner}, {s.rows} rows")
            walls["ours"] = b.run("e2e-ours-local", argv, cwd=d)
            rows["ours"] = count_lines(merged)
            records = completions(job)
            b.shared["e2e"] = {"job": job, "input": data, "merged": merged}
            secs = effective_seconds(records)  # in the order the attempts started
            ours_detail = {
                "shards": s.e2e_shards,
                "rows_in": s.rows,
                "rows_out": rows["ours"],
                "input_bytes": data.stat().st_size,
                "output_bytes": merged.stat().st_size,
                "processing_span_secs": span(records),
                "sum_shard_secs": sum(secs),
                "median_shard_secs": median(secs),
                # The warm runtime starts inside the first attempt: its excess over a median shard.
                "node_startup_secs": max(0.0, secs[0] - median(secs)),
            }
    results = []
    for name in baselines:
        results.append(
            Result.times(
                name,
                f"1-node end-to-end vs dj-process {executors[name]}",
                walls["ours"],
                walls[name],
                "1.0",
                {"ours": ours_detail, "baseline_rows_out": rows[name], "same_row_count": rows[name] == rows["ours"]},
            )
        )
    return results


# -- heterogeneous nodes ---------------------------------------------------------------------------


def _split_thirds(data: Path, rows: int, d: Path) -> list[Path]:
    lines = data.read_bytes().splitlines(keepends=True)
    third = rows // 3
    return [_write(d / f"third-{k}.jsonl", b"".join(lines[k * third : (k + 1) * third])) for k in range(3)]


def _shard_rows(job: Path) -> list[int]:
    return [spec["rows"] for spec in orjson.loads((job / "manifest.json").read_bytes())["shards"]]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _uniform_dataset(path: Path, rows: int) -> Path:
    """Equal-length rows, so prepare's byte-balanced cut gives the static and the dynamic jobs
    exactly the same shards (equal row counts, contiguous)."""
    body = "node speed benchmark row " * 4
    return _write(path, b"".join(b'{"id":"%08d","text":"%s"}\n' % (i, body.encode()) for i in range(rows)))


IDEAL_FORMULA = (
    "ideal(run) = (R + sum_w v_w * a_w) / sum_w v_w over the workers with a_w < ideal: the makespan of the run if its "
    "R rows were perfectly divisible. v_w = rows/s of worker w's steady attempts in this run (all but its first; "
    "pooled over both runs if it has none), each attempt's time counted from max(its claim, the end of w's previous "
    "shard); a_w = when w could start steady work = (its first attempt's start - the run's first start) + (first "
    "attempt's duration - that attempt's rows / v_w), i.e. launch skew plus start-up. "
    "makespan = last finished_at - first started_at of the run's completion records."
)


def _divisible_makespan(rows: int, speeds: dict[int, float], ready: dict[int, float]) -> float:
    """Every worker busy from `ready` until a common end T; one ready only after T is left out."""
    active = set(ready)
    while True:
        ideal = (rows + sum(speeds[w] * ready[w] for w in active)) / sum(speeds[w] for w in active)
        late = {w for w in active if ready[w] >= ideal}
        if not late or late == active:
            return ideal
        active -= late


def _rate(attempts: list[dict]) -> float | None:
    secs = sum(r["secs"] for r in attempts)
    return sum(r["input_rows"] for r in attempts) / secs if attempts and secs > 0 else None


def _ideal_model(runs: dict[str, tuple[list[dict], dict[int, int]]]) -> dict:
    """Per-worker steady speed and start-up in each run, and the ideal makespans they imply."""
    by_role: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for kind, (records, roles) in runs.items():
        # Processing time, not claim-to-finish: a shard claimed ahead waits for the previous one.
        for r, secs in zip(sorted(records, key=lambda r: r["started_at"]), effective_seconds(records)):
            by_role[roles[r["pid"]]][kind].append({**r, "secs": secs})
    pooled = {
        role: _rate([r for recs in kinds.values() for r in recs[1:]]) or _rate([r for recs in kinds.values() for r in recs])
        for role, kinds in by_role.items()
    }
    model: dict = {}
    for kind, (records, _) in runs.items():
        run_start = min(r["started_at"] for r in records)
        speeds, ready = {}, {}
        for role, kinds in by_role.items():
            if not kinds.get(kind):
                continue
            first = kinds[kind][0]
            speeds[role] = _rate(kinds[kind][1:]) or pooled[role]
            ready[role] = first["started_at"] - run_start + max(0.0, first["secs"] - first["input_rows"] / speeds[role])
        rows = sum(r["input_rows"] for r in records)
        shards: dict[str, int] = defaultdict(int)
        for r in records:
            shards[f"worker{runs[kind][1][r['pid']]}"] += 1
        model[f"{kind}_ideal_secs"] = _divisible_makespan(rows, speeds, ready)
        model[f"{kind}_ideal_without_startup_secs"] = rows / sum(speeds.values())
        model[f"{kind}_steady_rows_per_sec"] = {f"worker{w}": speeds[w] for w in sorted(speeds)}
        model[f"{kind}_ready_after_secs"] = {f"worker{w}": ready[w] for w in sorted(ready)}
        model[f"{kind}_shards_per_worker"] = dict(sorted(shards.items()))
    return model


def measure_hetero(b: Bench, s: Sizes) -> list[Result]:
    """Three workers, the third `hetero_slowdown`× slower: dynamic claiming vs a static 1/3 split."""
    d = b.work / "hetero"
    d.mkdir(parents=True)
    rows = s.hetero_shards * s.hetero_rows_per_shard
    data = _uniform_dataset(d / "input.jsonl", rows)
    factors = [1.0, 1.0, s.hetero_slowdown]
    ops = sleep_ops(s.hetero_ms_per_row)
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", ops, custom_ops=True)
    dyn_job = d / "job-dynamic"
    thirds = _split_thirds(data, rows, d)
    static_jobs = [d / f"job-static-{k}" for k in range(3)]
    jobs = [(recipe, data, dyn_job, s.hetero_shards)]
    jobs += [(recipe, third, job, s.hetero_shards // 3) for third, job in zip(thirds, static_jobs)]
    _prepare_all(b, "hetero-prepare", jobs)

    def run(kind: str, jobs: list[Path]) -> tuple[float, dict[int, int]]:
        progress(f"hetero {kind}: 3 workers (slowdown {factors}), {s.hetero_shards} shards x {s.hetero_rows_per_shard} rows")
        t0 = time.monotonic()
        procs = []
        for k, job in enumerate(jobs):
            argv = _worker(b, job, b.our_runner, num_cpus=1, object_store_mb=512)
            procs.append(b.start(f"hetero-{kind}-worker{k}", argv, env={SLOWDOWN_ENV: str(factors[k])}))
        ended = b.wait(procs, f"hetero {kind}")
        return max(ended.values()) - t0, {proc.pid: k for k, proc in enumerate(procs)}

    dyn_wall, dyn_roles = run("dynamic", [dyn_job] * 3)
    static_wall, static_roles = run("static", static_jobs)
    dyn_records = completions(dyn_job)
    static_records = [r for job in static_jobs for r in completions(job)]

    model = _ideal_model({"dynamic": (dyn_records, dyn_roles), "static": (static_records, static_roles)})
    ideal, static_ideal = model["dynamic_ideal_secs"], model["static_ideal_secs"]
    dyn = span(dyn_records)
    static = span(static_records)
    same_shards = _shard_rows(dyn_job) == [n for job in static_jobs for n in _shard_rows(job)]
    details = {
        "same_shards": same_shards,
        "rows": rows,
        "shards": s.hetero_shards,
        "ms_per_row": s.hetero_ms_per_row,
        "slowdown_factors": factors,
        **model,
        "dynamic_makespan_secs": dyn,
        "static_makespan_secs": static,
        "dynamic_wall_secs": dyn_wall,
        "static_wall_secs": static_wall,
        "static_over_dynamic": static / dyn,
        "num_cpus_flag_used": b.supports("worker", "--ray-num-cpus"),
        "formula": IDEAL_FORMULA,
    }
    return [
        Result.times(
            "hetero_dynamic", "heterogeneous 3 nodes (1 slow), dynamic vs ideal", dyn, ideal, "1.10", details, of="ideal"
        ),
        Result.times(
            "hetero_static",
            "heterogeneous 3 nodes (1 slow), static 1/3 split vs ideal",
            static,
            static_ideal,
            None,
            {"static_over_dynamic": static / dyn},
        ),
    ]


# -- prepare and merge -----------------------------------------------------------------------------

PREPARE_BASELINES = Path(__file__).resolve().parent / "prepare_baselines.py"
# The line prepare logs when it is done. Newer checkouts end it with the prepare phase's own time
# and how many processes took part; older ones stop after "shard(s)".
PREPARED_LINE = re.compile(
    r"prepared (?P<job>\S+): (?P<rows>\d+) rows from (?P<files>\d+) file\(s\) in (?P<shards>\d+) shard\(s\)"
    r"(?: in (?P<secs>\d+(?:\.\d+)?)s by (?P<participants>\d+) participant\(s\))?"
)
MERGE_TARGET, MERGE_DIR_TARGET = "1.3", "0.05"


def prepared_lines(log: str) -> list[dict[str, Any]]:
    """Every complete 'prepared ...' line of a log: {job, rows, files, shards, secs, participants}
    (the last two None where this checkout does not log them)."""
    found = []
    for line in log.splitlines(keepends=True):
        if line.endswith("\n") and (m := PREPARED_LINE.search(line)):
            found.append(
                {
                    "job": m["job"],
                    "rows": int(m["rows"]),
                    "files": int(m["files"]),
                    "shards": int(m["shards"]),
                    "secs": float(m["secs"]) if m["secs"] else None,
                    "participants": int(m["participants"]) if m["participants"] else None,
                }
            )
    return found


def _logged_phase(b: Bench, name: str) -> dict[str, Any] | None:
    """The prepare phase as the prepare of run `name` logged it (None without a timed line)."""
    lines = [line for line in prepared_lines((b.logs / f"{name}.log").read_text(errors="replace")) if line["secs"] is not None]
    return max(lines, key=lambda line: line["secs"]) if lines else None


def _timed_to_file(argv: list[str], out: Path) -> float:
    t0 = time.monotonic()
    with open(out, "wb") as handle:
        subprocess.run(argv, stdout=handle, check=True)
    return time.monotonic() - t0


def _baseline(mode: str, *args: str | Path) -> list[str]:
    return [PYTHON, str(PREPARE_BASELINES), mode, *map(str, args)]


def _mb_per_sec(size: int, secs: float) -> float:
    return size / 1e6 / max(secs, 1e-9)


def measure_io(b: Bench, s: Sizes, wanted: tuple[str, ...]) -> list[Result]:
    """Everything about prepare and merge, on one input of real prose (~1.3 KB rows): prepare vs
    the one-process floor and vs the original tool's algorithm, the no-op prepare, prepare with
    1 vs 2 processes and participants, merge (to a file and to a directory) vs cat. Every side
    runs `repeats` times, interleaved with its baselines; the medians are compared."""
    d = b.work / "io"
    data, source = write_prose_dataset(d / "input.jsonl", s.io_rows)
    size = data.stat().st_size
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
    common = {"input_bytes": size, "rows": s.io_rows, "bytes_per_row": size / s.io_rows, "shards": s.io_shards, "prose": source}
    merging = "merge" in wanted or "merge_dir" in wanted
    results: list[Result] = []
    # job-0 serves the no-op prepare and the merge through the CLI (merge_measure makes its own).
    if {"prepare", "prepare_original", "prepare_noop"} & set(wanted) or (merging and _merge_module() is None):
        results += _measure_prepare(b, s, recipe, data, d, common, wanted)
    if "prepare_noop" in wanted:
        results.append(_measure_noop_prepare(b, s, recipe, data, d))
    if "prepare_procs" in wanted:
        results.append(_measure_prepare_procs(b, s, recipe, data, d, common))
    if "prepare_coop" in wanted:
        results.append(_measure_prepare_coop(b, s, data, d, common))
    if merging:
        results += _measure_merge(b, s, d, wanted)
    return results


def _measure_prepare(
    b: Bench, s: Sizes, recipe: Path, data: Path, d: Path, common: dict[str, Any], wanted: tuple[str, ...]
) -> list[Result]:
    """`prepare --num-shards io_shards` (wall time of the command) interleaved with the floor and
    the original algorithm (bench/prepare_baselines.py), `repeats` times where either is wanted
    (else once, to leave job-0 behind); then a prepare of a one-row input (the fixed cost)."""
    size = common["input_bytes"]
    sides = [side for side, name in (("floor", "prepare"), ("original", "prepare_original")) if name in wanted]
    runs = s.repeats if sides else 1
    progress(
        f"prepare --num-shards {s.io_shards}{' vs ' + ' and '.join(sides) if sides else ''}: {s.io_rows} rows of prose, "
        f"{size / 1e6:.0f} MB, {runs} run(s) each"
    )
    prep: list[float] = []
    base: dict[str, list[float]] = {side: [] for side in sides}
    logged: list[dict[str, Any] | None] = []
    for i in range(runs):
        if "floor" in base:
            base["floor"].append(_timed_to_file(_baseline("floor", data), d / "floor.json"))
        if "original" in base:
            shutil.rmtree(d / "original", ignore_errors=True)
            base["original"].append(_timed_to_file(_baseline("original", data, d / "original", s.io_shards), d / "original.json"))
            shutil.rmtree(d / "original")
        prep.append(_prepare(b, f"io-prepare-{i}", recipe, data, d / f"job-{i}", s.io_shards))
        logged.append(_logged_phase(b, f"io-prepare-{i}"))
        if i:
            shutil.rmtree(d / f"job-{i}")  # job-0 is kept for the no-op prepare and the merge
    tiny = write_dataset(d / "one-row.jsonl", 1)
    startup = _prepare(b, "io-prepare-one-row", recipe, tiny, d / "job-one-row", 1)
    ours = median(prep)
    prepare_details = {
        **common,
        "runs_ours": prep,
        "ours_mb_per_sec": _mb_per_sec(size, ours),
        "prepare_one_row_secs": startup,
        "ours_mb_per_sec_less_one_row": _mb_per_sec(size, ours - startup),
        "logged_phase_secs": [line and line["secs"] for line in logged],
        "logged_participants": [line and line["participants"] for line in logged],
        "cooperative_prepare": any(logged),  # its log line has "in X.XXs by P participant(s)"
    }
    results = []
    if "floor" in base:
        floor = median(base["floor"])
        floor_out = orjson.loads((d / "floor.json").read_bytes())
        details = {**prepare_details, "runs_baseline": base["floor"], "baseline_mb_per_sec": _mb_per_sec(size, floor)}
        details["baseline_read_every_row"] = floor_out["rows"] == s.io_rows
        label = f"prepare ({s.io_shards} shards) vs one-process floor"
        results.append(Result.times("prepare", label, ours, floor, "1.0", details))
    if "original" in base:
        orig = median(base["original"])
        orig_out = orjson.loads((d / "original.json").read_bytes())
        details = {**prepare_details, "runs_baseline": base["original"], "baseline_mb_per_sec": _mb_per_sec(size, orig)}
        details["baseline_rows"] = orig_out["rows"]
        label = "original tool's prepare vs ours (original / ours)"
        results.append(Result.speedup("prepare_original", label, ours, orig, "4", details))
    return results


# One process doing only what an identical-request check cannot avoid: read and hash every input byte.
HASH_FLOOR = "import hashlib, sys; print(hashlib.file_digest(open(sys.argv[1], 'rb'), 'sha256').hexdigest())"


def _measure_noop_prepare(b: Bench, s: Sizes, recipe: Path, data: Path, d: Path) -> Result:
    """The identical request again on job-0 (a no-op that hashes the whole input again) vs one
    process that only reads and hashes it. Judged on the part that grows with the input: each
    side less its own time on the one-row input (our start-up: imports, recipe, manifest)."""
    size = data.stat().st_size
    tiny = d / "one-row.jsonl"
    noop, floor = [], []
    progress(f"no-op prepare vs reading and hashing the input in one process: {size / 1e6:.0f} MB, {s.repeats} runs each")
    for i in range(s.repeats):
        floor.append(_timed_to_file([PYTHON, "-c", HASH_FLOOR, str(data)], d / "floor-sha256.txt"))
        noop.append(_prepare(b, f"io-prepare-noop-{i}", recipe, data, d / "job-0", s.io_shards))
    fixed_ours = _prepare(b, "io-prepare-noop-one-row", recipe, tiny, d / "job-one-row", 1)
    fixed_floor = _timed_to_file([PYTHON, "-c", HASH_FLOOR, str(tiny)], d / "floor-sha256.txt")
    ours, base = median(noop), median(floor)
    per_byte = max(ours - fixed_ours, 1e-9) / max(base - fixed_floor, 1e-9)
    return Result(
        name="prepare_noop",
        label="identical prepare again (re-hash) vs hashing the input",
        ours_secs=ours,
        baseline_secs=base,
        ratio=ours / base,
        value=per_byte,
        unit="x",
        target="<= 1.10x per byte",
        met=per_byte <= 1.10,
        details={
            "input_bytes": size,
            "runs_ours": noop,
            "runs_baseline": floor,
            "ours_one_row_secs": fixed_ours,
            "baseline_one_row_secs": fixed_floor,
            "rehash_mb_per_sec": size / 1e6 / max(ours - fixed_ours, 1e-9),
            "baseline_mb_per_sec": size / 1e6 / max(base - fixed_floor, 1e-9),
        },
    )


def _measure_prepare_procs(b: Bench, s: Sizes, recipe: Path, data: Path, d: Path, common: dict[str, Any]) -> Result:
    """`prepare --prepare-procs 1` vs `2` (wall times of the whole command), where it has the flag."""
    label = "prepare --prepare-procs 2 vs 1 (t1 / t2)"
    if not b.supports("prepare", "--prepare-procs"):
        return Result.skipped("prepare_procs", label, "this checkout's `elastic-shard prepare --help` lists no --prepare-procs")
    walls: dict[int, list[float]] = {1: [], 2: []}
    logged: dict[int, list[Any]] = {1: [], 2: []}
    progress(f"prepare --prepare-procs 1 vs 2: {size_mb(data)} MB, {s.repeats} run(s) each")
    for i in range(s.repeats):
        for procs in (1, 2):
            job, name = d / f"procs-{procs}-{i}", f"io-prepare-procs{procs}-{i}"
            argv = b.elastic(*_prepare_argv(recipe, data, job, s.io_shards), "--prepare-procs", str(procs))
            walls[procs].append(b.run(name, argv))
            line = _logged_phase(b, name)
            logged[procs].append(line and line["secs"])
            shutil.rmtree(job)
    t1, t2 = median(walls[1]), median(walls[2])
    details = {**common, "runs_1_proc": walls[1], "runs_2_procs": walls[2]}
    details |= {"logged_phase_secs_1_proc": logged[1], "logged_phase_secs_2_procs": logged[2]}
    return Result.speedup("prepare_procs", label, t2, t1, None, details)


def size_mb(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.0f}"


def _local_until_prepared(b: Bench, name: str, recipe: Path, data: Path, job: Path, shards: int, workers: int) -> dict:
    """`local --workers N`, stopped as soon as its prepare is done: the prepare phase as logged
    (`in X.XXs by P participant(s)`), else the time from starting `local` until its 'prepared'
    line appeared (this checkout logs no phase time)."""
    argv = b.elastic("local", "--workers", str(workers), "--config", str(recipe), "--dataset-path", str(data))
    argv += ["--job-dir", str(job), "--num-shards", str(shards), "--output", str(job.parent / "merged.jsonl")]
    argv += ["--runner", b.our_runner, *JOB_SETTINGS, *b.resource_flags("local")]
    until_line, log, code = b.run_until(name, argv, PREPARED_LINE, cwd=job.parent)
    lines = [line for line in prepared_lines(log) if line["secs"] is not None]
    phase = max(lines, key=lambda line: line["secs"]) if lines else None
    return {
        "secs": phase["secs"] if phase else until_line,
        "source": "logged" if phase else "wall_until_line",
        "participants": phase["participants"] if phase else None,
        "secs_until_line": until_line,
        "ended_by_itself": code is not None,
    }


def _measure_prepare_coop(b: Bench, s: Sizes, data: Path, d: Path, common: dict[str, Any]) -> Result:
    """The prepare phase of `local --workers 1` vs `--workers 2` (a trivial recipe; each run is
    stopped once prepared), interleaved, medians: t1 / t2."""
    recipe = write_recipe(d / "trivial.yaml", data, d / "unused.jsonl", TRIVIAL_OPS)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    progress(f"prepare phase of local --workers 1 vs 2: {size_mb(data)} MB, {s.io_shards} shards, {s.repeats} run(s) each")
    for i in range(s.repeats):
        for workers in (1, 2):
            parent = d / f"coop-{workers}-{i}"
            parent.mkdir()
            runs[workers].append(
                _local_until_prepared(b, f"io-coop-w{workers}-{i}", recipe, data, parent / "job", s.io_shards, workers)
            )
            shutil.rmtree(parent)
    t1, t2 = median([r["secs"] for r in runs[1]]), median([r["secs"] for r in runs[2]])
    sources = {r["source"] for rs in runs.values() for r in rs}
    details = {
        **common,
        "phase_secs_from": "the 'prepared ... in X.XXs by P participant(s)' log line"
        if sources == {"logged"}
        else "wall time from starting `local` until its 'prepared' line (no phase time logged)"
        if sources == {"wall_until_line"}
        else "mixed: " + ", ".join(sorted(sources)),
        "cooperative_prepare": sources == {"logged"},
        "participants_1_worker": runs[1][-1]["participants"],
        "participants_2_workers": runs[2][-1]["participants"],
        "runs_1_worker": runs[1],
        "runs_2_workers": runs[2],
    }
    label = "prepare phase, local --workers 2 vs 1 (t1 / t2)"
    return Result.speedup("prepare_coop", label, t2, t1, "1.7", details)


def _merge_module() -> Callable[..., dict[str, Any]] | None:
    """bench/merge_measure.py's `measure_merge(workdir, total_mb)`, where this checkout has it."""
    try:
        from merge_measure import measure_merge  # type: ignore[import-not-found]
    except ImportError:
        return None
    return measure_merge


def _dir_parts(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file() and not p.name.startswith("."))


def _measure_merge(b: Bench, s: Sizes, d: Path, wanted: tuple[str, ...]) -> list[Result]:
    """merge to one file and to a directory vs `cat` of the shard outputs: through
    bench/merge_measure.py where it exists, else here through the CLI on the completed job-0."""
    measure = _merge_module()
    if measure is not None:
        total_mb = (d / "input.jsonl").stat().st_size / 1e6
        progress(f"merge vs cat: bench/merge_measure.measure_merge({total_mb:.0f} MB)")
        kwargs = {"repeats": s.repeats} if "repeats" in inspect.signature(measure).parameters else {}
        m = measure(d / "merge-measure", total_mb, **kwargs)
        out_bytes, cat, merge, merge_dir = m["bytes"], m["cat_secs"], m["merge_secs"], m.get("dir_secs")
        details = {"source": "bench/merge_measure.measure_merge", "measure_merge": m, "output_bytes": out_bytes}
        dir_skipped = None if merge_dir else "measure_merge returned no dir_secs"
    else:
        out_bytes, cat, merge, merge_dir, details, dir_skipped = _merge_via_cli(b, s, d, wanted)
    results = []
    rates = {"ours_mb_per_sec": _mb_per_sec(out_bytes, merge), "baseline_mb_per_sec": _mb_per_sec(out_bytes, cat)}
    if "merge" in wanted:
        label = "merge to a file vs cat of the shard outputs"
        results.append(Result.times("merge", label, merge, cat, MERGE_TARGET, {**details, **rates}))
    if "merge_dir" in wanted:
        label = "merge to a directory vs cat of the shard outputs"
        if dir_skipped:
            results.append(Result.skipped("merge_dir", label, dir_skipped, details))
        else:
            dir_rates = {
                "ours_mb_per_sec": _mb_per_sec(out_bytes, merge_dir),
                "baseline_mb_per_sec": rates["baseline_mb_per_sec"],
            }
            results.append(Result.times("merge_dir", label, merge_dir, cat, MERGE_DIR_TARGET, {**details, **dir_rates}))
    return results


# A shard output's name by how its completion record says it is stored (elastic_sharding.layout.
# PROCESSED_NAMES); a record written before outputs could be stored compressed names no codec.
PROCESSED_NAMES = {"none": "processed.jsonl", "zstd": "processed.jsonl.zst"}
# The floor of getting the JSONL lines out of outputs stored compressed: one process writing each
# output's lines to stdout in order, decompressing the `.zst` ones (as `zstd -dcf` would).
DECOMPRESS_FLOOR = (
    "import shutil, sys, zstandard\n"
    "for path in sys.argv[1:]:\n"
    "    with open(path, 'rb') as f:\n"
    "        if path.endswith('.zst'):\n"
    "            zstandard.ZstdDecompressor().copy_stream(f, sys.stdout.buffer, read_size=1 << 20, write_size=1 << 20)\n"
    "        else:\n"
    "            shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)\n"
)


def _merge_via_cli(b: Bench, s: Sizes, d: Path, wanted: tuple[str, ...]) -> tuple:
    job = d / "job-0"
    progress("merge: completing the job with 2 passthrough workers (not timed)")
    b.wait([b.start(f"io-passthrough-{k}", _passthrough(job)) for k in range(2)], "passthrough workers")
    records = completions(job)
    codecs = [r.get("output_codec", "none") for r in records]
    outputs = [str(job / "attempts" / r["shard_id"] / r["attempt_id"] / PROCESSED_NAMES[c]) for r, c in zip(records, codecs)]
    # `cat` of plain outputs; outputs stored compressed are decompressed into the file instead.
    baseline = ["cat", *outputs] if set(codecs) == {"none"} else [PYTHON, "-c", DECOMPRESS_FLOOR, *outputs]
    out_bytes = sum(r["output_bytes"] for r in records)
    merges, dirs, cats = [], [], []
    dir_skipped: str | None = None if "merge_dir" in wanted else "not wanted"
    merged, merged_dir = d / "merged.jsonl", d / "merged-dir"
    progress(f"merge vs cat: {len(outputs)} shard outputs, {out_bytes / 1e6:.0f} MB, {s.repeats} runs each")
    for i in range(s.repeats):
        cats.append(_timed_to_file(baseline, d / "cat.jsonl"))
        if "merge" in wanted or i == 0:
            merged.unlink(missing_ok=True)
            merges.append(b.run(f"io-merge-{i}", b.elastic("merge", "--job-dir", str(job), "--output", str(merged))))
        if dir_skipped is None:
            shutil.rmtree(merged_dir, ignore_errors=True)
            name = f"io-merge-dir-{i}"
            try:
                secs = b.run(name, b.elastic("merge", "--job-dir", str(job), "--output", f"{merged_dir}/"))
            except BenchError:
                # An older merge that takes only a file; the row says so, with the log, not an error.
                dir_skipped = f"`merge --output DIR/` failed: no directory output in this checkout? see {b.logs / name}.log"
                continue
            if merged_dir.is_dir():
                dirs.append(secs)
            else:
                merged_dir.unlink(missing_ok=True)
                dir_skipped = "this checkout's merge writes no directory output (`merge --output DIR/` wrote one file)"
    cat_bytes = (d / "cat.jsonl").read_bytes()
    details: dict[str, Any] = {
        "source": "elastic-shard merge (CLI)",
        "output_bytes": out_bytes,
        "output_codecs": sorted(set(codecs)),
        "baseline": "cat" if baseline[0] == "cat" else "decompress (one process)",
        "shards": len(outputs),
        "runs_ours": merges,
        "runs_ours_dir": dirs,
        "runs_baseline": cats,
        "identical_output": merged.read_bytes() == cat_bytes,
    }
    if dirs:
        parts = _dir_parts(merged_dir)
        details["dir_files"] = len(parts)
        details["dir_same_bytes_as_cat"] = b"".join(p.read_bytes() for p in parts if p.suffix == ".jsonl") == cat_bytes
    merge_dir = median(dirs) if dirs else None
    return out_bytes, median(cats), median(merges), merge_dir, details, dir_skipped


# -- job directory size ----------------------------------------------------------------------------

JOB_DIR_TARGET = 2.2


def _own_job_dir_bytes(job: Path) -> int:
    """Apparent size of every regular file under `job`, each hard-linked inode once, links not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, files in os.walk(job):
        for name in files:
            st = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def measure_job_dir(b: Bench, s: Sizes) -> list[Result]:
    """Job-directory bytes per input byte after a whole `local` run of the CPU recipe (the
    end-to-end run's job when it ran in this invocation; the merged file is written outside the
    job directory)."""
    e2e = b.shared.get("e2e")
    if e2e is None:
        d = b.work / "jobdir"
        data = write_dataset(d / "input.jsonl", s.rows)
        recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
        job, merged = d / "job", d / "merged.jsonl"
        progress(f"job_dir_bytes: local --workers 1, {s.e2e_shards} shards, {s.rows} rows")
        b.run("jobdir-local", _local(b, recipe, data, job, s.e2e_shards, merged, b.our_runner), cwd=d)
        e2e = {"job": job, "input": data, "merged": merged, "run": "its own local --workers 1 run"}
    job, data = e2e["job"], e2e["input"]
    try:
        import jobdir_measure  # type: ignore[import-not-found]

        total, source = jobdir_measure.job_dir_bytes(job), "bench/jobdir_measure.job_dir_bytes"
        breakdown = jobdir_measure.job_dir_breakdown(job) if hasattr(jobdir_measure, "job_dir_breakdown") else None
    except ImportError:
        total, source, breakdown = _own_job_dir_bytes(job), "bench_measures._own_job_dir_bytes", None
    size = data.stat().st_size
    value = total / size
    return [
        Result(
            name="job_dir_bytes",
            label="job directory bytes per input byte after local",
            ours_secs=None,
            baseline_secs=None,
            ratio=None,
            value=value,
            unit="B/B",
            target=f"<= {JOB_DIR_TARGET} B/B",
            met=value <= JOB_DIR_TARGET,
            details={
                "job_dir_bytes": total,
                "input_bytes": size,
                "counted_by": source,
                "breakdown": breakdown,
                "run": e2e.get("run", "the e2e_ray run of this invocation (local --workers 1)"),
                "merged_output": f"outside the job directory ({e2e['merged']})",
                "shards": s.e2e_shards,
                "per_input_byte": {k: v / size for k, v in breakdown.items()} if breakdown else None,
            },
        )
    ]


# -- claim throughput ------------------------------------------------------------------------------


def measure_claims(b: Bench, s: Sizes) -> list[Result]:
    """Coordination alone: many tiny shards, `claim_workers` passthrough workers racing for them."""
    d = b.work / "claims"
    data = write_tiny_dataset(d / "input.jsonl", s.claim_shards * 2)
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
    job = d / "job"
    prepare_secs = _prepare(b, "claims-prepare", recipe, data, job, s.claim_shards)
    progress(f"claims: {s.claim_workers} passthrough workers, {s.claim_shards} shards")
    t0 = time.monotonic()
    ended = b.wait([b.start(f"claims-worker{k}", _passthrough(job)) for k in range(s.claim_workers)], "claim workers")
    wall = max(ended.values()) - t0
    records = completions(job)
    if len(records) != s.claim_shards:
        raise RuntimeError(f"claims: {len(records)} completions for {s.claim_shards} shards")
    phase = span(records)
    per_worker: dict[int, int] = defaultdict(int)
    for r in records:
        per_worker[r["pid"]] += 1
    rate = s.claim_shards / phase
    return [
        Result(
            name="claims",
            label=f"claim throughput, {s.claim_workers} workers, passthrough",
            ours_secs=phase,
            baseline_secs=None,
            ratio=None,
            value=rate,
            unit="claims/s",
            target=">= 100 claims/s",
            met=rate >= 100,
            details={
                "shards": s.claim_shards,
                "workers": s.claim_workers,
                "claim_phase_secs": phase,
                "wall_secs_incl_worker_startup": wall,
                "claims_per_sec_incl_startup": s.claim_shards / wall,
                "median_shard_secs": median(shard_seconds(records)),
                "shards_per_worker": sorted(per_worker.values()),
                "shards_per_worker_stdev": statistics.pstdev(per_worker.values()),
                "prepare_secs": prepare_secs,
            },
        )
    ]


# -- many shards -----------------------------------------------------------------------------------

MANY_SHARDS_PREPARE_MS, MANY_SHARDS_PREPARE_GROWTH = 3.0, 1.3
MANY_SHARDS_CLAIMS, MANY_SHARDS_CLAIMS_DROP, MANY_SHARDS_WORKERS = 100.0, 1.5, 2


def measure_many_shards(b: Bench, s: Sizes) -> list[Result]:
    """Bookkeeping at many shards: tiny rows (2 per shard), so that prepare and the claim loop
    measure nothing but their per-shard cost. Each figure at the larger count is set against the
    same figure at the smaller one, measured in this run: what grows with the shard count shows
    as a ratio above 1."""
    figures = {}
    for shards in s.many_shards:
        d = b.work / f"many-{shards}"
        data = write_tiny_dataset(d / "input.jsonl", shards * 2)
        recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
        job = d / "job"
        prepare_secs = _prepare(b, f"many-{shards}-prepare", recipe, data, job, shards)
        progress(f"many_shards: {MANY_SHARDS_WORKERS} passthrough workers, {shards} shards")
        workers = [b.start(f"many-{shards}-worker{k}", _passthrough(job)) for k in range(MANY_SHARDS_WORKERS)]
        b.wait(workers, "many_shards workers")
        records = completions(job)
        if len(records) != shards:
            raise RuntimeError(f"many_shards: {len(records)} completions for {shards} shards")
        figures[shards] = (prepare_secs, span(records))
    small, large = s.many_shards
    (prep_small, claims_small), (prep_large, claims_large) = figures[small], figures[large]
    ms_small, ms_large = 1000 * prep_small / small, 1000 * prep_large / large
    rate_small, rate_large = small / claims_small, large / claims_large
    growth, drop = ms_large / ms_small, rate_small / rate_large
    details = {"shards": list(s.many_shards), "workers": MANY_SHARDS_WORKERS, "prepare_secs": [prep_small, prep_large]}
    return [
        Result(
            name="many_shards_prepare",
            label=f"prepare per shard, tiny rows: {large:,} shards vs {small:,}",
            ours_secs=prep_large,
            baseline_secs=prep_small,
            ratio=growth,
            value=ms_large,
            unit="ms/shard",
            target=f"<= {MANY_SHARDS_PREPARE_MS:g} ms/shard, <= {MANY_SHARDS_PREPARE_GROWTH}x",
            met=ms_large <= MANY_SHARDS_PREPARE_MS and growth <= MANY_SHARDS_PREPARE_GROWTH,
            details={**details, "ms_per_shard": [ms_small, ms_large]},
        ),
        Result(
            name="many_shards_claims",
            label=f"claims/s, {MANY_SHARDS_WORKERS} passthrough workers: {large:,} shards vs {small:,} (ratio: the drop)",
            ours_secs=claims_large,
            baseline_secs=claims_small,
            ratio=drop,
            value=rate_large,
            unit="claims/s",
            target=f">= {MANY_SHARDS_CLAIMS:g} claims/s, <= {MANY_SHARDS_CLAIMS_DROP}x",
            met=rate_large >= MANY_SHARDS_CLAIMS and drop <= MANY_SHARDS_CLAIMS_DROP,
            details={**details, "claims_per_sec": [rate_small, rate_large], "claim_phase_secs": [claims_small, claims_large]},
        ),
    ]


# -- warm operators --------------------------------------------------------------------------------

MODEL_OP = "bench_model_mapper"
MODEL_LOAD_SECS = 4.0
MODEL_MS_PER_ROW = 25.0
WARM_BUSY_TARGET = 0.90


def _loads(log: Path) -> int:
    """Model loads of one side: the stand-in op appends a line per process that loaded it."""
    return len(log.read_text().split()) if log.exists() else 0


def _warm_figures(b: Bench, job: Path) -> dict[str, Any]:
    """The model op's figures from `status --json` (empty when it ran no warm instances)."""
    proc = subprocess.run(b.elastic("status", "--job-dir", str(job), "--json"), capture_output=True, check=True, timeout=300)
    ops = [op for node in orjson.loads(proc.stdout)["nodes"] for op in node.get("warm_operators", []) if op["op"] == MODEL_OP]
    return ops[0] if ops else {}


def measure_warm_ops(b: Bench, s: Sizes) -> list[Result]:
    """A model-loading actor-mode op: our `local` job, whose warm runner keeps the instance (and
    its model) for every shard, vs one plain `dj-process` that loads it once. The process runner
    (a load per shard) and `ray_partitioned` are run for reference. Sides run in a fixed order
    (dj ray, ours actor, ours task, process runner, dj ray_partitioned) so box drift hits all."""
    d = b.work / "warm_ops"
    d.mkdir(parents=True)
    data = _uniform_dataset(d / "input.jsonl", s.warm_ops_shards * s.warm_ops_rows_per_shard)
    sides: dict[str, dict[str, Any]] = {}
    outputs: dict[str, Path] = {}

    def recipe(side: str, mode: str, executor: str = "ray") -> Path:
        ops = model_ops(d / f"{side}-loads.log", mode, MODEL_LOAD_SECS, MODEL_MS_PER_ROW)
        return write_recipe(d / f"{side}.yaml", data, d / f"{side}-out.jsonl", ops, executor=executor, custom_ops=True)

    def dj(side: str, executor: str, env: dict[str, str] | None = None) -> None:
        progress(f"warm_ops {side}: dj-process --executor_type {executor}, actor mode, {data.name}")
        wall = b.run(f"warm-ops-{side}", b.dj_process(recipe(side, "actor", executor)), env=env, cwd=d)
        sides[side] = {"executor": executor, "mode": "actor", "wall_secs": wall, "loads": _loads(d / f"{side}-loads.log")}
        outputs[side] = d / f"{side}-out.jsonl"

    def reference(side: str, run: Callable[[], None]) -> None:
        """A side no result is judged on: a failure is recorded in its details, not fatal."""
        try:
            run()
        except BenchError as exc:
            progress(f"warm_ops {side} failed (recorded, not fatal): {str(exc).splitlines()[0]}")
            sides[side] = {"error": str(exc)}

    def ours(side: str, mode: str, runner: str, shards: int) -> None:
        job, merged = d / f"job-{side}", d / f"{side}-merged.jsonl"
        progress(f"warm_ops {side}: local --workers 1, {shards} shards, runner={runner}, {mode} mode")
        wall = b.run(f"warm-ops-{side}", _local(b, recipe(side, mode), data, job, shards, merged, runner), cwd=d)
        figures = _warm_figures(b, job)
        sides[side] = {
            "runner": runner,
            "mode": mode,
            "shards": shards,
            "wall_secs": wall,
            "loads": _loads(d / f"{side}-loads.log"),
            "median_shard_secs": median(effective_seconds(completions(job))),
            "instances": figures.get("instances"),
            "status_loads": figures.get("loads"),
            "deaths": figures.get("deaths"),
            "all_busy_fraction": figures.get("all_busy_fraction"),
            "busy_fraction": figures.get("busy_fraction"),
        }
        outputs[side] = merged

    dj("dj_ray", "ray")
    ours("ours_actor", "actor", b.our_runner, s.warm_ops_shards)
    ours("ours_task", "task", b.our_runner, s.warm_ops_shards)
    reference("process_runner", lambda: ours("process_runner", "actor", "process", s.warm_ops_process_shards))
    # ray_partitioned does not ship custom_operator_paths to its Ray workers: they import the op from PYTHONPATH.
    importable = os.pathsep.join(p for p in (str(CUSTOM_OPS.parent), os.environ.get("PYTHONPATH")) if p)
    reference("dj_ray_partitioned", lambda: dj("dj_ray_partitioned", "ray_partitioned", {"PYTHONPATH": importable}))

    base = sides["dj_ray"]["wall_secs"]
    expected = rows_by_id(outputs["dj_ray"])
    for figures in sides.values():
        if "error" in figures:
            continue
        figures["ratio_to_dj_ray"] = figures["wall_secs"] / base
        if "shards" in figures:
            figures["per_shard_overhead_secs"] = (figures["wall_secs"] - base) / figures["shards"]
    same_output = {side: rows_by_id(out) == expected for side, out in outputs.items() if side != "dj_ray"}
    actor = sides["ours_actor"]
    checks = {
        "ratio <= 1.2x": actor["ratio_to_dj_ray"] <= 1.2,
        "loads == instances == 1": actor["loads"] == actor["instances"] == 1,
        f"all_busy_fraction >= {WARM_BUSY_TARGET}": (actor["all_busy_fraction"] or 0.0) >= WARM_BUSY_TARGET,
    }
    common = {
        "rows": len(expected),
        "shards": s.warm_ops_shards,
        "rows_per_shard": s.warm_ops_rows_per_shard,
        "load_secs": MODEL_LOAD_SECS,
        "ms_per_row": MODEL_MS_PER_ROW,
        "same_output_as_dj_ray": same_output,
    }
    actor_result = Result.times(
        "warm_ops_actor",
        "warm model op (actor mode), 1-node local vs dj-process ray",
        actor["wall_secs"],
        base,
        "1.2",
        {**common, "checks": checks, "missed": [name for name, ok in checks.items() if not ok], **sides},
    )
    actor_result.target = f"<= 1.2x, 1 load, all-busy >= {WARM_BUSY_TARGET:.2f}"
    actor_result.met = all(checks.values())
    task = sides["ours_task"]
    task_result = Result.times(
        "warm_ops_task",
        "warm model op (task mode), 1-node local vs dj-process ray",
        task["wall_secs"],
        base,
        "1.2",
        {**common, "ours_task": task, "dj_ray": sides["dj_ray"]},
    )
    return [actor_result, task_result]


# -- the fixed cost of a shard ---------------------------------------------------------------------


def measure_shard_cost(b: Bench, s: Sizes) -> list[Result]:
    """What one more shard costs, black-box: the same rows through one worker as 1 and as N
    shards, (T(N) - T(1)) / (N - 1), so start-up and the rows' own work cancel out. The process
    runner's side uses fewer shards: each one is a whole dj-process."""
    d = b.work / "shard_cost"
    data = write_dataset(d / "input.jsonl", s.shard_cost_rows)
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
    runs = [("ours", b.our_runner, 1), ("ours", b.our_runner, s.shard_cost_shards)]
    runs += [("baseline", "process", 1), ("baseline", "process", s.shard_cost_baseline_shards)]
    _prepare_all(b, "shard-cost-prepare", [(recipe, data, d / f"job-{label}-{n}", n) for label, _, n in runs])
    walls: dict[str, dict[str, float]] = defaultdict(dict)  # side -> "<N> shards" -> worker wall secs
    for label, runner, n in runs:
        progress(f"shard_cost {label}: {s.shard_cost_rows} rows as {n} shard(s), one worker, runner={runner}")
        walls[label][f"{n} shards"] = b.run(f"shard-cost-{label}-{n}", _worker(b, d / f"job-{label}-{n}", runner))

    def per_shard(label: str, n: int) -> float:
        return (walls[label][f"{n} shards"] - walls[label]["1 shards"]) / (n - 1)

    ours, base = per_shard("ours", s.shard_cost_shards), per_shard("baseline", s.shard_cost_baseline_shards)
    return [
        Result(
            name="shard_cost",
            label=f"fixed cost per added shard, {b.our_runner} vs process runner",
            ours_secs=ours,
            baseline_secs=base,
            ratio=ours / base,
            value=ours,
            unit="s/shard",
            target="<= 0.5 s/shard",
            met=ours <= 0.5,
            details={
                "rows": s.shard_cost_rows,
                "formula": "(T(N shards) - T(1 shard)) / (N - 1), T = worker wall time, same rows",
                "ours": {"runner": b.our_runner, "worker_wall_secs_by_shards": walls["ours"]},
                "baseline": {"runner": "process", "worker_wall_secs_by_shards": walls["baseline"]},
            },
        )
    ]
