"""The `global_ops` rows: a recipe of whole-dataset operators run across shards, ours
(`elastic-shard local`: prepare, the line deduplicator as a stage on the input shards, the
stats filter on Ray, the two selectors as stages, merge) against one `dj-process` run with
Data-Juicer's default executor (`bench/dj_default.py`, `np` = cores) of the same recipe on the
same input.

The sides, in this order so that drift of the box hits all of them: dj-process on the whole
input, ours `local --workers 2` on it, then ours `--workers 2` on the input's first half in half
the shards (the same rows per shard). Every side is one run, timed end to end, its process tree's
memory sampled (`bench_lib.TreeMemory`); its output rows are read in order with `__dj__stats__`
removed and each serialized canonically (sorted keys), then its job directory (or Data-Juicer's
cache) is removed. Ours also keeps where its time went: the prepare as logged, and per stage phase
and per recipe segment the window and the summed seconds of its units and shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
from bench_data import GLOBAL_OPS, write_global_dataset, write_prefix, write_recipe
from bench_lib import Bench, BenchError, Result, progress
from bench_measures import Sizes, _local, prepared_lines
from dedup_measure import _lines, _worker_memory, dj_default_side, remove_dj_files

DJ_DEFAULT = Path(__file__).resolve().parent / "dj_default.py"
NAMES = ("global_ops_time", "global_ops_rss")
TIME_TARGET, RSS_TARGET = "1.0", "1.15"
STATS = "__dj__stats__"
MB = 1e6
RUNTIME_READY = re.compile(r"warm runtime pid \d+ ready in (?P<secs>[0-9.]+)s")


@dataclasses.dataclass
class GlobalSizes(Sizes):
    """`bench_measures.Sizes` and the global_ops rows' sizes (`elastic_bench` sizes every row with it)."""

    global_rows: int = 200_000  # the input (multi-line prose, ~560 bytes a row); its first half for the second size
    global_shards: int = 16  # shards of ours at global_rows (half as many at half the rows)


def _mb(value: float) -> str:
    return f"{value / MB:,.0f} MB"


def _secs(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def canonical_rows(path: Path) -> list[bytes]:
    """Every row of a JSONL file in file order, `__dj__stats__` removed, as canonical JSON
    (orjson, keys sorted): two outputs are the same rows in the same order when these are equal."""
    with open(path, "rb") as handle:
        rows = (orjson.loads(line) for line in handle if line.strip())
        return [orjson.dumps({k: v for k, v in row.items() if k != STATS}, option=orjson.OPT_SORT_KEYS) for row in rows]


def _digest(rows: list[bytes]) -> dict[str, Any]:
    """What is kept of an output (the rows themselves are not: 100 MB at the default size)."""
    whole = hashlib.sha256()
    for row in rows:
        whole.update(row + b"\n")
    return {
        "rows_out": len(rows),
        "canonical_bytes": sum(len(row) + 1 for row in rows),
        "canonical_sha256": whole.hexdigest(),
        # one 16-byte digest per row: compares order and content, and says which row differs first
        "row_digests": [hashlib.blake2b(row, digest_size=16).digest() for row in rows],
    }


def compare_outputs(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Equal when the canonical rows are the same in the same order; otherwise whether they are
    the same rows in another order, and the first position that differs."""
    a, b = ours["row_digests"], theirs["row_digests"]
    equal = a == b
    first = None if equal else next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {
        "equal": equal,
        "same_rows_any_order": equal or sorted(a) == sorted(b),
        "first_difference_at": first,
        "rows": {"ours": len(a), "dj": len(b)},
        "canonical_bytes": {"ours": ours["canonical_bytes"], "dj": theirs["canonical_bytes"]},
    }


# -- the sides -------------------------------------------------------------------------------------


def _dj_side(b: Bench, d: Path, tag: str, data: Path) -> dict[str, Any]:
    """One default-executor `dj-process` run (np = cores): time, memory and its output's digest."""
    side, out = dj_default_side(b, d, tag, "global_ops", GLOBAL_OPS, data)
    output = _digest(canonical_rows(out))
    remove_dj_files(d, tag)
    return {**side, **output}


def _window(spans: list[tuple[float, float]], t0: float) -> dict[str, Any]:
    return {
        "count": len(spans),
        "secs_sum": sum(end - start for start, end in spans),
        "secs_max": max(end - start for start, end in spans),
        "from_secs": min(start for start, _ in spans) - t0,  # after the run started
        "to_secs": max(end for _, end in spans) - t0,
    }


def time_breakdown(job: Path, t0: float) -> dict[str, Any]:
    """Where a finished job's time went (`t0`: the run's start, wall clock): per stage phase (keys,
    buckets, place, keep) its units, per recipe segment its shard attempts; for each the summed and
    longest seconds and the window, in seconds after the start. A unit record with `secs` ended when
    its file was written; keep units and shard completions have `started_at` / `finished_at`."""
    phases: dict[str, list[tuple[float, float]]] = {}
    for path in sorted(job.glob("stages/*/units/*.json")):
        record = orjson.loads(path.read_bytes())
        stage, phase = path.parts[-3], path.stem.rsplit("-", 1)[0]
        if "started_at" in record:
            span = (record["started_at"], record["finished_at"])
        else:
            end = path.stat().st_mtime
            span = (end - record.get("secs", 0.0), end)
        phases.setdefault(f"stage {stage} {phase}", []).append(span)
    segments: dict[str, list[tuple[float, float]]] = {}
    for path in sorted(job.glob("**/state/done/*.json")):
        record = orjson.loads(path.read_bytes())
        where = path.parent.parent.parent.relative_to(job)
        key = "segment after stage " + where.name if where.parts else "segment"
        segments.setdefault(key, []).append((record["started_at"], record["finished_at"]))
    return {
        "stage_phases": {name: _window(spans, t0) for name, spans in phases.items()},
        "segments": {name: _window(spans, t0) for name, spans in segments.items()},
    }


def _ours_side(b: Bench, d: Path, tag: str, data: Path, shards: int, workers: int) -> dict[str, Any]:
    """`local --workers N` end to end (prepare, work, stages, merge): time, memory, where the time
    went and its output's digest."""
    job, merged = d / f"{tag}-job", d / f"{tag}-merged.jsonl"
    recipe = write_recipe(d / f"{tag}.yaml", data, d / "unused.jsonl", GLOBAL_OPS)
    argv = _local(b, recipe, data, job, shards, merged, b.our_runner, workers=workers)
    progress(f"global_ops {tag}: local --workers {workers}, {shards} shards, runner={b.our_runner}, {data.name}")
    t0 = time.time()
    wall, tree, largest = b.run_with_memory(f"global-{tag}", argv, cwd=d)
    output = _digest(canonical_rows(merged))
    log = (b.logs / f"global-{tag}.log").read_text(errors="replace")
    logged = [line for line in prepared_lines(log) if line["secs"]]
    workers_memory = _worker_memory(tree)
    if not workers_memory:  # a worker that ends between two samples of the tree may be missed; none is an error
        raise BenchError(f"global_ops {tag}: found no worker process under the launcher")
    side = {
        "wall_secs": wall,
        "workers": workers,
        "workers_sampled": len(workers_memory),
        "shards": shards,
        "rows_in": _lines(data),
        "worker_peak_bytes": max(w["worker_peak_bytes"] for w in workers_memory),
        "runtime_peak_sum_bytes": max(w["runtime_peak_sum_bytes"] for w in workers_memory),
        "per_worker": workers_memory,
        "launcher_peak_bytes": tree.peak_one({tree.root_key}) if tree.root_key else None,
        "largest_process_bytes_wait4": largest,
        "prepare_phase_secs": max((line["secs"] for line in logged), default=None),
        "runtime_ready_secs": [float(m["secs"]) for m in RUNTIME_READY.finditer(log)],
        "time": time_breakdown(job, t0),
        **output,
    }
    shutil.rmtree(job, ignore_errors=True)
    merged.unlink(missing_ok=True)
    return side


# -- the rows --------------------------------------------------------------------------------------


def _public(side: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in side.items() if k != "row_digests"}


def _where_time_went(side: dict[str, Any]) -> str:
    """One line: the prepare, the runtimes' start-up, each segment and each stage phase (summed
    seconds over units / shards, and the window after the start)."""
    parts = []
    if side["prepare_phase_secs"] is not None:
        parts.append(f"prepare {_secs(side['prepare_phase_secs'])}")
    if side["runtime_ready_secs"]:
        parts.append("Ray runtimes ready in " + ", ".join(_secs(s) for s in side["runtime_ready_secs"]))
    spans = {**side["time"]["segments"], **side["time"]["stage_phases"]}
    for name, w in sorted(spans.items(), key=lambda item: item[1]["from_secs"]):
        parts.append(f"{name} {_secs(w['secs_sum'])} over {w['count']} ({w['from_secs']:.1f}-{w['to_secs']:.1f} s)")
    return "; ".join(parts)


def measure_global_ops(b: Bench, s: GlobalSizes, wanted: tuple[str, ...]) -> list[Result]:
    """The wanted `global_ops_*` rows (module docstring)."""
    d = b.work / "global_ops"
    rows, half_rows = s.global_rows, s.global_rows // 2
    shards, half_shards = s.global_shards, max(2, s.global_shards // 2)
    data = d / "input.jsonl"
    planted = write_global_dataset(data, rows)
    progress(f"global_ops: {rows:,} rows of multi-line prose ({data.stat().st_size / MB:.0f} MB), planted {planted}")
    sides: dict[str, dict[str, Any]] = {}
    if "global_ops_time" in wanted:
        sides["dj"] = _dj_side(b, d, "dj", data)
    sides["ours"] = _ours_side(b, d, "w2", data, shards, 2)
    if "global_ops_rss" in wanted:
        half = write_prefix(data, d / "input-half.jsonl", half_rows)
        sides["ours_half"] = _ours_side(b, d, "w2-half", half, half_shards, 2)
    ours = sides["ours"]
    common: dict[str, Any] = {
        "process": GLOBAL_OPS,
        "rows": rows,
        "shards": shards,
        "half_rows": half_rows,
        "half_shards": half_shards,
        "input_bytes": data.stat().st_size,
        "planted": planted,
        **{key: _public(side) for key, side in sides.items()},
    }
    notes = [f"ours, {rows:,} rows, where the time went: {_where_time_went(ours)}"]
    results: list[Result] = []
    if "global_ops_time" in wanted:
        dj = sides["dj"]
        same = compare_outputs(ours, dj)
        checks = {
            f"ratio <= {TIME_TARGET}x": ours["wall_secs"] / dj["wall_secs"] <= float(TIME_TARGET),
            "equal output with __dj__stats__ removed (same rows, same order)": same["equal"],
        }
        label = f"global-ops recipe, {rows:,} rows: local --workers 2 ({shards} shards) vs dj-process default np={dj['np']}"
        r = Result.times("global_ops_time", label, ours["wall_secs"], dj["wall_secs"], TIME_TARGET,
                         {**common, "same_output": same, "checks": checks})  # fmt: skip
        r.target, r.met = f"<= {TIME_TARGET}x, equal rows", all(checks.values())
        r.details["missed"] = [c for c, ok in checks.items() if not ok]
        r.details["shown"] = {
            "ours": f"{_secs(ours['wall_secs'])}, {ours['rows_out']:,} rows",
            "baseline": f"{_secs(dj['wall_secs'])}, {dj['rows_out']:,} rows",
        }
        order = ""
        if not same["equal"]:
            any_order = "yes" if same["same_rows_any_order"] else "no"
            order = f" (same rows in any order: {any_order}; first difference at row {same['first_difference_at']})"
        notes = [
            f"output with {STATS} removed, canonical JSON: equal {'yes' if same['equal'] else 'no'}{order}; "
            f"rows ours {ours['rows_out']:,}, dj-process {dj['rows_out']:,}; bytes ours {ours['canonical_bytes']:,}, "
            f"dj-process {dj['canonical_bytes']:,}",
            f"peak RSS: ours per worker process {_mb(ours['worker_peak_bytes'])} (its Ray runtime "
            f"{_mb(ours['runtime_peak_sum_bytes'])} at once); dj-process largest process "
            f"{_mb(dj['largest_process_bytes_wait4'])}, all {dj['processes_seen']} processes "
            f"{_mb(dj['all_processes_peak_sum_bytes'])} at once",
            *notes,
        ]
        r.details["notes"] = notes
        results.append(r)
    if "global_ops_rss" in wanted:
        small = sides["ours_half"]
        growth = ours["worker_peak_bytes"] / small["worker_peak_bytes"]
        label = f"global-ops recipe: peak RSS per worker process, {rows:,} vs {half_rows:,} rows"
        r = Result("global_ops_rss", label, None, None, growth, growth, "x", f"<= {RSS_TARGET}x",
                   growth <= float(RSS_TARGET), dict(common))  # fmt: skip
        r.details["shown"] = {
            "ours": f"{_mb(ours['worker_peak_bytes'])} at {rows:,}",
            "baseline": f"{_mb(small['worker_peak_bytes'])} at {half_rows:,}",
        }
        r.details["notes"] = [
            f"{rows:,} vs {half_rows:,} rows ({shards} vs {half_shards} shards): ours per worker's Ray runtime "
            f"{_mb(ours['runtime_peak_sum_bytes'])} vs {_mb(small['runtime_peak_sum_bytes'])} at once; "
            f"{_secs(ours['wall_secs'])} vs {_secs(small['wall_secs'])}",
            *([] if "global_ops_time" in wanted else notes),
        ]
        results.append(r)
    return results
