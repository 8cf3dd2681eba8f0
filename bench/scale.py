"""Project a whole job to many nodes from measured rates: wall time, speed-up and serial fraction.

    bench/scale --prepare-mbps X --process-mbps Y --merge-mbps Z [--per-shard-secs S] [...]

`bench/run` runs the same projection at its end from the rates it measured in that run (and
writes it to its JSON under "scale"). Only the standard library is used, so any Python runs it.
The model (also printed with every table):
"""

from __future__ import annotations

import argparse
import json
import math
import sys
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

__doc__ = (__doc__ or "") + "\n" + FORMULA + "\n\n" + DEDUP_FORMULA + "\n"


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


def project(rates: Rates, total_bytes: float, shards: int, nodes: int) -> dict[str, Any]:
    """One row of the table: every term of the formula at `nodes` nodes."""
    mb = total_bytes / 1e6
    p = participants(rates, nodes, shards)
    prepare = rates.prepare_fixed_secs + mb / (rates.prepare_mbps * p)
    process = rates.node_startup_secs + mb / (rates.process_mbps * nodes) + shards / nodes * rates.per_shard_secs
    dedup, dedup_serial = dedup_terms(rates, total_bytes, shards, nodes)
    merges = {"file": mb * rates.output_ratio / rates.merge_mbps, "dir": rates.merge_dir_secs}
    row: dict[str, Any] = {"nodes": nodes, "participants": p, "prepare_secs": prepare, "process_secs": process}
    if rates.dedup is not None:
        row |= {"dedup_secs": dedup, "dedup_serial_secs": dedup_serial}
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
    proj = {"bytes": total_bytes, "shards": shards, "rates": asdict(rates), "rows": rows, "target": target, "formula": formula}
    if rates.dedup is not None:
        proj["dedup_phases"] = dedup_phases(rates, total_bytes, shards)
    return proj


def _secs(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


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
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    rendered = [" | ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    rendered.insert(1, "-+-".join("-" * w for w in widths))
    t = proj["target"]

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    lines += rendered
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
    for key, (value, source) in ASSUMED.items():
        if key not in values:
            put(key, value, source)
    return Rates(**values), sources


# -- command line ----------------------------------------------------------------------------------


def _participants(text: str) -> int | None:
    return None if text == "all" else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/scale",
        description=__doc__.splitlines()[0],
        epilog=FORMULA + "\n\n" + DEDUP_FORMULA,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--prepare-mbps", type=float, required=True, help="prepare MB/s of one participant (one node)")
    parser.add_argument("--process-mbps", type=float, required=True, help="processing MB/s per node")
    parser.add_argument("--merge-mbps", type=float, required=True, help="merge MB/s into one file")
    parser.add_argument("--per-shard-secs", type=float, default=0.0, help="fixed cost per shard (default %(default)s)")
    parser.add_argument("--prepare-fixed-secs", type=float, default=0.0, help="prepare start-up (default %(default)s)")
    parser.add_argument("--node-startup-secs", type=float, default=0.0, help="a node's start-up (default %(default)s)")
    parser.add_argument("--merge-dir-secs", type=float, default=0.0, help="merge into a directory (default %(default)s)")
    parser.add_argument(
        "--participants", type=_participants, default=None, metavar="all|K", help="prepare participants at most (default all)"
    )
    parser.add_argument("--output-ratio", type=float, default=1.0, help="output bytes per input byte (default %(default)s)")
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
    for name in ("prepare_mbps", "process_mbps", "merge_mbps", "tb"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    dedup: dict[str, Any] = {}
    if args.dedup:
        for flag in ("dedup_keys_mbps", "dedup_bucket_recs", "dedup_keep_mbps"):
            if not (getattr(args, flag) or 0) > 0:
                parser.error(f"--dedup needs a positive --{flag.replace('_', '-')}")
        if args.dedup != "exact" and args.dedup_rounds > 0 and not args.dedup_round_secs > 0:
            parser.error("--dedup-rounds needs a positive --dedup-round-secs")
        if args.dedup_procs < 1 or args.dedup_fanout <= 0 or args.dedup_rows_per_mb <= 0:
            parser.error("--dedup-procs, --dedup-fanout and --dedup-rows-per-mb must be positive")
        dedup = {
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
    rates = Rates(
        prepare_mbps=args.prepare_mbps,
        process_mbps=args.process_mbps,
        merge_mbps=args.merge_mbps,
        per_shard_secs=args.per_shard_secs,
        prepare_fixed_secs=args.prepare_fixed_secs,
        node_startup_secs=args.node_startup_secs,
        merge_dir_secs=args.merge_dir_secs,
        max_participants=args.participants,
        output_ratio=args.output_ratio,
        **dedup,
    )
    nodes = tuple(int(n) for n in args.nodes.split(","))
    if any(n < 1 for n in nodes):
        parser.error("--nodes must be positive")
    proj = projection(rates, args.tb * TB, args.shards, nodes)
    sys.stdout.write(render(proj) + "\n")
    if args.json:
        args.json.write_text(json.dumps(proj, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
