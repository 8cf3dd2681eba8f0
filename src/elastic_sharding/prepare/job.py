"""prepare: validate the recipe and input, split the input into fixed shards, publish the job.

Two streaming passes over the input, in units that any process can do (`prepare.units`, shared
through `prepare.cooperate`): pass one (`prepare.scan`) validates and learns, pass two writes the
shards (`prepare.shard_writer`). Everything is written into a private staging directory that is
renamed onto the job directory only when complete: a failed prepare leaves no job directory
behind.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from elastic_sharding.dependencies.install import install
from elastic_sharding.errors import JobStateError, RecipeError, UsageError
from elastic_sharding.fsprobe import check_job_filesystem
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.analysis_recipe import analysis_recipe
from elastic_sharding.prepare.cooperate import RECIPE, Gone, Participant, PrepareDir, spawn_helpers, stop_helpers
from elastic_sharding.prepare.inputs import check_existing, check_locations, discover, input_format, stat_input
from elastic_sharding.prepare.plan import configured_unit_bytes, make_plan, open_plan, plan_units, write_units
from elastic_sharding.prepare.recipe import Recipe, missing_requirements, read_recipe, read_resolved
from elastic_sharding.prepare.units import UnitWork
from elastic_sharding.records import MAX_SHARDS, Manifest, Request
from elastic_sharding.settings import Settings, validate_settings

log = logging.getLogger(__name__)


@dataclass
class PrepareRequest:
    config: Path
    dataset_path: Path | None
    job_dir: Path
    num_shards: int
    settings: Settings
    base_dir: Path | None = None  # relative paths in the recipe resolve from here (default: cwd)
    procs: int | None = None  # processes on this node that share the work (default: its usable cores)
    install_missing: bool = False  # pip-install the packages the operators need and this node lacks, first
    analyze: bool = False  # compute dj-analyze's analysis of the recipe instead of processing (`analysis/`)
    percentiles: list[float] | None = None  # with `analyze`: `--percentiles` (None: the recipe's)


@dataclass
class PrepareResult:
    manifest: Manifest
    created: bool


class _Checked(NamedTuple):
    base: Path
    config_path: Path
    config_sha: str
    dataset: Path
    job: JobLayout


def preflight(req: PrepareRequest) -> _Checked:
    """The checks that need no input scan and no Data-Juicer: settings, the recipe file, where the
    dataset and the job directory are, and whether the job directory's filesystem can coordinate
    workers (its one write, which leaves nothing). Launchers run them before writing anything."""
    validate_settings(req.settings)
    if req.num_shards < 1:
        raise UsageError("--num-shards must be at least 1")
    if req.percentiles is not None and not req.analyze:
        raise UsageError("--percentiles is an option of --analyze; add --analyze, or leave --percentiles out")
    if req.num_shards > MAX_SHARDS:
        raise UsageError(
            f"--num-shards {req.num_shards} is more than {MAX_SHARDS}, the most a job holds (shard ids have five "
            "digits); docs/guides/shard-count.md says how many to choose"
        )
    base = req.base_dir or Path.cwd()
    config_path = Path(os.path.abspath(req.config))
    raw_config, config_sha = read_recipe(config_path)
    dataset_value = req.dataset_path if req.dataset_path is not None else raw_config.get("dataset_path")
    if not dataset_value:
        raise UsageError(f"{config_path}: the recipe has no dataset_path; pass --dataset-path")
    if not isinstance(dataset_value, (str, Path)):
        raise UsageError(f"{config_path}: dataset_path must be a path string")
    dataset = Path(os.path.abspath(base / dataset_value))
    job = JobLayout(Path(os.path.abspath(req.job_dir)))
    check_locations(job.root, dataset)
    if not job.root.parent.is_dir():
        raise UsageError(
            f"the parent directory of --job-dir does not exist: {job.root.parent}. It is not created on purpose: on a "
            "shared filesystem a missing parent usually means the share is not mounted on this node, and creating it "
            "would split the job across local disks. Mount the share (or create the parent once, on the shared "
            "filesystem) and run the same command again"
        )
    check_job_filesystem(job.root, creating=True)
    return _Checked(base, config_path, config_sha, dataset, job)


def prepare(req: PrepareRequest, *, quiet: bool = False, verify_content: bool = True) -> PrepareResult:
    """Prepare the job `req` describes (a no-op if the job directory already holds exactly it).

    The work is shared by `req.procs` processes on this node (default: its usable cores) and by
    any other process that joins through the job directory's parent (`prepare.cooperate`). `quiet`
    turns off progress bars on stderr; `verify_content=False` skips re-hashing the inputs of an
    existing job: for a `dlc` instance whose prepare coordinator has just done that."""
    started = time.monotonic()
    base, config_path, config_sha, dataset, job = preflight(req)
    request = Request(
        config_path=str(config_path),
        config_sha256=config_sha,
        dataset_path=str(dataset),
        num_shards=req.num_shards,
        settings=req.settings,
        analyze=req.analyze,
        percentiles=req.percentiles if req.analyze else None,
    )
    existing = check_existing(job, request, dataset, verify_content, quiet)
    if existing is not None:
        log.info("job %s is already prepared with this exact request: nothing to do", job.root)
        PrepareDir.of(job.root).sweep()
        return PrepareResult(existing, created=False)

    kind, root, files = discover(dataset)
    stats = [stat_input(path) for path in files]
    units = plan_units(files, [st.st_size for st in stats], configured_unit_bytes())
    total = sum(st.st_size for st in stats)
    procs = req.procs or usable_cores()
    writes = write_units(total, req.num_shards, configured_unit_bytes())
    # A small input is not worth a helper's start-up, unless it is many shards' bookkeeping.
    small = total < configured_unit_bytes() // 2 and writes < 2
    helpers = 0 if small else max(0, min(procs, max(len(units), writes)) - 1)
    # Helpers start now: their interpreters start while this process plans.
    procs_started = spawn_helpers(job.root, helpers) if helpers else []
    try:
        recipe = read_resolved(config_path, base)
        analysis = analysis_recipe(recipe, req.percentiles) if req.analyze else None
        if req.install_missing:
            install(missing_requirements(recipe))
        fmt = input_format(files)
        if fmt == "parquet":
            refuse_on_parquet(recipe)
        plan = make_plan(request, recipe, kind, root, files, stats, units, base, fmt, analysis)
        pdir = PrepareDir.of(job.root)
        # A prepare of the same request that was under way may have published the job since the
        # check above: then there is nothing to join.
        existing = check_existing(job, request, dataset, False, quiet)
        if existing is None:
            plan = open_plan(pdir, plan)
    except BaseException:
        stop_helpers(procs_started, wait_secs=0)
        raise
    if existing is not None:
        stop_helpers(procs_started, wait_secs=0)
        log.info("job %s was prepared meanwhile with this exact request: nothing to do", job.root)
        pdir.sweep()
        return PrepareResult(existing, created=False)
    log.info(
        "preparing %s: %d input file(s), %d byte(s) in %d scan unit(s), %d shard(s), %d process(es) here",
        job.root,
        len(files),
        total,
        len(plan.units),
        plan.num_shards,
        helpers + 1,
    )
    participant = Participant(pdir, plan, UnitWork(pdir, plan), quiet=quiet)
    try:
        # Data-Juicer's judgement of the recipe (seconds of imports) first, while the helpers and
        # any other participant already scan.
        participant.run(
            first=RECIPE,
            write_phase=lambda: _write_shards(participant),
            then=lambda: _log_warnings(recipe.warnings),
        )
    except Gone:
        stop_helpers(procs_started, wait_secs=0)
        raise JobStateError(f"the prepare of {job.root} was abandoned by another process; run prepare again") from None
    except BaseException:
        # A failure (this process's, or the one another participant published), or an interrupt:
        # the prepare directory is removed; the other participants then fail or stop too.
        stop_helpers(procs_started, wait_secs=0)
        pdir.remove()
        raise
    stop_helpers(procs_started)
    manifest = job.load_manifest()
    participants = len(manifest.prepared_by)
    log.info(
        "prepared %s: %d rows from %d file(s) in %d shard(s) in %.2fs by %d participant(s)",
        job.root,
        manifest.total_rows,
        len(files),
        len(manifest.shards),
        time.monotonic() - started,
        participants,
    )
    return PrepareResult(manifest, created=True)


def refuse_on_parquet(recipe: Recipe) -> None:
    """A whole-dataset operator that comes before every other operator would read the prepared shards as
    JSON lines; on Parquet input they are Parquet files."""
    first = recipe.segments[0] if recipe.segments else None
    if first is not None and not first.has_ops and len(recipe.segments) > 1:
        name = recipe.ops[first.end_op][0]
        raise RecipeError(
            f"process[0] {name} runs as a stage across all shards: on Parquet input the recipe must begin with another operator for now "
            "(any mapper or filter, e.g. clean_email_mapper); or convert the input to JSONL"
        )


def _log_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        log.warning("%s", warning)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _write_shards(participant: Participant) -> None:
    """Pass two, this process's share: write shards until none is left to claim."""
    participant.write_phase()
