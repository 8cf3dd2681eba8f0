"""`mpi`: the MPIJob Launcher's one command — prepare, `mpirun` one worker per node, finalize.

A PAI-DLC MPIJob runs its command only on the Launcher; the Launcher starts one worker process
on every Worker node with `mpirun -np N -npernode 1 --hostfile /etc/mpi/hostfile`. Workers do not
use MPI to communicate: ranks only place them, and the shared directory coordinates them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

from elastic_sharding.children import child_env
from elastic_sharding.errors import EXIT_OK, UsageError
from elastic_sharding.launch.steps import (
    JobRequest,
    finalize,
    job_failure,
    preflight_job,
    prepare_job,
    wait_draining,
    worker_command,
)
from elastic_sharding.observe.status import Status
from elastic_sharding.prepare.cooperate import JOIN_ENV

log = logging.getLogger(__name__)

DLC_HOSTFILE = Path("/etc/mpi/hostfile")
FORWARDED_ENV = (
    JOIN_ENV,
    "PATH",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "HF_ENDPOINT",
    "CUDA_VISIBLE_DEVICES",
)


def hostfile_hosts(path: Path) -> list[str]:
    """Distinct host names of an OpenMPI hostfile (`name [slots=N] ...`, `#` comments)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read --hostfile {path}: {exc.strerror or exc}") from None
    hosts: list[str] = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if fields and fields[0] not in hosts:
            hosts.append(fields[0])
    if not hosts:
        raise UsageError(f"--hostfile {path} names no hosts")
    return hosts


def mpirun_command(
    mpirun: str, np: int, hostfile: Path | None, extra: list[str], worker: list[str], env: dict[str, str]
) -> list[str]:
    command = [mpirun]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += ["-np", str(np), "-npernode", "1"]
    if hostfile is not None:
        command += ["--hostfile", str(hostfile)]
    for name in FORWARDED_ENV:
        if name in env:
            command += ["-x", name]
    return command + extra + worker


def run_mpi(
    req: JobRequest,
    np: int | None,
    hostfile: Path | None,
    mpirun: str,
    mpirun_args: list[str],
    max_shards: int | None,
    expect_nodes: int,
    runner: str,
) -> int:
    if hostfile is None and DLC_HOSTFILE.is_file():
        hostfile = DLC_HOSTFILE
    hosts = hostfile_hosts(hostfile) if hostfile is not None else None
    if np is None:
        if hosts is None:
            raise UsageError(f"pass --np N or --hostfile FILE (no {DLC_HOSTFILE} here)")
        np = len(hosts)
    if hosts is not None and np > len(hosts):
        raise UsageError(
            f"--np {np} is more than the {len(hosts)} host(s) in {hostfile}: one worker per node needs a host per rank"
        )
    if np < 1:
        raise UsageError("--np must be at least 1")
    if expect_nodes > np:
        raise UsageError(f"--expect-nodes {expect_nodes} is more than the {np} rank(s) mpirun starts")
    if shutil.which(mpirun) is None:
        raise UsageError(f"{mpirun!r} not found; install OpenMPI (e.g. apt-get install openmpi-bin) or pass --mpirun PATH")
    preflight_job(req)

    # The workers start before the prepare and share it (cooperate.help_until_prepared):
    # prepare time falls with the number of nodes, not only with this node's cores.
    options = ["--runner", runner] + (["--max-shards", str(max_shards)] if max_shards else [])
    env = child_env({JOIN_ENV: str(req.prepare_procs or 0)})
    command = mpirun_command(mpirun, np, hostfile, mpirun_args, worker_command(req.layout.root, *options), env)
    log.info("starting %d worker(s), one per node, to share the prepare and then run: %s", np, " ".join(command))
    proc = subprocess.Popen(command, env=env)
    try:
        message, _ = prepare_job(req)
    except BaseException:
        proc.send_signal(signal.SIGTERM)  # the workers stop waiting for a job that will not come
        proc.wait()
        raise
    log.info("%s", message)
    code = wait_draining(proc)
    if code != EXIT_OK:
        raise job_failure(Status(req.layout.root), [f"mpirun exited with code {code}"])
    done = finalize(req, expect_nodes)
    log.info("%s", done.message)
    return EXIT_OK
