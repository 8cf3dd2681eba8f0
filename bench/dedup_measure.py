"""The `dedup` rows: whole recipes with a deduplicator, ours (`elastic-shard local`: prepare, the
recipe's segments on Ray, the deduplication stage shared by the workers, merge) against one
`dj-process` run with Data-Juicer's default executor (`bench/dj_default.py`, `np` = cores) of
the same recipe on the same input.

Per recipe (simhash, exact), in this order so that drift of the box hits every side: dj-process
on the whole input, ours `local --workers 2`, ours `--workers 1`, then on the input's first half
(half the shards, so the same rows per shard) ours `--workers 2` and dj-process. Every side is
one run, timed end to end, its process tree's memory sampled (`bench_lib.TreeMemory`); its kept
row ids are read in order, then its job directory (or Data-Juicer's cache) is removed.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import orjson
from bench_data import DEDUP_RECIPES, write_dedup_dataset, write_prefix, write_recipe
from bench_lib import PYTHON, Bench, BenchError, Result, TreeMemory, progress
from bench_measures import Sizes, _local, prepared_lines

DJ_DEFAULT = Path(__file__).resolve().parent / "dj_default.py"
KINDS = ("simhash", "exact")
NAMES = tuple(f"dedup_{kind}{suffix}" for kind in KINDS for suffix in ("", "_workers", "_rss"))
TIME_TARGET, WORKERS_TARGET, RSS_TARGET = "1.0", "1.6", "1.10"
MB = 1e6


def _mb(value: float) -> str:
    return f"{value / MB:,.0f} MB"


def _secs(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def ids_in_order(path: Path) -> list[Any]:
    """The `id` of every row of a JSONL file, in file order."""
    with open(path, "rb") as handle:
        return [orjson.loads(line)["id"] for line in handle if line.strip()]


def _torch_dists() -> list[str]:
    site = Path(sysconfig.get_paths()["purelib"])
    return sorted(p.name for p in site.iterdir() if p.name.lower().startswith("torch"))


# -- one side -------------------------------------------------------------------------------------


def dj_default_side(b: Bench, d: Path, tag: str, label: str, ops: list[dict], data: Path) -> tuple[dict[str, Any], Path]:
    """One default-executor `dj-process` run (np = cores): its time and memory, and its export
    (the caller reads it, then calls `remove_dj_files`)."""
    cores = os.cpu_count() or 1
    out, cache = d / f"{tag}-out.jsonl", d / f"{tag}-hf-cache"
    # ds_cache_dir: Hugging Face's dataset cache in the bench's work directory (removed with it),
    # not in ~/.cache; everything else is Data-Juicer's default.
    extra = {"np": cores, "ds_cache_dir": str(cache)}
    recipe = write_recipe(d / f"{tag}.yaml", data, out, ops, executor="default", extra=extra)
    before = _torch_dists()
    progress(f"{label} {tag}: dj-process --executor_type default, np={cores}, {data.name}")
    wall, tree, largest = b.run_with_memory(f"{label}-{tag}", [PYTHON, str(DJ_DEFAULT), str(recipe)], cwd=d)
    if (after := _torch_dists()) != before:
        raise BenchError(f"{label} {tag}: the site-packages changed during the run: {before} -> {after}")
    everything = tree.subtree(tree.root_key) if tree.root_key else set()
    side = {
        "wall_secs": wall,
        "rows_in": _lines(data),
        "np": cores,
        "largest_process_bytes_wait4": largest,
        "main_process_peak_bytes": tree.peak_one({tree.root_key}) if tree.root_key else None,
        "largest_process_peak_bytes": tree.peak_one(everything),
        "all_processes_peak_sum_bytes": tree.peak_sum(everything),
        "processes_seen": len(everything),
    }
    return side, out


def remove_dj_files(d: Path, tag: str) -> None:
    """A `dj_default_side` run's export (and Data-Juicer's `<export>_stats.jsonl`), cache and work directory."""
    for path in d.glob(f"{tag}-out*.jsonl"):
        path.unlink()
    for path in (d / f"{tag}-hf-cache", d / f"{tag}-work"):
        shutil.rmtree(path, ignore_errors=True)


def _dj_side(b: Bench, d: Path, tag: str, ops: list[dict], data: Path) -> dict[str, Any]:
    """One default-executor `dj-process` run, its memory and its kept ids."""
    side, out = dj_default_side(b, d, tag, "dedup", ops, data)
    ids = ids_in_order(out)
    remove_dj_files(d, tag)
    return {**side, "rows_out": len(ids), "ids": ids}


def _lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


def _worker_memory(tree: TreeMemory) -> list[dict[str, Any]]:
    """Per worker process of a `local` run (a child of the launcher running `worker`): its own
    peak (it runs the deduplication stage's units) and its Ray runtime's (the warm driver and
    Ray's processes below it)."""
    if tree.root_key is None:
        return []
    workers = [
        key
        for key, info in tree.procs.items()
        if info["parent"] == tree.root_key and "worker" in info["argv"] and "elastic_sharding" in info["argv"]
    ]
    figures = []
    for key in sorted(workers):
        runtime = tree.subtree(key) - {key}
        figures.append(
            {
                "pid": key[0],
                "worker_peak_bytes": tree.peak_one({key}),
                "runtime_peak_sum_bytes": tree.peak_sum(runtime),
                "runtime_largest_process_bytes": tree.peak_one(runtime),
                "runtime_processes_seen": len(runtime),
                "worker_and_runtime_peak_sum_bytes": tree.peak_sum(runtime | {key}),
            }
        )
    return figures


def _stage_figures(job: Path, input_bytes: int, workers: int) -> dict[str, Any]:
    """The deduplication stage of a finished job from its unit results (`stages/1/units`): per
    phase its units, their summed and longest seconds and its window; the gaps between phases
    (barriers); and the per-process rates the scale projection uses."""
    stage = job / "stages" / "1"
    done = orjson.loads((stage / "stage.json").read_bytes())
    phases: dict[str, dict[str, Any]] = {}
    kept_rows = rows_in = records = 0
    for path in sorted((stage / "units").glob("*.json")):
        record = orjson.loads(path.read_bytes())
        name = path.stem
        phase = name.rsplit("-", 1)[0]  # keys, buckets, components-r0000, keep
        if phase == "keep":
            secs, end = record["finished_at"] - record["started_at"], record["finished_at"]
            kept_rows += record["output_rows"]
            rows_in += record["input_rows"]
        else:
            secs, end = record["secs"], path.stat().st_mtime
            if phase == "keys":
                records += record["count"]
        p = phases.setdefault(phase, {"units": 0, "secs_sum": 0.0, "secs_max": 0.0, "start": end - secs, "end": end})
        p["units"] += 1
        p["secs_sum"] += secs
        p["secs_max"] = max(p["secs_max"], secs)
        p["start"], p["end"] = min(p["start"], end - secs), max(p["end"], end)
    order = ["keys", "buckets", *sorted(p for p in phases if p.startswith("components")), "keep"]
    order = [p for p in order if p in phases]
    gaps = [max(0.0, phases[b]["start"] - phases[a]["end"]) for a, b in zip(order, order[1:])]
    window = phases[order[-1]]["end"] - phases[order[0]]["start"] if order else 0.0
    for p in phases.values():
        p["window_secs"] = p.pop("end") - p.pop("start")
    input_mb = input_bytes / MB
    rounds = done.get("rounds") or 0
    components = sum(p["secs_sum"] for name, p in phases.items() if name.startswith("components"))

    def per_sec(amount: float, phase: str) -> float | None:
        """Per second of the phase's units, each at least a millisecond (what a record resolves)."""
        if phase not in phases:
            return None
        return amount / max(phases[phase]["secs_sum"], 0.001 * phases[phase]["units"])

    rates = {
        "keys_mbps": per_sec(input_mb, "keys"),
        "keep_mbps": per_sec(input_mb, "keep"),
        "bucket_recs_per_sec": per_sec(records, "buckets"),
        "fanout": records / rows_in if rows_in else None,
        "rows_per_mb": rows_in / input_mb if input_mb else None,
        "round_secs_per_mrow": components / rounds / (rows_in / MB) if rounds and rows_in else 0.0,
        "rounds": rounds,
        "barrier_secs": sum(gaps) / len(gaps) if gaps else 0.0,
        "procs_per_node": workers,
    }
    return {
        "phases": {p: phases[p] for p in order},
        "barrier_gaps_secs": gaps,
        "stage_window_secs": window,
        "rounds": rounds,
        "bucket_records": done.get("bucket_records"),
        "key_records": records,
        "rows_in": rows_in,
        "rows_kept": kept_rows,
        "rates": rates,
    }


def _ours_side(b: Bench, d: Path, tag: str, ops: list[dict], data: Path, shards: int, workers: int) -> dict[str, Any]:
    """`local --workers N` end to end (prepare, work, merge), its memory, stage and kept ids."""
    job, merged = d / f"{tag}-job", d / f"{tag}-merged.jsonl"
    recipe = write_recipe(d / f"{tag}.yaml", data, d / "unused.jsonl", ops)
    argv = _local(b, recipe, data, job, shards, merged, b.our_runner, workers=workers)
    progress(f"dedup {tag}: local --workers {workers}, {shards} shards, runner={b.our_runner}, {data.name}")
    wall, tree, largest = b.run_with_memory(f"dedup-{tag}", argv, cwd=d)
    ids = ids_in_order(merged)
    # The prepare phase as `local` logged it ("... in X.XXs by P participant(s)"; a checkout
    # without a cooperative prepare logs no time).
    logged = [line for line in prepared_lines((b.logs / f"dedup-{tag}.log").read_text(errors="replace")) if line["secs"]]
    workers_memory = _worker_memory(tree)
    if len(workers_memory) != workers:
        raise BenchError(f"dedup {tag}: found {len(workers_memory)} worker process(es) under the launcher, not {workers}")
    side = {
        "wall_secs": wall,
        "workers": workers,
        "shards": shards,
        "rows_in": _lines(data),
        "rows_out": len(ids),
        "worker_peak_bytes": max(w["worker_peak_bytes"] for w in workers_memory),
        "runtime_peak_sum_bytes": max(w["runtime_peak_sum_bytes"] for w in workers_memory),
        "per_worker": workers_memory,
        "launcher_peak_bytes": tree.peak_one({tree.root_key}) if tree.root_key else None,
        "prepare_phase_secs": max((line["secs"] for line in logged), default=None),
        "prepare_participants": max((line["participants"] for line in logged), default=None),
        "largest_process_bytes_wait4": largest,
        "stage": _stage_figures(job, data.stat().st_size, workers),
    }
    shutil.rmtree(job, ignore_errors=True)
    merged.unlink(missing_ok=True)
    return {**side, "ids": ids}


# -- one recipe ------------------------------------------------------------------------------------


def _public(side: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in side.items() if k != "ids"}


def _measure_recipe(b: Bench, s: Sizes, kind: str, data: Path, half: Path, wanted: tuple[str, ...]) -> list[Result]:
    d = b.work / "dedup"
    ops = DEDUP_RECIPES[kind]
    name, workers_name, rss_name = f"dedup_{kind}", f"dedup_{kind}_workers", f"dedup_{kind}_rss"
    rows, half_rows = s.dedup_rows, s.dedup_rows // 2
    shards, half_shards = s.dedup_shards, max(2, s.dedup_shards // 2)
    sides: dict[str, dict[str, Any]] = {}
    if name in wanted:
        sides["dj"] = _dj_side(b, d, f"{kind}-dj", ops, data)
    sides["ours_w2"] = _ours_side(b, d, f"{kind}-w2", ops, data, shards, 2)
    if workers_name in wanted:
        sides["ours_w1"] = _ours_side(b, d, f"{kind}-w1", ops, data, shards, 1)
    if rss_name in wanted:
        sides["ours_w2_half"] = _ours_side(b, d, f"{kind}-w2-half", ops, half, half_shards, 2)
        sides["dj_half"] = _dj_side(b, d, f"{kind}-dj-half", ops, half)

    w2 = sides["ours_w2"]
    same = {
        f"{side} == {ref}": sides[side]["ids"] == sides[ref]["ids"]
        for side, ref in (("ours_w2", "dj"), ("ours_w1", "ours_w2"), ("ours_w2_half", "dj_half"))
        if side in sides and ref in sides
    }
    common = {
        "recipe": kind,
        "process": ops,
        "rows": rows,
        "shards": shards,
        "half_rows": half_rows,
        "half_shards": half_shards,
        "input_bytes": data.stat().st_size,
        "same_kept_ids": same,
        "stage_rates": w2["stage"]["rates"],
        # read by bench/scale: this checkout's prepare is the cooperative one (every node takes part)
        "cooperative_prepare": w2["prepare_phase_secs"] is not None,
        **{side: _public(v) for side, v in sides.items()},
    }
    results: list[Result] = []
    if name in wanted:
        dj = sides["dj"]
        checks = {
            f"ratio <= {TIME_TARGET}x": w2["wall_secs"] / dj["wall_secs"] <= float(TIME_TARGET),
            "rows kept equal (same ids, same order)": same["ours_w2 == dj"],
        }
        label = f"{kind} recipe, {rows:,} rows: local --workers 2 vs dj-process default np={dj['np']}"
        r = Result.times(name, label, w2["wall_secs"], dj["wall_secs"], TIME_TARGET, {**common, "checks": checks})
        r.target, r.met = f"<= {TIME_TARGET}x, equal rows", all(checks.values())
        r.details["missed"] = [c for c, ok in checks.items() if not ok]
        r.details["shown"] = {
            "ours": f"{_secs(w2['wall_secs'])}, {w2['rows_out']:,} rows",
            "baseline": f"{_secs(dj['wall_secs'])}, {dj['rows_out']:,} rows",
        }
        r.details["notes"] = [
            f"peak RSS: ours per worker process {_mb(w2['worker_peak_bytes'])} (its Ray runtime "
            f"{_mb(w2['runtime_peak_sum_bytes'])} at once); dj-process largest process "
            f"{_mb(dj['largest_process_bytes_wait4'])}, all {dj['processes_seen']} processes "
            f"{_mb(dj['all_processes_peak_sum_bytes'])} at once",
            f"rows kept: ours {w2['rows_out']:,}, dj-process {dj['rows_out']:,}, same ids in the same order: "
            f"{same['ours_w2 == dj']}",
        ]
        results.append(r)
    if workers_name in wanted:
        w1 = sides["ours_w1"]
        label = f"{kind} recipe, {rows:,} rows: local --workers 2 vs --workers 1 (t1 / t2)"
        r = Result.speedup(workers_name, label, w2["wall_secs"], w1["wall_secs"], WORKERS_TARGET, common)
        checks = {f">= {WORKERS_TARGET}x": bool(r.met), "rows kept equal": same["ours_w1 == ours_w2"]}
        r.met = all(checks.values())
        r.details |= {"checks": checks, "missed": [c for c, ok in checks.items() if not ok]}
        r.details["shown"] = {"ours": f"{_secs(w2['wall_secs'])}, 2 workers", "baseline": f"{_secs(w1['wall_secs'])}, 1 worker"}
        results.append(r)
    if rss_name in wanted:
        small, dj_small = sides["ours_w2_half"], sides["dj_half"]
        growth = w2["worker_peak_bytes"] / small["worker_peak_bytes"]
        checks = {f"<= {RSS_TARGET}x": growth <= float(RSS_TARGET)}
        if "ours_w2_half == dj_half" in same:
            checks["rows kept equal at half size"] = same["ours_w2_half == dj_half"]
        label = f"{kind} recipe: peak RSS per worker process, {rows:,} vs {half_rows:,} rows"
        r = Result(
            name=rss_name,
            label=label,
            ours_secs=None,
            baseline_secs=None,
            ratio=growth,
            value=growth,
            unit="x",
            target=f"<= {RSS_TARGET}x",
            met=all(checks.values()),
            details={**common, "checks": checks, "missed": [c for c, ok in checks.items() if not ok]},
        )
        r.details["shown"] = {
            "ours": f"{_mb(w2['worker_peak_bytes'])} at {rows:,}",
            "baseline": f"{_mb(small['worker_peak_bytes'])} at {half_rows:,}",
        }
        dj_line = ""
        if "dj" in sides:
            dj = sides["dj"]
            dj_line = (
                f"; dj-process largest process {_mb(dj['largest_process_bytes_wait4'])} vs "
                f"{_mb(dj_small['largest_process_bytes_wait4'])}, all processes at once "
                f"{_mb(dj['all_processes_peak_sum_bytes'])} vs {_mb(dj_small['all_processes_peak_sum_bytes'])}"
            )
        else:
            dj_line = (
                f"; dj-process at {half_rows:,}: largest process {_mb(dj_small['largest_process_bytes_wait4'])}, "
                f"all processes at once {_mb(dj_small['all_processes_peak_sum_bytes'])}"
            )
        r.details["notes"] = [
            f"{rows:,} vs {half_rows:,} rows ({shards} vs {half_shards} shards): ours per worker's Ray runtime "
            f"{_mb(w2['runtime_peak_sum_bytes'])} vs {_mb(small['runtime_peak_sum_bytes'])} at once" + dj_line
        ]
        results.append(r)
    return results


def measure_dedup(b: Bench, s: Sizes, wanted: tuple[str, ...]) -> list[Result]:
    """The wanted `dedup_*` rows of each recipe (module docstring)."""
    d = b.work / "dedup"
    data = d / "input.jsonl"
    planted = write_dedup_dataset(data, s.dedup_rows)
    half = write_prefix(data, d / "input-half.jsonl", s.dedup_rows // 2)
    progress(f"dedup: {s.dedup_rows:,} rows of prose ({data.stat().st_size / MB:.0f} MB), planted {planted}")
    results: list[Result] = []
    for kind in KINDS:
        names = tuple(n for n in wanted if n.startswith(f"dedup_{kind}"))
        if names:
            got = _measure_recipe(b, s, kind, data, half, names)
            for r in got:
                r.details["planted"] = planted
            results += got
    return results
