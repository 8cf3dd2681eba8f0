"""retry: requeue terminally failed shards, and failed deduplication stages, after their cause
was fixed.

The failed shard's attempts, failure record and claim move into a fresh
`state/history/<retry-id>/` directory (never overwriting older history). The claim goes last:
until it is gone the shard stays failed, so an interrupted retry can simply be run again.

In a recipe with deduplicators every segment has its own shards (`segments.py`): `--all-failed`
requeues the failed shards of every segment, and `--shard-id` the named shard in the first
segment where it is not done. A failed stage's `failed.json` and the claim of the unit that
failed move into `stages/<k>/history/<retry-id>/`; the units already published stay, so the
stage resumes where it failed.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

from elastic_sharding import confined, fsops
from elastic_sharding.errors import JobStateError, UsageError
from elastic_sharding.layout import AnalysisLayout, JobLayout, StageLayout, check_shard_id
from elastic_sharding.observe.snapshot import ShardView, job_views
from elastic_sharding.records import StageFailure, load
from elastic_sharding.segments import job_segments, segment_manifest, stage_files
from elastic_sharding.vocabulary import ShardState

log = logging.getLogger(__name__)


def _select(views: list[ShardView], all_failed: bool, shard_ids: list[str]) -> list[ShardView]:
    by_id = {view.shard_id: view for view in views}
    if all_failed:
        return [view for view in views if view.state == ShardState.FAILED]
    chosen = []
    for shard_id in shard_ids:
        check_shard_id(shard_id)
        view = by_id.get(shard_id)
        if view is None:
            raise UsageError(f"{shard_id} is not a shard of this job ({len(views)} shards)")
        if view.state == ShardState.DONE:
            continue  # done here: the shard may be unfinished in a later segment
        if view.state in (ShardState.RUNNING, ShardState.STALE):
            raise JobStateError(
                f"{shard_id} has an active claim by host={view.owner} ({view.state}); wait for it, or let a worker take a stale claim over"
            )
        chosen.append(view)
    return chosen


def retry(job_dir: Path, all_failed: bool = False, shard_ids: list[str] | None = None) -> list[str]:
    """Requeue and return what was chosen: shard ids, and `stage <k>` for a failed stage."""
    root = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = root.load_manifest()
    timeout = manifest.request.settings.lock_timeout_secs
    if all_failed == bool(shard_ids):
        raise UsageError("select exactly one of --all-failed or --shard-id")
    retry_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
    requeued: list[str] = []
    wanted = list(dict.fromkeys(shard_ids or []))
    for segment in job_segments(manifest):
        stage = f"stage {segment.index}"
        if segment.index > 0 and all_failed and _requeue_stage(stage_files(root, segment.index), stage, retry_id):
            requeued.append(f"stage {segment.index}")
        view_manifest = segment_manifest(root, manifest, segment.index)
        if view_manifest is None:
            break
        if not segment.has_ops:
            continue
        layout = root.segment(segment.index)
        views = job_views(layout, view_manifest, timeout)
        chosen = _select(views, all_failed, wanted)
        if wanted:
            wanted = [shard_id for shard_id in wanted if shard_id not in {v.shard_id for v in chosen}]
        requeued += _requeue(layout, chosen, retry_id)
        if shard_ids and not wanted:
            break
    if wanted:
        raise JobStateError(f"{wanted[0]} is already done; retry only requeues unfinished shards")
    analysis = AnalysisLayout(root.analysis_stage)
    if all_failed and manifest.analysis is not None and _requeue_stage(analysis, "the analysis", retry_id):
        requeued.append("analysis")
    if not requeued:
        log.info("nothing failed to retry")
    return requeued


def _requeue(layout: JobLayout, chosen: list[ShardView], retry_id: str) -> list[str]:
    if not chosen:
        return []
    archive = layout.history / retry_id
    if not fsops.make_dir_exclusive(archive):
        raise JobStateError(f"history entry {archive} already exists; run retry again")
    requeued = []
    for view in chosen:
        shard_id = view.shard_id
        target = layout.archived(retry_id, shard_id)
        fsops.ensure_dir(target["root"])
        fsops.rename_away(layout.attempts_dir(shard_id), target["attempts"])
        fsops.rename_away(layout.failed(shard_id), target["failed"])
        fsops.rename_away(layout.lock(shard_id), target["lock"])
        requeued.append(shard_id)
        where = f" in recipe segment {layout.segment_index}" if layout.segment_index else ""
        log.info(
            "requeued %s%s (was %s; %d failed attempt(s) archived in %s)",
            shard_id,
            where,
            view.state if view.state != ShardState.PENDING else "pending",
            view.failures,
            target["root"],
        )
    return requeued


def _requeue_stage(files: StageLayout | AnalysisLayout, stage: str, retry_id: str) -> bool:
    """Archive a failed stage's failure and the failed unit's claim; False if it has not failed."""
    if not confined.lexists(files.failed):
        return False
    failure = load(StageFailure, files.failed)
    archive = files.root / "history" / retry_id
    fsops.ensure_dir(archive.parent)
    if not fsops.make_dir_exclusive(archive):
        raise JobStateError(f"history entry {archive} already exists; run retry again")
    fsops.rename_away(files.lock(failure.unit), archive / f"{failure.unit}.lock")
    fsops.rename_away(files.failed, archive / "failed.json")
    log.info("requeued %s (its unit %s failed: %s)", stage, failure.unit, failure.message)
    return True
