"""Project a whole job to many nodes from measured rates: wall time, speed-up and serial fraction.

    bench/scale --prepare-mbps X --process-mbps Y --merge-mbps Z [--per-shard-secs S] [...]
    bench/scale --from-json bench/results/latest.json [--prepare-mbps X ...]

`bench/run` runs the same projection at its end from the rates it measured in that run (and
writes it to its JSON under "scale"). Only the standard library is used, so any Python runs it.
The model (also printed with every table):
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NODES = (1, 2, 4, 8, 16, 32, 64)
TB = 1e12
DEFAULT_SHARDS = 4096  # 1 TB in ~244 MB shards
SERIAL_TARGET = 0.10  # at most 10 % of the wall time with fewer than all nodes busy ...
TARGET_NODES = 16  # ... at 16 nodes

FORMULA = """\
T(n)        = prepare(n) + process(n) + merge
prepare(n)  = prepare_fixed + B / (prepare_rate * p(n)),   p(n) = min(n, max_participants, shards)
process(n)  = node_startup + B / (process_rate * n) + shards / n * per_shard
merge       = file output: B * output_ratio / merge_rate  |  directory output: merge_dir (a constant)
serial(n)   = time with fewer than n nodes busy = [prepare(n) if p(n) < n] + [merge if n > 1]
serial fraction = serial(n) / T(n);  speed-up = T(1) / T(n)
(B = input bytes; rates in MB/s = 1e6 B/s; the uneven last wave of shards, at most one shard's
time, is left out.)"""

# The units of a deduplication stage, as src/elastic_sharding/dedup/stage.py cuts them (copied:
# this file uses only the standard library; tests/test_bench.py checks they agree).
RECORDS_PER_BUCKET_UNIT = 1 << 21
ROWS_PER_NODE_PART = 1 << 22
MAX_PARTS = 4096

DEDUP_FORMULA = """\
With one deduplication stage (between two segments of the recipe), T(n) and serial(n) gain:
dedup(n)        = sum over its phases p of  ceil(U_p / (n * w)) * u_p + barrier      (components: once per round)
dedup_serial(n) = sum over the same phases of  u_p + barrier  (n > 1: each phase's last wave,
                  at most one unit long, and the wait between phases have fewer than n nodes busy)
U_keys = U_keep = shards;  U_buckets = min(4096, ceil(R * fanout / 2^21));  U_components = min(shards, 4096, ceil(R / 2^22))
u_keys = B / shards / keys_rate;  u_keep = B / shards / keep_rate;  u_buckets = R * fanout / U_buckets / bucket_rate
u_components = R / U_components * round_cost;  R = rows = B * rows_per_MB;  w = stage processes per node
(rates of one process; the keys units that overlap the previous segment's last shards are not credited.)"""

COORD_FORMULA = """\
With the coordination measured on a shared filesystem (the coordination_* rows, up to N nodes), process(n) gains
coord(n)  = shards / n * c(n),   c(n) = c_N * max(1, n / N)^a
c_N       = N / claims_N - sleep  (= makespan * N / S - sleep: a worker's seconds per shard beyond its work at N nodes)
a         = ln(c_N / c_M) / ln(N / M), at least 0  (M: the fewest nodes above 1 measured; the growth past N)
per_shard (shard_cost: one worker, a local disk) holds that worker's claim and publish on the local
disk; c(n) is all of it on the shared filesystem, so the local part is counted twice (an upper bound).
Load on the shared filesystem (the NAS), metadata operations per second:
processing(n) = shards / process(n) * meta_ops_per_shard + n * busy_ops_per_worker
idle(n)       = n * idle_ops_per_worker  (a job at its tail: every worker polls, none claims)
claims needed = shards / process(n), against claims_N measured (held back by its `sleep`: a lower bound)"""

__doc__ = (__doc__ or "") + "\n" + FORMULA + "\n\n" + DEDUP_FORMULA + "\n\n" + COORD_FORMULA + "\n"


@dataclass
class Rates:
    """What one node does, as measured (MB = 1e6 bytes)."""

    prepare_mbps: float  # one prepare participant: one node, all its cores (as the `prepare` row runs)
    process_mbps: float  # processing, per node
    merge_mbps: float  # merge into one file (one node)
    per_shard_secs: float = 0.0  # fixed cost of one shard beyond its rows
    prepare_fixed_secs: float = 0.0  # prepare's start-up (imports, recipe, manifest)
    node_startup_secs: float = 0.0  # a node's runtime start-up before its first shard
    merge_dir_secs: float = 0.0  # merge into a directory (links or renames, not bytes)
    max_participants: int | None = None  # prepare participants at most (None: every node)
    output_ratio: float = 1.0  # output bytes per input byte
    # One deduplication stage (None: none). Rates of one participant process (MB of job input).
    dedup: str | None = None  # its deduplicator: "simhash", "exact" (no components) or "minhash"
    dedup_keys_mbps: float = 0.0  # keys units: input hashed per second
    dedup_bucket_recs_per_sec: float = 0.0  # bucket units: key records sorted and joined per second
    dedup_round_secs_per_mrow: float = 0.0  # components units: seconds per million rows covered, per round
    dedup_keep_mbps: float = 0.0  # keep units: input rewritten per second
    dedup_fanout: float = 1.0  # key records per row
    dedup_rows_per_mb: float = 1000.0  # rows per MB of input
    dedup_rounds: int = 0  # components rounds (about the widest duplicate cluster's diameter)
    dedup_barrier_secs: float = 0.0  # between two phases: the last unit's end to the next phase's start
    dedup_procs_per_node: int = 1  # stage participants per node (workers per node)
    # The coordination on a shared filesystem (None: not measured; COORD_FORMULA).
    coord_secs_per_shard: float | None = None  # c_N: a worker's seconds per shard beyond its work, at coord_nodes
    coord_growth_exponent: float = 0.0  # a: c(n) grows as (n / coord_nodes)^a past coord_nodes
    coord_nodes: int | None = None  # N: the node count the coordination terms were measured at
    coord_claims_per_sec: float | None = None  # claims/s measured at coord_nodes
    meta_ops_per_shard: float | None = None  # metadata operations on the shared filesystem per shard, at coord_nodes
    idle_ops_per_worker_per_sec: float | None = None  # metadata ops/s of one worker that finds nothing to claim
    busy_ops_per_worker_per_sec: float | None = None  # metadata ops/s of one worker holding a shard (heartbeats)

    @property
    def coordinated(self) -> bool:
        """Whether any coordination term was measured (the NAS table and COORD_FORMULA are printed)."""
        return any(
            value is not None
            for value in (
                self.coord_secs_per_shard,
                self.coord_claims_per_sec,
                self.meta_ops_per_shard,
                self.idle_ops_per_worker_per_sec,
                self.busy_ops_per_worker_per_sec,
            )
        )


def participants(rates: Rates, nodes: int, shards: int) -> int:
    return max(1, min(nodes, shards, rates.max_participants or nodes))


def dedup_phases(rates: Rates, total_bytes: float, shards: int) -> list[dict[str, Any]]:
    """The stage's phases at this size: units, one unit's seconds, and how many times the phase
    runs (components: once per round); empty without a stage."""
    if rates.dedup is None:
        return []
    mb = total_bytes / 1e6
    rows = mb * rates.dedup_rows_per_mb
    records = rows * rates.dedup_fanout
    buckets = min(MAX_PARTS, max(1, math.ceil(records / RECORDS_PER_BUCKET_UNIT)))
    phases = [
        {"phase": "keys", "units": shards, "unit_secs": mb / shards / rates.dedup_keys_mbps, "times": 1},
        {"phase": "buckets", "units": buckets, "unit_secs": records / buckets / rates.dedup_bucket_recs_per_sec, "times": 1},
    ]
    if rates.dedup != "exact" and rates.dedup_rounds > 0:
        parts = min(shards, MAX_PARTS, max(1, math.ceil(rows / ROWS_PER_NODE_PART)))
        unit = rows / parts / 1e6 * rates.dedup_round_secs_per_mrow
        phases.append({"phase": "components", "units": parts, "unit_secs": unit, "times": rates.dedup_rounds})
    phases.append({"phase": "keep", "units": shards, "unit_secs": mb / shards / rates.dedup_keep_mbps, "times": 1})
    return phases


def dedup_terms(rates: Rates, total_bytes: float, shards: int, nodes: int) -> tuple[float, float]:
    """(dedup(n), dedup_serial(n)) of DEDUP_FORMULA; (0, 0) without a stage."""
    slots = nodes * max(1, rates.dedup_procs_per_node)
    total = serial = 0.0
    for p in dedup_phases(rates, total_bytes, shards):
        total += p["times"] * (math.ceil(p["units"] / slots) * p["unit_secs"] + rates.dedup_barrier_secs)
        serial += p["times"] * (p["unit_secs"] + rates.dedup_barrier_secs) if nodes > 1 else 0.0
    return total, serial


def coord_per_shard(rates: Rates, nodes: int) -> float | None:
    """c(n) of COORD_FORMULA: the measured cost, flat up to the node count it was measured at (an
    upper bound there, if it grows) and grown by the measured exponent past it; None: not measured."""
    if rates.coord_secs_per_shard is None:
        return None
    past = max(1.0, nodes / rates.coord_nodes) if rates.coord_nodes else 1.0
    return max(0.0, rates.coord_secs_per_shard) * past ** max(0.0, rates.coord_growth_exponent)


def nas_load(rates: Rates, shards: int, nodes: int, process_secs: float) -> dict[str, Any]:
    """What the shared filesystem must serve at `nodes` nodes (COORD_FORMULA); None where a term
    was not measured."""
    claims = shards / process_secs
    processing = idle = None
    if rates.meta_ops_per_shard is not None:
        processing = claims * rates.meta_ops_per_shard + nodes * (rates.busy_ops_per_worker_per_sec or 0.0)
    if rates.idle_ops_per_worker_per_sec is not None:
        idle = nodes * rates.idle_ops_per_worker_per_sec
    measured = rates.coord_claims_per_sec
    return {
        "claims_per_sec_needed": claims,
        "claims_per_sec_measured": measured,
        "claims_headroom": None if measured is None else measured / claims,
        "meta_ops_per_sec_processing": processing,
        "meta_ops_per_sec_idle": idle,
    }


def project(rates: Rates, total_bytes: float, shards: int, nodes: int) -> dict[str, Any]:
    """One row of the table: every term of the formula at `nodes` nodes."""
    mb = total_bytes / 1e6
    p = participants(rates, nodes, shards)
    prepare = rates.prepare_fixed_secs + mb / (rates.prepare_mbps * p)
    c = coord_per_shard(rates, nodes)
    coord = 0.0 if c is None else shards / nodes * c
    process = rates.node_startup_secs + mb / (rates.process_mbps * nodes) + shards / nodes * rates.per_shard_secs + coord
    dedup, dedup_serial = dedup_terms(rates, total_bytes, shards, nodes)
    merges = {"file": mb * rates.output_ratio / rates.merge_mbps, "dir": rates.merge_dir_secs}
    row: dict[str, Any] = {"nodes": nodes, "participants": p, "prepare_secs": prepare, "process_secs": process}
    if rates.dedup is not None:
        row |= {"dedup_secs": dedup, "dedup_serial_secs": dedup_serial}
    if rates.coordinated:
        row |= {"coord_secs_per_shard": c, "coord_secs": coord, "nas": nas_load(rates, shards, nodes, process)}
    for kind, merge in merges.items():
        total = prepare + process + dedup + merge
        serial = (prepare if p < nodes else 0.0) + (merge if nodes > 1 else 0.0) + dedup_serial
        row[kind] = {"merge_secs": merge, "total_secs": total, "serial_secs": serial, "serial_fraction": serial / total}
    return row


def projection(
    rates: Rates, total_bytes: float = TB, shards: int = DEFAULT_SHARDS, nodes: tuple[int, ...] = NODES
) -> dict[str, Any]:
    """The whole table, speed-ups against one node, and the verdict at TARGET_NODES."""
    one = project(rates, total_bytes, shards, 1)
    rows = [project(rates, total_bytes, shards, n) for n in nodes]
    for row in rows:
        for kind in ("file", "dir"):
            row[kind]["speedup"] = one[kind]["total_secs"] / row[kind]["total_secs"]
    at = project(rates, total_bytes, shards, TARGET_NODES)
    target = {
        "nodes": TARGET_NODES,
        "max_serial_fraction": SERIAL_TARGET,
        "serial_fraction_file": at["file"]["serial_fraction"],
        "serial_fraction_dir": at["dir"]["serial_fraction"],
        "met_file": at["file"]["serial_fraction"] <= SERIAL_TARGET,
        "met_dir": at["dir"]["serial_fraction"] <= SERIAL_TARGET,
    }
    formula = FORMULA if rates.dedup is None else FORMULA + "\n" + DEDUP_FORMULA
    if rates.coordinated:
        formula += "\n" + COORD_FORMULA
    proj = {"bytes": total_bytes, "shards": shards, "rates": asdict(rates), "rows": rows, "target": target, "formula": formula}
    if rates.dedup is not None:
        proj["dedup_phases"] = dedup_phases(rates, total_bytes, shards)
    return proj


def _secs(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _opt(value: float | None, fmt: str, what: str) -> str:
    """A measured figure, or that it was not measured (a reader must not take a blank for zero)."""
    return f"{fmt.format(value)} {what}" if value is not None else f"{what}: not measured"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    rendered = [" | ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    rendered.insert(1, "-+-".join("-" * w for w in widths))
    return rendered


def _nas_table(proj: dict[str, Any], r: Rates) -> list[str]:
    """The load on the shared filesystem per node count: what a reader sizes the NAS by."""
    at = f" at {r.coord_nodes}" if r.coord_nodes else ""

    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else fmt.format(value)

    table = [
        (
            "nodes",
            "coord/shard",
            "coord in process",
            "claims/s needed",
            f"measured{at}",
            "headroom",
            "meta ops/s processing",
            "meta ops/s idle",
        )
    ]
    for row in proj["rows"]:
        nas = row["nas"]
        table.append(
            (
                str(row["nodes"]),
                cell(row["coord_secs_per_shard"], "{:.3f} s"),
                _secs(row["coord_secs"]),
                f"{nas['claims_per_sec_needed']:.2f}",
                cell(nas["claims_per_sec_measured"], "{:.1f}"),
                cell(nas["claims_headroom"], "{:.0f}x"),
                cell(nas["meta_ops_per_sec_processing"], "{:.0f}"),
                cell(nas["meta_ops_per_sec_idle"], "{:.0f}"),
            )
        )
    return ["load on the shared filesystem (metadata operations per second; claims while processing):", *_table(table)]


def render(proj: dict[str, Any], sources: dict[str, str] | None = None) -> str:
    r = Rates(**proj["rates"])
    parts = "every node" if r.max_participants is None else f"at most {r.max_participants}"
    lines = [
        f"scale projection: {proj['bytes'] / 1e12:g} TB in {proj['shards']} shards",
        f"  prepare {r.prepare_mbps:.1f} MB/s per participant (+{r.prepare_fixed_secs:.1f} s fixed), participants: {parts}",
        f"  processing {r.process_mbps:.2f} MB/s per node (+{r.node_startup_secs:.1f} s start-up), {r.per_shard_secs:.2f} s per shard",
        f"  merge {r.merge_mbps:.0f} MB/s to a file (output {r.output_ratio:.2f} x input), {r.merge_dir_secs:.2f} s to a directory",
    ]
    stage = r.dedup is not None
    if stage:
        lines.append(
            f"  dedup stage ({r.dedup}), per process: keys {r.dedup_keys_mbps:.2f} MB/s, buckets "
            f"{r.dedup_bucket_recs_per_sec / 1e6:.2f} M records/s ({r.dedup_fanout:.1f} per row, {r.dedup_rows_per_mb:.0f} rows/MB), "
            f"components {r.dedup_round_secs_per_mrow:.2f} s per M rows x {r.dedup_rounds} round(s), keep "
            f"{r.dedup_keep_mbps:.1f} MB/s; {r.dedup_procs_per_node} process(es) per node, {r.dedup_barrier_secs:.2f} s between phases"
        )
        units = ", ".join(
            f"{p['phase']} {p['units']} x {_secs(p['unit_secs'])}" + (f" x {p['times']} rounds" if p["times"] > 1 else "")
            for p in proj.get("dedup_phases", [])
        )
        lines.append(f"  dedup units at this size: {units}")
    if r.coordinated:
        cost = _opt(r.coord_secs_per_shard, "{:.3f} s", "per shard beyond the work")
        if r.coord_secs_per_shard is not None and r.coord_nodes:
            cost += f" (x (n / {r.coord_nodes})^{r.coord_growth_exponent:.2f} past {r.coord_nodes} nodes)"
        figures = (
            cost,
            _opt(r.coord_claims_per_sec, "{:.1f}", "claims/s"),
            _opt(r.meta_ops_per_shard, "{:.1f}", "metadata ops per shard"),
            _opt(r.busy_ops_per_worker_per_sec, "{:.2f}", "ops/s per busy worker"),
            _opt(r.idle_ops_per_worker_per_sec, "{:.2f}", "ops/s per idle worker"),
        )
        at = f" at {r.coord_nodes} nodes" if r.coord_nodes else ""
        lines.append(f"  coordination on the shared filesystem{at}: " + ", ".join(figures))
    if sources:
        lines.append("  rates from: " + "; ".join(f"{k} {v}" for k, v in sources.items()))
    header = ("nodes", "prepare", "process", *(("dedup",) if stage else ()), "merge file", "T file", "speed-up", "serial")
    header += ("T dir", "speed-up", "serial")
    table = [header]
    for row in proj["rows"]:
        f, d = row["file"], row["dir"]
        table.append(
            (
                f"{row['nodes']}" + ("" if row["participants"] == row["nodes"] else f" (p={row['participants']})"),
                _secs(row["prepare_secs"]),
                _secs(row["process_secs"]),
                *((_secs(row["dedup_secs"]),) if stage else ()),
                _secs(f["merge_secs"]),
                _secs(f["total_secs"]),
                f"{f['speedup']:.1f}x",
                f"{100 * f['serial_fraction']:.1f} %",
                _secs(d["total_secs"]),
                f"{d['speedup']:.1f}x",
                f"{100 * d['serial_fraction']:.1f} %",
            )
        )
    rendered = _table(table)
    t = proj["target"]

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    lines += rendered
    if r.coordinated:
        lines += ["", *_nas_table(proj, r)]
    lines += ["", *proj["formula"].splitlines(), ""]
    lines.append(
        f"target: serial fraction <= {100 * t['max_serial_fraction']:.0f} % at {t['nodes']} nodes: "
        f"file output {100 * t['serial_fraction_file']:.1f} % {verdict(t['met_file'])}, "
        f"directory output {100 * t['serial_fraction_dir']:.1f} % {verdict(t['met_dir'])}"
    )
    return "\n".join(lines)


# -- rates from a bench run ------------------------------------------------------------------------

# Where a rate was not measured in the run: today's figures of ../shared/notes/prepare-floor.md and
# README (Step 7), marked "assumed" wherever they are used.
ASSUMED = {
    "prepare_mbps": (55.0, "assumed 55 MB/s (prepare-floor note, single-process prepare)"),
    "prepare_fixed_secs": (3.0, "assumed 3 s"),
    "max_participants": (1, "assumed 1 participant (no prepare measured)"),
    "process_mbps": (4.7, "assumed 4.7 MB/s (prepare-floor note, 2-op recipe)"),
    "node_startup_secs": (12.0, "assumed 12 s (prepare-floor note)"),
    "output_ratio": (1.0, "assumed 1.0"),
    "per_shard_secs": (0.34, "assumed 0.34 s (README Step 7 shard_cost)"),
    "merge_mbps": (380.0, "assumed 380 MB/s (prepare-floor note)"),
    "merge_dir_secs": (0.0, "assumed 0 s"),
}


# The dedup rows, simhash first (its stage has components rounds): each carries its stage's rates.
DEDUP_ROWS = tuple(f"dedup_{kind}{suffix}" for kind in ("simhash", "exact") for suffix in ("", "_workers", "_rss"))


def _ok(result: dict[str, Any] | None) -> bool:
    return bool(result) and not result.get("error") and result.get("details", {}).get("skipped") is None


def rates_from_results(results: dict[str, dict[str, Any]]) -> tuple[Rates, dict[str, str]]:
    """The model's rates from one bench run's results (the JSON's "results"); every rate the run
    did not measure is ASSUMED and says so. Returns (rates, where each came from)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(key: str, value: Any, source: str) -> None:
        values[key], sources[key] = value, source

    prep = next((results[n] for n in ("prepare", "prepare_original") if _ok(results.get(n))), None)
    if prep:
        d = prep["details"]
        fixed = d["prepare_one_row_secs"]
        if prep["ours_secs"] - fixed >= 0.25 * prep["ours_secs"]:
            how = "input / (median prepare - one-row prepare)"
        else:  # an input so small that start-up is nearly all of it: do not subtract noise
            fixed, how = 0.0, "input / median prepare (input too small to subtract the one-row prepare)"
        put("prepare_mbps", d["input_bytes"] / 1e6 / (prep["ours_secs"] - fixed), f"{prep['name']}: {how}")
        put("prepare_fixed_secs", fixed, f"{prep['name']}: one-row prepare" if fixed else f"{prep['name']}: 0 (see prepare_mbps)")
    # A prepare that logs its phase time "by P participant(s)" is the cooperative one, which any
    # number of processes on any nodes share: every node takes part. One without: one process.
    logs = [
        results[n]["details"].get("cooperative_prepare")
        for n in ("prepare", "prepare_original", "prepare_coop", *DEDUP_ROWS)
        if _ok(results.get(n))
    ]
    if any(logs):
        put("max_participants", None, "every node (this checkout's prepare is cooperative: it logs its participants)")
    elif logs:
        put("max_participants", 1, "1 (this checkout's prepare logs no participants: a single-process prepare)")
    e2e = next((results[n] for n in ("e2e_ray", "e2e_partitioned") if _ok(results.get(n))), None)
    cost = results.get("shard_cost")
    if _ok(cost) and cost["value"] is not None:
        put("per_shard_secs", max(0.0, cost["value"]), "shard_cost")
    per_shard = values.get("per_shard_secs", ASSUMED["per_shard_secs"][0])
    if e2e:
        o = e2e["details"]["ours"]
        startup = o.get("node_startup_secs", 0.0)
        work = max(o["sum_shard_secs"] - startup, 1e-3)
        net = work - o["shards"] * per_shard
        if net < 0.5 * work:  # the per-shard cost would be most of it (tiny shards): do not subtract it
            net = work
        put(
            "process_mbps",
            o["input_bytes"] / 1e6 / net,
            f"{e2e['name']}: input / (shard seconds - start-up - shards x per-shard)",
        )
        put("node_startup_secs", startup, f"{e2e['name']}: first shard - median shard")
        put("output_ratio", o["output_bytes"] / o["input_bytes"], f"{e2e['name']}: merged / input bytes")
    merge = results.get("merge")
    if _ok(merge):
        put("merge_mbps", merge["details"]["ours_mb_per_sec"], "merge")
    merge_dir = results.get("merge_dir")
    if _ok(merge_dir):
        put("merge_dir_secs", merge_dir["ours_secs"], "merge_dir")
    # A deduplication stage only where this run measured one (simhash preferred: it has rounds).
    stage = next(
        ((name, results[name]) for name in DEDUP_ROWS if _ok(results.get(name)) and results[name]["details"].get("stage_rates")),
        None,
    )
    if stage:
        name, result = stage
        measured = result["details"]["stage_rates"]
        how = f"{name}: the stage's units in local --workers {measured['procs_per_node']} at {result['details']['rows']:,} rows"
        put("dedup", result["details"]["recipe"], how + " (every dedup_* rate)")
        for key in ("keys_mbps", "bucket_recs_per_sec", "round_secs_per_mrow", "keep_mbps", "fanout", "rows_per_mb"):
            if measured.get(key) is not None:
                values[f"dedup_{key}"] = measured[key]
        for key in ("rounds", "barrier_secs", "procs_per_node"):
            values[f"dedup_{key}"] = measured[key]
    coordination_rates(results, put)
    for key, (value, source) in ASSUMED.items():
        if key not in values:
            put(key, value, source)
    return Rates(**values), sources


def coordination_points(results: dict[str, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per node count the coordination rows measured: claims/s, the simulated work per shard, the
    metadata operations per shard, and the row they come from. The makespan rows first; the fsops
    row (which holds the same runs' figures at two node counts) where they were not kept."""
    points: dict[int, dict[str, Any]] = {}
    fsops = results.get("coordination_fsops")
    if _ok(fsops):
        d = fsops["details"]
        for nodes, claims in d.get("claims_per_sec", {}).items():
            meta = d.get("metadata_ops_per_shard", {}).get(nodes)
            points[int(nodes)] = {
                "claims_per_sec": claims,
                "sleep": d["sizes"]["sleep"],
                "meta": meta,
                "row": "coordination_fsops",
            }
    for name in sorted(results):
        if name.startswith("coordination_makespan_") and _ok(results[name]):
            d = results[name]["details"]
            points[int(d["nodes"])] = {
                "claims_per_sec": d["claims_per_sec"],
                "sleep": d["sleep_secs"],
                "meta": d["metadata_ops_per_shard"],
                "row": name,
            }
    return {n: pt for n, pt in sorted(points.items()) if pt["claims_per_sec"]}


def coordination_rates(results: dict[str, dict[str, Any]], put: Callable[[str, Any, str], None]) -> None:
    """The coordination terms of COORD_FORMULA from the coordination rows, where the run has them
    (else they stay None: not measured, and the projection leaves them out)."""
    points = coordination_points(results)
    if points:
        big = max(points)
        pt = points[big]

        def cost(n: int) -> float:
            return n / points[n]["claims_per_sec"] - points[n]["sleep"]

        put("coord_nodes", big, f"{pt['row']}: the most nodes measured")
        put("coord_claims_per_sec", pt["claims_per_sec"], f"{pt['row']}: shards / makespan")
        put(
            "coord_secs_per_shard",
            max(0.0, cost(big)),
            f"{pt['row']}: makespan x {big} / shards - {pt['sleep']:g} s of work (at least 0)",
        )
        if pt["meta"] is not None:
            put("meta_ops_per_shard", pt["meta"], f"{pt['row']}: GlusterFS profile, every fop but READ and WRITE / shards")
        smaller = [n for n in points if 1 < n < big and cost(n) > 0]
        if smaller and cost(big) > 0:
            m = min(smaller)
            exponent = max(0.0, math.log(cost(big) / cost(m)) / math.log(big / m))
            put(
                "coord_growth_exponent",
                exponent,
                f"{pt['row']} vs {points[m]['row']}: ln(c_{big} / c_{m}) / ln({big} / {m}), at least 0",
            )
    idle = results.get("coordination_idle")
    if _ok(idle):
        d = idle["details"]
        per = d.get("per_worker_metadata_ops_per_sec", {})
        where = f"coordination_idle ({d.get('at_nodes')} nodes)"
        if per.get("per_busy_worker") is not None:
            put("busy_ops_per_worker_per_sec", max(0.0, per["per_busy_worker"]), f"{where}: all_busy / workers")
        idles = {k: per[k] for k in ("per_idle_worker", "per_idle_worker_at_tail") if per.get(k) is not None}
        if idles:
            key = max(idles, key=lambda k: idles[k])
            how = "(hold - busy) / idle workers" if key == "per_idle_worker" else "(tail - 1 busy) / idle workers"
            put("idle_ops_per_worker_per_sec", max(0.0, idles[key]), f"{where}: {how}, the larger of hold and tail")


# -- command line ----------------------------------------------------------------------------------


def _participants(text: str) -> int | None:
    return None if text == "all" else int(text)


# The rate flags (Rates field: its flag's name where it differs); given flags override --from-json.
REQUIRED = ("prepare_mbps", "process_mbps", "merge_mbps")
OPTIONAL = {  # without --from-json, a flag not given is this
    "per_shard_secs": 0.0,
    "prepare_fixed_secs": 0.0,
    "node_startup_secs": 0.0,
    "merge_dir_secs": 0.0,
    "max_participants": None,  # every node
    "output_ratio": 1.0,
}
COORD_FLAGS = (
    "coord_secs_per_shard",
    "coord_growth_exponent",
    "coord_nodes",
    "coord_claims_per_sec",
    "meta_ops_per_shard",
    "idle_ops_per_worker_per_sec",
    "busy_ops_per_worker_per_sec",
)


def _flag(field: str) -> str:
    names = {"max_participants": "participants", "idle_ops_per_worker_per_sec": "idle_ops_per_worker"}
    names["busy_ops_per_worker_per_sec"] = "busy_ops_per_worker"
    return "--" + names.get(field, field).replace("_", "-")


def _from_json(parser: argparse.ArgumentParser, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Every rate `rates_from_results` takes from a `bench/run --json` file, and their sources."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"--from-json {path}: {exc}")
    results = report.get("results") if isinstance(report, dict) else None
    if not isinstance(results, dict):
        parser.error(f'--from-json {path}: no "results" (not a bench/run --json file)')
    rates, sources = rates_from_results(results)
    return asdict(rates), sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/scale",
        description=__doc__.splitlines()[0],
        epilog=FORMULA + "\n\n" + DEDUP_FORMULA + "\n\n" + COORD_FORMULA,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Rate flags default to absent (SUPPRESS) so that one given can be told from one not given.
    rate = {"default": argparse.SUPPRESS}
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="PATH",
        help="take every rate a bench/run --json file measured (as bench/run's own projection); flags override",
    )
    parser.add_argument(
        "--prepare-mbps",
        type=float,
        **rate,
        help="prepare MB/s of one participant (one node; required unless --from-json has it)",
    )
    parser.add_argument(
        "--process-mbps", type=float, **rate, help="processing MB/s per node (required unless --from-json has it)"
    )
    parser.add_argument("--merge-mbps", type=float, **rate, help="merge MB/s into one file (required unless --from-json has it)")
    parser.add_argument("--per-shard-secs", type=float, **rate, help="fixed cost per shard (default 0)")
    parser.add_argument("--prepare-fixed-secs", type=float, **rate, help="prepare start-up (default 0)")
    parser.add_argument("--node-startup-secs", type=float, **rate, help="a node's start-up (default 0)")
    parser.add_argument("--merge-dir-secs", type=float, **rate, help="merge into a directory (default 0)")
    parser.add_argument(
        "--participants", type=_participants, dest="max_participants", metavar="all|K", **rate,
        help="prepare participants at most (default all)",
    )  # fmt: skip
    parser.add_argument("--output-ratio", type=float, **rate, help="output bytes per input byte (default 1)")
    coord = parser.add_argument_group(
        "coordination on a shared filesystem (the coordination_* rows; default: not measured, no NAS table)"
    )
    coord.add_argument(
        "--coord-secs-per-shard", type=float, **rate, help="c_N: a worker's seconds per shard beyond its work, at --coord-nodes"
    )
    coord.add_argument("--coord-nodes", type=int, **rate, help="N: the node count they were measured at")
    coord.add_argument(
        "--coord-growth-exponent", type=float, **rate, help="a: c(n) = c_N * (n / N)^a past N nodes (default 0: flat)"
    )
    coord.add_argument("--coord-claims-per-sec", type=float, **rate, help="claims/s measured at N nodes (the headroom column)")
    coord.add_argument("--meta-ops-per-shard", type=float, **rate, help="metadata operations on the shared filesystem per shard")
    coord.add_argument(
        "--busy-ops-per-worker", type=float, dest="busy_ops_per_worker_per_sec", metavar="OPS_PER_SEC", **rate,
        help="metadata ops/s of a worker holding a shard (heartbeats)",
    )  # fmt: skip
    coord.add_argument(
        "--idle-ops-per-worker", type=float, dest="idle_ops_per_worker_per_sec", metavar="OPS_PER_SEC", **rate,
        help="metadata ops/s of a worker that finds nothing to claim (polls)",
    )  # fmt: skip
    stage = parser.add_argument_group("one deduplication stage (rates of one process; MB of job input)")
    stage.add_argument("--dedup", choices=("simhash", "exact", "minhash"), help="project one stage of this deduplicator")
    stage.add_argument("--dedup-keys-mbps", type=float, help="keys units: MB/s")
    stage.add_argument("--dedup-bucket-recs", type=float, help="bucket units: key records/s")
    stage.add_argument("--dedup-round-secs", type=float, default=0.0, help="components: s per million rows per round")
    stage.add_argument("--dedup-keep-mbps", type=float, help="keep units: MB/s")
    stage.add_argument("--dedup-fanout", type=float, default=1.0, help="key records per row (default %(default)s)")
    stage.add_argument("--dedup-rows-per-mb", type=float, default=1000.0, help="rows per MB of input (default %(default)s)")
    stage.add_argument("--dedup-rounds", type=int, default=0, help="components rounds (default %(default)s)")
    stage.add_argument("--dedup-barrier-secs", type=float, default=0.0, help="wait between phases (default %(default)s)")
    stage.add_argument("--dedup-procs", type=int, default=1, help="stage processes per node (default %(default)s)")
    parser.add_argument("--tb", type=float, default=1.0, help="input size in TB (default %(default)s)")
    parser.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="shards (default %(default)s)")
    parser.add_argument("--nodes", default=",".join(map(str, NODES)), help="node counts (default %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the projection here")
    args = parser.parse_args(argv)
    given = {key: value for key, value in vars(args).items() if key in (*REQUIRED, *OPTIONAL, *COORD_FLAGS)}
    if args.from_json:
        values, sources = _from_json(parser, args.from_json)
        # The three main rates must be measured or given: an assumed one would pass for the run's.
        missing = [k for k in REQUIRED if k not in given and sources[k].startswith("assumed")]
        if missing:
            flags = ", ".join(_flag(k) for k in missing)
            parser.error(f"--from-json {args.from_json} measured no {flags}: give {flags} on the command line")
        # The others it did not measure take the flags' defaults, not bench/run's assumed figures:
        # this projection is the run's measurements and the command line alone.
        for key, default in OPTIONAL.items():
            if key not in given and sources[key].startswith("assumed"):
                shown = "all" if default is None else default
                values[key], sources[key] = default, f"not measured in the run: the flag's default ({shown})"
        sources |= {key: "command line" for key in given}
    else:
        missing = [k for k in REQUIRED if k not in given]
        if missing:
            parser.error("the following arguments are required: " + ", ".join(_flag(k) for k in missing))
        values, sources = dict(OPTIONAL), {}
    values |= given
    for name, value in [*((k, values[k]) for k in REQUIRED), ("tb", args.tb)]:
        if value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    for key in COORD_FLAGS:
        if key in given and given[key] < 0:
            parser.error(f"{_flag(key)} must not be negative")
    if given.get("coord_nodes") == 0:
        parser.error("--coord-nodes must be positive")
    if args.dedup:
        for flag in ("dedup_keys_mbps", "dedup_bucket_recs", "dedup_keep_mbps"):
            if not (getattr(args, flag) or 0) > 0:
                parser.error(f"--dedup needs a positive --{flag.replace('_', '-')}")
        if args.dedup != "exact" and args.dedup_rounds > 0 and not args.dedup_round_secs > 0:
            parser.error("--dedup-rounds needs a positive --dedup-round-secs")
        if args.dedup_procs < 1 or args.dedup_fanout <= 0 or args.dedup_rows_per_mb <= 0:
            parser.error("--dedup-procs, --dedup-fanout and --dedup-rows-per-mb must be positive")
        values |= {
            "dedup": args.dedup,
            "dedup_keys_mbps": args.dedup_keys_mbps,
            "dedup_bucket_recs_per_sec": args.dedup_bucket_recs,
            "dedup_round_secs_per_mrow": args.dedup_round_secs,
            "dedup_keep_mbps": args.dedup_keep_mbps,
            "dedup_fanout": args.dedup_fanout,
            "dedup_rows_per_mb": args.dedup_rows_per_mb,
            "dedup_rounds": args.dedup_rounds,
            "dedup_barrier_secs": args.dedup_barrier_secs,
            "dedup_procs_per_node": args.dedup_procs,
        }
        if sources:
            sources["dedup"] = "command line (every dedup_* rate)"
    rates = Rates(**values)
    nodes = tuple(int(n) for n in args.nodes.split(","))
    if any(n < 1 for n in nodes):
        parser.error("--nodes must be positive")
    proj = projection(rates, args.tb * TB, args.shards, nodes)
    if sources:
        proj["sources"] = sources
    sys.stdout.write(render(proj, sources) + "\n")
    if args.json:
        args.json.write_text(json.dumps(proj, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
