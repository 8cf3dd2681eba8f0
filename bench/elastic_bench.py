"""elastic-sharding benchmark: every performance ratio of bench/README.md, each measured side by side
with its baseline in this one invocation (on a shared, noisy box only ratios mean anything).

Usage: bench/run [--quick] [--rows N] [--io-rows N] [--dedup-rows N] [--analyze-rows N] [--global-rows N] [--json PATH] [--only NAME,...] [--our-runner RUNNER]
The table goes to stdout (then the scaling projection from this run's rates), progress to
stderr, everything measured to the JSON file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import analyze_measure
import coordination_measure
import dedup_measure
import global_ops_measure
import orjson
import scale
import stage_scale_measure
import tail_measure
from bench_lib import REPO, Bench, BenchError, Result, machine_info, progress
from bench_measures import (
    Sizes,
    measure_claims,
    measure_e2e,
    measure_hetero,
    measure_io,
    measure_job_dir,
    measure_many_shards,
    measure_overhead,
    measure_shard_cost,
    measure_warm_ops,
)

from elastic_sharding.work.runners import RUNNERS

DEFAULT = global_ops_measure.GlobalSizes(
    rows=100_000,
    # prepare and merge exist for very large inputs: on a small one their fixed start-up (~3 s,
    # mostly importing Data-Juicer to validate the recipe) would be all that is measured. 500k
    # rows of prose are ~650 MB.
    io_rows=500_000,
    io_shards=16,
    overhead_shards=16,
    overhead_rows_per_shard=50,
    e2e_shards=8,
    hetero_shards=24,
    hetero_rows_per_shard=20,
    hetero_ms_per_row=50.0,
    hetero_slowdown=3.0,
    claim_shards=2000,
    claim_workers=8,
    many_shards=(1000, 20000),
    repeats=3,
    warm_ops_shards=12,
    warm_ops_rows_per_shard=20,
    warm_ops_process_shards=12,
    shard_cost_rows=450,
    shard_cost_shards=9,
    shard_cost_baseline_shards=3,
    # ~0.9 KB rows of prose with 10 % planted duplicates (~470 MB); 31,250 rows per shard.
    dedup_rows=500_000,
    dedup_shards=16,
    # ~1.3 KB rows of prose (~650 MB); its first half for the finish's second size.
    analyze_rows=500_000,
    analyze_shards=16,
    # ~560-byte rows of multi-line prose with planted boilerplate lines (~112 MB); its first half in 8 shards.
    global_rows=200_000,
    global_shards=16,
)
QUICK = dataclasses.replace(
    DEFAULT,
    rows=10_000,
    io_rows=0,
    overhead_shards=3,
    hetero_shards=6,
    claim_shards=400,
    many_shards=(100, 1000),
    repeats=1,
    warm_ops_shards=6,
    warm_ops_process_shards=3,  # a dj-process and a model load per shard: fewer, to stay quick
    shard_cost_rows=250,
    shard_cost_shards=5,
    shard_cost_baseline_shards=2,
    dedup_rows=0,  # --rows
    dedup_shards=4,
    tail_shards=24,
    tail_rows_per_shard=100,
    analyze_rows=20_000,  # and 10,000 for the finish's second size
    analyze_shards=4,
    global_rows=0,  # --rows (and half of it in 2 shards)
    global_shards=4,
)

# Name -> (the results it yields, how to measure them). Names are what --only accepts.
NAMES = (
    "overhead",
    "e2e_ray",
    "e2e_partitioned",
    "hetero_dynamic",
    "hetero_static",
    "job_dir_bytes",
    "prepare",
    "prepare_original",
    "prepare_noop",
    "prepare_procs",
    "prepare_coop",
    "merge",
    "merge_dir",
    "claims",
    "many_shards_prepare",
    "many_shards_claims",
    "warm_ops_actor",
    "warm_ops_task",
    "shard_cost",
    *dedup_measure.NAMES,
    *tail_measure.NAMES,
    *analyze_measure.NAMES,
    *global_ops_measure.NAMES,
    *coordination_measure.NAMES,
    *stage_scale_measure.NAMES,
)
IO_NAMES = ("prepare", "prepare_original", "prepare_noop", "prepare_procs", "prepare_coop", "merge", "merge_dir")
GROUPS: dict[str, tuple[str, ...]] = {
    "e2e": ("e2e_ray", "e2e_partitioned"),
    "hetero": ("hetero_dynamic", "hetero_static"),
    "warm_ops": ("warm_ops_actor", "warm_ops_task"),
    "io": IO_NAMES,
    "many_shards": ("many_shards_prepare", "many_shards_claims"),
    "dedup": dedup_measure.NAMES,
    "tail": tail_measure.NAMES,
    "analyze": analyze_measure.NAMES,
    "global_ops": global_ops_measure.NAMES,
    "coordination": (*coordination_measure.NAMES, *stage_scale_measure.NAMES),
}


# What a failed measurement raises: it is reported as that row's error, and the others still run.
MEASURE_FAILURES = (BenchError, OSError, RuntimeError, ValueError, KeyError, ZeroDivisionError, subprocess.SubprocessError)


def _plan(wanted: tuple[str, ...]) -> list[tuple[tuple[str, ...], Callable[[Bench, Sizes], list[Result]]]]:
    """Group the wanted results by the measurement that produces them, in a fixed order."""
    plan: list[tuple[tuple[str, ...], Callable[[Bench, Sizes], list[Result]]]] = []

    def want(*names: str) -> tuple[str, ...]:
        return tuple(n for n in names if n in wanted)

    if names := want("overhead"):
        plan.append((names, measure_overhead))
    if names := want("e2e_ray", "e2e_partitioned"):
        plan.append((names, lambda b, s, n=names: measure_e2e(b, s, n)))
    if names := want("job_dir_bytes"):  # after e2e: it measures e2e's job when that ran
        plan.append((names, measure_job_dir))
    if names := want("hetero_dynamic", "hetero_static"):
        plan.append((("hetero_dynamic", "hetero_static"), measure_hetero))
    if names := want(*IO_NAMES):
        plan.append((names, lambda b, s, n=names: measure_io(b, s, n)))
    if names := want("claims"):
        plan.append((names, measure_claims))
    if want("many_shards_prepare", "many_shards_claims"):
        plan.append((("many_shards_prepare", "many_shards_claims"), measure_many_shards))
    if want("warm_ops_actor", "warm_ops_task"):
        plan.append((("warm_ops_actor", "warm_ops_task"), measure_warm_ops))
    if names := want("shard_cost"):
        plan.append((names, measure_shard_cost))
    if names := want(*dedup_measure.NAMES):
        plan.append((names, lambda b, s, n=names: dedup_measure.measure_dedup(b, s, n)))
    if want(*tail_measure.NAMES):
        plan.append((tail_measure.NAMES, tail_measure.measure_tail))
    if names := want(*analyze_measure.NAMES):
        plan.append((names, lambda b, s, n=names: analyze_measure.measure_analyze(b, s, n)))
    if names := want(*global_ops_measure.NAMES):
        plan.append((names, lambda b, s, n=names: global_ops_measure.measure_global_ops(b, s, n)))
    if names := want(*coordination_measure.NAMES):
        plan.append((names, lambda b, s, n=names: coordination_measure.measure_coordination(b, s, n)))
    if names := want(*stage_scale_measure.NAMES):
        plan.append((names, lambda b, s, n=names: stage_scale_measure.measure_stage_scale(b, s, n)))
    return plan


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke test (a few minutes)")
    parser.add_argument("--rows", type=int, help=f"end-to-end input rows (default {DEFAULT.rows}, quick {QUICK.rows})")
    parser.add_argument(
        "--io-rows",
        type=int,
        help=f"prepare/merge input rows of prose, ~1.3 KB each (default {DEFAULT.io_rows:,}; quick: --rows)",
    )
    parser.add_argument(
        "--dedup-rows",
        type=int,
        help=f"dedup input rows of prose with planted duplicates, ~0.9 KB each (default {DEFAULT.dedup_rows:,}; "
        "quick: --rows); the second size is half of it",
    )
    parser.add_argument(
        "--analyze-rows",
        type=int,
        help=f"analyze input rows of prose, ~1.3 KB each (default {DEFAULT.analyze_rows:,}; quick {QUICK.analyze_rows:,}); "
        "the finish is also measured on half of it",
    )
    parser.add_argument(
        "--global-rows",
        type=int,
        help=f"global_ops input rows of multi-line prose with planted boilerplate lines, ~560 bytes each "
        f"(default {DEFAULT.global_rows:,}; quick: --rows); the second size is half of it",
    )
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "latest.json", help="results file")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join((*NAMES, *GROUPS))}")
    parser.add_argument("--our-runner", default="warm", help="runner of our jobs (default %(default)s)")
    parser.add_argument("--work-dir", type=Path, help="parent of the run's fresh work directory (default /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, jobs) afterwards")
    parser.add_argument("--timeout", type=float, default=1800, help="limit for any one step, seconds (default %(default)s)")
    coordination_measure.add_arguments(parser)
    stage_scale_measure.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.our_runner not in RUNNERS:
        parser.error(f"runner {args.our_runner!r} is not available in this checkout (have: {', '.join(RUNNERS)})")
    wanted: list[str] = []
    for name in args.only.split(",") if args.only else NAMES:
        name = name.strip()
        if name not in NAMES and name not in GROUPS:
            parser.error(f"unknown --only name {name!r}; choose from {', '.join((*NAMES, *GROUPS))}")
        wanted += GROUPS.get(name, (name,))
    args.wanted = tuple(n for n in NAMES if n in wanted)
    sizes = QUICK if args.quick else DEFAULT
    try:
        args.coordination = coordination_measure.sizes(args)
        args.stage_scale = stage_scale_measure.sizes(args)
    except ValueError as exc:
        parser.error(str(exc))
    rows = args.rows or sizes.rows
    args.sizes = dataclasses.replace(
        sizes,
        rows=rows,
        io_rows=args.io_rows or sizes.io_rows or rows,
        dedup_rows=args.dedup_rows or sizes.dedup_rows or rows,
        analyze_rows=args.analyze_rows or sizes.analyze_rows,
        global_rows=args.global_rows or sizes.global_rows or rows,
    )
    if args.sizes.dedup_rows < 2 * args.sizes.dedup_shards:
        parser.error(f"--dedup-rows must be at least {2 * args.sizes.dedup_shards} (two rows per shard at half size)")
    if args.sizes.global_rows < 2 * args.sizes.global_shards:
        parser.error(f"--global-rows must be at least {2 * args.sizes.global_shards} (two rows per shard at half size)")
    if args.sizes.analyze_rows < 2 * args.sizes.analyze_shards:
        parser.error(f"--analyze-rows must be at least {2 * args.sizes.analyze_shards} (a row per shard at half size)")
    return args


def _fmt_secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def _fmt_ratio(r: Result) -> str:
    if r.error:
        return "ERROR"
    if shown := (r.details.get("shown") or {}).get("ratio"):  # a row judged on a check, not a number (PASS / FAIL)
        return shown
    if r.ratio is not None and r.unit == "x" and r.value is not None and abs(r.value - r.ratio) > 1e-9:
        return f"{r.ratio:.2f}x (judged: {r.value:.2f}x)"
    if r.ratio is not None:
        return f"{r.ratio:.2f}x"
    if r.value is None:
        return "-"
    return f"{r.value:.0f} {r.unit}" if r.value >= 100 else f"{r.value:.2f} {r.unit}"


def _verdict(r: Result) -> str:
    if r.error:
        return "ERROR"
    if r.met is None:
        return "-"
    return "met" if r.met else "MISSED"


def table(results: list[Result], machine: dict, runner: str) -> str:
    rows = [("ratio", "ours", "baseline", "ratio", "target", "met")]
    for r in results:
        # A row whose sides are not plain seconds says what to show (dedup: seconds and rows, MB).
        shown = r.details.get("shown") or {}
        ours, baseline = shown.get("ours") or _fmt_secs(r.ours_secs), shown.get("baseline") or _fmt_secs(r.baseline_secs)
        rows.append((r.label, ours, baseline, _fmt_ratio(r), r.target, _verdict(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    lines.append("")
    lines.append(
        f"machine: {machine['cores']} cores, {machine['ram_gib']} GiB RAM, {machine['cpu_model']}, {machine['date']}, "
        f"load avg {machine['load_avg_at_start']} at start, {machine['load_avg_at_end']} at end; ours = runner {runner!r}, commit {machine['git_commit']}"
    )
    for r in results:
        if r.error:
            lines.append(f"ERROR in {r.name}: {r.error.splitlines()[0]}")
        elif r.details.get("skipped"):
            lines.append(f"not measured: {r.name}: {r.details['skipped']}")
        else:
            lines += [f"{r.name}: {note}" for note in r.details.get("notes", [])]
            if r.met is False and r.details.get("missed"):
                lines.append(f"{r.name}: missed: {', '.join(r.details['missed'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    machine = machine_info()
    parent = args.work_dir or Path("/tmp")
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="elastic-bench-", dir=parent))
    bench = Bench(work, args.our_runner, args.timeout)
    bench.shared["coordination"] = args.coordination
    bench.shared["stage_scale"] = args.stage_scale
    progress(f"work dir {work}; ours = runner {args.our_runner!r}; measuring {', '.join(args.wanted)}")
    started = time.monotonic()
    results: list[Result] = []
    try:
        for names, measure in _plan(args.wanted):
            t0 = time.monotonic()
            try:
                got = measure(bench, args.sizes)
            except MEASURE_FAILURES as exc:
                bench.stop_all()
                text = str(exc) if isinstance(exc, BenchError) else traceback.format_exc()
                progress(f"{'/'.join(names)} failed: {text}")
                got = [Result(n, n, None, None, None, None, "", "", None, error=text) for n in names]
            results += [r for r in got if r.name in args.wanted]
            progress(f"{'/'.join(names)} took {time.monotonic() - t0:.0f}s")
    finally:
        bench.close(args.keep)
    if args.keep:
        progress(f"kept {work}")
    machine["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "format": 1,
        "machine": machine,
        "our_runner": args.our_runner,
        "quick": args.quick,
        "sizes": dataclasses.asdict(args.sizes),
        "resource_flags_available": bench.available_resource_flags(),
        "bench_wall_secs": time.monotonic() - started,
        "results": {r.name: dataclasses.asdict(r) for r in results},
    }
    rates, sources = scale.rates_from_results(report["results"])
    report["scale"] = {**scale.projection(rates), "sources": sources}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.write(table(results, machine, args.our_runner) + "\n\n")
    sys.stdout.write(scale.render(report["scale"], sources) + "\n")
    progress(f"results in {args.json}; whole bench {report['bench_wall_secs']:.0f}s")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
