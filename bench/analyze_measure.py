"""The `analyze` rows: `dj-analyze`'s statistics computed shard by shard (`elastic-shard local
--analyze`: prepare, the workers, the finish that writes the analysis directory) against one
`dj-analyze` run of the same recipe on the same input, with Data-Juicer's default `Analyzer`
(`np` = cores) and with its `RayAnalyzer` (`executor_type: ray`).

The sides, in this order so that drift of the box hits them all: dj-analyze default, ours
`local --analyze --workers 2`, dj-analyze ray, ours `--workers 1`, then the manual workflow
(`prepare --analyze`, two `worker`s, `merge`) on the whole input and on its first half in the
same number of shards. The manual workflow exists to time and sample the finish alone: in
`local` it runs inside the launcher, after the prepare, in the same process. Every side is timed
end to end with its process tree's memory sampled (`bench_lib.TreeMemory`); its `overall.csv` is
kept, its job directory, exports and caches removed.
"""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from bench_data import ANALYZE_OPS, write_prefix, write_prose_dataset, write_recipe
from bench_lib import PYTHON, Bench, BenchError, Result, TreeMemory, progress
from bench_measures import Sizes, _local, _prepare_argv, _worker
from dedup_measure import _lines, _torch_dists, _worker_memory
from parquet import stop_ray_under

DJ_ANALYZE = Path(__file__).resolve().parent / "dj_analyze.py"
NAMES = ("analyze_time", "analyze_ray", "analyze_workers", "analyze_exact", "analyze_finish_rss", "analyze_finish_rows")
TIME_TARGET, FINISH_RSS_TARGET = "0.7", "0.1"
TOLERANCE = 1e-9  # a float cell of overall.csv may differ by this much, relative or absolute
MB = 1e6
# What each process that took part in the analysis units logs when they are done (workers, the finish).
ANALYSIS_DONE = re.compile(r"analysis done here in (?P<secs>[0-9.]+)s")


def _mb(value: float) -> str:
    return f"{value / MB:,.0f} MB"


def _secs(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


# -- overall.csv --------------------------------------------------------------------------------------


def _float(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def cells_equal(ours: str, theirs: str, tolerance: float = TOLERANCE) -> bool:
    """One cell as written by pandas: strings exactly, numbers within `tolerance` (relative or
    absolute: a sum merged from shards rounds differently from one pass), NaN equal to NaN."""
    if ours == theirs:
        return True
    a, b = _float(ours), _float(theirs)
    if a is None or b is None:
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def read_overall(path: Path) -> tuple[list[str], list[str], dict[tuple[str, str], str]]:
    """`overall.csv` as (its columns, its row labels, {(label, column): cell}), both in file order."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        return [], [], {}
    columns = rows[0][1:]
    labels = [row[0] for row in rows[1:]]
    cells = {(row[0], column): cell for row in rows[1:] for column, cell in zip(columns, row[1:])}
    return columns, labels, cells


def compare_overall(ours: Path, theirs: Path, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Every cell of our `overall.csv` against dj-analyze's: equal only with the same columns and
    row labels in the same order and every cell equal (`cells_equal`). The first mismatches are
    described; the largest numeric differences are kept to show how close the rest came."""
    our_columns, our_labels, our_cells = read_overall(ours)
    columns, labels, cells = read_overall(theirs)
    mismatches: list[str] = []
    if our_columns != columns:
        mismatches.append(f"columns: ours {our_columns}, dj-analyze {columns}")
    if our_labels != labels:
        mismatches.append(f"row labels: ours {our_labels}, dj-analyze {labels}")
    max_abs = max_rel = 0.0
    compared = 0
    for key, cell in cells.items():
        if key not in our_cells:
            mismatches.append(f"{key[0]}/{key[1]}: missing in ours")
            continue
        compared += 1
        mine = our_cells[key]
        if not cells_equal(mine, cell, tolerance):
            mismatches.append(f"{key[0]}/{key[1]}: ours {mine!r}, dj-analyze {cell!r}")
        a, b = _float(mine), _float(cell)
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and a != b:
            max_abs = max(max_abs, abs(a - b))
            max_rel = max(max_rel, abs(a - b) / max(abs(a), abs(b)))
    mismatches += [f"{key[0]}/{key[1]}: not in dj-analyze's" for key in our_cells if key not in cells]
    return {
        "equal": not mismatches and bool(cells),
        "cells": len(cells),
        "compared": compared,
        "columns": columns,
        "labels": labels,
        "mismatch_count": len(mismatches),
        "mismatches": mismatches[:20],
        "max_abs_diff": max_abs,
        "max_rel_diff": max_rel,
    }


def _time_and_memory(side: dict[str, Any]) -> str:
    return f"{_secs(side['wall_secs'])}, {_mb(side['peak_bytes'])}"


# -- the sides ----------------------------------------------------------------------------------------


def _peak(tree: TreeMemory, largest: int) -> dict[str, Any]:
    """A run's peak RSS: its process tree's largest sampled sum, or its largest process's own
    high-water mark where that is more (a short step can end between two samples)."""
    everything = tree.subtree(tree.root_key) if tree.root_key else set()
    summed, one = tree.peak_sum(everything), max(tree.peak_one(everything), largest)
    return {"peak_bytes": max(summed, one), "peak_sum_bytes": summed, "largest_process_bytes": one, "processes": len(everything)}


def _keep_overall(directory: Path, target: Path) -> Path:
    source = directory / "overall.csv"
    if not source.is_file():
        raise BenchError(f"no overall.csv in {directory}")
    shutil.copyfile(source, target)
    return target


def _dj_side(b: Bench, d: Path, tag: str, data: Path, executor: str) -> dict[str, Any]:
    """One `dj-analyze` run (`bench/dj_analyze.py`): default executor with np = cores, or ray with
    as many CPUs; its time, memory and overall.csv."""
    cores = os.cpu_count() or 1
    export, cache = d / f"{tag}-export", d / f"{tag}-hf-cache"
    argv = [PYTHON, str(DJ_ANALYZE)]
    if executor == "default":
        # ds_cache_dir: Hugging Face's dataset cache in the bench's work directory, not ~/.cache.
        extra = {"np": cores, "ds_cache_dir": str(cache), "open_tracer": False}
    else:
        extra = {"open_tracer": False}
    recipe = write_recipe(d / f"{tag}.yaml", data, export / "export.jsonl", ANALYZE_OPS, executor=executor, extra=extra)
    work = d / f"{tag}-work"  # write_recipe's work_dir
    ray_dir = None if executor == "default" else b.ray_root / tag
    argv.append(str(recipe))
    if ray_dir is not None:
        ray_dir.mkdir()
        argv += [str(cores), str(ray_dir)]
    before = _torch_dists()
    progress(f"analyze {tag}: dj-analyze --executor_type {executor} ({cores} CPUs), {data.name}")
    try:
        wall, tree, largest = b.run_with_memory(f"analyze-{tag}", argv, cwd=d)
    finally:
        if ray_dir is not None:
            stop_ray_under(ray_dir)  # whatever of its Ray runtime outlived the run
    if (after := _torch_dists()) != before:
        raise BenchError(f"analyze {tag}: the site-packages changed during the run: {before} -> {after}")
    # dj-analyze 1.6.1 writes <work_dir>/<timestamp>/analysis/ (the Ray analyzer too).
    found = sorted(p.parent for pattern in ("*/analysis/overall.csv", "analysis/overall.csv") for p in work.glob(pattern))
    if len(found) != 1:
        raise BenchError(f"analyze {tag}: {len(found)} analysis directories under {work}; see {b.logs / f'analyze-{tag}.log'}")
    overall = _keep_overall(found[0], d / f"{tag}-overall.csv")
    for path in (export, cache, work):
        shutil.rmtree(path, ignore_errors=True)
    return {"wall_secs": wall, "executor": executor, "cpus": cores, "overall": str(overall), **_peak(tree, largest)}


def _ours_local(b: Bench, d: Path, tag: str, data: Path, shards: int, workers: int) -> dict[str, Any]:
    """`local --analyze --workers N` end to end (prepare, work, finish): time, memory, overall.csv."""
    job, out = d / f"{tag}-job", d / f"{tag}-analysis"
    recipe = write_recipe(d / f"{tag}.yaml", data, d / f"{tag}-export.jsonl", ANALYZE_OPS)
    argv = [*_local(b, recipe, data, job, shards, out, b.our_runner, workers=workers), "--analyze"]
    progress(f"analyze {tag}: local --analyze --workers {workers}, {shards} shards, runner={b.our_runner}, {data.name}")
    wall, tree, largest = b.run_with_memory(f"analyze-{tag}", argv, cwd=d)
    overall = _keep_overall(out, d / f"{tag}-overall.csv")
    per_worker = _worker_memory(tree)
    for path in (job, out):
        shutil.rmtree(path, ignore_errors=True)
    return {"wall_secs": wall, "workers": workers, "shards": shards, "overall": str(overall), "per_worker": per_worker,
            **_peak(tree, largest)}  # fmt: skip


def _ours_manual(b: Bench, d: Path, tag: str, data: Path, shards: int) -> dict[str, Any]:
    """`prepare --analyze`, two `worker`s, then `merge` in a process of its own: the finish's
    time and memory alone (its process tree sampled)."""
    job, out = d / f"{tag}-job", d / f"{tag}-analysis"
    recipe = write_recipe(d / f"{tag}.yaml", data, d / f"{tag}-export.jsonl", ANALYZE_OPS)
    progress(f"analyze {tag}: prepare --analyze, 2 workers, merge; {shards} shards, runner={b.our_runner}, {data.name}")
    prepare = b.run(f"analyze-{tag}-prepare", [*b.elastic(*_prepare_argv(recipe, data, job, shards)), "--analyze"], cwd=d)
    cpus = max(1, (os.cpu_count() or 1) // 2)  # as `local --workers 2` splits the node
    t0 = time.monotonic()
    procs = [b.start(f"analyze-{tag}-worker-{k}", _worker(b, job, b.our_runner, num_cpus=cpus), cwd=d) for k in range(2)]
    ended = b.wait(procs, f"analyze {tag} workers")
    workers = max(ended.values()) - t0 if ended else 0.0
    merge = b.elastic("merge", "--job-dir", str(job), "--output", str(out))
    wall, tree, largest = b.run_with_memory(f"analyze-{tag}-merge", merge, cwd=d)
    overall = _keep_overall(out, d / f"{tag}-overall.csv")
    # Where the analysis units ran: the workers take part once their shards are done, the finish
    # does what is left (the seconds each logged; None where a checkout logs no such line).
    units = {name: _logged_analysis_secs(b, f"analyze-{tag}-{name}") for name in ("worker-0", "worker-1", "merge")}
    for path in (job, out):
        shutil.rmtree(path, ignore_errors=True)
    return {
        "prepare_secs": prepare,
        "workers_secs": workers,
        "finish_secs": wall,
        "analysis_units_secs": units,
        "rows": _lines(data),
        "shards": shards,
        "overall": str(overall),
        **{f"finish_{key}": value for key, value in _peak(tree, largest).items()},
    }


def _logged_analysis_secs(b: Bench, name: str) -> float | None:
    found = ANALYSIS_DONE.findall((b.logs / f"{name}.log").read_text(errors="replace"))
    return sum(map(float, found)) if found else None


# -- the rows -----------------------------------------------------------------------------------------


def _needed(wanted: tuple[str, ...]) -> set[str]:
    """The sides the wanted rows compare."""
    sides = {
        "analyze_time": {"dj", "ours_w2"},
        "analyze_ray": {"dj_ray", "ours_w2"},
        "analyze_workers": {"ours_w1", "ours_w2"},
        "analyze_exact": {"dj", "ours_w2"},
        "analyze_finish_rss": {"dj", "manual"},
        "analyze_finish_rows": {"manual", "manual_half"},
    }
    return set().union(*(sides[name] for name in wanted))


def _side_notes(sides: dict[str, dict[str, Any]], rows: int, half: int) -> list[str]:
    """One line per side: its wall time and peak RSS (what the table's rows are made of)."""
    notes = []
    for key, what in (("dj", "dj-analyze default"), ("dj_ray", "dj-analyze ray"), ("ours_w2", "local --analyze --workers 2"),
                      ("ours_w1", "local --analyze --workers 1")):  # fmt: skip
        if key in sides:
            side = sides[key]
            notes.append(
                f"{what}, {rows:,} rows: {_secs(side['wall_secs'])}, peak RSS {_mb(side['peak_bytes'])} "
                f"(process tree at once; largest process {_mb(side['largest_process_bytes'])}, {side['processes']} processes)"
            )
    for key, at in (("manual", rows), ("manual_half", half)):
        if key in sides:
            side = sides[key]
            logged = {name: secs for name, secs in side["analysis_units_secs"].items() if secs is not None}
            units = ", ".join(f"{name} {_secs(secs)}" for name, secs in logged.items()) or "(not logged)"
            notes.append(
                f"prepare --analyze + 2 workers + merge, {at:,} rows, {side['shards']} shards: prepare {_secs(side['prepare_secs'])}, "
                f"workers {_secs(side['workers_secs'])}, merge {_secs(side['finish_secs'])}, merge peak RSS "
                f"{_mb(side['finish_peak_bytes'])}; analysis units as logged: {units}"
            )
    return notes


def _rss_row(name: str, label: str, ratio: float, limit: str | None, details: dict[str, Any]) -> Result:
    met = None if limit is None else ratio <= float(limit)
    target = "(reported)" if limit is None else f"<= {limit}x"
    return Result(name, label, None, None, ratio, ratio, "x", target, met, details)


def measure_analyze(b: Bench, s: Sizes, wanted: tuple[str, ...]) -> list[Result]:
    """The wanted `analyze_*` rows (module docstring)."""
    d = b.work / "analyze"
    rows, half_rows, shards = s.analyze_rows, s.analyze_rows // 2, s.analyze_shards
    data, prose = write_prose_dataset(d / "input.jsonl", rows)
    half = write_prefix(data, d / "input-half.jsonl", half_rows) if "analyze_finish_rows" in wanted else None
    progress(f"analyze: {rows:,} rows of prose ({data.stat().st_size / MB:.0f} MB, from {prose}), {shards} shards")
    need = _needed(wanted)
    sides: dict[str, dict[str, Any]] = {}
    if "dj" in need:
        sides["dj"] = _dj_side(b, d, "dj", data, "default")
    if "ours_w2" in need:
        sides["ours_w2"] = _ours_local(b, d, "w2", data, shards, 2)
    if "dj_ray" in need:
        sides["dj_ray"] = _dj_side(b, d, "dj-ray", data, "ray")
    if "ours_w1" in need:
        sides["ours_w1"] = _ours_local(b, d, "w1", data, shards, 1)
    if "manual" in need:
        sides["manual"] = _ours_manual(b, d, "manual", data, shards)
    if half is not None:
        sides["manual_half"] = _ours_manual(b, d, "manual-half", half, shards)

    same: dict[str, dict[str, Any]] = {}
    if "dj" in sides:
        reference = Path(sides["dj"]["overall"])
        for key in ("ours_w2", "ours_w1", "manual"):
            if key in sides:
                same[f"{key} == dj"] = compare_overall(Path(sides[key]["overall"]), reference)
    common = {
        "rows": rows,
        "half_rows": half_rows,
        "shards": shards,
        "input_bytes": data.stat().st_size,
        "prose": prose,
        "process": ANALYZE_OPS,
        "overall_equal": {key: v["equal"] for key, v in same.items()},
        **sides,
    }
    notes = _side_notes(sides, rows, half_rows)
    results: list[Result] = []
    w2 = sides.get("ours_w2")
    if "analyze_time" in wanted:
        dj = sides["dj"]
        label = f"analysis, {rows:,} rows: local --analyze --workers 2 vs dj-analyze default np={dj['cpus']}"
        r = Result.times("analyze_time", label, w2["wall_secs"], dj["wall_secs"], TIME_TARGET, dict(common))
        r.details["shown"] = {"ours": _time_and_memory(w2), "baseline": _time_and_memory(dj)}
        results.append(r)
    if "analyze_ray" in wanted:
        ray = sides["dj_ray"]
        label = f"analysis, {rows:,} rows: local --analyze --workers 2 vs dj-analyze ray ({ray['cpus']} CPUs)"
        r = Result.times("analyze_ray", label, w2["wall_secs"], ray["wall_secs"], None, dict(common))
        r.details["shown"] = {"ours": _time_and_memory(w2), "baseline": _time_and_memory(ray)}
        results.append(r)
    if "analyze_workers" in wanted:
        w1 = sides["ours_w1"]
        label = f"analysis, {rows:,} rows: local --analyze --workers 2 vs --workers 1 (t1 / t2)"
        r = Result.speedup("analyze_workers", label, w2["wall_secs"], w1["wall_secs"], None, dict(common))
        r.details["shown"] = {"ours": _time_and_memory(w2), "baseline": _time_and_memory(w1)}
        results.append(r)
    if "analyze_exact" in wanted:
        main = same["ours_w2 == dj"]
        checks = {key: v["equal"] for key, v in same.items()}
        label = f"analysis, {rows:,} rows: overall.csv of ours vs dj-analyze default, every cell"
        r = Result("analyze_exact", label, None, None, None, float(main["mismatch_count"]), "cells", "all cells equal",
                   all(checks.values()), {**common, "checks": checks, "compared": same})  # fmt: skip
        r.details["missed"] = [f"overall.csv of {key}" for key, ok in checks.items() if not ok]
        r.details["shown"] = {
            "ours": f"{len(main['columns'])} stats x {len(main['labels'])} rows",
            "baseline": f"{main['cells']} cells",
            "ratio": "PASS" if r.met else "FAIL",
        }
        r.details["notes"] = [
            f"overall.csv {key}: {'PASS' if v['equal'] else 'FAIL'} ({v['compared']} of {v['cells']} cells compared, "
            f"largest difference {v['max_abs_diff']:.3g} absolute, {v['max_rel_diff']:.3g} relative)"
            + ("" if v["equal"] else f"; first mismatches: {'; '.join(v['mismatches'][:3])}")
            for key, v in same.items()
        ]
        results.append(r)
    if "analyze_finish_rss" in wanted:
        finish, dj = sides["manual"], sides["dj"]
        ratio = finish["finish_peak_bytes"] / dj["peak_bytes"]
        label = f"analysis finish (merge) peak RSS vs dj-analyze default's, {rows:,} rows"
        r = _rss_row("analyze_finish_rss", label, ratio, FINISH_RSS_TARGET, dict(common))
        r.details["shown"] = {
            "ours": f"{_mb(finish['finish_peak_bytes'])} ({_secs(finish['finish_secs'])})",
            "baseline": f"{_mb(dj['peak_bytes'])} ({_secs(dj['wall_secs'])})",
        }
        results.append(r)
    if "analyze_finish_rows" in wanted:
        full, small = sides["manual"], sides["manual_half"]
        ratio = full["finish_peak_bytes"] / small["finish_peak_bytes"]
        label = f"analysis finish (merge) peak RSS, {rows:,} vs {half_rows:,} rows ({shards} shards each)"
        r = _rss_row("analyze_finish_rows", label, ratio, None, dict(common))
        r.details["shown"] = {
            "ours": f"{_mb(full['finish_peak_bytes'])} at {rows:,}",
            "baseline": f"{_mb(small['finish_peak_bytes'])} at {half_rows:,}",
        }
        results.append(r)
    if results:  # every side's time and memory, once, under the table
        results[0].details["notes"] = notes + results[0].details.get("notes", [])
    return results
