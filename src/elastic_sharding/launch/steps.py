"""What every launcher shares: prepare (and requeue earlier failures), worker processes, finalize."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_sharding.children import set_parent_death_signal
from elastic_sharding.destination import (
    check_destination,
    check_target,
    inside_job,
    output_form,
    prepare_destination,
    published,
    refuse_foreign_output,
)
from elastic_sharding.errors import ElasticShardError, Interrupted, UsageError
from elastic_sharding.finish.analysis_output import check_analysis_output, publish_analysis
from elastic_sharding.finish.merge import publish
from elastic_sharding.finish.retry import retry
from elastic_sharding.finish.validate import completed_outputs, validate_outputs
from elastic_sharding.finish.verify import check_hosts, verify_output
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.status import Status
from elastic_sharding.output_formats import JSONL, choose_format, default_output
from elastic_sharding.prepare.job import PrepareRequest, preflight, prepare
from elastic_sharding.prepare.recipe import recipe_and_base
from elastic_sharding.records import Settings
from elastic_sharding.signals import on_stop_signals

log = logging.getLogger(__name__)


@dataclass
class JobRequest:
    """The job a launcher prepares; identical on every instance of one submission."""

    job_dir: Path
    config: Path | None
    dataset_path: Path | None
    num_shards: int
    settings: Settings
    output: Path | None = None
    quiet: bool = False  # no progress bars on stderr (they are drawn only on a terminal anyway)
    output_dir: bool = False  # `--output` was written with a trailing `/`: publish a directory there
    output_format: str | None = None  # `--output-format`; None: what the `--output` name says, else jsonl
    prepare_procs: int | None = None  # processes on this node that share the prepare (default: its cores)
    install_missing: bool = False  # install the packages the operators need and this node lacks, once
    analyze: bool = False  # `--analyze`: the job computes dj-analyze's analysis; `output` is its directory
    percentiles: list[float] | None = None

    @property
    def layout(self) -> JobLayout:
        return JobLayout(Path(os.path.abspath(self.job_dir)))

    @property
    def output_path(self) -> Path:
        if self.output is None:
            return default_output(self.layout, self.format)
        return Path(os.path.abspath(self.output))

    @property
    def output_is_dir(self) -> bool:
        """A directory output: asked for with a trailing `/`, or `--output` is an existing directory."""
        return self.output is not None and output_form(Path(os.path.abspath(self.output)), True if self.output_dir else None)[1]

    @property
    def format(self) -> str:
        """What the output holds (a UsageError if `--output-format` contradicts the `--output` name)."""
        return choose_format(self.output, self.output_format, self.output_is_dir)


def prepare_request(req: JobRequest) -> PrepareRequest:
    config, base = recipe_and_base(req.config)
    return PrepareRequest(
        config,
        req.dataset_path,
        req.job_dir,
        req.num_shards,
        req.settings,
        base,
        req.prepare_procs,
        req.install_missing,
        req.analyze,
        req.percentiles,
    )


def preflight_job(req: JobRequest, create: bool = True) -> Path:
    """Refuse bad parameters before a launcher writes or processes anything: a wrong `--output`
    found only at the merge would waste the whole run. Its missing directories are created now
    and tried with a file, unless it lies in the job directory, which prepare creates and merge
    fills in; an existing file there that is not this job's merge is refused. `create=False` (a
    dry run) makes the same checks and leaves nothing: no directory of `--output` is created.
    Returns the dataset path, resolved as prepare resolves it."""
    if req.analyze:
        checked = preflight(prepare_request(req))
        check_analysis_output(req.layout, req.output, req.output_format, create)
        return checked.dataset
    output_format = req.format  # first: a contradicting --output-format is refused before anything
    checked = preflight(prepare_request(req))
    layout = req.layout
    directory = req.output_is_dir
    output = check_target(req.output_path, layout, directory)
    refuse_foreign_output(output, layout, directory, output_format)
    if not inside_job(output, layout):
        check = prepare_destination if create else check_destination
        check(output, create_once=True, directory=directory)
    return checked.dataset


def prepare_job(req: JobRequest) -> tuple[str, dict[str, Any]]:
    """Prepare (a no-op when already prepared identically), then requeue shards that failed in an
    earlier run of the same job: relaunching after fixing the cause is how a user retries."""
    result = prepare(prepare_request(req), quiet=req.quiet)
    requeued = retry(req.job_dir, all_failed=True)
    if requeued:
        log.warning("requeued %d shard(s) that failed in an earlier run: %s", len(requeued), ", ".join(requeued))
    manifest = result.manifest
    verb = "prepared" if result.created else "already prepared"
    message = f"{verb} {len(manifest.shards)} shard(s), {manifest.total_rows} rows"
    return message, {"created": result.created, "shards": len(manifest.shards), "rows": manifest.total_rows, "requeued": requeued}


def check_same_request(req: JobRequest) -> None:
    """An instance that did not prepare checks that the job is the one its own command asks for
    (same recipe, input, shard count and settings): a no-op `prepare` that refuses a mismatch.
    The input's bytes are not hashed again here: the prepare coordinator of this submission has
    just done that, once for every instance."""
    try:
        prepare(prepare_request(req), quiet=True, verify_content=False)
    except ElasticShardError as exc:
        raise UsageError(f"this instance's command differs from the one the job was prepared with: {exc}") from None


@dataclass
class Finalized:
    shards: int
    hosts: list[str]
    output: Path
    rows: int
    output_format: str = "jsonl"

    @property
    def message(self) -> str:
        return (
            f"PASS: {self.shards} shards were completed by {len(self.hosts)} node(s): {', '.join(self.hosts)}; "
            f"{self.rows} rows in {self.output} ({self.output_format})"
        )


def finalize(req: JobRequest, expect_nodes: int) -> Finalized:
    """Check the participating hosts, merge once (which checks every shard output against its
    record), verify the published output (a merged file, or a directory of one file per shard).

    An output that already is this job's verified merge is kept (a repeated finalize is a no-op;
    every shard output is checked too); any other existing file, or non-empty directory, is
    refused rather than overwritten.
    """
    layout = req.layout
    shards = completed_outputs(layout)
    hosts = check_hosts(shards, expect_nodes)
    log.info("%d shards were completed by %d node(s): %s", len(shards), len(hosts), ", ".join(hosts))
    if layout.load_manifest().analysis is not None:
        analysis, _, trusted = publish_analysis(layout.root, req.output, quiet=req.quiet)
        record = verify_output(layout, analysis.stats_export, False, shards, trusted, JSONL)
        return Finalized(len(shards), hosts, analysis.directory, record.rows, "analysis")
    output = req.output_path
    directory = req.output_is_dir
    output_format = req.format
    if published(output, directory):
        trusted = validate_outputs(shards, quiet=True)
        try:
            record = verify_output(layout, output, directory, shards, trusted, output_format)
        except ElasticShardError as exc:
            raise UsageError(
                f"{output} already exists and is not this job's verified merge ({exc}); move it away or pass another --output"
            ) from None
        log.info("%s is already this job's verified merge", output)
    else:
        trusted = {}
        try:
            _, trusted = publish(layout.root, output, quiet=req.quiet, directory=directory, output_format=output_format)
        except UsageError:
            if not published(output, directory):
                raise
            log.info("%s appeared while merging (another coordinator); verifying it", output)
        record = verify_output(layout, output, directory, shards, trusted, output_format)
    return Finalized(len(shards), hosts, output, record.rows, record.output_format)


def job_failure(status: Status, detail: list[str]) -> ElasticShardError:
    """Why a launcher's workers did not finish the job: how they ended, each failed shard's root
    cause and log, the shard counts, and what to do."""
    text = "; ".join(detail + status.errors(failed_only=True)) or "workers stopped early"
    return ElasticShardError(f"{text}. {status.summary_line()}. Fix the cause and run the same command again to resume")


# -- worker processes -----------------------------------------------------------------------------


def worker_command(job_dir: Path, *options: str) -> list[str]:
    """`elastic-shard worker` with this interpreter, runnable without the package installed."""
    level = logging.getLevelName(logging.getLogger("elastic_sharding").getEffectiveLevel())
    return [sys.executable, "-m", "elastic_sharding", "--log-level", str(level), "worker", "--job-dir", str(job_dir), *options]


def drain_with_parent() -> None:
    """For a worker child: receive SIGTERM (drain, hand back the shard) if the launcher dies."""
    set_parent_death_signal(signal.SIGTERM)


def wait_draining(proc: subprocess.Popen) -> int:
    """Wait for a launcher's child (`mpirun`, `srun`) that runs the workers: SIGTERM/SIGINT to the
    launcher becomes SIGTERM to it, which passes it to every worker, and they drain."""
    stopped: list[str] = []

    def on_signal(name: str) -> None:
        stopped.append(name)
        proc.send_signal(signal.SIGTERM)

    with on_stop_signals(on_signal):
        code = proc.wait()
    if stopped:
        raise Interrupted(f"received {stopped[0]}; workers handed their shards back")
    return code
