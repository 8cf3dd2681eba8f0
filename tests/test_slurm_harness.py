"""The Slurm test harness itself (tests/support/slurm.py): real sbatch, srun, arrays and requeue on separate nodes, clean stop."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cluster import _alive, _ns_ids, _pids_in
from support.slurm import SlurmCluster

pytestmark = pytest.mark.cluster

# Each srun task prints what its node and the job look like from there, and reads a file the test put on the volume.
MULTI = """#!/bin/sh
srun --ntasks-per-node=1 sh -c 'echo "$(hostname) $SLURMD_NODENAME $SLURM_JOB_NUM_NODES $(cat {vol}/token)"'
"""

# One file per run of a task; task 0's first run waits to be requeued.
ARRAY = """#!/bin/sh
echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_JOB_ID $(hostname)" > {vol}/array/$SLURM_ARRAY_TASK_ID-${{SLURM_RESTART_COUNT:-0}}
if [ "$SLURM_ARRAY_TASK_ID" = 0 ] && [ -z "$SLURM_RESTART_COUNT" ]; then exec sleep 300; fi
"""

DAEMONS = {"munged", "slurmctld", "slurmscriptd", "slurmd", "slurmstepd"}


def _files(harness: SlurmCluster, directory: Path) -> dict[str, str]:
    """name -> content of the files in a volume directory, as node2 sees it."""
    proc = harness.cluster.nodes[1].run(["sh", "-c", 'cd "$1" && grep -H "" -- *', "-", str(directory)], timeout=30)
    return dict(line.split(":", 1) for line in proc.stdout.splitlines())


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_jobs_arrays_requeue_and_a_clean_stop(slurm):
    harness = slurm(nodes=2)
    c, vol = harness.cluster, harness.mount
    assert harness.timings["up"] < 10
    assert harness.run(["sh", "-c", f"echo shared > {vol}/token && mkdir {vol}/array"]).returncode == 0

    array = harness.submit(ARRAY.format(vol=vol), "--array=0-2%2", "--output=/dev/null")
    multi = harness.submit(MULTI.format(vol=vol), "--nodes=2", f"--output={vol}/multi.out")

    harness.wait_for(lambda: "0-0" in _files(harness, vol / "array"), 30, what="array task 0 started")
    first = harness.job(f"{array}_0")
    assert first["JobState"] == "RUNNING"
    harness.requeue(f"{array}_0")

    record = harness.wait_done(multi, timeout=30)
    assert (record["JobState"], record["ExitCode"], record["NodeList"]) == ("COMPLETED", "0:0", "node[1-2]")
    lines = sorted(c.nodes[1].read_bytes(vol / "multi.out").decode().splitlines())
    assert lines == ["node1 node1 2 shared", "node2 node2 2 shared"]

    harness.wait_done(array, timeout=40)  # the requeued task starts again after cred_expire + 1 s
    runs = {name: content.split() for name, content in _files(harness, vol / "array").items()}
    assert set(runs) == {"0-0", "0-1", "1-0", "2-0"}
    for name, (array_id, task, _job_id, host) in runs.items():
        assert (array_id, task, host in harness.node_names) == (array, name[0], True)
    assert runs["0-0"][2] == runs["0-1"][2] == first["JobId"]  # a requeue keeps the job id
    requeued = harness.job(f"{array}_0")
    assert (requeued["JobState"], requeued["Restarts"]) == ("COMPLETED", "1")
    assert {job["state"] for job in harness.jobs(all_states=True)} == {"COMPLETED"}

    # Stop with a two-node step still running: every job process and daemon goes, by pid and namespace.
    running = harness.submit("#!/bin/sh\nsrun sleep 300\n", "--nodes=2")
    harness.wait_for(lambda: sum(_comm(pid) == "sleep" for pid in harness.job_processes()) == 2, 30, what="steps up")
    assert harness.job(running)["JobState"] == "RUNNING"
    # Without --output, the job's log is on the volume, not in the caller's working directory.
    assert c.nodes[1].run(["test", "-f", f"{vol}/slurm-{running}.out"], timeout=30).returncode == 0
    assert not Path(f"slurm-{running}.out").exists()
    daemons = harness.daemon_pids()
    assert set(daemons) == {"munged", "slurmctld", "slurmd-node1", "slurmd-node2"}
    assert c.server_anchor is not None
    ids = set().union(*(_ns_ids(anchor.pid) for anchor in [c.server_anchor, *(n.anchor for n in c.nodes)] if anchor))
    harness.down()
    assert harness.timings["down"] < 10
    assert not [name for name, pid in daemons.items() if _alive(pid)]
    assert not [(pid, _comm(pid)) for pid in _pids_in(ids) if _comm(pid) in DAEMONS]
    assert not harness.job_processes()
    assert not harness.private.exists()

    # A start that fails (slurmctld and slurmd refuse the config) says why and leaves nothing behind.
    broken = SlurmCluster(c, extra_conf=["NoSuchOption=1"])
    with pytest.raises(RuntimeError, match="NoSuchOption"):
        broken.up(timeout=15)
    assert not broken.daemon_pids()
    assert not [(pid, _comm(pid)) for pid in _pids_in(ids) if _comm(pid) in DAEMONS]
    assert not broken.private.exists()
