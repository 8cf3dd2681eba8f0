"""The `coordination` rows: claiming across many nodes that share only a network filesystem.

Every run is on the GlusterFS test cluster (`tests/support/cluster.py`): one server, N "nodes" of
their own (hostname, network link, FUSE client), the job directory on the shared volume. One
`bench/passthrough_worker.py` per node, with the settings a worker has under `dlc`/`local` (lease
600 s, poll 2 s), sleeps `sleep` seconds a shard and copies its input: the cost measured is the
coordination, and the nodes sharing this box's two cores do not slow each other's "work". The
workers of a run start together once all of them have imported (`--ready-file`/`--go-file`).

- `coordination_makespan_<n>`: makespan (first claim to last completion, `bench_lib.span`) of S
  shards of `sleep` seconds on n nodes, against the ideal S x sleep / n. One node runs fewer
  shards by default (its ideal is linear: the full count would take half an hour).
- `coordination_fsops`: what the server saw, by GlusterFS's own `volume profile` (per-fop call
  counts on the bricks, cleared right before the workers start): metadata operations (every fop
  but READ and WRITE) per shard at 32 nodes / at 8. Coordination that scans or races more with
  more nodes shows as a ratio above 1.
- `coordination_idle`: metadata operations per second while nothing is claimable: workers that
  hold a shard for a long time (they heartbeat) and idle workers (they poll), at 32 nodes and, if
  a 64-node cluster comes up on this box, at 64 (else projected from the 32-node rates).
- `coordination_cluster_<n>`: what the test cluster itself costs (bring-up, tear-down, memory
  per node and of the server), to size runs on this box.

The sizes are `CoordinationSizes` (its own flags, `add_arguments`), separate from
`bench_measures.Sizes`, so that these rows can grow without touching every other measure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_data import CPU_OPS, write_recipe, write_tiny_dataset
from bench_lib import PYTHON, REPO, Bench, BenchError, Result, _die_with_parent, _tail, completions, progress, span

from elastic_sharding.settings import LAUNCHER_LOCK_TIMEOUT, LAUNCHER_POLL_INTERVAL

sys.path.insert(0, str(REPO / "tests"))
from support import cluster as gluster  # noqa: E402

PASSTHROUGH = Path(__file__).resolve().parent / "passthrough_worker.py"
MAKESPAN_NAMES = ("coordination_makespan_1", "coordination_makespan_8", "coordination_makespan_16", "coordination_makespan_32")
CLUSTER_NAMES = ("coordination_cluster_16", "coordination_cluster_32")
NAMES = (*MAKESPAN_NAMES, "coordination_fsops", "coordination_idle", *CLUSTER_NAMES)
# Which of `CoordinationSizes.nodes` each row is measured at (the names say the default sizes).
FSOPS_SLOTS = (1, 3)  # 8 and 32 nodes
CLUSTER_SLOTS = {"coordination_cluster_16": 2, "coordination_cluster_32": 3}
IDLE_SLOT = 3
MAKESPAN_TARGET, FSOPS_TARGET, IDLE_TARGET_OPS = "1.10", "1.3", 200.0
TAIL_SETTLE_SECS = 60.0  # after the tail job's last completion, before its idle window
DATA_FOPS = frozenset({"READ", "WRITE"})  # every other fop counts as a metadata operation
MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class CoordinationSizes:
    """How big the coordination rows are; `--quick` and the default differ only here."""

    nodes: tuple[int, int, int, int] = (1, 8, 16, 32)  # the four makespan rows, in the order of MAKESPAN_NAMES
    shards: int = 4000
    single_node_shards: int | None = 400  # the one-node run (None: `shards`); its ideal is linear
    sleep: float = 0.5  # simulated work per shard
    mode: str = "cached"  # the cluster's mode (tests/support/cluster.py): "cached" (a NAS) or "strict"
    lease: float = LAUNCHER_LOCK_TIMEOUT
    poll: float = LAUNCHER_POLL_INTERVAL
    idle_window: float = 60.0  # seconds of each idle measurement
    idle_hold: float = 3600.0  # how long a busy worker's shard "runs" (it is stopped after the window)
    tail_shards: int = 1000  # the idle-at-the-tail variant: all done but one
    try_nodes: int = 64  # the idle row's larger cluster, if this box can build it (0: project only)
    # The next shard processed while the current one publishes, as the default (warm) runner does
    # (`passthrough_worker.OverlappingRunner`); False: each shard's claim, collect and publish come
    # between two shards' work, as with the process runner.
    overlap: bool = True

    def run_shards(self, nodes: int) -> int:
        """Shards of the run on `nodes` nodes: fewer on one node, never more than `shards`."""
        if nodes == 1 and self.single_node_shards:
            return min(self.single_node_shards, self.shards)
        return self.shards


DEFAULT = CoordinationSizes()
QUICK = CoordinationSizes(
    nodes=(1, 2, 3, 4),
    shards=100,
    single_node_shards=50,
    sleep=0.1,
    idle_window=31.0,  # just over one heartbeat interval (lease 600 s: every 30 s), else busy workers show 0
    idle_hold=600.0,
    tail_shards=40,
    try_nodes=8,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The coordination rows' flags (elastic_bench's parser; `sizes` reads them back)."""
    group = parser.add_argument_group("coordination rows (GlusterFS test cluster)")
    group.add_argument("--coordination-mode", choices=gluster.MODES, help=f"cluster mode (default {DEFAULT.mode})")
    group.add_argument(
        "--coordination-nodes",
        help=f"four node counts for the makespan rows (default {','.join(map(str, DEFAULT.nodes))}, "
        f"quick {','.join(map(str, QUICK.nodes))}); the fsops row compares the 2nd and 4th, idle runs at the 4th",
    )
    group.add_argument(
        "--coordination-shards", type=int, help=f"shards per run (default {DEFAULT.shards:,}, quick {QUICK.shards})"
    )
    group.add_argument(
        "--coordination-single-node-full",
        action="store_true",
        help=f"the one-node run takes every shard too (default: {DEFAULT.single_node_shards}, quick {QUICK.single_node_shards})",
    )
    group.add_argument(
        "--coordination-sleep", type=float, help=f"seconds of simulated work per shard (default {DEFAULT.sleep:g})"
    )
    group.add_argument("--coordination-lease", type=float, help=f"workers' --lock-timeout-secs (default {DEFAULT.lease:g})")
    group.add_argument("--coordination-poll", type=float, help=f"workers' --poll-interval-secs (default {DEFAULT.poll:g})")
    group.add_argument(
        "--coordination-idle-window", type=float, help=f"seconds per idle measurement (default {DEFAULT.idle_window:g})"
    )
    group.add_argument(
        "--coordination-no-overlap",
        action="store_true",
        help="workers publish a shard before the next one's work begins (the process runner's way; default: the warm runner's overlap)",
    )
    group.add_argument(
        "--coordination-try-nodes",
        type=int,
        help=f"the idle row's larger cluster (default {DEFAULT.try_nodes}, quick {QUICK.try_nodes}; 0: project it)",
    )


def sizes(args: argparse.Namespace) -> CoordinationSizes:
    """The sizes `add_arguments`' flags ask for, over the default or quick ones."""
    base = QUICK if getattr(args, "quick", False) else DEFAULT
    changes: dict[str, Any] = {}
    if args.coordination_mode:
        changes["mode"] = args.coordination_mode
    if getattr(args, "coordination_no_overlap", False):
        changes["overlap"] = False
    if args.coordination_nodes:
        nodes = tuple(int(n) for n in args.coordination_nodes.split(","))
        if len(nodes) != 4 or not all(1 <= n <= 200 for n in nodes):
            raise ValueError("--coordination-nodes takes four node counts of 1..200")
        changes["nodes"] = nodes
    for flag, key in (
        ("coordination_shards", "shards"),
        ("coordination_sleep", "sleep"),
        ("coordination_lease", "lease"),
        ("coordination_poll", "poll"),
        ("coordination_idle_window", "idle_window"),
        ("coordination_try_nodes", "try_nodes"),
    ):
        if getattr(args, flag) is not None:
            changes[key] = getattr(args, flag)
    if args.coordination_single_node_full:
        changes["single_node_shards"] = None
    return dataclasses.replace(base, **changes)


# -- GlusterFS's profile ---------------------------------------------------------------------------

# A row of a fop table: %-latency, avg, min, max (each with its unit), calls, fop.
_FOP_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\w+\s+[\d.]+\s+\w+\s+[\d.]+\s+\w+\s+(\d+)\s+([A-Z_]+)\s*$")


def parse_profile(text: str) -> dict[str, int]:
    """Per-fop call counts of `gluster volume profile VOL info cumulative`, summed over the bricks.

    Only "Cumulative Stats" tables count: plain `info` prints each brick's cumulative table and
    then an "Interval N Stats" table of the same calls (summing both would count them twice). The
    text is parsed, not `--xml`: the XML leaves out the fops without latency (RELEASE,
    RELEASEDIR, FORGET), which are still calls the server handles.
    """
    counts: Counter[str] = Counter()
    bricks = 0
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Brick:"):
            bricks += 1
            section = ""
        elif stripped.endswith("Stats:"):
            section = stripped
        elif section == "Cumulative Stats:" and (match := _FOP_ROW.match(line)):
            counts[match[2]] += int(match[1])
    if bricks == 0:
        raise BenchError(f"no brick in the volume profile:\n{text[-2000:]}")
    return dict(counts)


def metadata_ops(fops: dict[str, int]) -> int:
    return sum(n for fop, n in fops.items() if fop not in DATA_FOPS)


def data_ops(fops: dict[str, int]) -> int:
    return sum(n for fop, n in fops.items() if fop in DATA_FOPS)


class Profile:
    """The volume's server-side profile: started once per cluster, cleared before each measured span."""

    def __init__(self, cluster: gluster.Cluster):
        self.cluster = cluster
        self._gluster("volume", "profile", gluster.VOLUME, "start")

    def _gluster(self, *args: str) -> str:
        proc = self.cluster.gluster(*args)
        if proc.returncode != 0:
            raise BenchError(f"gluster {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
        return proc.stdout

    def clear(self) -> None:
        self._gluster("volume", "profile", gluster.VOLUME, "info", "clear")

    def read(self) -> dict[str, int]:
        return parse_profile(self._gluster("volume", "profile", gluster.VOLUME, "info", "cumulative"))


# -- memory ----------------------------------------------------------------------------------------


def _rss(pid: int) -> int:
    """VmRSS of a process in bytes (0 once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cluster_memory(cluster: gluster.Cluster) -> dict[str, Any]:
    """RSS of the cluster's own processes, found by its namespaces (never by name): per node its
    glusterfs client and namespace anchor (a worker there is counted apart), and the server's
    glusterd and brick process (glusterfsd) apart from the rest."""
    per_node: list[int] = []
    workers: list[int] = []
    for node in cluster.nodes:
        assert node.anchor is not None
        node_bytes = 0
        for pid in gluster._pids_in(gluster._ns_ids(node.anchor.pid)):
            if _comm(pid) in ("glusterfs", "sleep"):
                node_bytes += _rss(pid)
            else:
                workers.append(_rss(pid))
        per_node.append(node_bytes)
    server: Counter[str] = Counter()
    assert cluster.server_anchor is not None
    for pid in gluster._pids_in(gluster._ns_ids(cluster.server_anchor.pid)):
        comm = _comm(pid)
        server[comm if comm in ("glusterd", "glusterfsd") else "other"] += _rss(pid)
    return {
        "node_mb_mean": sum(per_node) / len(per_node) / MB,
        "node_mb_max": max(per_node) / MB,
        "server_mb": {k: v / MB for k, v in server.items()},
        "worker_mb_mean": sum(workers) / len(workers) / MB if workers else None,
        "workers_seen": len(workers),
    }


# -- one run: one passthrough worker per node ------------------------------------------------------


class Fleet:
    """One passthrough worker on each of some nodes of a cluster, lined up to start together."""

    def __init__(self, b: Bench, cluster: gluster.Cluster, name: str, job: Path, cs: CoordinationSizes):
        self.b, self.cluster, self.name, self.job, self.cs = b, cluster, name, job, cs
        self.lineup = b.work / "coordination" / "lineup" / name
        self.lineup.mkdir(parents=True)
        self.go = self.lineup / "go"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.started: float | None = None  # monotonic, when the first worker was started

    def start(self, nodes: list[gluster.Node], sleep: float, *extra: str) -> None:
        """Start a worker on each node; they wait for `go` after their imports."""
        if self.started is None:
            self.started = time.monotonic()
        for node in nodes:
            argv = [PYTHON, str(PASSTHROUGH), str(self.job), "--lock-timeout-secs", f"{self.cs.lease:g}"]
            argv += ["--poll-interval-secs", f"{self.cs.poll:g}", "--sleep", f"{sleep:g}", *extra]
            argv += ["--overlap"] if self.cs.overlap else []
            argv += ["--ready-file", str(self.lineup / f"ready-{node.name}-{len(self.procs)}"), "--go-file", str(self.go)]
            log = self.b.logs / f"coord-{self.name}-{node.name}-{len(self.procs)}.log"
            with open(log, "ab") as handle:
                handle.write(f"# {node.name}: {' '.join(argv)}\n".encode())
                handle.flush()
                proc = node.popen(
                    argv,
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            self.procs.append(proc)
            self.logs.append(log)

    def ready(self) -> float:
        """Wait until every started worker has imported; seconds since the first was started."""
        deadline = time.monotonic() + self.b.timeout
        while len(list(self.lineup.glob("ready-*"))) < len(self.procs):
            self._check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"coordination {self.name}: workers not ready after {self.b.timeout:.0f}s")
            time.sleep(0.05)
        assert self.started is not None
        return time.monotonic() - self.started

    def release(self) -> None:
        """Let the waiting workers join the job."""
        self.go.touch()

    def _check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            code = proc.poll()
            if code is not None and code != 0:
                raise BenchError(f"coordination {self.name}: a worker exited {code}; see {log}\n{_tail(log)}")

    def wait(self) -> float:
        """Wait for every worker to exit (each must succeed); the monotonic time the last one did."""
        deadline = time.monotonic() + self.b.timeout
        while any(proc.poll() is None for proc in self.procs):
            self._check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"coordination {self.name}: workers still running after {self.b.timeout:.0f}s")
            time.sleep(0.05)
        self._check_alive()
        return time.monotonic()

    def stop(self) -> None:
        """SIGKILL every worker of this fleet that still runs (its job is thrown away), by pid."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _host_view(cluster: gluster.Cluster, path: Path) -> Path:
    """`path` on the volume as this process can read it: through a node's mount namespace."""
    anchor = cluster.nodes[0].anchor
    assert anchor is not None
    return Path(f"/proc/{anchor.pid}/root") / path.relative_to("/")


def _copy_job(cluster: gluster.Cluster, template: Path, name: str) -> Path:
    """A fresh copy of a prepared job on the volume (jobs hold no path of their own directory)."""
    job = cluster.mount / name
    node = cluster.nodes[0]
    t0 = time.monotonic()
    proc = node.run(["cp", "-r", str(template), str(job)], timeout=3600)
    if proc.returncode != 0:
        raise BenchError(f"copying the job to the volume failed: {proc.stderr}")
    progress(f"coordination: copied the job for {name} to the volume in {time.monotonic() - t0:.1f} s")
    time.sleep(1.0)  # let the client flush what it still holds before the profile is cleared
    return job


def _prepare_template(b: Bench, shards: int, cs: CoordinationSizes) -> Path:
    """Prepare (once per shard count, on the local disk) a job of `shards` shards of two tiny rows."""
    d = b.work / "coordination" / f"template-{shards}"
    job = d / "job"
    if job.exists():
        return job
    data = write_tiny_dataset(d / "input.jsonl", shards * 2)
    recipe = write_recipe(d / "recipe.yaml", data, d / "unused.jsonl", CPU_OPS)
    argv = ["prepare", "--config", str(recipe), "--dataset-path", str(data), "--job-dir", str(job)]
    argv += ["--num-shards", str(shards), "--lock-timeout-secs", f"{cs.lease:g}", "--poll-interval-secs", f"{cs.poll:g}"]
    b.run(f"coord-prepare-{shards}", b.elastic(*argv))
    return job


def _per_shard(fops: dict[str, int], shards: int) -> dict[str, float]:
    return {fop: n / shards for fop, n in sorted(fops.items(), key=lambda kv: -kv[1])}


def run_makespan(b: Bench, cluster: gluster.Cluster, profile: Profile, cs: CoordinationSizes) -> dict[str, Any]:
    """S shards of `sleep` seconds, one worker per node of the cluster: makespan, balance, fops."""
    n = len(cluster.nodes)
    shards = cs.run_shards(n)
    job = _copy_job(cluster, _prepare_template(b, shards, cs), f"makespan-{n}")
    fleet = Fleet(b, cluster, f"makespan-{n}", job, cs)
    try:
        fleet.start(cluster.nodes, cs.sleep)
        startup = fleet.ready()
        profile.clear()
        t_go = time.monotonic()
        fleet.release()
        ended = fleet.wait()
        fops = profile.read()
    finally:
        fleet.stop()
    assert fleet.started is not None
    records = completions(_host_view(cluster, job))
    if len(records) != shards:
        raise BenchError(f"coordination makespan-{n}: {len(records)} completions for {shards} shards")
    per_worker = Counter((r["host"], r["pid"]) for r in records)
    makespan = span(records)
    ideal = shards * cs.sleep / n
    meta = metadata_ops(fops)
    figures = {
        "nodes": n,
        "shards": shards,
        "sleep_secs": cs.sleep,
        "makespan_secs": makespan,
        "ideal_secs": ideal,
        "claims_per_sec": shards / makespan,
        "shards_per_worker_min": min(per_worker.values()),
        "shards_per_worker_max": max(per_worker.values()),
        "workers_with_shards": len(per_worker),
        "startup_secs": startup,
        "go_to_last_exit_secs": ended - t_go,
        "wall_secs_incl_startup": ended - fleet.started,
        "fops": fops,
        "metadata_ops": meta,
        "data_ops": data_ops(fops),
        "metadata_ops_per_shard": meta / shards,
        "data_ops_per_shard": data_ops(fops) / shards,
        "fops_per_shard": _per_shard(fops, shards),
    }
    progress(
        f"coordination makespan: {n} node(s), {shards} shards x {cs.sleep:g} s: {makespan:.1f} s (ideal {ideal:.1f} s), "
        f"{shards / makespan:.1f} claims/s, {meta / shards:.1f} metadata ops/shard, start-up {startup:.1f} s"
    )
    return figures


# -- idle load -------------------------------------------------------------------------------------


def run_idle(
    b: Bench, cluster: gluster.Cluster, profile: Profile, cs: CoordinationSizes, variant: str, busy: int, idle: int
) -> dict[str, Any]:
    """Operations per second over `idle_window` while nothing is claimable.

    "hold": `busy` workers each hold one shard of a `busy`-shard job for a long time, then `idle`
    more workers join and find nothing to claim. "tail": a `tail_shards` job where one worker holds
    one shard and `idle` workers finished all the others first (the end of a long job: they scan
    a job full of finished shards); no backup attempts (`--backup-after 0`), which would otherwise
    take the held shard over as a straggler and end the job.
    """
    nodes = cluster.nodes[: busy + idle]
    if variant == "tail":
        shards = cs.tail_shards
        backup = ["--backup-after", "0"]
    else:
        shards, backup = busy, []
    name = f"idle-{variant}-{busy}b{idle}i"
    job = _copy_job(cluster, _prepare_template(b, shards, cs), name)
    locks = _host_view(cluster, job) / "state" / "locks"
    fleet = Fleet(b, cluster, name, job, cs)
    try:
        fleet.start(nodes[:busy], cs.idle_hold, "--max-shards", "1", *backup)
        fleet.ready()
        fleet.release()
        _wait_for(lambda: len(list(locks.glob("*.json"))) >= busy, f"coordination {name}: {busy} claims", b.timeout, fleet)
        if idle:
            others = Fleet(b, cluster, f"{name}-idle", job, cs)
            try:
                others.start(nodes[busy:], 0.0, *backup)
                others.ready()
                others.release()
                if variant == "tail":
                    done = _host_view(cluster, job) / "state" / "done"
                    _wait_for(
                        lambda: len(list(done.glob("*.json"))) >= shards - busy,
                        f"coordination {name}: {shards - busy} completions",
                        b.timeout,
                        others,
                    )
                # Every idle worker past its first scan; at the tail, also past the pass that
                # learns every other shard is done (once per worker at the job's end, not idling).
                time.sleep(max(2 * cs.poll, 3.0) + (TAIL_SETTLE_SECS if variant == "tail" else 0.0))
                window = _measure_window(profile, cs.idle_window, [fleet, others])
                memory = cluster_memory(cluster)
            finally:
                others.stop()
        else:
            time.sleep(max(2 * cs.poll, 3.0))
            window = _measure_window(profile, cs.idle_window, [fleet])
            memory = cluster_memory(cluster)
    finally:
        fleet.stop()
    secs, fops = window
    meta = metadata_ops(fops)
    figures = {
        "variant": variant,
        "nodes": busy + idle,
        "busy_workers": busy,
        "idle_workers": idle,
        "shards": shards,
        "window_secs": secs,
        "fops": fops,
        "metadata_ops_per_sec": meta / secs,
        "data_ops_per_sec": data_ops(fops) / secs,
        "fops_per_sec": {fop: count / secs for fop, count in sorted(fops.items(), key=lambda kv: -kv[1])},
        "memory": memory,
    }
    progress(
        f"coordination idle ({variant}): {busy} busy + {idle} idle workers, {secs:.0f} s window: "
        f"{meta / secs:.1f} metadata ops/s, {data_ops(fops) / secs:.1f} data ops/s"
    )
    return figures


def _wait_for(ready: Any, what: str, timeout: float, fleet: Fleet) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        fleet._check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not reached after {timeout:.0f}s")
        time.sleep(0.2)


def _measure_window(profile: Profile, window: float, fleets: list[Fleet]) -> tuple[float, dict[str, int]]:
    """The profile over `window` seconds; every worker must still be running at its end."""
    profile.clear()
    t0 = time.monotonic()
    time.sleep(window)
    fops = profile.read()
    secs = time.monotonic() - t0
    for fleet in fleets:
        fleet._check_alive()
        if any(proc.poll() is not None for proc in fleet.procs):
            raise BenchError(f"coordination {fleet.name}: a worker ended during the idle window")
    return secs, fops


def idle_rates(mixed: dict[str, Any], all_busy: dict[str, Any] | None, tail: dict[str, Any] | None) -> dict[str, Any]:
    """Per-worker metadata ops/s: a busy (heartbeating) worker's from the all-busy run, an idle
    one's from what the mixed run adds over its busy workers, an idle worker's at the tail from
    what the tail run adds over its one busy worker. None where the run needed is missing."""
    per_busy = all_busy["metadata_ops_per_sec"] / all_busy["busy_workers"] if all_busy else None
    per_idle = per_idle_tail = None
    if per_busy is not None and mixed["idle_workers"]:
        per_idle = (mixed["metadata_ops_per_sec"] - mixed["busy_workers"] * per_busy) / mixed["idle_workers"]
    if per_busy is not None and tail and tail["idle_workers"]:
        per_idle_tail = (tail["metadata_ops_per_sec"] - tail["busy_workers"] * per_busy) / tail["idle_workers"]
    return {"per_busy_worker": per_busy, "per_idle_worker": per_idle, "per_idle_worker_at_tail": per_idle_tail}


def project(rates: dict[str, Any], nodes: int) -> dict[str, float | None]:
    """Metadata ops/s of `nodes` nodes from per-worker rates: half busy + half idle, all busy, and
    one busy + the rest idle at the tail."""
    busy, idle, tail = rates["per_busy_worker"], rates["per_idle_worker"], rates["per_idle_worker_at_tail"]
    half = nodes // 2
    return {
        "mixed": None if busy is None or idle is None else half * busy + (nodes - half) * idle,
        "all_busy": None if busy is None else nodes * busy,
        "tail": None if busy is None or tail is None else busy + (nodes - 1) * tail,
    }


# -- the rows --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Built:
    """A cluster this measure brought up, and what it cost."""

    nodes: int
    up_secs: float
    down_secs: float | None = None
    memory_fresh: dict[str, Any] | None = None
    memory_after_run: dict[str, Any] | None = None


def _bring_up(nodes: int, cs: CoordinationSizes, work: Path) -> tuple[gluster.Cluster, Built]:
    cluster = gluster.Cluster(nodes=nodes, mode=cs.mode, workdir=work)
    t0 = time.monotonic()
    cluster.up()
    built = Built(nodes, time.monotonic() - t0)
    built.memory_fresh = cluster_memory(cluster)
    progress(f"coordination: {nodes}-node {cs.mode} cluster up in {built.up_secs:.1f} s at {cluster.mount}")
    return cluster, built


def _tear_down(cluster: gluster.Cluster, built: Built | None) -> None:
    t0 = time.monotonic()
    cluster.down()
    if built is not None:
        built.down_secs = time.monotonic() - t0


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"


FAILURES = (BenchError, OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError, TimeoutError)


def measure_coordination(b: Bench, s: object, wanted: tuple[str, ...]) -> list[Result]:
    """Every wanted coordination row; `b.shared["coordination"]` holds the sizes (else DEFAULT)."""
    cs: CoordinationSizes = b.shared.get("coordination") or DEFAULT
    why = gluster.cluster_available()
    if why is not None:
        return [Result.skipped(name, name, f"no GlusterFS test cluster here: {why}") for name in wanted]
    work = b.work / "coordination"
    (work / "clusters").mkdir(parents=True, exist_ok=True)
    slots: set[int] = {MAKESPAN_NAMES.index(n) for n in wanted if n in MAKESPAN_NAMES}
    if "coordination_fsops" in wanted:
        slots |= set(FSOPS_SLOTS)
    if "coordination_idle" in wanted:
        slots.add(IDLE_SLOT)
    slots |= {CLUSTER_SLOTS[n] for n in wanted if n in CLUSTER_SLOTS}
    runs: dict[int, dict[str, Any]] = {}  # slot -> makespan figures
    built: dict[int, Built] = {}  # slot -> its cluster's cost
    idle: dict[str, dict[str, Any]] = {}  # variant -> figures at the idle slot's node count
    idle_big: dict[str, Any] | None = None  # the mixed run on try_nodes, if it came up
    idle_big_why = ""
    errors: dict[str, str] = {}
    needs_run = {i for i in slots if MAKESPAN_NAMES[i] in wanted or ("coordination_fsops" in wanted and i in FSOPS_SLOTS)}
    by_nodes: dict[int, list[int]] = {}
    for slot in sorted(slots):
        by_nodes.setdefault(cs.nodes[slot], []).append(slot)
    for nodes, same in by_nodes.items():
        cluster: gluster.Cluster | None = None
        cost: Built | None = None
        try:
            cluster, cost = _bring_up(nodes, cs, work / "clusters")
            for slot in same:
                built[slot] = cost
            profile = Profile(cluster)
            if needs_run & set(same):
                figures = run_makespan(b, cluster, profile, cs)
                cost.memory_after_run = cluster_memory(cluster)
                for slot in same:
                    runs[slot] = figures
            if IDLE_SLOT in same and "coordination_idle" in wanted:
                busy = nodes // 2
                variants = {"hold": (busy, nodes - busy), "all_busy": (nodes, 0), "tail": (1, nodes - 1)}
                for variant, (n_busy, n_idle) in variants.items():
                    if variant == "tail" and nodes < 2:
                        continue
                    idle[variant] = run_idle(b, cluster, profile, cs, variant, n_busy, n_idle)
        except FAILURES as exc:
            text = _error_text(exc)
            progress(f"coordination: {nodes}-node cluster failed: {text}")
            for slot in same:
                errors.setdefault(f"slot{slot}", text)
        finally:
            if cluster is not None:
                _tear_down(cluster, cost)
                progress(f"coordination: {nodes}-node cluster down in {cost.down_secs if cost else 0:.1f} s")
    if "coordination_idle" in wanted and cs.try_nodes and "hold" in idle:
        idle_big, idle_big_why = _try_big(b, cs, work)
    return _results(wanted, cs, runs, built, idle, idle_big, idle_big_why, errors)


def _try_big(b: Bench, cs: CoordinationSizes, work: Path) -> tuple[dict[str, Any] | None, str]:
    """The idle row's mixed run on `try_nodes` nodes, if this box can build that cluster."""
    cluster: gluster.Cluster | None = None
    try:
        cluster, _ = _bring_up(cs.try_nodes, cs, work / "clusters")
        profile = Profile(cluster)
        busy = cs.try_nodes // 2
        return run_idle(b, cluster, profile, cs, "hold", busy, cs.try_nodes - busy), ""
    except FAILURES as exc:
        text = _error_text(exc)
        progress(f"coordination: the {cs.try_nodes}-node idle run failed, projecting instead: {text}")
        return None, text.splitlines()[0] if text else type(exc).__name__
    finally:
        if cluster is not None:
            cluster.down()


def _fmt_fops(per: dict[str, float], digits: int = 1) -> str:
    return ", ".join(f"{fop} {value:.{digits}f}" for fop, value in per.items())


def _results(
    wanted: tuple[str, ...],
    cs: CoordinationSizes,
    runs: dict[int, dict[str, Any]],
    built: dict[int, Built],
    idle: dict[str, dict[str, Any]],
    idle_big: dict[str, Any] | None,
    idle_big_why: str,
    errors: dict[str, str],
) -> list[Result]:
    results: list[Result] = []
    common = {"mode": cs.mode, "lease_secs": cs.lease, "poll_secs": cs.poll, "sizes": dataclasses.asdict(cs)}

    def failed(name: str, slots: tuple[int, ...]) -> Result | None:
        for slot in slots:
            if f"slot{slot}" in errors:
                return Result(name, name, None, None, None, None, "", "", None, error=errors[f"slot{slot}"])
        return None

    for slot, name in enumerate(MAKESPAN_NAMES):
        if name not in wanted:
            continue
        if (bad := failed(name, (slot,))) is not None or slot not in runs:
            results.append(bad or Result(name, name, None, None, None, None, "", "", None, error="not measured"))
            continue
        f = runs[slot]
        fewer = " (fewer shards: the ideal is linear)" if f["shards"] < cs.shards else ""
        how = "" if cs.overlap else ", no overlap"
        label = f"coordination: {f['nodes']} node(s), {f['shards']:,} shards x {cs.sleep:g} s{fewer}{how}, makespan vs ideal"
        limit = MAKESPAN_TARGET if slot == len(MAKESPAN_NAMES) - 1 else None
        details = {
            **common,
            **{k: v for k, v in f.items() if k not in ("fops_per_shard",)},
            "notes": [
                f"{f['nodes']} node(s): {f['claims_per_sec']:.1f} claims/s, shards per worker {f['shards_per_worker_min']}"
                f"-{f['shards_per_worker_max']}, wall {f['wall_secs_incl_startup']:.1f} s incl. start-up "
                f"({f['startup_secs']:.1f} s to import {f['nodes']} workers)"
            ],
        }
        results.append(Result.times(name, label, f["makespan_secs"], f["ideal_secs"], limit, details, of="ideal"))
    if "coordination_fsops" in wanted:
        name = "coordination_fsops"
        small_slot, large_slot = FSOPS_SLOTS
        bad = failed(name, FSOPS_SLOTS)
        if bad is not None or small_slot not in runs or large_slot not in runs:
            results.append(bad or Result(name, name, None, None, None, None, "", "", None, error="not measured"))
        else:
            small, large = runs[small_slot], runs[large_slot]
            label = f"coordination: metadata ops per shard, {large['nodes']} nodes vs {small['nodes']} (GlusterFS profile)"
            notes = [
                f"{f['nodes']} nodes, per shard: metadata {f['metadata_ops_per_shard']:.1f}, data (READ+WRITE) "
                f"{f['data_ops_per_shard']:.1f}; {_fmt_fops(f['fops_per_shard'])}"
                for f in (small, large)
            ]
            notes.append(
                f"claims/s: {small['claims_per_sec']:.1f} at {small['nodes']} nodes, {large['claims_per_sec']:.1f} at {large['nodes']}"
            )
            details = {
                **common,
                "per_shard": {str(f["nodes"]): f["fops_per_shard"] for f in (small, large)},
                "metadata_ops_per_shard": {str(f["nodes"]): f["metadata_ops_per_shard"] for f in (small, large)},
                "data_ops_per_shard": {str(f["nodes"]): f["data_ops_per_shard"] for f in (small, large)},
                "claims_per_sec": {str(f["nodes"]): f["claims_per_sec"] for f in (small, large)},
                "shown": {
                    "ours": f"{large['metadata_ops_per_shard']:.1f} ops/shard ({large['nodes']} nodes)",
                    "baseline": f"{small['metadata_ops_per_shard']:.1f} ops/shard ({small['nodes']} nodes)",
                },
                "notes": notes,
            }
            results.append(
                Result.times(name, label, large["metadata_ops_per_shard"], small["metadata_ops_per_shard"], FSOPS_TARGET, details)
            )
    if "coordination_idle" in wanted:
        results.append(_idle_result(cs, idle, idle_big, idle_big_why, errors, common))
    for name, slot in CLUSTER_SLOTS.items():
        if name not in wanted:
            continue
        if (bad := failed(name, (slot,))) is not None or slot not in built or built[slot].down_secs is None:
            results.append(bad or Result(name, name, None, None, None, None, "", "", None, error="not measured"))
            continue
        c = built[slot]
        memory = c.memory_after_run or c.memory_fresh
        assert memory is not None and c.down_secs is not None
        server = memory["server_mb"]
        when = "after the makespan run" if c.memory_after_run else "fresh"
        details = {
            **common,
            "nodes": c.nodes,
            "up_secs": c.up_secs,
            "down_secs": c.down_secs,
            "memory_fresh": c.memory_fresh,
            "memory_after_run": c.memory_after_run,
            "shown": {
                "ours": f"up {c.up_secs:.1f} s, down {c.down_secs:.1f} s",
                "baseline": f"server: glusterd {server.get('glusterd', 0):.0f} MB, glusterfsd {server.get('glusterfsd', 0):.0f} MB",
            },
            "notes": [
                f"{c.nodes} nodes: per node (glusterfs client + anchor, {when}) {memory['node_mb_mean']:.1f} MB mean, "
                f"{memory['node_mb_max']:.1f} MB max; server {', '.join(f'{k} {v:.0f} MB' for k, v in server.items())}"
            ],
        }
        label = f"coordination: {c.nodes}-node test cluster: bring-up, tear-down; MB per node"
        results.append(Result(name, label, c.up_secs, None, None, memory["node_mb_mean"], "MB/node", "(reported)", None, details))
    return results


def _idle_result(
    cs: CoordinationSizes,
    idle: dict[str, dict[str, Any]],
    big: dict[str, Any] | None,
    big_why: str,
    errors: dict[str, str],
    common: dict[str, Any],
) -> Result:
    name = "coordination_idle"
    if f"slot{IDLE_SLOT}" in errors or "hold" not in idle:
        return Result(name, name, None, None, None, None, "", "", None, error=errors.get(f"slot{IDLE_SLOT}", "not measured"))
    mixed = idle["hold"]
    n = mixed["nodes"]
    rates = idle_rates(mixed, idle.get("all_busy"), idle.get("tail"))
    target_nodes = cs.try_nodes or 2 * n
    projected = project(rates, target_nodes)
    at_n = {k: v["metadata_ops_per_sec"] for k, v in idle.items()}
    if big is not None:
        judged, how = big["metadata_ops_per_sec"], "measured"
    else:
        judged, how = projected["mixed"] or 0.0, f"projected ({big_why or 'not tried'})"
    # The tail and all-busy figures at the larger size are projections either way; the row is
    # judged on the largest of them, so that no way of idling hides behind another.
    worst = max([judged, *(v for k, v in projected.items() if k != "mixed" and v is not None)])
    notes = [
        f"{n} nodes, metadata ops/s: {', '.join(f'{k} {v:.1f}' for k, v in at_n.items())} "
        f"(hold: {mixed['busy_workers']} busy + {mixed['idle_workers']} idle; all_busy: {n} busy; tail: 1 busy + {n - 1} idle "
        f"after {cs.tail_shards} shards, backups off)",
        "per worker, metadata ops/s: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in rates.items()),
        f"{target_nodes} nodes, half busy + half idle: {judged:.1f} ops/s {how}; projected: "
        + ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} -" for k, v in projected.items()),
    ]
    notes.append(f"{n} nodes, hold, ops/s by kind: {_fmt_fops(mixed['fops_per_sec'], 2)}")
    if "tail" in idle:
        notes.append(f"{n} nodes, tail, ops/s by kind: {_fmt_fops(idle['tail']['fops_per_sec'], 2)}")
    if mixed["memory"].get("worker_mb_mean"):
        notes.append(f"worker RSS at idle: {mixed['memory']['worker_mb_mean']:.0f} MB mean")
    details = {
        **common,
        "at_nodes": n,
        "variants": idle,
        "per_worker_metadata_ops_per_sec": rates,
        "target_nodes": target_nodes,
        "measured_at_target_nodes": big,
        "measured_at_target_why_not": big_why or None,
        "projected_at_target_nodes": projected,
        "judged_ops_per_sec": worst,
        "shown": {
            "ours": f"{judged:.0f} ops/s at {target_nodes} nodes ({'measured' if big is not None else 'projected'})",
            "baseline": f"{mixed['metadata_ops_per_sec']:.0f} ops/s at {n} nodes",
        },
        "notes": notes,
    }
    label = f"coordination: metadata ops/s while nothing is claimable, {target_nodes} nodes (half busy, half idle)"
    return Result(
        name,
        label,
        None,
        None,
        None,
        worst,
        "ops/s",
        f"<= {IDLE_TARGET_OPS:g} metadata ops/s",
        worst <= IDLE_TARGET_OPS,
        details,
    )
