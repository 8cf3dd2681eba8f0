#!/usr/bin/env python3
"""A real Slurm on the GlusterFS test cluster's nodes (tests/support/cluster.py), started and stopped by the tests.

Why: the Slurm launch flow has to be tested against real `sbatch`, `srun`, array jobs, `scancel` and
`scontrol requeue` on separate hosts that share only a network filesystem, not against a mock.
Debian's slurmctld, slurmd, slurm-client and munge (`scripts/system-packages`) are enough.

Arrangement on a started `Cluster` with index k (see docs/testing/slurm.md)::

    server ns (es-srv-<k>, 10.200.<k>.1)   munged -F (private socket), slurmctld -D
    node i ns (node<i>, 10.200.<k>.<10+i>)  slurmd -D -N node<i>; its jobs see hostname node<i> and the volume
    node1 ns                                 the client commands (sbatch, squeue, scontrol, ...)

slurmctld runs in the server's namespaces because that is the one address every node reaches and
no compute node is special; munged runs there too, so that the cluster's own clean-up (everything in
its namespaces is killed) also stops both after an owner was killed with SIGKILL. munged is private:
its key, socket, pid, seed and log live in this harness's directory (inside the cluster's private
directory), and slurm.conf's `AuthInfo=socket=...` points every daemon and client at it. A
path-based unix socket is reachable from every network namespace and, being under /tmp rather than
/run, from the server's mount namespace too. Nothing of the host's /etc/munge, /run/munge or any
host-wide Slurm is used.

By hand (as root):

    python tests/support/slurm.py up --nodes 3     # prints how to submit; Ctrl-C tears down

In tests: the `slurm` fixture (tests/conftest.py): `slurm_cluster = slurm(nodes=2)`, then
`job_id = slurm_cluster.submit("#!/bin/sh\\nsrun hostname\\n", "--nodes=2")`, `slurm_cluster.wait_done(job_id)`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):  # run as a script: make `support` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.cluster import (  # noqa: E402
    MODES,
    Cluster,
    _alive,
    _ns_ids,
    _pids_in,
    _tool,
    built_for_a_test,
    cluster_available,
)

T = TypeVar("T")

SLURM_TOOLS = (
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "munged",
    "munge",
    "sbatch",
    "srun",
    "salloc",
    "scontrol",
    "squeue",
    "sinfo",
    "scancel",
)
CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")
DONE_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
KILL_WAIT = 5
_SQUEUE_FIELDS = (("job_id", "%i"), ("job_id_raw", "%A"), ("array_job_id", "%F"), ("array_task_id", "%K"),
                  ("state", "%T"), ("nodes", "%N"), ("reason", "%r"), ("name", "%j"))  # fmt: skip
_KEY_VALUE = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=(.*?)(?=\s[A-Za-z][\w:/]*=|\s*$)")

_CONF = """\
ClusterName=es{k}
SlurmctldHost={ctld_host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket},cred_expire={cred_expire}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PreemptType=preempt/none
ReturnToService=2
JobRequeue=1
KillWait={kill_wait}
MinJobAge=600
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SlurmdParameters=config_overrides
MailProg=/bin/true
StateSaveLocation={private}/state
SlurmdSpoolDir={private}/spool/%n
SlurmctldPidFile={private}/run/slurmctld.pid
SlurmdPidFile={private}/run/slurmd-%n.pid
SlurmctldLogFile={private}/log/slurmctld.log
SlurmdLogFile={private}/log/slurmd-%n.log
{nodes}
PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
{extra}"""


def slurm_available() -> str | None:
    """None if a SlurmCluster can be built here, else the reason why not."""
    if os.geteuid() != 0:
        return "the Slurm test harness needs root (namespaces, FUSE mounts, slurmd)"
    missing = [name for name in SLURM_TOOLS if shutil.which(name, path=_sbin_path()) is None]
    if missing:
        return f"missing {', '.join(missing)} (scripts/system-packages installs slurmctld, slurmd, slurm-client and munge)"
    reason = cluster_available()
    return None if reason is None else f"GlusterFS test cluster unavailable: {reason}"


def _sbin_path() -> str:
    return os.environ.get("PATH", os.defpath) + ":/usr/local/sbin:/usr/sbin:/sbin"


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def parse_key_values(line: str) -> dict[str, str]:
    """`Key=value Key2=va lue` (scontrol -o) -> dict; a value runs until the next ` Key=`."""
    return {m.group(1): m.group(2) for m in _KEY_VALUE.finditer(line.strip())}


def _job_env(pid: int) -> bool:
    """A Slurm job process in a node: a slurmstepd, or anything with SLURM_JOB_ID in its environment."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmstepd":
            return True
        return b"\0SLURM_JOB_ID=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


class SlurmCluster:
    """slurmctld + one slurmd per node of a started `Cluster` (see the module docstring); `up()` starts, `down()` stops."""

    _instances: set[SlurmCluster] = set()

    def __init__(
        self,
        cluster: Cluster,
        cpus: int = 2,
        real_memory: int = 2000,
        cred_expire: int = 10,
        extra_conf: Sequence[str] = (),
    ):
        """`cred_expire` (s) also delays a requeued job's restart (by cred_expire + 1 s); `extra_conf`: more slurm.conf lines."""
        if cluster.k is None or cluster.private is None or not cluster.nodes:
            raise RuntimeError("SlurmCluster needs a started Cluster")
        self.cluster = cluster
        self.cpus = cpus
        self.real_memory = real_memory
        self.cred_expire = cred_expire
        self.extra_conf = list(extra_conf)
        self.k: int = cluster.k
        self.private = cluster.private / "slurm"
        self.conf = self.private / "slurm.conf"
        self.socket = self.private / "munge" / "munge.socket"
        self.ctld_port = 20000 + 10 * self.k  # each daemon has its own netns anyway; a k-derived port is clear in logs
        self.slurmd_port = self.ctld_port + 1
        self.munged: subprocess.Popen | None = None
        self.slurmctld: subprocess.Popen | None = None
        self.slurmds: list[subprocess.Popen] = []
        self.timings: dict[str, float] = {}  # seconds: "up", "down"
        self._started = False
        self._owner = os.getpid()
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"SlurmCluster(k={self.k}, nodes={self.node_names}, conf={self.conf})"

    def __enter__(self) -> SlurmCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.cluster.nodes]

    @property
    def ctld_host(self) -> str:
        """The server namespace's hostname, which slurmctld checks against SlurmctldHost."""
        return self.cluster.server_netns

    @property
    def mount(self) -> Path:
        """The shared volume, at the same path on every node."""
        return self.cluster.mount

    # --- clients ---

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Our environment without inherited Slurm variables, with SLURM_CONF; `extra` over it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_ENV_PREFIXES)}
        return {**env, "PATH": _sbin_path(), "SLURM_CONF": str(self.conf), **(extra or {})}

    def _client(self, args: Sequence[str | os.PathLike], cwd: Path | str | None) -> list[str]:
        return [*self.cluster.nodes[0].enter(cwd), *map(str, args)]

    def run(
        self,
        args: Sequence[str | os.PathLike],
        *,
        input: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float = 60,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, squeue, ...) on node1, output captured as text."""
        cmd = self._client(args, cwd)
        return subprocess.run(cmd, input=input, env=self.env(env), capture_output=True, text=True, timeout=timeout, check=check)

    def popen(
        self, args: Sequence[str | os.PathLike], *, env: dict[str, str] | None = None, cwd: Path | str | None = None, **kwargs
    ) -> subprocess.Popen:
        """Start a Slurm client command (e.g. a blocking `srun`) on node1; its pid is the real process."""
        return subprocess.Popen(self._client(args, cwd), env=self.env(env), **kwargs)

    def _checked(self, args: Sequence[str], **kwargs) -> str:
        proc = self.run(args, **kwargs)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def submit(self, script: str, *sbatch_args: str, env: dict[str, str] | None = None, cwd: Path | str | None = None) -> str:
        """`sbatch --parsable` the script text; returns the job id ("123"; an array's tasks are "123_<i>").
        Without `--output`, the job's log goes to the shared volume (`slurm-<id>.out`), not to sbatch's
        default, the caller's working directory (a repository checkout, where it was left behind)."""
        if not any(arg.startswith(("--output", "-o")) for arg in sbatch_args):
            sbatch_args = (*sbatch_args, f"--output={self.mount}/slurm-%j.out")
        out = self._checked(["sbatch", "--parsable", *sbatch_args], input=script, env=env, cwd=cwd)
        return out.strip().split(";")[0]

    def job_records(self, job_id: str | int) -> list[dict[str, str]]:
        """`scontrol show job -o` as dicts: one per job, or per task of an array job id."""
        out = self._checked(["scontrol", "show", "job", "-o", str(job_id)])
        return [parse_key_values(line) for line in out.splitlines() if line.strip()]

    def job(self, job_id: str | int) -> dict[str, str]:
        """The record of one job or array task ("123_4"); for an array job id, the task whose JobId it is."""
        records = self.job_records(job_id)
        array_id, _, task = str(job_id).partition("_")
        for record in records:
            if task and record.get("ArrayJobId") == array_id and record.get("ArrayTaskId") == task:
                return record
            if not task and record.get("JobId") == array_id:
                return record
        if len(records) == 1:
            return records[0]
        raise LookupError(f"no single record for job {job_id}: {records}")

    def jobs(self, all_states: bool = False) -> list[dict[str, str]]:
        """squeue's view: job_id (123 or 123_4), job_id_raw, array_job_id, array_task_id, state, nodes, reason, name.

        Only pending/running/completing jobs unless `all_states` (finished ones are kept for MinJobAge=600 s).
        """
        fmt = "|".join(code for _, code in _SQUEUE_FIELDS)
        out = self._checked(["squeue", "-h", "-o", fmt, *(["--states=all"] if all_states else [])])
        keys = [key for key, _ in _SQUEUE_FIELDS]
        return [dict(zip(keys, line.split("|", len(keys) - 1))) for line in out.splitlines() if line.strip()]

    def wait_for(self, predicate: Callable[[], T], timeout: float = 30, interval: float = 0.2, what: str = "") -> T:
        """Poll until `predicate()` is truthy and return it; TimeoutError (with `what`) after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout} s: {what or predicate}")
            time.sleep(interval)

    def wait_done(self, job_id: str | int, timeout: float = 60) -> dict[str, str]:
        """Wait until the job (or every task of an array job) has finished; returns its record."""

        def done() -> bool:
            return all(r.get("JobState") in DONE_STATES for r in self.job_records(job_id))

        self.wait_for(done, timeout, what=f"job {job_id} finished; now {self.jobs(all_states=True)}")
        return self.job(job_id)

    def cancel(self, job_id: str | int, signal: str | None = None) -> None:
        """`scancel` the job, or only send it `signal` (e.g. "USR1") to every step and the batch shell."""
        self._checked(["scancel", *([f"--signal={signal}", "--full"] if signal else []), str(job_id)])

    def requeue(self, job_id: str | int) -> None:
        """`scontrol requeue`: the job is killed and runs again with SLURM_RESTART_COUNT+1, the same job id."""
        self._checked(["scontrol", "requeue", str(job_id)])

    def job_processes(self) -> list[int]:
        """Live slurmstepd and job processes (SLURM_JOB_ID in their environment) in the nodes' namespaces."""
        ids: set[str] = set()
        for node in self.cluster.nodes:
            if node.anchor is not None and _alive(node.anchor.pid):
                with contextlib.suppress(OSError):
                    ids |= _ns_ids(node.anchor.pid)
        return [pid for pid in _pids_in(ids) if _job_env(pid)] if ids else []

    def daemon_pids(self) -> dict[str, int]:
        """The pids of munged, slurmctld and every slurmd (by node name) that still run."""
        daemons = {"munged": self.munged, "slurmctld": self.slurmctld}
        daemons |= {f"slurmd-{name}": proc for name, proc in zip(self.node_names, self.slurmds)}
        return {name: proc.pid for name, proc in daemons.items() if proc is not None and proc.poll() is None}

    def logs(self, lines: int = 25) -> str:
        """The tail of every daemon's log, for a failure message."""
        logs = sorted((self.private / "log").glob("*")) if (self.private / "log").is_dir() else []
        return "\n".join(f"--- {log.name}\n{_tail(log, lines)}" for log in logs)

    # --- start and stop ---

    def up(self, timeout: float = 30) -> SlurmCluster:
        """Start munged, slurmctld and the slurmds; wait until every node is idle. On failure, stop and raise with the logs."""
        if self._started or self.munged is not None:
            raise RuntimeError("a SlurmCluster is brought up once; make a new one")
        reason = slurm_available()
        if reason is not None:
            raise RuntimeError(f"Slurm test harness unavailable: {reason}")
        started = time.monotonic()
        _register(self)
        self._started = True
        try:
            self._start(timeout)
        except BaseException as exc:
            logs = self.logs()
            self.down()
            if isinstance(exc, Exception):
                raise RuntimeError(f"Slurm did not start: {exc}\n{logs}") from exc
            raise
        self.timings["up"] = time.monotonic() - started
        return self

    def _in_server(self, args: Sequence[str], log: str) -> subprocess.Popen:
        assert self.cluster.server_anchor is not None
        enter = [_tool("nsenter"), "-t", str(self.cluster.server_anchor.pid), "-u", "-m", "-n", "--"]
        return self._daemon([*enter, *args], log)

    def _daemon(self, cmd: Sequence[str], log: str) -> subprocess.Popen:
        with open(self.private / "log" / log, "ab") as out:
            return subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env(), cwd="/", start_new_session=True
            )

    def _write_conf(self) -> None:
        c = self.cluster
        nodes = "\n".join(
            f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.ip} CPUs={self.cpus} RealMemory={self.real_memory} State=UNKNOWN"
            for n in c.nodes
        )
        self.conf.write_text(
            _CONF.format(
                k=self.k,
                ctld_host=self.ctld_host,
                ctld_addr=c.server_ip,
                ctld_port=self.ctld_port,
                slurmd_port=self.slurmd_port,
                socket=self.socket,
                cred_expire=self.cred_expire,
                kill_wait=KILL_WAIT,
                private=self.private,
                nodes=nodes,
                node_list=",".join(self.node_names),
                extra="".join(f"{line}\n" for line in self.extra_conf),
            )
        )

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        c = self.cluster
        assert c.private is not None
        c.private.chmod(0o711)  # munged requires search permission for all on every directory above its socket
        if len(str(self.socket)) > 100:
            raise RuntimeError(f"munge socket path too long for a unix socket: {self.socket}")
        self.private.mkdir(mode=0o711)
        for sub in ("state", "run", "log", *(f"spool/{name}" for name in self.node_names)):
            (self.private / sub).mkdir(parents=True)
        (self.private / "munge").mkdir(mode=0o755)
        key = self.private / "munge.key"
        key.touch(mode=0o600)
        key.write_bytes(os.urandom(1024))
        self._write_conf()
        munged = [_tool("munged"), "-F", f"--socket={self.socket}", f"--key-file={key}", f"--origin={c.server_ip}"]
        munged += [f"--pid-file={self.private}/run/munged.pid", f"--seed-file={self.private}/munged.seed", "--num-threads=4"]
        self.munged = self._in_server(munged, "munged.log")  # -F logs to stderr
        self.slurmctld = self._in_server([_tool("slurmctld"), "-D"], "slurmctld.out")
        self.wait_for(lambda: self._check_daemons() or self.socket.exists(), deadline - time.monotonic(), 0.02, "munged socket")
        for node in c.nodes:
            self.slurmds.append(
                self._daemon([*node.enter("/"), _tool("slurmd"), "-D", "-N", node.name], f"slurmd-{node.name}.out")
            )
        self.wait_for(self._all_idle, deadline - time.monotonic(), 0.1, f"all of {self.node_names} idle")

    def _check_daemons(self) -> bool:
        for name, proc in [("munged", self.munged), ("slurmctld", self.slurmctld), *zip(self.node_names, self.slurmds)]:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}")
        return False

    def _all_idle(self) -> bool:
        self._check_daemons()
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
        if proc.returncode != 0:
            return False
        states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in self.node_names)

    def down(self) -> None:
        """Cancel every job and wait for its processes to go, then stop slurmd, slurmctld and munged by pid; idempotent."""
        with self._lock:
            if not self._started:
                SlurmCluster._instances.discard(self)
                return
            started = time.monotonic()
            try:
                self._stop_jobs()
            finally:
                self._stop_daemons()
                shutil.rmtree(self.private, ignore_errors=True)
                self._started = False
                SlurmCluster._instances.discard(self)
                self.timings["down"] = time.monotonic() - started

    def _stop_jobs(self) -> None:
        ctld_up = self.slurmctld is not None and self.slurmctld.poll() is None
        deadline = time.monotonic() + KILL_WAIT + 15
        if ctld_up:
            with contextlib.suppress(Exception):
                ids = {job["job_id"] for job in self.jobs()}
                if ids:
                    self.run(["scancel", *sorted(ids)], timeout=20)
                while time.monotonic() < deadline and (self.jobs() or self.job_processes()):
                    time.sleep(0.1)
        for pid in self.job_processes():  # slurmd gone or jobs stuck: by pid, only in the nodes' namespaces
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            self.wait_for(lambda: not self.job_processes(), 10, 0.05)

    def _stop_daemons(self) -> None:
        for group in (self.slurmds, [self.slurmctld], [self.munged]):
            procs = [p for p in group if p is not None]
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


# --- clean-up on exit and SIGTERM ----------------------------------------------------------------

_handlers_installed = False


def _down_all() -> None:
    for harness in list(SlurmCluster._instances):
        if harness._owner == os.getpid():
            with contextlib.suppress(Exception):
                harness.down()


def _register(harness: SlurmCluster) -> None:
    """Track live harnesses so that exit and SIGTERM stop Slurm before the cluster under it goes.

    Registered after the cluster's own handlers (a cluster is up first): atexit runs this one first,
    and the SIGTERM handler chains to the one it replaces.
    """
    global _handlers_installed
    SlurmCluster._instances.add(harness)
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_down_all)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL or previous is None or getattr(previous, "__module__", "") == "support.cluster":

        def on_sigterm(signum: int, frame: object) -> None:
            _down_all()
            if callable(previous):
                previous(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)


# --- pytest ------------------------------------------------------------------------------------


@contextlib.contextmanager
def slurm_factory() -> Iterator[Callable[..., SlurmCluster]]:
    """Behind the `slurm` fixture: skip (or fail, with ELASTIC_SHARD_REQUIRE_CLUSTER=1) if unavailable; tear all down."""
    with built_for_a_test(slurm_available(), "Slurm test harness") as made:

        def make(nodes: int = 3, cpus: int = 2, mode: str = "strict", **kwargs) -> SlurmCluster:
            cluster = Cluster(nodes, mode)
            made.append(cluster)
            cluster.up()
            harness = SlurmCluster(cluster, cpus, **kwargs)
            made.append(harness)
            return harness.up()

        yield make


# --- script ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A real Slurm on a GlusterFS test cluster of namespaces on this machine.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start Slurm on a new cluster and keep it until Ctrl-C/SIGTERM")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--cpus", type=int, default=2, help="CPUs per node")
    up.add_argument("--mode", choices=MODES, default="strict")
    commands.add_parser("check", help="say whether the harness can be built here")
    args = parser.parse_args(argv)
    if args.command == "check":
        reason = slurm_available()
        print("available" if reason is None else f"unavailable: {reason}")
        return 0 if reason is None else 1
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = Cluster(args.nodes, args.mode)
    harness: SlurmCluster | None = None
    try:
        cluster.up()
        harness = SlurmCluster(cluster, args.cpus).up()
        node1 = cluster.nodes[0]
        assert node1.anchor is not None
        print(f"Slurm up in {harness.timings['up']:.1f} s (cluster {cluster.timings['up']:.1f} s): nodes {harness.node_names}")
        print(f"volume: {cluster.mount} on every node; logs: {harness.private}/log")
        print("submit from node1 (the host has no route to the cluster):")
        print(f"  nsenter -t {node1.anchor.pid} -u -m -n env SLURM_CONF={harness.conf} bash")
        print(f"  sbatch --nodes={args.nodes} --wrap 'srun hostname'; squeue; scontrol show job -o <id>")
        print("Ctrl-C or SIGTERM tears it down.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if harness is not None:
            harness.down()
        cluster.down()
    if harness is not None:
        print(f"down in {harness.timings.get('down', 0):.1f} s (cluster {cluster.timings.get('down', 0):.1f} s)")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
