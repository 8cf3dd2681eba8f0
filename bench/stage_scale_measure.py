"""The `stage_scale_*` and `dlc_elections` rows: how the cooperative parts of a job behave when
many nodes share them, measured on the GlusterFS test cluster (`tests/support/cluster.py`: one
server and one simulated node per participant, each with its own hostname, network and client
cache; mode "cached" by default, `--stage-mode strict` turns Gluster's caches off).

`stage_scale_exact` / `stage_scale_minhash`: one deduplication stage alone (`dedup/cooperate.py`)
over many tiny rows with planted duplicates in `stage_shards` shard files on the volume, run by
each count of `stage_participants`, one participant process per node (this module's
`participant` mode: `tests/support/dedup_node.py`'s API, plus its own timings, the units it ran
and a digest of the kept rows instead of the whole list). The partition counts are the job's own
(`DedupPlan.for_rows`, as `work/stages.py` cuts a stage). Every participant imports Data-Juicer
and builds the operator first, then all are released at once: the stage time runs from that
release to the first participant that returns with the stage complete (`stage.json`), so what is
timed is the stage and not N imports of Data-Juicer fighting over this box's cores (the launch to
release time is kept in the details). The baseline is the same stage run by one participant; the
row reports the speed-up at the largest count. Checked, or the row is an error: every unit of the
stage was claimed once and run once (no stale claim under `units/`, every participant's own list
of the units it ran: a unit re-done after a takeover shows as a second run), every participant
reports the same stage record, and the kept rows are identical across participants and counts.

`dlc_elections`: `dlc_instances` `elastic-shard dlc` instances with the fake runner
(`tests/support/fake_worker.py launch`), one per node, started within one second, on one small
job; baseline: the same job with one instance. Checked: exactly one prepare and one finalize
coordinator (the "elected" lines of the instances' logs and the phase results, whose pid must be
the elected one's; no stale phase lock), all exit 0, the merged output byte-identical to the one
instance's. Reported: seconds from the first start to prepared (`prepare-result.json`), to every
instance working (its "Starting DLC worker" line, seen by polling the logs), to finalized
(`finalize-result.json`). One machine, one kernel clock: every wall time here is comparable.

`python bench/stage_scale_measure.py participant SPEC.json` is the participant process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

import orjson
from bench_data import _dedup_table, _dedup_text, _near_copy, _surface_copy
from bench_lib import PYTHON, REPO, Bench, BenchError, Result, progress

THIS = Path(__file__).resolve()
NAMES = ("stage_scale_exact", "stage_scale_minhash", "dlc_elections")
# Data-Juicer's own defaults for both operators (the minhash one: 256 permutations, Jaccard 0.7,
# window 5, bands and rows per band chosen by Data-Juicer), as a recipe that names them bare has.
STAGE_OPERATORS: dict[str, tuple[str, dict[str, Any]]] = {
    "exact": ("document_deduplicator", {}),
    "minhash": ("document_minhash_deduplicator", {}),
}
DUP_FRACTION = 0.15  # planted: a third exact copies, a third surface copies, a third near copies
# Participants' lease: long, since no participant is killed here; any takeover is then a finding.
LEASE_SECS, HEARTBEAT_SECS, POLL_SECS = 30.0, 1.0, 0.05
DLC_FLAGS = ("--poll-interval-secs", "0.2", "--lock-timeout-secs", "60", "--heartbeat-interval-secs", "2",
             "--coordinator-lease-secs", "30", "--wait-timeout-secs", "1200")  # fmt: skip
DLC_RECIPE = "project_name: dlc-elections\nprocess:\n  - whitespace_normalization_mapper:\n"
GATE_POLL_SECS = 0.005  # the dlc instances' start gate polls its go file this often
WORKING_LINE = "Starting DLC worker"


@dataclasses.dataclass(frozen=True)
class StageScaleSizes:
    """How big this module's rows are (`--quick` and the default differ only here)."""

    stage_rows: int  # tiny rows (a sentence or two) of the stage_scale input
    stage_shards: int  # shard files of that input on the volume
    stage_participants: tuple[int, ...]  # one participant per node; the first count is the baseline
    dlc_instances: int  # dlc instances (one per node) of dlc_elections; its baseline is one
    dlc_shards: int
    dlc_rows: int
    mode: str = "cached"  # the cluster's: "strict" turns Gluster's caches off


DEFAULT = StageScaleSizes(
    stage_rows=1_000_000, stage_shards=64, stage_participants=(1, 8, 32), dlc_instances=32, dlc_shards=64, dlc_rows=6_400
)
QUICK = dataclasses.replace(DEFAULT, stage_rows=20_000, stage_participants=(1, 2, 4), dlc_instances=4)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This module's flags (elastic_bench's parser; `sizes` reads them back)."""
    group = parser.add_argument_group("stage_scale and dlc_elections rows (GlusterFS test cluster)")
    group.add_argument("--stage-mode", choices=("cached", "strict"), help=f"cluster mode (default {DEFAULT.mode})")
    group.add_argument(
        "--stage-rows", type=int, help=f"stage_scale input rows (default {DEFAULT.stage_rows:,}, quick {QUICK.stage_rows:,})"
    )
    group.add_argument(
        "--stage-participants",
        help=f"participant counts, the first the baseline (default {','.join(map(str, DEFAULT.stage_participants))}, "
        f"quick {','.join(map(str, QUICK.stage_participants))})",
    )
    group.add_argument(
        "--dlc-instances",
        type=int,
        help=f"dlc_elections instances (default {DEFAULT.dlc_instances}, quick {QUICK.dlc_instances})",
    )


def sizes(args: argparse.Namespace) -> StageScaleSizes:
    """The sizes `add_arguments`' flags ask for, over the default or quick ones."""
    base = QUICK if getattr(args, "quick", False) else DEFAULT
    changes: dict[str, Any] = {}
    if args.stage_mode:
        changes["mode"] = args.stage_mode
    if args.stage_rows is not None:
        if args.stage_rows < base.stage_shards:
            raise ValueError(f"--stage-rows must be at least {base.stage_shards} (a row per shard)")
        changes["stage_rows"] = args.stage_rows
    if args.stage_participants:
        counts = tuple(int(n) for n in args.stage_participants.split(","))
        if not counts or not all(1 <= n <= 200 for n in counts):
            raise ValueError("--stage-participants takes participant counts of 1..200")
        changes["stage_participants"] = counts
    if args.dlc_instances is not None:
        if not 1 <= args.dlc_instances <= 200:
            raise ValueError("--dlc-instances takes 1..200")
        changes["dlc_instances"] = args.dlc_instances
    return dataclasses.replace(base, **changes)


# -- the input --------------------------------------------------------------------------------------


def write_tiny_shards(directory: Path, rows: int, shards: int, seed: int = 20261205) -> dict[str, int]:
    """`rows` rows `{"id", "text"}` of 8 to 16 words each (a sentence or two: even a near copy with
    three words deleted keeps the minhash window of 5, so every row has shingles; rows without any
    would all share every band and make one giant component), cut into `shards` JSONL files of consecutive rows;
    `DUP_FRACTION` are planted copies of an earlier row picked uniformly (usually in another
    shard): exact, surface (case/space/punctuation) and near (one to three words edited). Returns
    the count of each kind."""
    rng = random.Random(seed)
    table = _dedup_table()
    texts: list[str] = []
    counts = {"original": 0, "exact": 0, "surface": 0, "near": 0}
    directory.mkdir(parents=True, exist_ok=True)
    cut = [rows * i // shards for i in range(shards + 1)]
    for shard in range(shards):
        lines = []
        for i in range(cut[shard], cut[shard + 1]):
            if i and rng.random() < DUP_FRACTION:
                roll, source = rng.random(), texts[rng.randrange(i)]
                if roll < 1 / 3:
                    kind, text = "exact", source
                elif roll < 2 / 3:
                    kind, text = "surface", _surface_copy(rng, source)
                else:
                    kind, text = "near", _near_copy(rng, source, table)
            else:
                kind, text = "original", _dedup_text(rng, table, 8, 16)
            texts.append(text)
            counts[kind] += 1
            lines.append(orjson.dumps({"id": i, "text": text}) + b"\n")
        (directory / f"{shard:05d}.jsonl").write_bytes(b"".join(lines))
    return counts


# -- the participant process -------------------------------------------------------------------------


def participant_main(spec_path: str) -> int:
    """One participant (see the module docstring); prints one JSON line on stdout."""
    import numpy as np

    from elastic_sharding.dedup.cooperate import StageParticipant
    from elastic_sharding.dedup.rules import DedupRule
    from elastic_sharding.dedup.stage import DedupPlan, DedupStage
    from elastic_sharding.errors import ElasticShardError

    spec = json.loads(Path(spec_path).read_text())
    shards = [Path(s) for s in spec["shards"]]
    rule = DedupRule(spec["rule"], spec["args"])
    op = rule.build()  # imports Data-Juicer: before the release, on every participant alike
    stage = DedupStage(Path(spec["root"]), DedupPlan(rule, len(shards), spec["bucket_parts"], spec["node_parts"]))

    def rows_of(shard_index: int) -> list[dict]:
        return [orjson.loads(line) for line in shards[shard_index].read_bytes().splitlines()]

    participant = StageParticipant(stage, rows_of, spec["lease_secs"], spec["heartbeat_secs"], spec["poll_secs"], op=op)
    ran: list[list[Any]] = []  # [unit, started, finished (None: it raised)], wall clock
    guarded = participant.shared.guarded

    def recorded(do: Any) -> Any:
        """Every unit whose work starts here is listed, whether it then publishes or not: a unit
        done twice (a takeover of a live claim) shows in two participants' lists."""

        def run(name: str) -> bytes:
            entry: list[Any] = [name, time.time(), None]
            ran.append(entry)
            result = do(name)
            entry[2] = time.time()
            return result

        return guarded(run)

    participant.shared.guarded = recorded  # type: ignore[method-assign]
    ready_at = time.time()
    Path(spec["ready"], f"{os.uname().nodename}-{os.getpid()}").touch()
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.005)
    released_at = time.time()
    try:
        done = participant.run()
    except ElasticShardError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    done_at = time.time()
    digest, kept, base = hashlib.sha256(), 0, 0
    for shard_index, shard in enumerate(shards):
        rows = shard.read_bytes().count(b"\n")
        keep = np.ones(rows, dtype=bool)
        keep[stage.drops(shard_index, done.final_round)] = False
        indices = (base + np.flatnonzero(keep)).astype("<i8")
        digest.update(indices.tobytes())
        kept, base = kept + len(indices), base + rows
    report = {
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "ready_at": ready_at,
        "released_at": released_at,
        "done_at": done_at,
        "record": dataclasses.asdict(done),
        "ran": ran,
        "rows": base,
        "kept": kept,
        "kept_sha256": digest.hexdigest(),
    }
    print(json.dumps(report))
    return 0


# -- the cluster -------------------------------------------------------------------------------------

# What a node prints about a stage's `units/` (the bench process cannot see the volume): per unit
# its result's and its claim's holder, and how many stale claims it has (each is a takeover).
_UNITS_SNIPPET = """import json, os, sys
units = sys.argv[1]
out, temps = {}, []
for name in sorted(os.listdir(units)):
    if name.startswith("."):  # a temporary file of a publish or a heartbeat (fsops._temp_name)
        temps.append(name)
        continue
    unit, _, rest = name.partition(".")
    entry = out.setdefault(unit, {"result": None, "claim": None, "stale_claims": 0})
    if rest == "json" or rest == "lock":
        record = json.load(open(os.path.join(units, name)))
        entry["result" if rest == "json" else "claim"] = [record.get("host"), record.get("pid")]
    elif rest.startswith("lock."):
        entry["stale_claims"] += 1
done = os.path.exists(os.path.join(os.path.dirname(units), "stage.json"))
print(json.dumps({"units": out, "stage_done": done, "temporary_files": temps}))
"""


def _cluster_module() -> Any:
    """`tests/support/cluster.py` (the bench imports it from the checkout's tests)."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support import cluster

    return cluster


class _Procs:
    """The node processes this measurement started: each in its own session, so that a failure
    stops exactly their process groups (the cluster's `down()` then removes whatever is left)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[IO[bytes]] = []

    def start(self, node: Any, argv: list[str], stdout: Path, stderr: Path) -> subprocess.Popen[bytes]:
        out, err = open(stdout, "wb"), open(stderr, "wb")
        self.files += [out, err]
        proc = node.popen(argv, cwd=REPO, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        for handle in self.files:
            handle.close()
        self.procs, self.files = [], []


def _wait_all(procs: list[subprocess.Popen[bytes]], logs: list[Path], what: str, timeout: float) -> dict[int, float]:
    """Each process's exit time (wall clock); a non-zero exit or the timeout is a BenchError."""
    ended: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(ended) < len(procs):
        for i, proc in enumerate(procs):
            if i in ended or proc.poll() is None:
                continue
            ended[i] = time.time()
            if proc.returncode != 0:
                tail = logs[i].read_text(errors="replace")[-3000:]
                raise BenchError(f"{what}: participant {i + 1} exited {proc.returncode}; see {logs[i]}\n{tail}")
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: still running after {timeout:.0f}s")
        time.sleep(0.02)
    return ended


def _secs(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


# -- stage_scale -------------------------------------------------------------------------------------


def _stage_run(
    b: Bench, cluster: Any, d: Path, kind: str, shards: list[Path], plan: dict[str, int], participants: int
) -> dict[str, Any]:
    """One stage run by `participants` participants on nodes 1..N; its timings and audit."""
    rule, args = STAGE_OPERATORS[kind]
    tag = f"{kind}-p{participants}"
    root = cluster.mount / f"stage-{tag}"
    ready, go = d / f"ready-{tag}", d / f"go-{tag}"
    ready.mkdir()
    spec = d / f"spec-{tag}.json"
    spec.write_text(json.dumps({
        "root": str(root), "rule": rule, "args": args, "shards": [str(s) for s in shards], **plan,
        "lease_secs": LEASE_SECS, "heartbeat_secs": HEARTBEAT_SECS, "poll_secs": POLL_SECS,
        "ready": str(ready), "go": str(go),
    }))  # fmt: skip
    procs = _Procs()
    outs = [b.logs / f"stage-{tag}-{i + 1}.json" for i in range(participants)]
    logs = [b.logs / f"stage-{tag}-{i + 1}.log" for i in range(participants)]
    progress(f"stage_scale {kind}: {participants} participant(s), {plan}")
    try:
        launched = time.time()
        running = [
            procs.start(cluster.nodes[i], [PYTHON, str(THIS), "participant", str(spec)], outs[i], logs[i])
            for i in range(participants)
        ]
        deadline = time.monotonic() + b.timeout
        while len(list(ready.iterdir())) < participants:
            for i, proc in enumerate(running):
                if proc.poll() is not None:
                    tail = logs[i].read_text(errors="replace")[-3000:]
                    raise BenchError(f"stage {tag}: participant {i + 1} exited {proc.returncode} before the release\n{tail}")
            if time.monotonic() > deadline:
                raise BenchError(f"stage {tag}: participants not ready after {b.timeout:.0f}s")
            time.sleep(0.02)
        released = time.time()
        go.touch()
        _wait_all(running, logs, f"stage {tag}", b.timeout)
    finally:
        procs.stop()
    reports = [json.loads(out.read_text().strip().splitlines()[-1]) for out in outs]
    audit = json.loads(cluster.nodes[0].run([PYTHON, "-c", _UNITS_SNIPPET, str(root / "units")], timeout=300, check=True).stdout)
    cluster.nodes[0].run(["rm", "-rf", str(root)], timeout=600)
    done_at = min(r["done_at"] for r in reports)
    return {
        "participants": participants,
        "stage_secs": done_at - released,
        "launch_to_release_secs": released - launched,
        "launch_to_done_secs": done_at - launched,
        "release_spread_secs": max(r["released_at"] for r in reports) - released,
        "last_return_secs": max(r["done_at"] for r in reports) - released,
        "hosts": sorted(r["host"] for r in reports),
        "phases": _phases(reports, released),
        "reports": reports,
        "audit": audit,
    }


def _phases(reports: list[dict[str, Any]], released: float) -> dict[str, dict[str, float]]:
    """Per phase (keys, buckets, components-rNNNN) from the participants' unit timings: its units,
    its window in seconds after the release and the summed seconds of its units (where the
    stage's time goes, and how long each barrier waits for a phase's last unit)."""
    phases: dict[str, dict[str, float]] = {}
    for report in reports:
        for name, started, finished in report["ran"]:
            phase = name.rsplit("-", 1)[0]
            end = finished if finished is not None else started
            p = phases.setdefault(phase, {"units": 0, "start": started - released, "end": end - released, "unit_secs": 0.0})
            p["units"] += 1
            p["start"], p["end"] = min(p["start"], started - released), max(p["end"], end - released)
            p["unit_secs"] += end - started
    return dict(sorted(phases.items(), key=lambda item: item[1]["start"]))


def _phase_text(phases: dict[str, dict[str, float]]) -> str:
    rounds = [p for name, p in phases.items() if name.startswith("components")]
    parts = [
        f"{name} {p['units']:.0f} at {p['start']:.2f}-{p['end']:.2f} ({p['unit_secs']:.2f})"
        for name, p in phases.items()
        if not name.startswith("components")
    ]
    if rounds:
        parts.append(
            f"{len(rounds)} components rounds at {rounds[0]['start']:.2f}-{rounds[-1]['end']:.2f} "
            f"({sum(p['unit_secs'] for p in rounds):.2f})"
        )
    return ", ".join(parts)


def _check_stage(run: dict[str, Any]) -> dict[str, Any]:
    """What one run's participants and `units/` say (module docstring); the problems found."""
    reports, units = run["reports"], run["audit"]["units"]
    ran: dict[str, int] = {}
    for report in reports:
        for name, _, _ in report["ran"]:
            ran[name] = ran.get(name, 0) + 1
    record = reports[0]["record"]
    problems = []
    if not run["audit"]["stage_done"]:
        problems.append("no stage.json")
    if any(r["record"] != record for r in reports):
        problems.append(f"participants report different stage records: {[r['record'] for r in reports]}")
    if len({(r["kept"], r["kept_sha256"]) for r in reports}) != 1:
        problems.append(f"participants read different kept rows: {[(r['host'], r['kept']) for r in reports]}")
    missing = sorted(name for name, entry in units.items() if entry["result"] is None)
    twice = {name: count for name, count in ran.items() if count > 1}
    taken_over = {name: entry["stale_claims"] for name, entry in units.items() if entry["stale_claims"]}
    never_ran = sorted(name for name in units if name not in ran)
    unknown = sorted(name for name in ran if name not in units)
    not_holder = sorted(
        name for name, entry in units.items() if entry["claim"] and entry["result"] and entry["claim"] != entry["result"]
    )
    for what, found in (
        ("units without a result", missing),
        ("units run more than once (no participant crashed)", twice),
        ("units taken over (stale claims; no participant crashed)", taken_over),
        ("units with a result that no participant ran", never_ran),
        ("units run that left no files", unknown),
        ("units published by another process than their claim's", not_holder),
    ):
        if found:
            problems.append(f"{what}: {found if len(found) <= 10 else f'{len(found)}, e.g. {sorted(found)[:10]}'}")
    per_host: dict[str, int] = {report["host"]: len(report["ran"]) for report in reports}
    return {
        "units": len(units),
        "units_run_once": sum(1 for count in ran.values() if count == 1),
        "stale_claims": sum(taken_over.values()),
        "units_per_participant": per_host,
        "temporary_files_left": run["audit"].get("temporary_files", []),
        "record": record,
        "kept": reports[0]["kept"],
        "kept_sha256": reports[0]["kept_sha256"],
        "problems": problems,
    }


def _public(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k not in ("reports", "audit")}


def _measure_stage_kind(b: Bench, s: StageScaleSizes, cluster: Any, d: Path, shards: list[Path], kind: str) -> Result:
    from elastic_sharding.dedup.rules import DedupRule
    from elastic_sharding.dedup.stage import DedupPlan

    rule = DedupRule(*STAGE_OPERATORS[kind])
    cut = DedupPlan.for_rows(rule, rule.fanout(rule.build()), len(shards), s.stage_rows)
    plan = {"bucket_parts": cut.bucket_parts, "node_parts": cut.node_parts}
    runs = [_stage_run(b, cluster, d, kind, shards, plan, n) for n in s.stage_participants]
    checks = {run["participants"]: _check_stage(run) for run in runs}
    base, top = runs[0], runs[-1]
    problems = [f"{n} participant(s): {p}" for n, c in checks.items() for p in c["problems"]]
    reference = checks[base["participants"]]
    for n, c in checks.items():
        if (c["kept"], c["kept_sha256"], c["record"]) != (reference["kept"], reference["kept_sha256"], reference["record"]):
            problems.append(
                f"{n} participant(s) kept {c['kept']:,} rows (sha256 {c['kept_sha256'][:12]}, {c['record']}), "
                f"{base['participants']} kept {reference['kept']:,} ({reference['kept_sha256'][:12]}, {reference['record']})"
            )
    if problems:
        raise BenchError(f"stage_scale_{kind}: " + "; ".join(problems))
    rule_name, args = STAGE_OPERATORS[kind]
    details = {
        "operator": {rule_name: args},
        "rows": s.stage_rows,
        "shards": len(shards),
        "plan": plan,
        "cluster_mode": s.mode,
        "cores": os.cpu_count(),
        "runs": [_public(run) for run in runs],
        "checks": {str(n): c for n, c in checks.items()},
        "speedups": {str(run["participants"]): base["stage_secs"] / run["stage_secs"] for run in runs},
    }
    cores = os.cpu_count() or 1
    label = (
        f"{kind} stage alone, {s.stage_rows:,} tiny rows, {len(shards)} shards: {top['participants']} vs "
        f"{base['participants']} participant(s) (t1 / tN; {cores} cores here: CPU-bound speed-up capped near {cores})"
    )
    r = Result.speedup(f"stage_scale_{kind}", label, top["stage_secs"], base["stage_secs"], None, details)
    r.details["shown"] = {
        "ours": ", ".join(f"{_secs(run['stage_secs'])} ({run['participants']}p)" for run in runs[1:]),
        "baseline": f"{_secs(base['stage_secs'])} (1p)" if base["participants"] == 1 else _secs(base["stage_secs"]),
    }
    r.details["notes"] = (
        [
            f"{run['participants']} participant(s): stage {_secs(run['stage_secs'])} (speed-up "
            f"{details['speedups'][str(run['participants'])]:.2f}x), launch to release {_secs(run['launch_to_release_secs'])}, "
            f"last participant back {_secs(run['last_return_secs'])} after release; "
            f"{checks[run['participants']]['units']} units each claimed and run once, units per participant "
            f"{sorted(checks[run['participants']]['units_per_participant'].values(), reverse=True)}"
            for run in runs
        ]
        + [
            f"{run['participants']} participant(s), phases (units, seconds after the release, summed seconds of the units' "
            f"work): {_phase_text(run['phases'])}"
            for run in runs
        ]
        + [f"kept {reference['kept']:,} of {s.stage_rows:,} rows, identical at every participant count; plan {plan}"]
    )
    return r


# -- dlc_elections -----------------------------------------------------------------------------------


def _dlc_run(
    b: Bench, cluster: Any, d: Path, tag: str, instances: int, dataset: Path, recipe: Path, s: StageScaleSizes
) -> dict[str, Any]:
    """One `dlc` submission by `instances` instances on nodes 1..N, started together."""
    from elastic_sharding.claims.submission import run_hash
    from elastic_sharding.layout import coordination_root

    fake_worker = REPO / "tests" / "support" / "fake_worker.py"
    job, output, run_id = cluster.mount / f"dlc-{tag}", cluster.mount / f"dlc-{tag}-merged.jsonl", f"bench-{tag}"
    argv = [PYTHON, str(fake_worker), "launch", "dlc", "--config", str(recipe), "--dataset-path", str(dataset),
            "--job-dir", str(job), "--num-shards", str(s.dlc_shards), "--run-id", run_id, "--output", str(output),
            *DLC_FLAGS]  # fmt: skip
    logs = [b.logs / f"dlc-{tag}-{i + 1}.log" for i in range(instances)]
    procs = _Procs()
    progress(f"dlc_elections: {instances} instance(s), {s.dlc_shards} shards")
    working: dict[int, float] = {}
    try:
        # Forking 32 nsenters from this 2-core box takes 2-3 s under load: each instance first
        # waits (a shell, on the local disk) for one go file, then execs `dlc`: they start within
        # the gate's 5 ms poll of each other, as 32 pods created at once would.
        go = b.work / "dlc-go" / tag
        go.parent.mkdir(parents=True, exist_ok=True)
        gated = ["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.005; done; exec "$@"', str(go), *argv]
        running = [procs.start(cluster.nodes[i], gated, b.logs / f"dlc-{tag}-{i + 1}.out", logs[i]) for i in range(instances)]
        time.sleep(1.0)  # every gate shell running
        go.touch()
        first = time.time()
        starts = [first, first + GATE_POLL_SECS]
        deadline = time.monotonic() + b.timeout
        while any(proc.poll() is None for proc in running) or len(working) < instances:
            now = time.time()
            for i in range(instances):
                if i not in working and WORKING_LINE in logs[i].read_text(errors="replace"):
                    working[i] = now
            if all(proc.poll() is not None for proc in running):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"dlc {tag}: still running after {b.timeout:.0f}s")
            time.sleep(0.05)
        failed = {i + 1: proc.returncode for i, proc in enumerate(running) if proc.returncode != 0}
        if failed:
            i = next(iter(failed)) - 1
            raise BenchError(
                f"dlc {tag}: instances exited {failed}; see {logs[i]}\n{logs[i].read_text(errors='replace')[-3000:]}"
            )
    finally:
        procs.stop()
    gen = coordination_root(job) / run_hash(run_id)
    node = cluster.nodes[0]
    results = {phase: orjson.loads(node.read_bytes(gen / f"{phase}-result.json")) for phase in ("prepare", "finalize")}
    stale = node.run(["ls", "-A", str(gen / "stale")], timeout=60, check=True).stdout.split()
    texts = [log.read_text(errors="replace") for log in logs]
    elected = {
        phase: [i + 1 for i, text in enumerate(texts) if f"elected as DLC {phase} coordinator" in text]
        for phase in ("prepare", "finalize")
    }
    elections = {phase: sum(text.count(f"elected as DLC {phase} coordinator") for text in texts) for phase in elected}
    merged = node.read_bytes(output)
    node.run(["rm", "-rf", str(job), str(output), str(coordination_root(job))], timeout=600)
    return {
        "instances": instances,
        "start_spread_secs": starts[-1] - first,
        "prepared_secs": results["prepare"]["at"] - first,
        "all_working_secs": max(working.values()) - first if len(working) == instances else None,
        "finalized_secs": results["finalize"]["at"] - first,
        "elections": elections,
        "elected_instances": elected,
        "coordinators": {p: [r["host"], r["details"].get("pid")] for p, r in results.items()},
        # nsenter and sh exec, so each Popen's pid is the instance's own: the one a result names
        "instances_at": [[cluster.nodes[i].name, proc.pid] for i, proc in enumerate(running)],
        "phases_ok": {p: r["ok"] for p, r in results.items()},
        "stale_phase_locks": stale,
        "working_seen": len(working),
        "merged_bytes": len(merged),
        "merged_sha256": hashlib.sha256(merged).hexdigest(),
    }


def _measure_dlc(b: Bench, s: StageScaleSizes, cluster: Any, d: Path) -> Result:
    from bench_data import write_tiny_dataset

    local = write_tiny_dataset(d / "dlc-input.jsonl", s.dlc_rows)
    dataset = cluster.mount / "dlc-input.jsonl"
    cluster.nodes[0].run(["cp", str(local), str(dataset)], timeout=600, check=True)
    recipe = d / "dlc-recipe.yaml"
    recipe.write_text(DLC_RECIPE)
    one = _dlc_run(b, cluster, d, "one", 1, dataset, recipe, s)
    many = _dlc_run(b, cluster, d, "many", s.dlc_instances, dataset, recipe, s)
    problems = []
    for run in (one, many):
        n = run["instances"]
        if run["elections"] != {"prepare": 1, "finalize": 1}:
            problems.append(f"{n} instance(s): elections {run['elections']} (instances {run['elected_instances']})")
        if not all(run["phases_ok"].values()):
            problems.append(f"{n} instance(s): phase results {run['phases_ok']}")
        if run["stale_phase_locks"]:
            problems.append(f"{n} instance(s): phase taken over: {run['stale_phase_locks']}")
        for phase, (host, pid) in run["coordinators"].items():
            chosen = [run["instances_at"][i - 1] for i in run["elected_instances"][phase]]
            if chosen != [[host, pid]]:
                problems.append(f"{n} instance(s): the {phase} result names {host} pid {pid}, the logs elected {chosen}")
        if run["working_seen"] != n:
            problems.append(f"{n} instance(s): only {run['working_seen']} logged {WORKING_LINE!r}")
    if many["start_spread_secs"] > 1.0:
        problems.append(f"the {s.dlc_instances} instances took {many['start_spread_secs']:.2f}s to start (not within 1 s)")
    if (many["merged_bytes"], many["merged_sha256"]) != (one["merged_bytes"], one["merged_sha256"]):
        problems.append(f"merged output differs: {many['merged_bytes']:,} vs one instance's {one['merged_bytes']:,} bytes")
    if problems:
        raise BenchError("dlc_elections: " + "; ".join(problems))
    details = {"shards": s.dlc_shards, "rows": s.dlc_rows, "cluster_mode": s.mode, "flags": list(DLC_FLAGS),
               "one": one, "many": many}  # fmt: skip
    label = f"dlc, {s.dlc_shards} shards, fake runner: {s.dlc_instances} instances vs 1, first start to finalized"
    r = Result.times("dlc_elections", label, many["finalized_secs"], one["finalized_secs"], None, details)

    def phases(run: dict[str, Any]) -> str:
        return f"prep {run['prepared_secs']:.1f}, work {run['all_working_secs']:.1f}, final {run['finalized_secs']:.1f} s"

    r.details["shown"] = {"ours": f"{phases(many)} ({s.dlc_instances} inst)", "baseline": f"{phases(one)} (1 inst)"}
    r.details["notes"] = [
        f"{s.dlc_instances} instances started within {many['start_spread_secs']:.2f}s; one prepare coordinator "
        f"({many['coordinators']['prepare'][0]}), one finalize coordinator ({many['coordinators']['finalize'][0]}), "
        f"all exited 0, merged output identical to one instance's ({many['merged_bytes']:,} bytes)",
        f"seconds from the first start: prepared {many['prepared_secs']:.2f} (1 instance: {one['prepared_secs']:.2f}), "
        f"every instance working {many['all_working_secs']:.2f} ({one['all_working_secs']:.2f}), finalized "
        f"{many['finalized_secs']:.2f} ({one['finalized_secs']:.2f})",
    ]
    return r


# -- the rows ----------------------------------------------------------------------------------------


def measure_stage_scale(b: Bench, general: Any, wanted: tuple[str, ...]) -> list[Result]:
    """The wanted rows of this module on one cluster of as many nodes as the largest count needs,
    sized by `b.shared["stage_scale"]` (`sizes`; the general `Sizes` do not apply). A row that
    fails is reported as its error and the others still run; the cluster and every process
    started on it are removed whatever happens."""
    s: StageScaleSizes = b.shared.get("stage_scale") or DEFAULT
    cluster_module = _cluster_module()
    reason = cluster_module.cluster_available()
    if reason is not None:
        raise BenchError(f"stage_scale/dlc_elections need the GlusterFS test cluster: {reason}")
    d = b.work / "stage_scale"
    d.mkdir(parents=True, exist_ok=True)
    stage_kinds = [kind for kind in STAGE_OPERATORS if f"stage_scale_{kind}" in wanted]
    nodes = max([*(s.stage_participants if stage_kinds else ()), *((s.dlc_instances,) if "dlc_elections" in wanted else ())])
    cluster = cluster_module.Cluster(nodes=nodes, mode=s.mode, workdir=d)
    results: list[Result] = []
    try:
        progress(f"stage_scale: GlusterFS cluster of {nodes} node(s), mode {s.mode}")
        cluster.up()
        progress(f"stage_scale: cluster up in {cluster.timings['up']:.1f}s at {cluster.mount}")
        if stage_kinds:
            planted = write_tiny_shards(d / "input", s.stage_rows, s.stage_shards)
            cluster.nodes[0].run(["cp", "-r", str(d / "input"), str(cluster.mount / "input")], timeout=1800, check=True)
            shards = [cluster.mount / "input" / f"{i:05d}.jsonl" for i in range(s.stage_shards)]
            progress(f"stage_scale: {s.stage_rows:,} rows in {s.stage_shards} shards on the volume, planted {planted}")
            for kind in stage_kinds:
                results.append(_guarded(f"stage_scale_{kind}", lambda k=kind: _measure_stage_kind(b, s, cluster, d, shards, k)))
                results[-1].details["planted"] = planted
        if "dlc_elections" in wanted:
            results.append(_guarded("dlc_elections", lambda: _measure_dlc(b, s, cluster, d)))
    finally:
        cluster.down()
    return results


def _guarded(name: str, measure: Any) -> Result:
    """One row's measurement; its failure becomes the row's error."""
    try:
        return measure()
    except (BenchError, OSError, RuntimeError, ValueError, KeyError, ZeroDivisionError, subprocess.SubprocessError) as exc:
        text = str(exc) if isinstance(exc, BenchError) else traceback.format_exc()
        progress(f"{name} failed: {text}")
        return Result(name, name, None, None, None, None, "", "", None, error=text)


if __name__ == "__main__":
    if sys.argv[1:2] != ["participant"] or len(sys.argv) != 3:
        sys.exit("usage: stage_scale_measure.py participant SPEC.json")
    sys.exit(participant_main(sys.argv[2]))
