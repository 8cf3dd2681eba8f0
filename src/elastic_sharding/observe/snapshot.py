"""A read-only view of a job: the state of every shard, shared by status, retry, merge, verify.

A one-shot reader cannot watch a heartbeat for a whole lease, so `stale` here is an estimate
from the owner's recorded heartbeat time against this machine's clock, labelled as such.
Workers never use it to take a claim over.

A symbolic link planted where a record or an attempt directory belongs is never followed: here it
reads as a missing record (with a warning); merge and verify re-read what they need strictly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from elastic_sharding import confined, fsops
from elastic_sharding.claims.heartbeat import read_claim_heartbeat, read_heartbeat
from elastic_sharding.claims.history import attempt_failure, count_failures, read_attempt
from elastic_sharding.claims.protocol import read_claim
from elastic_sharding.claims.shard_state import shard_state
from elastic_sharding.layout import JobLayout, attempt_files, attempt_ids
from elastic_sharding.records import (
    AttemptRecord,
    BackupRecord,
    ClaimRecord,
    CompletionRecord,
    FailureRecord,
    Heartbeat,
    Manifest,
    NodeRefusal,
    OperatorStats,
    ShardSpec,
    decode,
)
from elastic_sharding.vocabulary import OUTCOMES, SHARD_STATES, AttemptOutcome, AttemptStatus, ClaimStatus, ShardState

T = TypeVar("T")

log = logging.getLogger(__name__)


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


def _lenient(read: Callable[[], T | None]) -> T | None:
    """A record as a one-shot view takes it: a link planted in its place (with a warning) or an
    unparsable one reads as missing."""
    try:
        return read()
    except confined.LinkRefused as exc:
        log.warning("ignoring %s", exc)
        return None
    except ValueError:
        return None


def read_leniently(path: Path, cls: type[T]) -> T | None:
    """A small record as a one-shot view reads it (`_lenient`)."""
    return _lenient(lambda: fsops.read_record(path, lambda data: decode(cls, data, path), attempts=2))


def _records_in(directory: Path, cls: type[T]) -> list[T]:
    """Every readable `*.json` record of a directory of create-once or replaced records, by name
    (hidden temporary files, and records that are unreadable or planted as links, left out)."""
    try:
        entries = confined.list_dir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except confined.LinkRefused as exc:
        log.warning("ignoring %s", exc)
        return []
    found = []
    for name, kind in sorted(entries.items()):
        if kind == "file" and name.endswith(".json") and not name.startswith("."):
            record = read_leniently(directory / name, cls)
            if record is not None:
                found.append(record)
    return found


def node_refusals(layout: JobLayout) -> list[NodeRefusal]:
    """The hosts whose worker refused to claim (`work.node_check`, `work.node_health`), by host."""
    return sorted(_records_in(layout.refusals, NodeRefusal), key=lambda r: r.host)


def backup_records(layout: JobLayout) -> dict[str, BackupRecord]:
    """The backup records of the recipe segment `layout` is of, by the backup attempt's id: what an
    attempt record does not say about its backup (why it started, the claim it backs up)."""
    return {record.attempt_id: record for record in _records_in(layout.backups_dir, BackupRecord)}


def _claim(layout: JobLayout, shard_id: str) -> ClaimRecord | None:
    return _lenient(lambda: read_claim(layout, shard_id))


def shard_view(layout: JobLayout, spec: ShardSpec, lock_timeout: float, now: float | None = None) -> ShardView:
    now = time.time() if now is None else now
    failures = count_failures(layout, spec.shard_id)
    completion = read_leniently(layout.done(spec.shard_id), CompletionRecord)
    return _build_view(layout, spec, _claim(layout, spec.shard_id), completion, failures[0], failures[2], lock_timeout, now)


def _build_view(
    layout: JobLayout,
    spec: ShardSpec,
    claim: ClaimRecord | None,
    completion: CompletionRecord | None,
    failures: int,
    last_error: str | None,
    lock_timeout: float,
    now: float,
) -> ShardView:
    shard_id = spec.shard_id
    failure = read_leniently(layout.failed(shard_id), FailureRecord)
    heartbeat = None
    age = None
    state = shard_state(claim, completion is not None, failure is not None)
    if state == ShardState.FAILED and failure is not None:
        last_error = failure.last_error
    elif state == ShardState.RUNNING:
        heartbeat = read_claim_heartbeat(layout, claim)
        last_seen = heartbeat.wall_time if heartbeat is not None and heartbeat.token == claim.token else claim.claimed_at
        age = max(0.0, now - last_seen)
        state = ShardState.STALE if age > lock_timeout else ShardState.RUNNING
    return ShardView(spec, state, claim, heartbeat, completion, failure, failures, last_error, age)  # type: ignore[arg-type]


def job_views(layout: JobLayout, manifest: Manifest, lock_timeout: float) -> list[ShardView]:
    now = time.time()
    return [shard_view(layout, spec, lock_timeout, now) for spec in manifest.shards]


def counts(views: list[ShardView]) -> dict[str, int]:
    result = {state.value: 0 for state in SHARD_STATES}
    for view in views:
        result[view.state] += 1
    return result


@dataclass
class AttemptView:
    """One attempt of one shard as the job directory records it (times are the owner's clock).

    `ended_at` is None only for a running attempt; an attempt whose owner vanished ends at its
    last heartbeat. `archive` names the `retry` that moved it to state/history (None if current).
    """

    shard_id: str
    attempt_id: str
    host: str
    pid: int
    runner: str
    started_at: float
    ended_at: float | None
    outcome: str
    error: str | None
    input_rows: int
    input_bytes: int
    output_rows: int | None
    phase: str | None
    expected_secs: float | None
    log: Path
    archive: str | None = None
    phase_secs: float | None = None  # in `phase` as of the last heartbeat, by the owner's own clock
    counts_as_failure: bool = False  # against the shard's retry limit (claims.history.attempt_failure)
    setup_secs: float = 0.0  # of it spent starting the node's runtime
    operators: list[OperatorStats] | None = None  # its warm runtime's operators (live while running)
    segment: int = 0  # the recipe segment it ran (`segments.py`); a shard has attempts in each
    backup_of: str | None = None  # a backup attempt: the attempt it backs up (`claims.backups`)
    promoted: bool = False  # a backup the claim was handed to (its original failed or was drained)
    output_sha256: str | None = None  # of the output it collected, published or not

    @property
    def secs(self) -> float | None:
        return None if self.ended_at is None else max(0.0, self.ended_at - self.started_at)


def _attempt_view(
    attempt_dir: Path,
    spec: ShardSpec,
    current: ClaimRecord | None,
    lock_timeout: float,
    now: float,
    archive: str | None,
    published: str | None = None,
) -> AttemptView | None:
    """Reads the heartbeat only of an attempt still marked running, and looks for a superseded
    marker only on one that did not succeed: `status --watch` repeats this for every attempt.

    The attempt the shard's completion record names (`published`) succeeded, whatever its own
    record says: its owner can publish and then lose the filesystem before it records that."""
    record = read_attempt(attempt_dir)
    if record is None:
        return None
    if record.attempt_id == published and record.status != AttemptStatus.SUCCEEDED:
        record = replace(record, status=AttemptStatus.SUCCEEDED)
    files = attempt_files(attempt_dir)
    superseded = record.status != AttemptStatus.SUCCEEDED and confined.lexists(files["superseded"])
    heartbeat = read_heartbeat(attempt_dir) if record.status == AttemptStatus.RUNNING or record.finished_at is None else None
    last_seen = heartbeat.wall_time if heartbeat is not None and heartbeat.token == record.token else record.started_at
    outcome = record.status
    if record.status == AttemptStatus.FENCED or superseded:
        outcome = AttemptOutcome.SUPERSEDED
    elif record.status == AttemptStatus.RUNNING:
        live = archive is None and _runs_under(record, current)
        outcome = AttemptOutcome.RUNNING if live and now - last_seen <= lock_timeout else AttemptOutcome.STALE
    running = outcome == AttemptOutcome.RUNNING
    ended_at = None if running else record.finished_at if record.finished_at is not None else last_seen
    counts, error = attempt_failure(record, superseded)
    return AttemptView(
        shard_id=spec.shard_id,
        attempt_id=record.attempt_id,
        host=record.host,
        pid=record.pid,
        runner=record.runner,
        started_at=record.started_at,
        ended_at=ended_at,
        outcome=outcome if outcome in OUTCOMES else AttemptOutcome.FAILED,
        error=error or record.error,
        input_rows=spec.rows,
        input_bytes=spec.bytes,
        output_rows=record.output_rows,
        phase=heartbeat.phase if heartbeat is not None and running else None,
        expected_secs=heartbeat.expected_secs if heartbeat is not None else None,
        log=files["log"],
        archive=archive,
        phase_secs=_phase_secs(heartbeat) if running else None,
        counts_as_failure=counts,
        setup_secs=record.setup_secs or 0.0,
        operators=(heartbeat.operators if running and heartbeat is not None else None) or record.operators,
        backup_of=record.backup_of,
        promoted=record.promoted,
        output_sha256=record.output_sha256,
    )


def _runs_under(record: AttemptRecord, current: ClaimRecord | None) -> bool:
    """The shard's claim is this attempt's own and running, or (a backup) the claim it backs up,
    whatever that claim's status: a backup stops only at its next heartbeat after the claim ended."""
    if current is None:
        return False
    if current.token == record.token:
        return current.status == ClaimStatus.RUNNING
    return record.backup_of is not None and current.attempt_id == record.backup_of


def _phase_secs(heartbeat: Heartbeat | None) -> float | None:
    if heartbeat is None or heartbeat.phase_since is None:
        return None
    return max(0.0, heartbeat.wall_time - heartbeat.phase_since)


def _subdirs(path: Path) -> list[str]:
    """Real subdirectories of `path`, sorted; links (and `path` being one) are skipped, with a warning."""
    try:
        entries = confined.list_dir(path)
    except confined.LinkRefused as exc:
        log.warning("ignoring %s", exc)
        return []
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name, kind in entries.items():
        if kind == "link":
            log.warning("ignoring %s", confined.LinkRefused(path / name))
    return sorted(name for name, kind in entries.items() if kind == "dir")


def _attempts_in(
    root: Path,
    spec: ShardSpec,
    claim: ClaimRecord | None,
    lock_timeout: float,
    now: float,
    archive: str | None,
    published: str | None = None,
) -> list[AttemptView]:
    try:
        names = attempt_ids(root)
    except confined.LinkRefused as exc:
        log.warning("ignoring %s", exc)
        return []
    except NotADirectoryError:
        return []
    views = (_attempt_view(root / name, spec, claim, lock_timeout, now, archive, published) for name in names)
    return [view for view in views if view is not None]


def job_snapshot(
    layout: JobLayout, manifest: Manifest, lock_timeout: float, now: float | None = None
) -> tuple[list[ShardView], list[AttemptView]]:
    """Every shard's view and every attempt (archived ones, moved by `retry`, included; oldest
    first) of the recipe segment `layout` is of, reading each record once: what `status` and
    `report` show."""
    now = time.time() if now is None else now
    specs = {spec.shard_id: spec for spec in manifest.shards}
    attempts: list[AttemptView] = []
    for archive in _subdirs(layout.history):
        for shard_id in _subdirs(layout.history / archive):
            if shard_id in specs:
                root = layout.archived(archive, shard_id)["attempts"]
                attempts += _attempts_in(root, specs[shard_id], None, lock_timeout, now, archive)
    views = []
    for spec in manifest.shards:
        claim = _claim(layout, spec.shard_id)
        completion = read_leniently(layout.done(spec.shard_id), CompletionRecord)
        published = completion.attempt_id if completion is not None else None
        current = _attempts_in(layout.attempts_dir(spec.shard_id), spec, claim, lock_timeout, now, None, published)
        failed = [view for view in current if view.counts_as_failure]
        errors = [view.error for view in failed if view.error]
        views.append(_build_view(layout, spec, claim, completion, len(failed), errors[-1] if errors else None, lock_timeout, now))
        attempts += current
    for attempt in attempts:
        attempt.segment = layout.segment_index
    attempts.sort(key=lambda view: (view.started_at, view.shard_id, view.attempt_id))
    return views, attempts


def attempt_history(layout: JobLayout, manifest: Manifest, lock_timeout: float, now: float | None = None) -> list[AttemptView]:
    return job_snapshot(layout, manifest, lock_timeout, now)[1]
