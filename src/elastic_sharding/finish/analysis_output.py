"""The finish of a `--analyze` job: its analysis directory, with the file names `dj-analyze` writes.

The directory (`--output`, default `<job-dir>/analysis/`) holds the stats export
`<export stem>_stats.jsonl` (every row's statistics and meta fields in input order: the shard
outputs merged, and recorded in `merge.json` like any merge) and the analysis the units made
(`overall.csv`, `overall.md`, the figures, `figures.json`, `index.html`). The finish first takes
part in the analysis itself, so a job whose workers all left before it ended (`worker
--max-shards`, a crash) is still finished here; its work grows with shards × statistics only.
Each file is replaced atomically and `index.html` comes last, so a finish run again over an
earlier one rewrites the same bytes, and a reader who sees the index sees every file it names.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elastic_sharding import confined, fsops
from elastic_sharding.analysis.cooperate import read_done
from elastic_sharding.destination import check_destination, check_target, inside_job, prepare_destination
from elastic_sharding.errors import JobStateError, UsageError
from elastic_sharding.finish.merge import publish
from elastic_sharding.finish.validate import Trusted, completed_outputs
from elastic_sharding.finish.verify import verify_output
from elastic_sharding.layout import AnalysisLayout, JobLayout
from elastic_sharding.output_formats import JSONL
from elastic_sharding.records import Manifest, PublishRecord
from elastic_sharding.segments import job_segments
from elastic_sharding.work.analysis import AnalysisWork

log = logging.getLogger(__name__)

INDEX_PAGE = "index.html"


@dataclass
class AnalysisPublished:
    directory: Path
    stats_export: Path
    rows: int
    statistics: list[str]
    files: list[str]

    @property
    def message(self) -> str:
        return (
            f"analysis of {self.rows} rows ({len(self.statistics)} statistic(s)) in {self.directory}/: "
            f"open {self.directory / INDEX_PAGE}; the stats export is {self.stats_export.name}"
        )


def is_analysis(layout: JobLayout) -> bool:
    return layout.load_manifest().analysis is not None


def analysis_directory(layout: JobLayout, output: Path | str | None) -> Path:
    """`--output` of a `--analyze` job (always a directory), or its default."""
    return Path(os.path.abspath(output)) if output is not None else layout.default_analysis


def stats_export_name(manifest: Manifest) -> str:
    if manifest.analysis is None:
        raise JobStateError(
            f"job {manifest.job_id} was not prepared with --analyze; run `merge` to publish its rows, or prepare a new --job-dir with --analyze"
        )
    return f"{manifest.analysis.export_stem}_stats.jsonl"


def check_analysis_output(layout: JobLayout, output: Path | str | None, output_format: str | None, create: bool) -> Path:
    """Refuse a place the analysis cannot go before any work: what a launcher checks up front."""
    if output_format not in (None, JSONL):
        raise UsageError(f"--output-format {output_format}: the stats export of --analyze is JSONL, as dj-analyze writes it")
    directory = check_target(analysis_directory(layout, output), layout, directory=True)
    if not inside_job(directory, layout):  # else prepare makes the job directory, and the finish it
        check = prepare_destination if create else check_destination
        check(directory / ".probe-analysis", create_once=True)
    return directory


def publish_analysis(
    job_dir: Path,
    output: Path | str | None,
    overwrite: bool = False,
    lock_timeout: float | None = None,
    *,
    quiet: bool = False,
    output_format: str | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[AnalysisPublished, PublishRecord, Trusted]:
    """Finish the analysis (taking part in it) and publish its directory; also the stats export's
    merge record and the shard outputs its merge has just checked (for a verify right after)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = layout.load_manifest()
    directory = check_analysis_output(layout, output, output_format, create=False)
    shards = completed_outputs(layout, lock_timeout)  # every shard done, before any analysis work
    segment = job_segments(manifest)[-1]
    AnalysisWork(layout, manifest, segment, manifest.request.settings, stop).run()
    paths = AnalysisLayout(layout.analysis_stage)
    done = read_done(paths)
    if done is None:
        raise JobStateError(f"{paths.done}: missing after the analysis ended; remove {paths.root} and run the finish again")
    export = directory / stats_export_name(manifest)
    if confined.lexists(export) and not overwrite:
        record = verify_output(layout, export, False, shards, None, JSONL)
        trusted: Trusted = {}
        log.info("%s is already this job's stats export", export)
    else:
        record, trusted = publish(layout.root, export, overwrite, lock_timeout, quiet=quiet, directory=False, output_format=JSONL)
    files = [name for name in done["files"] if name != INDEX_PAGE]
    for name in [*files, INDEX_PAGE]:
        fsops.replace_atomic(directory / name, (paths.report / name).read_bytes())
    published = AnalysisPublished(directory, export, done["rows"], done["columns"], [*files, INDEX_PAGE, export.name])
    log.info("%s", published.message)
    return published, record, trusted
