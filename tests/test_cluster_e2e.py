"""The launch flows end to end on a real network filesystem: a GlusterFS volume (tests/support/cluster.py)
mounted at the same path on simulated nodes, each with its own network, mount and UTS namespace.
Real Data-Juicer + Ray on every node; each merged output must equal, byte for byte, a plain
single-process `dj-process` run over the whole input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.e2e_support import DEMO_RECIPE, DLC_JOB, SHARD_JOB
from support.exhaustive import exhaustive_only
from support.jobs import REPO

from elastic_sharding.work.runners import DEFAULT_RUNNER

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

PY = sys.executable
QUICK = ("--poll-interval-secs", "1", "--lock-timeout-secs", "120", "--coordinator-lease-secs", "4")


JOB_FACTS = """
import glob, json, os, sys
job = sys.argv[1]
records = [json.load(open(p)) for p in glob.glob(job + "/attempts/*/*/attempt.json")]
print(json.dumps({
    "runners": sorted({r["runner"] for r in records}),
    "statuses": sorted({r["status"] for r in records}),
    "empty_logs": sum(os.path.getsize(p) == 0 for p in glob.glob(job + "/attempts/*/*/process.log")),
    "cache": os.path.isdir(job + "/cache"),
    "merged_rows": json.load(open(job + "/merge.json"))["rows"],
}))
"""


def run_on(node, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = node.run([PY, *args], cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, f"{node.name}: {' '.join(args)} exited {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc


def start_on(node, *args: str, log: Path) -> subprocess.Popen:
    with open(log, "wb") as handle:
        return node.popen([PY, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=handle)


def wait_nodes(procs: dict, logs: Path, timeout: float = 900) -> None:
    codes = {name: proc.wait(timeout=timeout) for name, proc in procs.items()}
    failed = {name: (logs / f"{name}.log").read_text()[-3000:] for name, code in codes.items() if code != 0}
    assert not failed, f"exit codes {codes}\n{failed}"


def merged_lines(node, path: Path) -> list[bytes]:
    return node.read_bytes(path).splitlines(keepends=True)


@exhaustive_only  # CI: test_slurm_e2e.py and the fault matrix run workers on GlusterFS nodes
def test_two_nodes_manual_workflow_on_a_strict_volume(gluster, tmp_path, demo_baseline):
    cluster = gluster(nodes=2, mode="strict")
    a, b = cluster.nodes
    job = cluster.mount / "jobs" / "two-node"
    a.run(["mkdir", "-p", str(job.parent)], check=True)
    run_on(a, str(SHARD_JOB), "prepare", "--config", str(DEMO_RECIPE), "--job-dir", str(job), "--num-shards", "4",
           "--lock-timeout-secs", "300", "--poll-interval-secs", "1", "--ray-address", "local")  # fmt: skip
    workers = {node.name: start_on(node, str(SHARD_JOB), "worker", "--job-dir", str(job), log=tmp_path / f"{node.name}.log")
               for node in (a, b)}  # fmt: skip
    wait_nodes(workers, tmp_path)

    report = json.loads(run_on(b, str(SHARD_JOB), "status", "--job-dir", str(job), "--json").stdout)
    assert report["complete"] and report["counts"]["done"] == 4
    assert {s["host"] for s in report["shards"]} == {a.name, b.name}
    merged = job.parent / "merged.jsonl"
    run_on(b, str(SHARD_JOB), "merge", "--job-dir", str(job), "--output", str(merged))
    verify = run_on(a, str(SHARD_JOB), "verify", "--job-dir", str(job), "--output", str(merged), "--expect-nodes", "2")
    assert "PASS: 4 shards were completed by 2 node(s)" in verify.stderr
    got = merged_lines(a, merged)
    assert got == demo_baseline and all(b'"__dj__stats__"' in line for line in got)
    facts = json.loads(run_on(a, "-c", JOB_FACTS, str(job)).stdout)
    assert facts == {
        "runners": [DEFAULT_RUNNER],
        "statuses": ["succeeded"],
        "empty_logs": 0,
        "cache": True,
        "merged_rows": len(got),
    }


@exhaustive_only  # CI: test_slurm_e2e.py's strict allocation job, real Data-Juicer on a caching volume
def test_dlc_strict_three_nodes_on_a_caching_volume(gluster, tmp_path, demo_baseline):
    cluster = gluster(nodes=3, mode="cached")
    job = cluster.mount / "strict-3x6"
    output = cluster.mount / "output" / "strict-3x6" / "merged.jsonl"  # created by three instances at once
    args = ("--job-dir", str(job), "--nodes", "3", "--num-shards", "6", "--require-all-nodes", "--run-id", "strict-1",
            "--output", str(output), *QUICK)  # fmt: skip
    instances = {
        node.name: start_on(node, str(DLC_JOB), "dlc", *args, log=tmp_path / f"{node.name}.log") for node in cluster.nodes
    }
    wait_nodes(instances, tmp_path)
    logs = "".join((tmp_path / f"{node.name}.log").read_text() for node in cluster.nodes)
    assert logs.count("elected as DLC prepare coordinator") == 1
    assert logs.count("elected as DLC finalize coordinator") == 1
    assert logs.count("PASS: 6 shards were completed by 3 node(s)") == 3
    node = cluster.nodes[1]
    report = json.loads(run_on(node, str(DLC_JOB), "status", "--job-dir", str(job), "--json").stdout)
    assert sorted(s["host"] for s in report["shards"]) == sorted([n.name for n in cluster.nodes] * 2), "2 shards per Worker"
    assert merged_lines(node, output) == demo_baseline


def test_a_stopped_real_worker_is_fenced_and_its_data_juicer_runtime_stopped(gluster, tmp_path, demo_baseline):
    """P3 with real Data-Juicer: node1's worker is SIGSTOPped while its warm runtime works on a
    shard; node2 takes the shard over after one lease and finishes the job; resumed, node1's
    worker publishes nothing and its runtime (which ran on while its parent was stopped) ends."""
    import re
    import signal
    import time

    from support.e2e_support import processes_with

    cluster = gluster(nodes=2, mode="strict")
    a, b = cluster.nodes
    job = cluster.mount / "fenced"
    run_on(a, str(SHARD_JOB), "prepare", "--config", str(DEMO_RECIPE), "--job-dir", str(job), "--num-shards", "2",
           "--lock-timeout-secs", "10", "--heartbeat-interval-secs", "1", "--poll-interval-secs", "1")  # fmt: skip
    log_a = tmp_path / "node1.log"
    first = start_on(a, str(SHARD_JOB), "worker", "--job-dir", str(job), log=log_a)
    deadline = time.monotonic() + 120
    while not (found := re.search(r"starting warm runtime pid (\d+)", log_a.read_text())):
        assert time.monotonic() < deadline and first.poll() is None, log_a.read_text()[-3000:]
        time.sleep(0.2)
    runtime = int(found.group(1))
    first.send_signal(signal.SIGSTOP)
    try:
        second = start_on(b, str(SHARD_JOB), "worker", "--job-dir", str(job), log=tmp_path / "node2.log")
        assert second.wait(timeout=600) == 0, (tmp_path / "node2.log").read_text()[-3000:]
        assert Path(f"/proc/{runtime}").exists(), "the stopped worker's runtime ran on (only the worker was stopped)"
    finally:
        first.send_signal(signal.SIGCONT)
    first.wait(timeout=120)
    text = log_a.read_text()
    assert "lost claim of part-00000-of-00002" in text or "claim lost before publishing" in text, text[-3000:]
    deadline = time.monotonic() + 60
    while processes_with(str(job)):
        assert time.monotonic() < deadline, (
            f"Data-Juicer/Ray processes of the job outlived both workers: {processes_with(str(job))}"
        )
        time.sleep(0.5)
    report = json.loads(run_on(b, str(SHARD_JOB), "status", "--job-dir", str(job), "--json").stdout)
    assert {s["host"] for s in report["shards"]} == {b.name}, "node1 published nothing"
    merged = job.parent / "fenced-merged.jsonl"
    run_on(b, str(SHARD_JOB), "merge", "--job-dir", str(job), "--output", str(merged))
    assert merged_lines(b, merged) == demo_baseline


MPI_AGENT = """\
#!/bin/sh
# OpenMPI's remote-shell agent for the simulated nodes: run the command inside the named node, as
# ssh would run it on that host.
host="$1"; shift
case "$host" in
{cases}
  *) echo "unknown host $host" >&2; exit 1 ;;
esac
exec nsenter -t "$anchor" -u -m -n -- /bin/sh -c "$*"
"""


def test_mpijob_launcher_with_one_rank_per_node_on_a_strict_volume(gluster, tmp_path, demo_baseline):
    """The launcher runs on node1 (as an MPIJob's launcher pod would run on its own host): it
    prepares, starts `mpirun -np 3 -npernode 1`, whose ranks reach node2 and node3 through the
    agent over the nodes' own network, then verifies and merges."""
    if not Path("/usr/bin/mpirun").exists():
        pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)")
    cluster = gluster(nodes=3, mode="strict")
    launcher = cluster.nodes[0]
    agent = tmp_path / "rsh-agent.sh"
    cases = "\n".join(f"  {n.name}) anchor={n.anchor.pid} ;;" for n in cluster.nodes)
    agent.write_text(MPI_AGENT.format(cases=cases))
    agent.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{n.name} slots=1\n" for n in cluster.nodes))
    job = cluster.mount / "mpi-job"
    subnet = cluster.nodes[0].ip.rsplit(".", 1)[0] + ".0/24"
    env = {"OMPI_MCA_plm_rsh_agent": str(agent), "OMPI_MCA_oob_tcp_if_include": subnet, "OMPI_MCA_btl_tcp_if_include": subnet}
    proc = launcher.run(
        [PY, str(DLC_JOB), "mpi", "--job-dir", str(job), "--num-shards", "6", "--hostfile", str(hostfile),
         "--max-shards", "2", "--expect-nodes", "3", "--poll-interval-secs", "1"],
        cwd=REPO, env={**env, "PATH": os.environ["PATH"]}, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "-np 3 -npernode 1 --hostfile" in proc.stderr
    assert "PASS: 6 shards were completed by 3 node(s)" in proc.stderr
    report = json.loads(run_on(launcher, str(DLC_JOB), "status", "--job-dir", str(job), "--json").stdout)
    assert sorted(s["host"] for s in report["shards"]) == sorted([n.name for n in cluster.nodes] * 2)
    assert merged_lines(launcher, job / "merged.jsonl") == demo_baseline
