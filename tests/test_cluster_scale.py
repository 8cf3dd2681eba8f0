"""The GlusterFS test cluster at 16 nodes: it comes up and goes away cleanly, and a job whose
recipe has a deduplication stage, run by a worker on every node, merges to the bytes the same job
gives when one node runs it.

Why 16: the protocol's costs grow with the number of workers (every one of them scans the claims,
races for the same next shard, takes part in the stage's units), and so do the cluster's own
(bring-up, tear-down); the fault matrix's scale kinds (`scripts/faults --nodes 16`) rely on both.

CI runs the cluster's bring-up and tear-down (a couple of seconds) and the 16-node job with the
fake processor for the segments' shards; the stage between them is the real code with Data-Juicer's
own `document_deduplicator`, shared by all 16 workers. `ELASTIC_SHARD_EXHAUSTIVE=1` adds the same
job with real Data-Juicer + Ray workers on every node (`--ray-num-cpus 1`, a small object store).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
from support.cluster import REGISTRY, Cluster, Node, _alive, _ns_ids, _pids_in, _proc_stat
from support.dedup_corpus import prose_rows
from support.exhaustive import exhaustive_only
from support.fake_worker import worker_command
from support.fakes import FakeRunner, fake_recipe_keep
from support.jobs import DEDUP_RECIPE, REPO, write_jsonl

from elastic_sharding.finish.merge import merge
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.records import Settings
from elastic_sharding.work.worker import Worker, WorkerOptions

pytestmark = [pytest.mark.cluster]

PY = sys.executable
NODES = 16
ROWS, SHARDS = 900, 32  # two shards per node in each segment, a few rows each
TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{TESTS}", "PYTHONUNBUFFERED": "1"}
# What a worker logs when it stops claiming after a failure of its own node (here: its Ray runtime
# timed out starting, 16 of them starting at once on 2 cores).
NODE_LOCAL = "this worker stops claiming"
# The real job: the fake's recipe shape, with Data-Juicer's own operators on both sides of the stage.
REAL_RECIPE = """\
executor_type: ray
ray_address: local
dataset_path: {dataset}
process:
  - text_length_filter:
      min_len: 20
  - document_deduplicator:
      lowercase: true
      ignore_non_character: true
  - whitespace_normalization_mapper:
"""


def _what_is_left(k: int, private: Path, mount: Path, namespaces: set[str], procs: list[tuple[int, int]]) -> list[str]:
    """What of cluster k is still there after `down()` (tests/test_cluster.py checks the same at 1
    and 2 nodes, and that a later cluster reusing k is not mistaken for a leftover)."""
    left = [f"process {pid}" for pid, start in procs if _alive(pid, start)]
    netns = Path("/run/netns")
    left += [f"netns {p.name}" for p in (netns.iterdir() if netns.is_dir() else []) if f"net:[{os.stat(p).st_ino}]" in namespaces]
    left += [f"registry entry {REGISTRY / str(k)}"] if (REGISTRY / str(k)).is_symlink() else []
    left += [f"private dir {private}"] if private.exists() else []
    left += [f"mountpoint dir {mount}"] if mount.exists() else []
    if any(line.split()[4] == str(mount) for line in Path("/proc/self/mountinfo").read_text().splitlines()):
        left.append(f"host mount at {mount}")
    return left


def test_a_16_node_cluster_comes_up_and_goes_away_cleanly(gluster):
    started = time.monotonic()
    cluster = gluster(nodes=NODES, mode="cached")
    up = time.monotonic() - started
    assert [node.name for node in cluster.nodes] == [f"node{i}" for i in range(1, NODES + 1)]
    hostnames = {node.run(["hostname"], check=True).stdout.strip() for node in cluster.nodes}
    assert hostnames == {node.name for node in cluster.nodes}
    # Every node sees what another wrote, through its own client.
    cluster.nodes[-1].run(["sh", "-c", f"echo hello > {cluster.mount}/hello"], check=True)
    assert cluster.nodes[0].read_bytes(cluster.mount / "hello") == b"hello\n"
    anchors = [cluster.server_anchor, *(node.anchor for node in cluster.nodes)]
    namespaces = set().union(*(_ns_ids(anchor.pid) for anchor in anchors if anchor))
    procs = [(pid, _proc_stat(pid)[1]) for pid in _pids_in(namespaces)]
    assert len(procs) >= 2 * NODES + 2  # an anchor and a client per node; the server's anchor and glusterd
    k, private, mount = cluster.k, cluster.private, cluster.mount
    assert k is not None and private is not None
    started = time.monotonic()
    cluster.down()
    down = time.monotonic() - started
    print(f"{NODES}-node cluster: up {up:.1f} s, down {down:.1f} s")
    assert _what_is_left(k, private, mount, namespaces, procs) == []


def _prepare(root: Path, recipe_text: str, settings: Settings, shards: int = SHARDS) -> Path:
    data = write_jsonl(root / "prose.jsonl", prose_rows(ROWS, seed=7))
    recipe = root / "recipe.yaml"
    recipe.write_text(recipe_text.format(dataset=data))
    job = root / "template"
    prepare(PrepareRequest(recipe, None, job, shards, settings), quiet=True)
    return job


def _run(
    cluster: Cluster, template: Path, name: str, nodes: list[Node], argv, logs: Path, timeout: float, node_local: bool = False
) -> bytes:
    """A copy of the job `template` on the volume, a worker (`argv(node, job)`) on each of
    `nodes`; each must exit 0, or with `node_local` 2 after a failure of its own node (it stops
    claiming so that the retries go to the other nodes), as long as most exit 0. Merged from
    another node; the merged bytes."""
    job = cluster.mount / name / "job"
    cluster.nodes[0].run(["mkdir", "-p", str(job.parent)], check=True)
    cluster.nodes[0].run(["cp", "-a", str(template), str(job)], check=True)
    procs = {}
    for node in nodes:
        with open(logs / f"{name}-{node.name}.log", "wb") as log:
            procs[node.name] = node.popen(argv(node, job), env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + timeout
    codes = {}
    for host, proc in procs.items():
        try:
            codes[host] = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes[host] = proc.wait()
    texts = {h: (logs / f"{name}-{h}.log").read_text(errors="replace") for h in codes}
    left = {h for h, c in codes.items() if node_local and c == 2 and NODE_LOCAL in texts[h]}
    failed = {h: texts[h][-2000:] for h, c in codes.items() if c != 0 and h not in left}
    assert not failed and len(left) < len(codes) / 2, f"{name}: workers exited {codes}\n{failed}"
    if left:
        print(f"{name}: {len(left)} of {len(codes)} workers left after a failure of their node: {sorted(left)}")
    out = job.parent / "merged.jsonl"
    merger = cluster.nodes[1]
    proc = merger.run([PY, "-m", "elastic_sharding", "merge", "--job-dir", str(job), "--output", str(out)], env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return merger.read_bytes(out)


def _hosts_in_stage(cluster: Cluster, job: Path) -> set[str]:
    """The nodes whose workers published shards of the segment after the stage."""
    script = "import glob, json, sys; print(json.dumps(sorted({json.load(open(p))['host'] for p in glob.glob(sys.argv[1])})))"
    pattern = f"{job}/stages/*/state/done/*.json"
    return set(orjson.loads(cluster.nodes[0].run([PY, "-c", script, pattern], check=True).stdout))


@exhaustive_only  # ~40-70 s of 16 worker starts on 2 cores; CI: the 16-node cluster above, dedup jobs on 3 nodes in the fault matrix
def test_a_16_node_job_with_a_dedup_stage_merges_as_one_node_does(gluster, tmp_path):
    """The fake processor for the segments' shards (rows dropped as `fakes.fake_recipe_keep` says),
    the real stage in between: 16 workers share its units and the next segment's shards. The one
    node is this machine, its worker in this process on local disk (a worker on one node of the
    cluster gives the same bytes, at the cost of another worker start; the exhaustive test below
    runs it there)."""
    cluster = gluster(nodes=NODES, mode="cached")
    settings = Settings(
        lock_timeout_secs=3.0, max_retries=6, poll_interval_secs=0.2, heartbeat_interval_secs=0.3, ray_address="local"
    )
    template = _prepare(tmp_path, DEDUP_RECIPE, settings)
    started = time.monotonic()
    clean = tmp_path / "one"
    shutil.copytree(template, clean, symlinks=True)
    assert Worker(clean, WorkerOptions(), runner=FakeRunner(keep=fake_recipe_keep)).run() == 0
    merge(clean, tmp_path / "one.jsonl")
    one = (tmp_path / "one.jsonl").read_bytes()
    alone = time.monotonic() - started

    def fake(node: Node, job: Path) -> list[str]:
        return worker_command(job, "--delay", "0.05", "--keep-fake-recipe")

    started = time.monotonic()
    many = _run(cluster, template, "many", cluster.nodes, fake, tmp_path, timeout=300)
    print(f"dedup job, {SHARDS} shards: one node (in process) {alone:.1f} s, {NODES} nodes {time.monotonic() - started:.1f} s")
    ids = [orjson.loads(line)["id"] for line in many.splitlines()]
    assert len(ids) == len(set(ids)) and ROWS * 0.5 < len(ids) < ROWS * 0.95, "the stage must drop duplicates"
    assert many == one
    assert len(_hosts_in_stage(cluster, cluster.mount / "many" / "job")) > 1, "the segment after the stage ran on one node"


@exhaustive_only  # CI: the fake processor for the segments (above); real workers: test_cluster_e2e.py, test_dedup_jobs.py
@pytest.mark.e2e
def test_a_16_node_real_data_juicer_job_with_a_dedup_stage_merges_as_one_node_does(gluster, tmp_path):
    """Real Data-Juicer + Ray on every node, each worker with its own Ray runtime of one CPU and
    a small object store (16 of them on one machine)."""
    cluster = gluster(nodes=NODES, mode="cached")
    settings = Settings(
        lock_timeout_secs=120.0,
        max_retries=3,
        poll_interval_secs=1.0,
        heartbeat_interval_secs=2.0,
        ray_address="local",
        ray_num_cpus=1,
        ray_object_store_mb=100,
    )
    template = _prepare(tmp_path, REAL_RECIPE, settings, shards=NODES)  # one Ray run per shard: one each
    ray_dirs = Path(tempfile.mkdtemp(prefix="escs", dir="/tmp"))  # Ray's socket paths must stay short

    def real(node: Node, job: Path) -> list[str]:
        ray_tmp = ray_dirs / f"{job.parent.name[0]}{node.index}"
        return [PY, "-m", "elastic_sharding", "worker", "--job-dir", str(job), "--ray-temp-dir", str(ray_tmp)]

    try:
        started = time.monotonic()
        one = _run(cluster, template, "one", cluster.nodes[:1], real, tmp_path, timeout=1200)
        alone = time.monotonic() - started
        started = time.monotonic()
        many = _run(cluster, template, "many", cluster.nodes, real, tmp_path, timeout=1800, node_local=True)
        print(f"real dedup job, {NODES} shards: one node {alone:.1f} s, {NODES} nodes {time.monotonic() - started:.1f} s")
    finally:
        shutil.rmtree(ray_dirs, ignore_errors=True)
    ids = [orjson.loads(line)["id"] for line in many.splitlines()]
    assert len(ids) == len(set(ids)) and len(ids) < ROWS * 0.95, "the stage must drop duplicates"
    assert many == one
    assert len(_hosts_in_stage(cluster, cluster.mount / "many" / "job")) > 1, "the segment after the stage ran on one node"
