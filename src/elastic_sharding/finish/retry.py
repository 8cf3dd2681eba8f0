"""retry: requeue terminally failed shards after their cause was fixed.

The failed shard's attempts, failure record and claim move into a fresh
`state/history/<retry-id>/` directory (never overwriting older history). The claim goes last:
until it is gone the shard stays failed, so an interrupted retry can simply be run again.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

from elastic_sharding import fsops
from elastic_sharding.errors import JobStateError, UsageError
from elastic_sharding.layout import JobLayout, check_shard_id
from elastic_sharding.observe.snapshot import ShardView, job_views
from elastic_sharding.vocabulary import ShardState

log = logging.getLogger(__name__)


def _select(views: list[ShardView], all_failed: bool, shard_ids: list[str]) -> list[ShardView]:
    if all_failed == bool(shard_ids):
        raise UsageError("select exactly one of --all-failed or --shard-id")
    by_id = {view.shard_id: view for view in views}
    if all_failed:
        return [view for view in views if view.state == ShardState.FAILED]
    chosen = []
    for shard_id in dict.fromkeys(shard_ids):
        check_shard_id(shard_id)
        view = by_id.get(shard_id)
        if view is None:
            raise UsageError(f"{shard_id} is not a shard of this job ({len(views)} shards)")
        if view.state == ShardState.DONE:
            raise JobStateError(f"{shard_id} is already done; retry only requeues unfinished shards")
        if view.state in (ShardState.RUNNING, ShardState.STALE):
            raise JobStateError(
                f"{shard_id} has an active claim by host={view.owner} ({view.state}); wait for it, or let a worker take a stale claim over"
            )
        chosen.append(view)
    return chosen


def retry(job_dir: Path, all_failed: bool = False, shard_ids: list[str] | None = None) -> list[str]:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    manifest = layout.load_manifest()
    views = job_views(layout, manifest, manifest.request.settings.lock_timeout_secs)
    chosen = _select(views, all_failed, shard_ids or [])
    if not chosen:
        log.info("no failed shards to retry")
        return []
    retry_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
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
        log.info(
            "requeued %s (was %s; %d failed attempt(s) archived in %s)",
            shard_id,
            view.state if view.state != ShardState.PENDING else "pending",
            view.failures,
            target["root"],
        )
    return requeued
