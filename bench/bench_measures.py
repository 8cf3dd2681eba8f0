"""The measurements. Each runs its own baseline side by side with ours in the same invocation and
returns `Result`s; absolute seconds on a shared 2-core box are noise, the ratios are the result.

Every job of ours uses a short lease and poll interval (`JOB_SETTINGS`) so that waiting for work
never shows up as cost, and the node-resource flags only where `elastic-shard` lists them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from bench_data import CPU_OPS, CUSTOM_OPS, model_ops, sleep_ops, write_dataset, write_recipe, write_tiny_dataset
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
    io_rows: int  # prepare and merge input
    overhead_shards: int
    overhead_rows_per_shard: int
    e2e_shards: int
    hetero_shards: int  # a multiple of 3: the static baseline gives each worker a third
    hetero_rows_per_shard: int
    hetero_ms_per_row: float
    hetero_slowdown: float
    claim_shards: int
    claim_workers: int
    repeats: int  # prepare and merge are short: median of this many interleaved runs
    warm_ops_shards: int
    warm_ops_rows_per_shard: int
    warm_ops_process_shards: int  # the process-runner side: a model load and a dj-process per shard
    shard_cost_rows: int
    shard_cost_shards: int  # ours: T(this many shards) vs T(1 shard), same rows
    shard_cost_baseline_shards: int  # the process runner's side, fewer (each shard is a dj-process)


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


def _local(b: Bench, recipe: Path, data: Path, job: Path, shards: int, output: Path, runner: str) -> list[str]:
    """`local --workers 1`: prepare, one worker, verify and merge into `output`."""
    argv = b.elastic("local", "--workers", "1", "--config", str(recipe), "--dataset-path", str(data), "--job-dir", str(job))
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
            ours_detail = {
                "shards": s.e2e_shards,
                "rows_in": s.rows,
                "rows_out": rows["ours"],
                "processing_span_secs": span(records),
                "sum_shard_secs": sum(effective_seconds(records)),
                "median_shard_secs": median(effective_seconds(records)),
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


def _timed_to_file(argv: list[str], out: Path) -> float:
    t0 = time.monotonic()
    with open(out, "wb") as handle:
        subprocess.run(argv, stdout=handle, check=True)
    return time.monotonic() - t0


def measure_prepare_merge(b: Bench, s: Sizes, wanted: tuple[str, ...]) -> list[Result]:
    """prepare vs `sha256sum` of the input; merge vs `cat` of the files merge reads. Median of
    `repeats` interleaved runs each (they are short, so one run would be mostly noise)."""
    d = b.work / "io"
    data = write_dataset(d / "input.jsonl", s.io_rows)
    size = data.stat().st_size
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
    results = []
    prep, sha = [], []
    progress(f"prepare vs sha256sum: {s.io_rows} rows, {size / 1e6:.0f} MB, {s.repeats} runs each")
    for i in range(s.repeats):
        sha.append(_timed_to_file(["sha256sum", str(data)], d / "sha256.txt"))
        prep.append(_prepare(b, f"io-prepare-{i}", recipe, data, d / f"job-{i}", s.e2e_shards))
    tiny = write_dataset(d / "one-row.jsonl", 1)
    startup = _prepare(b, "io-prepare-one-row", recipe, tiny, d / "job-one-row", 1)
    if "prepare_noop" in wanted:
        results.append(_measure_noop_prepare(b, s, recipe, data, d))
    if "prepare" in wanted:
        ours, base = median(prep), median(sha)
        results.append(
            Result.times(
                "prepare",
                "prepare vs sha256sum of the input",
                ours,
                base,
                "3",
                {
                    "input_bytes": size,
                    "rows": s.io_rows,
                    "shards": s.e2e_shards,
                    "runs_ours": prep,
                    "runs_baseline": sha,
                    "ours_mb_per_sec": size / 1e6 / ours,
                    "baseline_mb_per_sec": size / 1e6 / base,
                    "prepare_one_row_secs": startup,
                },
            )
        )
    if "merge" not in wanted:
        return results
    job = d / "job-0"
    progress("merge: completing the job with 2 passthrough workers (not timed)")
    b.wait([b.start(f"io-passthrough-{k}", _passthrough(job)) for k in range(2)], "passthrough workers")
    records = completions(job)
    outputs = [str(job / "attempts" / r["shard_id"] / r["attempt_id"] / "processed.jsonl") for r in records]
    out_bytes = sum(r["output_bytes"] for r in records)
    merges, cats = [], []
    progress(f"merge vs cat: {len(outputs)} shard outputs, {out_bytes / 1e6:.0f} MB, {s.repeats} runs each")
    for i in range(s.repeats):
        cats.append(_timed_to_file(["cat", *outputs], d / "cat.jsonl"))
        merged = d / "merged.jsonl"
        merged.unlink(missing_ok=True)
        merges.append(b.run(f"io-merge-{i}", b.elastic("merge", "--job-dir", str(job), "--output", str(merged))))
    same = (d / "cat.jsonl").read_bytes() == (d / "merged.jsonl").read_bytes()
    ours, base = median(merges), median(cats)
    results.append(
        Result.times(
            "merge",
            "merge vs cat of the shard outputs",
            ours,
            base,
            "2",
            {
                "output_bytes": out_bytes,
                "shards": len(outputs),
                "runs_ours": merges,
                "runs_baseline": cats,
                "identical_output": same,
                "ours_mb_per_sec": out_bytes / 1e6 / ours,
                "baseline_mb_per_sec": out_bytes / 1e6 / base,
            },
        )
    )
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
        noop.append(_prepare(b, f"io-prepare-noop-{i}", recipe, data, d / "job-0", s.e2e_shards))
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
