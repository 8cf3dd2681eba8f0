"""A read-only view of a job: the state of every shard, shared by status, retry, merge, verify.

A one-shot reader cannot watch a heartbeat for a whole lease, so `stale` here is an estimate
from the owner's recorded heartbeat time against this machine's clock, labelled as such.
Workers never use it to take a claim over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from . import fsops
from .layout import JobLayout
from .lease import DONE, FAILED, count_failures, read_claim, read_heartbeat
from .records import ClaimRecord, CompletionRecord, FailureRecord, Heartbeat, Manifest, ShardSpec, decode

PENDING, RUNNING, STALE = "pending", "running", "stale"
STATES = (PENDING, RUNNING, STALE, DONE, FAILED)


@dataclass
class ShardView:
    spec: ShardSpec
    state: str
    claim: ClaimRecord | None
    heartbeat: Heartbeat | None
    completion: CompletionRecord | None
    failure: FailureRecord | None
    failures: int
    last_error: str | None
    heartbeat_age: float | None

    @property
    def shard_id(self) -> str:
        return self.spec.shard_id

    @property
    def owner(self) -> str | None:
        if self.completion is not None:
            return self.completion.host
        return self.claim.host if self.claim is not None else None

    @property
    def attempt_id(self) -> str | None:
        if self.completion is not None:
            return self.completion.attempt_id
        return self.claim.attempt_id if self.claim is not None else None


def _read(path: Path, cls: type) -> object | None:
    try:
        return fsops.read_record(path, lambda data: decode(cls, data, path), attempts=2)
    except ValueError:
        return None


def shard_view(layout: JobLayout, spec: ShardSpec, lock_timeout: float, now: float | None = None) -> ShardView:
    now = time.time() if now is None else now
    shard_id = spec.shard_id
    try:
        claim = read_claim(layout, shard_id)
    except ValueError:
        claim = None
    completion = _read(layout.done(shard_id), CompletionRecord)
    failure = _read(layout.failed(shard_id), FailureRecord)
    heartbeat = None
    age = None
    failures, _, last_error = count_failures(layout, shard_id)
    if failure is not None or (claim is not None and claim.status == FAILED):
        state = FAILED
        if failure is not None:
            last_error = failure.last_error
    elif completion is not None or (claim is not None and claim.status == DONE):
        state = DONE
    elif claim is None:
        state = PENDING
    else:
        heartbeat = read_heartbeat(layout.attempt_dir(shard_id, claim.attempt_id))
        last_seen = heartbeat.wall_time if heartbeat is not None and heartbeat.token == claim.token else claim.claimed_at
        age = max(0.0, now - last_seen)
        state = STALE if age > lock_timeout else RUNNING
    return ShardView(spec, state, claim, heartbeat, completion, failure, failures, last_error, age)  # type: ignore[arg-type]


def job_views(layout: JobLayout, manifest: Manifest, lock_timeout: float) -> list[ShardView]:
    now = time.time()
    return [shard_view(layout, spec, lock_timeout, now) for spec in manifest.shards]


def counts(views: list[ShardView]) -> dict[str, int]:
    result = {state: 0 for state in STATES}
    for view in views:
        result[view.state] += 1
    return result
