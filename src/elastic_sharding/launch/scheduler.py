"""Where a launcher runs: the scheduler that started it, its node count, its node and its run id.

The same `dlc` command runs on every node of a submission. Each scheduler tells its processes who
they are in its own variables; reading them here means a user passes no `--nodes`/`--run-id` that
could disagree between nodes (datatrove's `--nodes=2` trap: every node computing the same rank).
Coordination never depends on these values (claims go through the shared directory); the run id
is the one that matters: it keeps one submission's coordination state out of the next one's.

Identity (node count, index) comes from the launcher closest to the process: `mpirun` started
inside a Slurm job is an OpenMPI rank first. The run id comes from the outermost submission that
names one, so a requeued Slurm job or a restarted PAI-DLC job rejoins its own run.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from elastic_sharding.errors import UsageError

RUN_ID_ENV = "ELASTIC_SHARD_RUN_ID"
NODES_ENV = "ELASTIC_SHARD_NODES"
SUBMISSION_ID_VARIABLES = ("PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID")
INTERACTIVE_STEP = "4294967290"  # SLURM_INTERACTIVE_STEP
ELASTIC_RANGE_RE = re.compile(r"^\d+:\d+$")  # PET_NNODES under a PyTorchJob elasticPolicy


class Scheduler(StrEnum):
    SLURM = "slurm"
    OPENMPI = "openmpi"
    VOLCANO = "volcano"
    KUBERNETES = "kubernetes"
    KUBEFLOW = "kubeflow"
    PAI_DLC = "pai-dlc"
    NONE = "none"


class Shape(StrEnum):
    """How the scheduler started the nodes of one submission."""

    ALLOCATION = "allocation"  # one Slurm job over N nodes, one task per node
    ARRAY = "array"  # a Slurm array: one single-node task per index, started whenever a node is free
    RANKS = "ranks"  # ranks of one launch: mpirun, a PyTorchJob
    INDEXED = "indexed"  # pods with an index: a Kubernetes Indexed Job, a Volcano task
    NONE = ""


@dataclass(frozen=True)
class Placement:
    scheduler: Scheduler
    shape: Shape
    nodes: int | None
    node_index: int | None
    node_name: str
    run_id: str | None
    evidence: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    def overridden(self, nodes: int | None, run_id: str | None) -> Placement:
        """The placement with the explicit flags applied: they always win over the environment."""
        evidence, changes = list(self.evidence), {}
        if nodes is not None and nodes != self.nodes:
            evidence.append(f"nodes {nodes} from --nodes" + (f" (the environment said {self.nodes})" if self.nodes else ""))
            changes["nodes"] = nodes
        if run_id is not None and run_id != self.run_id:
            evidence.append(f"run id {run_id} from --run-id" + (f" (the environment said {self.run_id})" if self.run_id else ""))
            changes["run_id"] = run_id
        return dataclasses.replace(self, evidence=tuple(evidence), **changes)

    def describe(self) -> str:
        """The `--explain` text: every value with where it came from."""
        shape = f" ({self.shape.value})" if self.shape else ""
        lines = [
            f"scheduler:  {self.scheduler.value}{shape}",
            f"nodes:      {self.nodes if self.nodes is not None else 'not said (elastic: any number may join)'}",
            f"node index: {self.node_index if self.node_index is not None else '-'}",
            f"node name:  {self.node_name}",
            f"run id:     {self.run_id if self.run_id is not None else 'none'}",
            "because (a later line wins over an earlier one):",
            *(f"  {line}" for line in self.evidence),
        ]
        lines += [f"warning: {line}" for line in self.warnings]
        return "\n".join(lines)


class _Reader:
    """Typed reads of the environment that remember which variables said what."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ
        self.evidence: list[str] = []
        self.warnings: list[str] = []

    def text(self, *names: str) -> tuple[str, str] | None:
        for name in names:
            value = self.environ.get(name, "").strip()
            if value:
                return name, value
        return None

    def number(self, *names: str) -> tuple[str, int] | None:
        found = self.text(*names)
        if found is None:
            return None
        name, value = found
        try:
            number = int(value)
        except ValueError:
            raise UsageError(f"${name}={value!r} is not a whole number; unset it or fix the job's environment") from None
        if number < 0:
            raise UsageError(f"${name}={value!r} is negative; unset it or fix the job's environment")
        return name, number

    def note(self, what: str, value: object, name: str, raw: object = None) -> None:
        shown = value if raw is None else raw
        self.evidence.append(f"{what} {value} from ${name}={shown}")


def read_number(environ: Mapping[str, str], *names: str) -> int | None:
    """The first of `names` that is set, as a whole number (a UsageError naming it otherwise)."""
    found = _Reader(environ).number(*names)
    return found[1] if found is not None else None


@dataclass
class _Found:
    scheduler: Scheduler
    shape: Shape
    nodes: int | None = None
    index: int | None = None
    run_id: str | None = None


def _openmpi(r: _Reader) -> _Found | None:
    size = r.number("OMPI_COMM_WORLD_SIZE")
    if size is None:
        return None
    found = _Found(Scheduler.OPENMPI, Shape.RANKS, nodes=size[1])
    r.note("nodes", size[1], size[0])
    rank = r.number("OMPI_COMM_WORLD_RANK")
    if rank is not None:
        found.index = rank[1]
        r.note("node index", rank[1], rank[0])
    local = r.number("OMPI_COMM_WORLD_LOCAL_SIZE")
    if local is not None and local[1] > 1:
        r.warnings.append(
            f"mpirun started {local[1]} ranks on this node (${local[0]}): one worker per node is the model; "
            "start it with `-npernode 1` (or `--map-by ppr:1:node`)"
        )
    jobid = r.text("OMPI_MCA_ess_base_jobid")
    if jobid is not None:
        found.run_id = f"mpi-{jobid[1]}"
        r.note("run id", found.run_id, jobid[0], jobid[1])
    return found


def _slurm(r: _Reader) -> _Found | None:
    job = r.text("SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        return None
    array = r.text("SLURM_ARRAY_JOB_ID")
    if array is not None:
        found = _Found(Scheduler.SLURM, Shape.ARRAY, run_id=f"slurm-{array[1]}")
        r.note("run id", found.run_id, array[0], array[1])
        count = r.number("SLURM_ARRAY_TASK_COUNT")
        if count is not None:
            found.nodes = count[1]
            r.note("nodes", count[1], count[0])
        task = r.number("SLURM_ARRAY_TASK_ID")
        if task is not None:
            found.index = task[1]
            r.note("node index", task[1], task[0])
        return found
    found = _Found(Scheduler.SLURM, Shape.ALLOCATION, run_id=f"slurm-{job[1]}")
    r.note("run id", found.run_id, job[0], job[1])
    step = r.text("SLURM_STEP_ID", "SLURM_STEPID")
    in_step = step is not None and step[1] != INTERACTIVE_STEP  # salloc's shell under use_interactive_step
    nodes = r.number("SLURM_STEP_NUM_NODES") if in_step else None
    nodes = nodes or r.number("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if nodes is not None:
        found.nodes = nodes[1]
        r.note("nodes", nodes[1], nodes[0])
    node = r.number("SLURM_NODEID")
    if node is not None:
        found.index = node[1]
        r.note("node index", node[1], node[0])
    if not in_step and found.nodes is not None and found.nodes > 1:
        r.warnings.append(
            f"in a {found.nodes}-node Slurm allocation but not in a job step: this command runs on one node only; "
            "start one per node with `srun --ntasks-per-node=1 ...`, or use `elastic-shard slurm`, which does"
        )
    # Slurm writes tasks per node compressed, e.g. "2(x4)" or "2,1": any count above 1 is a trap.
    tasks = r.text("SLURM_STEP_TASKS_PER_NODE") if in_step else None
    if tasks is not None and any(int(n) > 1 for n in re.findall(r"(?:^|,)(\d+)", tasks[1])):
        r.warnings.append(f"${tasks[0]}={tasks[1]}: one worker per node is the model; use `srun --ntasks-per-node=1`")
    return found


def _volcano(r: _Reader, hostname: str) -> _Found | None:
    index = r.number("VC_TASK_INDEX", "VK_TASK_INDEX")
    if index is None:
        return None
    found = _Found(Scheduler.VOLCANO, Shape.INDEXED, index=index[1])
    r.note("node index", index[1], index[0])
    counts = {name: value for name, value in r.environ.items() if re.fullmatch(r"VC_[A-Z0-9_]+_NUM", name)}
    # The svc plugin sets VC_<TASK>_NUM for every task of the job; the pod's own task is the one
    # its name (`<job>-<task>-<index>`) carries.
    mine = [n for n in counts if hostname.lower().endswith(f"-{n[3:-4].lower().replace('_', '-')}-{index[1]}")]
    chosen = mine[0] if len(mine) == 1 else next(iter(counts)) if len(counts) == 1 else None
    if chosen is not None:
        nodes = r.number(chosen)
        if nodes is not None:
            found.nodes = nodes[1]
            r.note("nodes", nodes[1], nodes[0])
    return found


def _kubernetes(r: _Reader) -> _Found | None:
    index = r.number("JOB_COMPLETION_INDEX")
    if index is None:
        return None
    r.note("node index", index[1], index[0])
    return _Found(Scheduler.KUBERNETES, Shape.INDEXED, index=index[1])


def _ranks(r: _Reader) -> _Found | None:
    """Kubeflow's PyTorchJob (and PAI-DLC's) sets RANK/WORLD_SIZE per pod, PET_* for torchrun."""
    # With an elasticPolicy PET_NNODES is a range ("1:8"): the pod count is then WORLD_SIZE's, a
    # count of this moment that pods coming and going change; anything else must be a number.
    nnodes = r.text("PET_NNODES")
    elastic = nnodes is not None and ELASTIC_RANGE_RE.match(nnodes[1]) is not None
    size = r.number("PET_NNODES") if nnodes is not None and not elastic else None
    size = size or r.number("WORLD_SIZE")
    if elastic:
        assert nnodes is not None
        counted = f"the node count is ${size[0]}={size[1]}, the pods of this moment" if size else "the node count is not said"
        r.warnings.append(
            f"${nnodes[0]}={nnodes[1]} is a range (a PyTorchJob elasticPolicy): {counted}; pods may come and go, so "
            "--require-all-nodes cannot rely on it: pass --nodes N, or leave out elasticPolicy (docs/guides/kubernetes.md)"
        )
    rank = r.number("PET_NODE_RANK", "RANK")
    if size is None and rank is None:
        return None
    scheduler = Scheduler.PAI_DLC if r.text("PAI_JOB_ID") is not None else Scheduler.KUBEFLOW
    found = _Found(scheduler, Shape.RANKS)
    if size is not None:
        found.nodes = size[1]
        r.note("nodes", size[1], size[0])
    if rank is not None:
        found.index = rank[1]
        r.note("node index", rank[1], rank[0])
    return found


def detect(environ: Mapping[str, str], hostname: str | None = None) -> Placement:
    """What the environment says about this process's place in its submission."""
    hostname = hostname or socket.gethostname()
    r = _Reader(environ)
    found = _openmpi(r) or _slurm(r) or _volcano(r, hostname) or _kubernetes(r) or _ranks(r)
    if found is None:
        pai = r.text("PAI_JOB_ID")
        found = _Found(Scheduler.PAI_DLC if pai else Scheduler.NONE, Shape.NONE)
        r.evidence.append(
            "no scheduler variables (SLURM_*, OMPI_COMM_WORLD_*, VC_TASK_INDEX, JOB_COMPLETION_INDEX, RANK/WORLD_SIZE)"
        )
    override = r.number(NODES_ENV)
    if override is not None:
        found.nodes = override[1]
        r.note("nodes", override[1], override[0])
    named = r.text(RUN_ID_ENV, *SUBMISSION_ID_VARIABLES)
    outer = r.text("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID") if found.scheduler is Scheduler.OPENMPI else None
    if named is not None:
        found.run_id = named[1]
        r.note("run id", named[1], named[0])
    elif outer is not None:
        found.run_id = f"slurm-{outer[1]}"  # mpirun inside a Slurm job: a requeue must rejoin the run
        r.note("run id", found.run_id, outer[0], outer[1])
    elif found.run_id is None and found.scheduler in (Scheduler.KUBERNETES, Scheduler.VOLCANO, Scheduler.KUBEFLOW):
        r.warnings.append(
            f"{found.scheduler.value} sets no per-submission id: pass one to every pod as ${RUN_ID_ENV} "
            "(the downward API, see docs/guides/kubernetes.md) or pass --run-id"
        )
    node_name = r.text("SLURMD_NODENAME")
    if found.scheduler is Scheduler.SLURM and node_name is not None:
        name = node_name[1]
    else:
        name = hostname
    return Placement(
        found.scheduler, found.shape, found.nodes, found.index, name, found.run_id, tuple(r.evidence), tuple(r.warnings)
    )


def check_run_id(source: str, value: str) -> str:
    value = value.strip()
    if not value or any(ord(c) < 32 for c in value):
        raise UsageError(f"{source} must be a non-empty single-line identifier, got {value!r}")
    return value


def resolve_run_id(explicit: str | None, placement: Placement) -> str:
    """`--run-id`, else what the scheduler says; the same value on every instance of a submission."""
    if explicit is not None:
        return check_run_id("--run-id", explicit)
    if placement.run_id is not None:
        return check_run_id("the detected run id", placement.run_id)
    raise UsageError(
        "no run id: pass --run-id ID (or set $"
        + RUN_ID_ENV
        + ") with the same value on every instance of this submission and a new value for each new submission; "
        f"under Slurm, mpirun and PAI-DLC ({', '.join(SUBMISSION_ID_VARIABLES)}) it is found automatically"
        + (
            f"; {placement.scheduler.value} sets none, see docs/guides/kubernetes.md"
            if placement.scheduler is not Scheduler.NONE
            else ""
        )
    )
