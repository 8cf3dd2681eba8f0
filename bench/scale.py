"""Project a whole job to many nodes from measured rates: wall time, speed-up and serial fraction.

    bench/scale --prepare-mbps X --process-mbps Y --merge-mbps Z [--per-shard-secs S] [...]

`bench/run` runs the same projection at its end from the rates it measured in that run (and
writes it to its JSON under "scale"). Only the standard library is used, so any Python runs it.
The model (also printed with every table):
"""

from __future__ import annotations

import argparse
import json
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

__doc__ = (__doc__ or "") + "\n" + FORMULA + "\n"


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


def participants(rates: Rates, nodes: int, shards: int) -> int:
    return max(1, min(nodes, shards, rates.max_participants or nodes))


def project(rates: Rates, total_bytes: float, shards: int, nodes: int) -> dict[str, Any]:
    """One row of the table: every term of the formula at `nodes` nodes."""
    mb = total_bytes / 1e6
    p = participants(rates, nodes, shards)
    prepare = rates.prepare_fixed_secs + mb / (rates.prepare_mbps * p)
    process = rates.node_startup_secs + mb / (rates.process_mbps * nodes) + shards / nodes * rates.per_shard_secs
    merges = {"file": mb * rates.output_ratio / rates.merge_mbps, "dir": rates.merge_dir_secs}
    row: dict[str, Any] = {"nodes": nodes, "participants": p, "prepare_secs": prepare, "process_secs": process}
    for kind, merge in merges.items():
        total = prepare + process + merge
        serial = (prepare if p < nodes else 0.0) + (merge if nodes > 1 else 0.0)
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
    return {"bytes": total_bytes, "shards": shards, "rates": asdict(rates), "rows": rows, "target": target, "formula": FORMULA}


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
    if sources:
        lines.append("  rates from: " + "; ".join(f"{k} {v}" for k, v in sources.items()))
    header = ("nodes", "prepare", "process", "merge file", "T file", "speed-up", "serial", "T dir", "speed-up", "serial")
    table = [header]
    for row in proj["rows"]:
        f, d = row["file"], row["dir"]
        table.append(
            (
                f"{row['nodes']}" + ("" if row["participants"] == row["nodes"] else f" (p={row['participants']})"),
                _secs(row["prepare_secs"]),
                _secs(row["process_secs"]),
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
        for n in ("prepare", "prepare_original", "prepare_coop")
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
        epilog=FORMULA,
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
