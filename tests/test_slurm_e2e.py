"""`elastic-shard slurm` on a real Slurm (tests/support/slurm.py: slurmctld, one slurmd per GlusterFS
node, each node its own hostname; docs/testing/slurm.md), submitted through `sbatch` as a user would.

With real Data-Juicer + Ray on a caching volume: an N-node allocation job (in strict mode: every
node its share) and an elastic array job both finish with a merge equal to one `dj-process` run. With the fake processor (the scheduler's behaviour, not
Data-Juicer's, is under test): an array task that the scheduler starts late joins and takes shards;
`scancel` of one node's task mid-shard costs only the shards it held, which other nodes take over; a
requeued task (preemption) and a task warned of its time limit (USR1) drain, run again with the
same job id and rejoin their run; `squeue` names the jobs
and steps; and inside an allocation (`salloc`) the command runs the step over its nodes.
"""

from __future__ import annotations

import json
import re
import stat
import sys
import time
from pathlib import Path

import pytest
from support.jobs import REPO, sample_rows, write_jsonl
from support.launchers import LAUNCH_RECIPE

pytestmark = pytest.mark.cluster

PY = sys.executable
FAKE_WORKER = REPO / "tests" / "support" / "fake_worker.py"
QUICK = (
    "--poll-interval-secs",
    "0.5",
    "--lock-timeout-secs",
    "8",
    "--heartbeat-interval-secs",
    "1",
    "--coordinator-lease-secs",
    "4",
)


def elastic_shard(slurm, *args: str, timeout: float = 120):
    """`elastic-shard ARGS` on node1, where a user on a login node would type it."""
    proc = slurm.run([PY, "-m", "elastic_sharding", *args], cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, f"elastic-shard {' '.join(args[:2])} exited {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc


def status(slurm, job: Path) -> dict:
    """`status --json` read on node1 (the volume is mounted only on the nodes); {} before the job exists."""
    proc = slurm.run([PY, "-m", "elastic_sharding", "status", "--job-dir", str(job), "--json"], cwd=REPO, timeout=60)
    return json.loads(proc.stdout) if proc.returncode in (0, 1) and proc.stdout.strip() else {}


def done_hosts(report: dict) -> dict[str, str]:
    return {s["shard_id"]: s["host"] for s in report.get("shards", []) if s["state"] == "done"}


def slurm_logs(directory: Path, slurm) -> str:
    text = "".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(directory.glob("*.out")))
    return text + "\n" + slurm.logs(10)


@pytest.mark.e2e
def test_an_allocation_job_and_an_elastic_array_job_merge_like_one_dj_process_run(slurm, demo_baseline, tmp_path):
    cluster = slurm(nodes=2, cpus=2, mode="cached")
    logs = tmp_path / "logs"
    timings = {}
    for shape, flags in (("allocation", ("--nodes", "2", "--require-all-nodes")), ("array", ("--array", "2"))):
        job = cluster.mount / f"demo-{shape}"
        started = time.monotonic()
        job_id = elastic_shard(
            cluster, "slurm", "--job-dir", str(job), "--num-shards", "6", *flags, "--log-dir", str(logs), *QUICK
        ).stdout.strip()
        name = f"es-demo-{shape}"
        names = cluster.wait_for(lambda: {j["name"] for j in cluster.jobs() if j["state"] == "RUNNING"}, 60, what="running")  # noqa: B023
        assert names == {name}, names
        cluster.wait_for(lambda: done_hosts(status(cluster, job)), 300, 0.5, "a first completed shard")  # noqa: B023
        timings[shape] = round(time.monotonic() - started, 1)
        record = cluster.wait_done(job_id, timeout=600)
        states = {r["JobState"] for r in cluster.job_records(job_id)}
        assert states == {"COMPLETED"}, f"{shape}: {states}\n{slurm_logs(logs, cluster)}"
        assert record["ExitCode"] == "0:0"
        report = status(cluster, job)
        assert report["complete"] and len(done_hosts(report)) == 6
        hosts = sorted(done_hosts(report).values())
        if shape == "allocation":  # strict mode: each node its cap of 6 / 2 shards
            assert hosts == ["node1"] * 3 + ["node2"] * 3, hosts
        assert set(hosts) <= {"node1", "node2"}
        merged = job / "merged.jsonl"
        assert cluster.cluster.nodes[0].read_bytes(merged).splitlines(keepends=True) == demo_baseline
        text = "".join(p.read_text() for p in logs.glob(f"{name}-*.out"))
        assert text.count("elected as DLC prepare coordinator") == 1, slurm_logs(logs, cluster)
        assert text.count("elected as DLC finalize coordinator") == 1, slurm_logs(logs, cluster)
    print(f"start to first completed shard: {timings}")


def _fake_python(directory: Path) -> Path:
    """What `--python` runs on the nodes: `elastic-shard` with the fake processor in place of Data-Juicer."""
    path = directory / "fake-python"
    path.write_text(
        f'#!/bin/sh\n# called as: fake-python -m elastic_sharding ARGS...\nshift 2\nexec {PY} {FAKE_WORKER} launch "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _claims(slurm, job: Path) -> dict[str, str]:
    report = status(slurm, job)
    return {s["shard_id"]: s["host"] for s in report.get("shards", []) if s["state"] == "running"}


def test_an_array_grows_loses_a_cancelled_task_and_requeued_tasks_rejoin(slurm, tmp_path):
    cluster = slurm(nodes=3, cpus=1, cred_expire=5)  # a requeued job restarts cred_expire + 1 s later
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(64))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(LAUNCH_RECIPE.format(dataset=dataset))
    job, logs = cluster.mount / "elastic", tmp_path / "logs"
    cluster.run(["scontrol", "update", "nodename=node3", "state=drain", "reason=not-yet"], check=True)

    array = elastic_shard(
        cluster, "slurm", "--config", str(recipe), "--job-dir", str(job), "--num-shards", "24", "--array", "3",
        "--python", str(_fake_python(tmp_path)), "--export", "FAKE_DELAY=1.5", "--log-dir", str(logs), *QUICK,
    ).stdout.strip()  # fmt: skip
    tasks = {i: f"{array}_{i}" for i in range(3)}
    running = cluster.wait_for(lambda: {j["array_task_id"] for j in cluster.jobs() if j["state"] == "RUNNING"} == {"0", "1"}, 60)
    assert running and {j["name"] for j in cluster.jobs()} == {"es-elastic"}
    steps = cluster.run(["squeue", "-h", "-s", "-o", "%j"], check=True).stdout.split()
    assert "es-elastic.workers" in steps, steps
    pending = cluster.job(tasks[2])
    assert pending["JobState"] == "PENDING"

    # The scheduler grants one more node: the late task joins the running job and takes shards.
    cluster.wait_for(lambda: len(done_hosts(status(cluster, job))) >= 2, 120, 0.5, "two shards done")
    cluster.run(["scontrol", "update", "nodename=node3", "state=resume"], check=True)
    cluster.wait_for(lambda: "node3" in _claims(cluster, job).values(), 60, 0.5, "node3 holding a shard")
    # Before its task is signalled below: a shard done there is what shows the late task worked
    # (its first shard was still running when the USR1 came, 2 s after it started, in a CI run).
    cluster.wait_for(lambda: "node3" in done_hosts(status(cluster, job)).values(), 60, 0.5, "a shard done on node3")

    # scancel of node1's task mid-shard: that shard is handed back (drained) and done elsewhere.
    held = cluster.wait_for(lambda: [s for s, h in _claims(cluster, job).items() if h == "node1"], 30, 0.2, "node1 mid-shard")
    cluster.cancel(tasks[0])
    cluster.wait_done(tasks[0], timeout=60)

    # A requeue (as preemption does) of node2's task: it drains, runs again as the same job, rejoins.
    cluster.requeue(tasks[1])
    # USR1 to node3's batch shell, as `--signal=B:USR1@S` sends it S seconds before the time limit:
    # its worker drains and the script requeues its own job, which rejoins the run.
    cluster.run(["scancel", "--signal=USR1", "--batch", tasks[2]], check=True)
    for task in (tasks[1], tasks[2]):
        cluster.wait_for(lambda: int(cluster.job(task).get("Restarts", "0")) >= 1, 60, 0.5, f"{task} requeued")  # noqa: B023
    record = cluster.wait_done(array, timeout=300)
    assert record is not None

    states = {r["ArrayTaskId"]: r["JobState"] for r in cluster.job_records(array)}
    assert states == {"0": "CANCELLED", "1": "COMPLETED", "2": "COMPLETED"}, f"{states}\n{slurm_logs(logs, cluster)}"
    report = status(cluster, job)
    hosts = done_hosts(report)
    assert report["complete"] and len(hosts) == 24 and report["output_rows"] == 64
    assert "node3" in hosts.values(), "the late task took shards"
    cancelled = (logs / f"es-elastic-{array}_0.out").read_text()
    handed_back = set(re.findall(r"(part-\S+): handed back", cancelled))
    assert handed_back and handed_back <= set(held) | set(hosts), cancelled[-2000:]
    assert all(f"done {shard}" not in cancelled for shard in handed_back), "done by another worker, not the cancelled one"
    task1 = (logs / f"es-elastic-{array}_1.out").read_text()
    runs = task1.split("DLC instance hostname=")[1:]
    assert len(runs) == 2, "task 1 ran twice: before and after its requeue"
    assert "handed back" in runs[0] and "INFO done part-" in runs[1], "it drained, then rejoined and completed shards"
    assert "already prepared with this exact request" in runs[1] and f"run slurm-{array}," in runs[1]
    task2 = (logs / f"es-elastic-{array}_2.out").read_text()
    assert "drained before the time limit; requeueing job" in task2 and task2.count("DLC instance hostname=") == 2
    text = slurm_logs(logs, cluster)
    assert "received SIGTERM" in task1 and "received SIGTERM" in cancelled, text
    assert text.count("elected as DLC finalize coordinator") == 1
    merged = cluster.cluster.nodes[0].read_bytes(job / "merged.jsonl")
    assert len(merged.splitlines()) == 64


def test_inside_an_allocation_the_command_runs_one_worker_per_node(slurm, tmp_path):
    cluster = slurm(nodes=2, cpus=1)
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(16))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(LAUNCH_RECIPE.format(dataset=dataset))
    job = cluster.mount / "salloc"
    command = [PY, "-m", "elastic_sharding", "slurm", "--config", str(recipe), "--job-dir", str(job), "--num-shards", "4",
               "--python", str(_fake_python(tmp_path)), *QUICK]  # fmt: skip
    env = {"FAKE_DELAY": "0.5", "SLURM_CPU_BIND": "quiet,mask_cpu:0x1"}  # a binding the allocation's step must not inherit
    proc = cluster.run(["salloc", "--nodes=2", "--job-name=es-salloc", *command], cwd=REPO, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "inside Slurm job" in proc.stderr and "on 2 node(s)" in proc.stderr
    report = status(cluster, job)
    assert report["complete"] and set(done_hosts(report).values()) == {"node1", "node2"}
    assert len(cluster.cluster.nodes[0].read_bytes(job / "merged.jsonl").splitlines()) == 16
