"""Scheduler detection (`launch/scheduler.py`): each scheduler's variables, as it sets them, give the
node count, the node and the run id; explicit flags win; `dlc --explain` says what and why; a
real `mpirun` is detected and runs a whole `dlc` job without `--nodes` or `--run-id`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import REPO

from elastic_sharding.errors import UsageError
from elastic_sharding.launch.scheduler import Scheduler, Shape, detect, resolve_run_id

# What each scheduler sets, copied from real processes (Slurm 22.05, OpenMPI 4.1) and from the
# operators' documentation (Kubernetes Indexed Job, Volcano's env/svc plugins, Kubeflow's
# training-operator, PAI-DLC).
SLURM_STEP = {
    "SLURM_JOB_ID": "812",
    "SLURM_JOBID": "812",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NNODES": "4",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_TASKS_PER_NODE": "1(x4)",
    "SLURM_NODEID": "2",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURMD_NODENAME": "gpu-a17",
    "SLURM_JOB_NODELIST": "gpu-a[15-18]",
}
SLURM_ARRAY = {
    "SLURM_JOB_ID": "907",
    "SLURM_ARRAY_JOB_ID": "900",
    "SLURM_ARRAY_TASK_ID": "7",
    "SLURM_ARRAY_TASK_COUNT": "16",
    "SLURM_ARRAY_TASK_MIN": "0",
    "SLURM_ARRAY_TASK_MAX": "15",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NODEID": "0",
    "SLURMD_NODENAME": "gpu-b02",
}
OPENMPI = {
    "OMPI_COMM_WORLD_SIZE": "3",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "OMPI_COMM_WORLD_NODE_RANK": "0",
    "OMPI_MCA_ess_base_jobid": "156368897",
    "OMPI_MCA_ess_base_vpid": "1",
}
INDEXED_JOB = {"JOB_COMPLETION_INDEX": "5", "ELASTIC_SHARD_RUN_ID": "3f6a9c1e-uid", "ELASTIC_SHARD_NODES": "8"}
VOLCANO = {
    "VC_TASK_INDEX": "1",
    "VK_TASK_INDEX": "1",
    "VC_WORKER_NUM": "6",
    "VC_MASTER_NUM": "1",
    "ELASTIC_SHARD_RUN_ID": "dj-x-7c1",
}
PYTORCHJOB = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "MASTER_ADDR": "dj-master-0",
    "MASTER_PORT": "23456",
    "PET_NNODES": "4",
    "PET_NODE_RANK": "3",
}
PAI_DLC = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "dlc-master-0", "PAI_JOB_ID": "dlc1a2b3c"}


@pytest.mark.parametrize(
    ("env", "hostname", "expected"),
    [
        (SLURM_STEP, "gpu-a17", (Scheduler.SLURM, Shape.ALLOCATION, 4, 2, "gpu-a17", "slurm-812")),
        (SLURM_ARRAY, "gpu-b02", (Scheduler.SLURM, Shape.ARRAY, 16, 7, "gpu-b02", "slurm-900")),
        (OPENMPI, "w1", (Scheduler.OPENMPI, Shape.RANKS, 3, 1, "w1", "mpi-156368897")),
        ({**SLURM_STEP, **OPENMPI}, "w1", (Scheduler.OPENMPI, Shape.RANKS, 3, 1, "w1", "slurm-812")),
        (INDEXED_JOB, "dj-5-abcde", (Scheduler.KUBERNETES, Shape.INDEXED, 8, 5, "dj-5-abcde", "3f6a9c1e-uid")),
        (VOLCANO, "dj-x-worker-1", (Scheduler.VOLCANO, Shape.INDEXED, 6, 1, "dj-x-worker-1", "dj-x-7c1")),
        (PYTORCHJOB, "dj-worker-2", (Scheduler.KUBEFLOW, Shape.RANKS, 4, 3, "dj-worker-2", None)),
        (PAI_DLC, "dlc-worker-0", (Scheduler.PAI_DLC, Shape.RANKS, 2, 0, "dlc-worker-0", "dlc1a2b3c")),
        ({"PAI_JOB_ID": "dlcz"}, "h", (Scheduler.PAI_DLC, Shape.NONE, None, None, "h", "dlcz")),
        ({"PATH": "/usr/bin"}, "h", (Scheduler.NONE, Shape.NONE, None, None, "h", None)),
    ],
    ids=[
        "slurm-step",
        "slurm-array",
        "openmpi",
        "mpirun-in-slurm",
        "indexed-job",
        "volcano",
        "pytorchjob",
        "pai-dlc",
        "pai-env",
        "none",
    ],
)
def test_each_scheduler_gives_its_node_count_identity_and_run_id(env, hostname, expected):
    found = detect(env, hostname=hostname)
    assert (found.scheduler, found.shape, found.nodes, found.node_index, found.node_name, found.run_id) == expected
    assert found.evidence  # every value says where it came from


def test_the_evidence_names_the_variables_and_the_warnings_name_the_traps():
    batch = {key: value for key, value in SLURM_STEP.items() if not key.startswith("SLURM_STEP")}
    found = detect(batch, hostname="gpu-a17")
    assert "run id slurm-812 from $SLURM_JOB_ID=812" in found.evidence
    assert any("not in a job step" in w and "srun --ntasks-per-node=1" in w for w in found.warnings)
    assert not detect(SLURM_STEP, hostname="x").warnings
    crowded = detect({**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x4)"}, hostname="x")
    assert any("--ntasks-per-node=1" in w for w in crowded.warnings)
    two_per_node = detect({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, hostname="x")
    assert any("-npernode 1" in w for w in two_per_node.warnings)
    no_id = detect({"JOB_COMPLETION_INDEX": "0"}, hostname="x")
    assert no_id.run_id is None and any("ELASTIC_SHARD_RUN_ID" in w for w in no_id.warnings)
    with pytest.raises(UsageError, match=r"kubernetes sets none.*kubernetes\.md"):
        resolve_run_id(None, no_id)
    # Two Volcano tasks: the pod's own task is the one its name carries.
    two_tasks = detect({"VC_TASK_INDEX": "0", "VC_PS_NUM": "2", "VC_WORKER_NUM": "5"}, hostname="job-worker-0")
    assert two_tasks.nodes == 5


def test_explicit_flags_and_the_generic_variables_win_over_the_scheduler():
    found = detect({**SLURM_ARRAY, "ELASTIC_SHARD_NODES": "3"}, hostname="x").overridden(nodes=None, run_id=None)
    assert found.nodes == 3
    found = detect(SLURM_ARRAY, hostname="x").overridden(nodes=2, run_id="mine")
    assert (found.nodes, found.run_id) == (2, "mine")
    assert "nodes 2 from --nodes (the environment said 16)" in found.evidence
    assert resolve_run_id("mine", found) == "mine"
    assert detect({**SLURM_STEP, "PAI_JOB_ID": "p"}, hostname="x").run_id == "p"
    assert detect({**SLURM_STEP, "ELASTIC_SHARD_RUN_ID": "e", "PAI_JOB_ID": "p"}, hostname="x").run_id == "e"


@pytest.mark.parametrize(
    "variable", ["SLURM_JOB_NUM_NODES", "OMPI_COMM_WORLD_SIZE", "JOB_COMPLETION_INDEX", "ELASTIC_SHARD_NODES", "PET_NNODES"]
)
def test_a_malformed_variable_is_refused_by_name(variable):
    env = {"SLURM_JOB_ID": "1"} if variable == "SLURM_JOB_NUM_NODES" else {}
    with pytest.raises(UsageError, match=rf"\${variable}='four' is not a whole number"):
        detect({**env, variable: "four"}, hostname="x")


def _explain(job: Path, *flags: str, **environ: str) -> subprocess.CompletedProcess:
    """`dlc --explain` in a process of its own, with only `environ` for a scheduler's variables."""
    return subprocess.run(
        [sys.executable, "-m", "elastic_sharding", "dlc", "--job-dir", str(job), "--explain", *flags],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dlc_explain_prints_what_it_detected_and_runs_nothing(tmp_path):
    job = tmp_path / "job"
    out = _explain(job, **SLURM_ARRAY)
    assert out.returncode == 0, out.stderr
    assert "scheduler:  slurm (array)" in out.stdout
    assert "run id:     slurm-900" in out.stdout
    assert "node index: 7" in out.stdout and "nodes:      16" in out.stdout
    assert "from $SLURM_ARRAY_TASK_COUNT=16" in out.stdout
    assert not job.exists()


def test_dlc_explain_warns_where_the_command_would_stop(tmp_path):
    """Outside a scheduler with no run id, and with strict-mode arithmetic that cannot hold: the
    explanation says so (exit 0: it only explains) where `dlc` itself would refuse to start."""
    out = _explain(tmp_path / "job", "--nodes", "4", "--num-shards", "6", "--require-all-nodes")
    assert out.returncode == 0, out.stderr
    assert "run id:     none" in out.stdout
    assert "warning: this command would stop here: no run id: pass --run-id ID" in out.stdout
    assert "warning: this command would stop here: --require-all-nodes with --nodes 4 and --num-shards 6" in out.stdout
    named = _explain(tmp_path / "job", "--run-id", "smoke-1")
    assert named.returncode == 0, named.stderr
    assert "run id:     smoke-1" in named.stdout and "would stop here" not in named.stdout
    assert not (tmp_path / "job").exists()


def _need_mpirun() -> list[str]:
    if shutil.which("mpirun") is None:
        pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)")
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH"]


def test_a_real_mpirun_is_detected_and_runs_a_whole_dlc_job_without_nodes_or_run_id(tmp_path, monkeypatch, launch):
    mpirun = _need_mpirun()
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    explain = subprocess.run(
        [*mpirun, sys.executable, "-m", "elastic_sharding", "dlc", "--job-dir", str(tmp_path / "x"), "--explain"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert explain.returncode == 0, explain.stderr
    run_ids = [line.split()[-1] for line in explain.stdout.splitlines() if line.startswith("run id:")]
    assert len(run_ids) == 2 and run_ids[0] == run_ids[1] and run_ids[0].startswith("mpi-")
    assert sorted(line.split()[-1] for line in explain.stdout.splitlines() if line.startswith("node index:")) == ["0", "1"]

    job = tmp_path / "job"
    codes = launch("dlc", "--job-dir", str(job), "--num-shards", "4", prefix=tuple(mpirun))
    assert codes == [0], (tmp_path / "dlc-0.log").read_text()[-3000:]
    log = (tmp_path / "dlc-0.log").read_text()
    assert f"run {run_ids[0][:4]}" in log and "openmpi node 0 of 2" in log and "openmpi node 1 of 2" in log
    merged = json.loads((job / "merge.json").read_text())
    assert merged["rows"] == 12


def test_an_elastic_pytorchjob_and_an_interactive_salloc_step_are_read_right():
    elastic = detect({"PET_NNODES": "1:8", "WORLD_SIZE": "3", "RANK": "2"}, hostname="x")
    assert (elastic.nodes, elastic.node_index) == (3, 2)
    assert any("$PET_NNODES=1:8 is a range" in w and "$WORLD_SIZE=3" in w and "--nodes" in w for w in elastic.warnings)
    assert "warning: $PET_NNODES=1:8 is a range" in elastic.describe()
    fixed = detect({"PET_NNODES": "4", "WORLD_SIZE": "4", "RANK": "2", "ELASTIC_SHARD_RUN_ID": "r"}, hostname="x")
    assert fixed.nodes == 4 and not fixed.warnings
    shell = {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "4294967290", "SLURM_NODEID": "0"}
    assert any("not in a job step" in w for w in detect(shell, hostname="x").warnings)
