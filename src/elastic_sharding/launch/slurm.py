"""`slurm`: one Slurm submission that runs a whole job — prepare once, a worker per node, merge once.

Two shapes. An allocation of N nodes runs one `srun` step with a `dlc` instance per node: all
nodes start together (gang-scheduled). An elastic array of K single-node tasks runs a `dlc`
instance per task whenever the scheduler grants a node: the job starts with the first free node
and grows, and no task waits for another; any task may prepare or finalize (the `dlc` election).
Either way the instances find their node count and run id in Slurm's variables
(`launch/scheduler.py`), so a requeued job (same job id) rejoins its own run.

Signals: SIGTERM (scancel, preemption) reaches every worker, which drains: it hands its shard
back at once, so another node or the requeued job takes it. The batch shell also asks for USR1 `--signal-secs` before the time limit: it
drains the step the same way and then requeues its own job, which resumes the run.

Before it submits, runs or prints anything (`--dry-run` too, and off-cluster, where there is no
`sbatch`), it makes the checks every `dlc` instance would make on the nodes: a bad recipe, input,
`--output` or strict-mode shard count is refused here, with the exit code the job would end with.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elastic_sharding import __version__
from elastic_sharding.errors import EXIT_OK, ElasticShardError, UsageError
from elastic_sharding.launch.dlc import strict_claim_cap
from elastic_sharding.launch.scheduler import INTERACTIVE_STEP, Shape, read_number
from elastic_sharding.launch.steps import JobRequest, preflight_job, wait_draining
from elastic_sharding.prepare.inputs import discover
from elastic_sharding.prepare.recipe import load_recipe, recipe_and_base

log = logging.getLogger(__name__)

# Variables a process inside a Slurm job inherits that would leak into a job submitted from it:
# SLURM_CPU_BIND* then binds the new job's steps to the old step's CPUs ("CPU binding outside of
# job step allocation", datatrove #248), SBATCH_*/SRUN_* silently change its options.
INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
USER_SETTINGS = ("SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT")  # the user's own, never a job's
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._+-]{1,100}$")
EXPORT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class SlurmRequest:
    job: JobRequest
    dlc_args: list[str]  # the `dlc` flags every instance runs with (no --nodes: Slurm says)
    nodes: int | None = None
    array: int | None = None
    max_running: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    mem: str | None = None
    job_name: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    log_dir: Path = Path(".")
    requeue: bool = True
    signal_secs: int = 120
    python: str = sys.executable
    log_level: str = "INFO"
    require_all_nodes: bool = False
    dry_run: bool = False
    submit: bool = False

    @property
    def shape(self) -> Shape:
        return Shape.ARRAY if self.array is not None else Shape.ALLOCATION

    @property
    def name(self) -> str:
        return self.job_name or f"es-{self.job.job_dir.resolve().name}"

    def dlc_command(self) -> list[str]:
        return [self.python, "-m", "elastic_sharding", "--log-level", self.log_level, "dlc", *self.dlc_args]


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Inside salloc's shell or a batch script (not inside a step): the nodes are already ours.
    The shell of `LaunchParameters=use_interactive_step` is a step of its own, but the same case."""
    step = environ.get("SLURM_STEP_ID", "")
    return bool(environ.get("SLURM_JOB_ID")) and step in ("", INTERACTIVE_STEP) and not environ.get("SLURM_ARRAY_JOB_ID")


def allocation_nodes(environ: Mapping[str, str]) -> int | None:
    """The node count of the enclosing allocation, or None where Slurm does not say."""
    return read_number(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")


def check_request(req: SlurmRequest, environ: Mapping[str, str]) -> None:
    here = in_allocation(environ) and not req.submit
    if req.nodes is not None and req.array is not None:
        raise UsageError("pass either --nodes N (one allocation of N nodes) or --array K (K single-node tasks), not both")
    if req.nodes is None and req.array is None and not here:
        raise UsageError(
            "pass --nodes N (one allocation of N nodes, all started together) or --array K (an elastic array of K "
            "single-node tasks that join whenever a node is free); inside an allocation (salloc) the allocation's nodes are used"
        )
    if here and req.array is not None:
        raise UsageError("--array submits a new job; inside an allocation pass --submit with it, or leave --array out")
    have = allocation_nodes(environ) if here else None
    if req.nodes is not None and have is not None and req.nodes > have:
        # srun would refuse the step, or wait for nodes the allocation will never get.
        raise UsageError(
            f"--nodes {req.nodes}: this allocation (Slurm job {environ.get('SLURM_JOB_ID')}) has {have} node(s); drop "
            f"--nodes to run on all {have}, or pass --submit to submit a new job of {req.nodes} nodes"
        )
    if req.max_running is not None and req.array is None:
        raise UsageError("--max-running limits the tasks of an --array job")
    if req.max_running is not None and req.array is not None and req.max_running > req.array:
        raise UsageError(f"--max-running {req.max_running} is more than --array {req.array}")
    if req.require_all_nodes and req.array is not None and req.max_running not in (None, req.array):
        raise UsageError(
            f"--require-all-nodes waits for all {req.array} array tasks, but --max-running {req.max_running} never runs them "
            "all at once: drop --max-running, or --require-all-nodes (elastic mode needs neither)"
        )
    if not JOB_NAME_RE.match(req.name):
        raise UsageError(f"--job-name {req.name!r}: use letters, digits and . _ + - (at most 100)")
    for line in req.exports:
        if not EXPORT_RE.match(line):
            raise UsageError(f"--export {line!r}: write NAME=VALUE")
    for arg in req.sbatch_args:
        if not arg.startswith("-") or "\n" in arg:
            raise UsageError(f"--sbatch-arg {arg!r}: give one sbatch option, e.g. --sbatch-arg=--constraint=a100")
    if req.signal_secs < 0:
        raise UsageError("--signal-secs must be 0 (no warning before the time limit) or more")


def sbatch_directives(req: SlurmRequest) -> list[str]:
    lines = [f"--job-name={req.name}"]
    if req.shape is Shape.ARRAY:
        assert req.array is not None
        limit = f"%{req.max_running}" if req.max_running else ""
        lines += [f"--array=0-{req.array - 1}{limit}", "--nodes=1"]
        output = req.log_dir.resolve() / "%x-%A_%a.out"
    else:
        lines += [f"--nodes={req.nodes}"]
        output = req.log_dir.resolve() / "%x-%j.out"
    lines += ["--ntasks-per-node=1"]
    lines += [f"--cpus-per-task={req.cpus_per_node}"] if req.cpus_per_node else ["--exclusive"]
    for flag, value in (
        ("partition", req.partition),
        ("account", req.account),
        ("qos", req.qos),
        ("time", req.time),
        ("gpus-per-node", req.gpus_per_node),
        ("mem", req.mem),
    ):
        if value is not None:
            lines.append(f"--{flag}={value}")
    lines += ["--requeue" if req.requeue else "--no-requeue"]
    if req.signal_secs:
        lines.append(f"--signal=B:USR1@{req.signal_secs}")
    lines += [f"--output={output}", "--open-mode=append", *req.sbatch_args]
    return lines


def step_command(req: SlurmRequest, nodes: str) -> list[str]:
    """The srun step: one task per node that uses the whole node and is bound to no CPU."""
    command = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--cpu-bind=none"]
    command += ["--kill-on-bad-exit=0", f"--job-name={req.name}.workers"]
    if req.cpus_per_node is not None:
        command.append(f"--cpus-per-task={req.cpus_per_node}")  # srun >= 22.05 does not inherit it from sbatch
    if req.gpus_per_node is not None:
        command.append(f"--gpus-per-node={req.gpus_per_node}")
    return command + req.dlc_command()


def batch_script(req: SlurmRequest) -> str:
    nodes = "1" if req.shape is Shape.ARRAY else "${SLURM_JOB_NUM_NODES}"
    what = (
        f"an elastic array of {req.array} single-node tasks" + (f", at most {req.max_running} at once" if req.max_running else "")
        if req.shape is Shape.ARRAY
        else f"one allocation of {req.nodes} nodes"
    )
    step = " ".join(part if "${" in part else shlex.quote(part) for part in step_command(req, nodes))
    lines = ["#!/bin/bash", *(f"#SBATCH {line}" for line in sbatch_directives(req))]
    lines += [
        f"# Written by elastic-shard {__version__} `slurm`: {what}.",
        "# Each task runs `elastic-shard dlc`: prepare once, a worker per node, verify and merge once (elected in the",
        "# job directory). SIGTERM (scancel, preemption) drains the workers: each hands back its shard at once.",
    ]
    if req.signal_secs and req.requeue:
        lines.append(
            f"# USR1, {req.signal_secs} s before the time limit, drains them too; then the job requeues itself and rejoins its run."
        )
    lines += ["set -uo pipefail", *req.setup]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in (line.split("=", 1) for line in req.exports)]
    lines += [
        "time_limit=0",
        "step=",
        'forward() { [ "$1" = USR1 ] && time_limit=1; [ -n "$step" ] && kill -TERM "$step" 2>/dev/null; }',
        "trap 'forward USR1' USR1",
        "trap 'forward TERM' TERM",
        f"{step} &",
        "step=$!",
        'while :; do wait "$step"; code=$?; kill -0 "$step" 2>/dev/null || break; done',
    ]
    if req.requeue and req.signal_secs:
        # An array task's own job id can be the array's (the last task to start gets it), and
        # requeueing that id would requeue every task: name the task.
        me = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" if req.shape is Shape.ARRAY else "${SLURM_JOB_ID}"
        lines += [
            'if [ "$time_limit" = 1 ]; then',
            f'  echo "elastic-shard: drained before the time limit; requeueing job {me} into the same run" >&2',
            f'  scontrol requeue "{me}" && exit 0',
            "fi",
        ]
    lines.append('exit "$code"')
    return "\n".join(lines) + "\n"


def submission_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch gets: the user's, without what an enclosing Slurm job would leak."""
    return {name: value for name, value in environ.items() if name in USER_SETTINGS or not name.startswith(INHERITED_PREFIXES)}


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise UsageError(f"{tool!r} not found: run this on a Slurm login node (or install slurm-client)")
    return path


def preflight(req: SlurmRequest, nodes: int | None) -> None:
    """What every `dlc` instance of the job checks first, checked before it is submitted or run, so
    that a bad parameter costs no queue wait and exits as the job would: the strict-mode shard
    count for the `nodes` Workers Slurm will start (the same rule as `dlc`), then the recipe, the
    job directory's filesystem and `--output` (`preflight_job`), that the input is there, and the
    operators and the packages they import, judged by Data-Juicer here (the nodes run this
    Python): a job would otherwise wait in the queue only to fail at once. A dry run creates no `--output`
    directory; its nearest existing parent is tried instead."""
    shards = req.job.num_shards
    if req.shape is Shape.ARRAY and not req.require_all_nodes:
        if req.array is not None and req.array > shards:
            log.warning("--array %d > --num-shards %d: some tasks will have nothing to do", req.array, shards)
    else:
        try:
            strict_claim_cap(nodes, shards, req.require_all_nodes)
        except UsageError as exc:
            if req.shape is Shape.ARRAY:
                raise UsageError(f"--array {req.array} starts {req.array} Workers: {exc}") from None
            raise
    dataset = preflight_job(req.job, create=not req.dry_run)
    discover(dataset)  # found and listed, not read: the first thing the nodes' prepare does with it
    if not req.job.install_missing:  # else the nodes install what they lack; the engine judges there
        config, base = recipe_and_base(req.job.config)
        load_recipe(config, base or Path.cwd())


def submit(req: SlurmRequest, environ: Mapping[str, str]) -> int:
    preflight(req, req.array if req.shape is Shape.ARRAY else req.nodes)
    script = batch_script(req)
    if req.dry_run:
        sys.stdout.write(script)
        return EXIT_OK
    sbatch = _need("sbatch")
    req.log_dir.mkdir(parents=True, exist_ok=True)
    kept = req.log_dir.resolve() / f"{req.name}.sbatch"
    kept.write_text(script)
    env = submission_env(environ)
    stripped = sorted(set(environ) - set(env))
    if stripped:
        log.info(
            "submitting from inside a Slurm job: not passing %s to the new job",
            ", ".join(stripped[:8]) + (" …" if len(stripped) > 8 else ""),
        )
    result = subprocess.run([sbatch, "--parsable", str(kept)], env=env, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise ElasticShardError(f"sbatch refused the job ({kept}): {result.stderr.strip() or result.stdout.strip()}")
    job_id = result.stdout.strip().split(";")[0]
    shown = f"array job {job_id} ({req.array} tasks)" if req.shape is Shape.ARRAY else f"job {job_id} ({req.nodes} nodes)"
    log.info(
        "submitted %s as %s; script %s; watch with `squeue --name %s` and `elastic-shard status --job-dir %s`",
        shown,
        req.name,
        kept,
        req.name,
        req.job.job_dir,
    )
    sys.stdout.write(job_id + "\n")
    return EXIT_OK


def run_in_allocation(req: SlurmRequest, environ: Mapping[str, str]) -> int:
    """salloc or a user's batch script: the step runs in the foreground over the allocation's nodes."""
    nodes = req.nodes or allocation_nodes(environ) or 1
    preflight(req, nodes)
    command = step_command(req, str(nodes))
    if req.dry_run:
        sys.stdout.write(shlex.join(command) + "\n")
        return EXIT_OK
    command[0] = _need("srun")
    # The allocation's own binding would pin every worker to the CPUs of the shell's task.
    env = {name: value for name, value in environ.items() if not name.startswith("SLURM_CPU_BIND")}
    log.info(
        "inside Slurm job %s: running one worker per node on %s node(s): %s",
        environ.get("SLURM_JOB_ID"),
        nodes,
        shlex.join(command),
    )
    return wait_draining(subprocess.Popen(command, env=env))


def run_slurm(req: SlurmRequest, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    check_request(req, environ)
    if in_allocation(environ) and not req.submit:
        return run_in_allocation(req, environ)
    return submit(req, environ)
