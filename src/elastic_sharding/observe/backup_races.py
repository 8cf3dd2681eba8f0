"""Backup attempts as `status` reports them: how each one's race with the attempt it backs up went.

Its own module because a race is judged from more than progress: both attempts' outcomes, the
shard's completion (which one published, with which output) and the backup record (why it
started). `metrics` only counts a backup and its original as one running shard for the ETA.

Each backup attempt is a `Backup`: its time and its original's are effective times
(`worker_time`; the original's up to the backup's win when it won); `behind_secs` is how much
longer the original had run than the backup needed, known whenever the backup won a race;
`saved_secs` only when both finished (the loser's end minus the winner's), since Ray reports no
rows mid-shard and the time a stopped original still needed is unknown.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

from elastic_sharding.observe.snapshot import AttemptView, ShardView
from elastic_sharding.observe.worker_time import busy_secs, worked_secs
from elastic_sharding.records import BackupRecord, CompletionRecord
from elastic_sharding.vocabulary import AttemptOutcome


class BackupState(StrEnum):
    """How a backup attempt's race with the attempt it backs up went."""

    RUNNING = "running"
    WON = "won"  # it published the shard's completion
    LOST = "lost"  # another attempt (the original) published first
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    FENCED = "fenced"  # the claim was taken over
    STALE = "stale"  # its heartbeat stopped


_BACKUP_STATE = {
    AttemptOutcome.RUNNING: BackupState.RUNNING,
    AttemptOutcome.SUCCEEDED: BackupState.WON,
    AttemptOutcome.BEATEN: BackupState.LOST,
    AttemptOutcome.FAILED: BackupState.FAILED,
    AttemptOutcome.INTERRUPTED: BackupState.INTERRUPTED,
    AttemptOutcome.SUPERSEDED: BackupState.FENCED,
    AttemptOutcome.STALE: BackupState.STALE,
}
# An original in one of these had not ended (nor stopped heartbeating) when its backup won: they raced.
_STILL_RACING = frozenset({AttemptOutcome.BEATEN, AttemptOutcome.RUNNING})


@dataclass
class Backup:
    """One backup attempt and its original (the module docstring says how its times count)."""

    shard_id: str
    attempt_id: str
    host: str
    pid: int
    of_attempt_id: str
    of_host: str | None  # None when the original's attempt record cannot be read
    started_at: float
    reason: str | None  # from its backup record, when readable
    state: BackupState
    promoted: bool
    backup_secs: float
    original_secs: float | None
    original_factor: float | None  # original_secs over the median completed shard's time for its size
    behind_secs: float | None
    saved_secs: float | None
    nondeterministic: bool  # both finished, with different outputs


@dataclass
class BackupCounts:
    started: int = 0
    running: int = 0
    won: int = 0
    lost: int = 0
    failed: int = 0


def count_backups(backups: list[Backup]) -> BackupCounts:
    states = Counter(backup.state for backup in backups)
    return BackupCounts(
        len(backups), states[BackupState.RUNNING], states[BackupState.WON], states[BackupState.LOST], states[BackupState.FAILED]
    )


def _end(attempt: AttemptView, now: float) -> float:
    return attempt.ended_at if attempt.ended_at is not None else now


def _backup_state(backup: AttemptView, completion: CompletionRecord | None) -> BackupState:
    state = _BACKUP_STATE.get(backup.outcome, BackupState.FAILED)
    if completion is None:
        return state
    if completion.attempt_id == backup.attempt_id:
        return BackupState.WON
    return BackupState.LOST if state in (BackupState.RUNNING, BackupState.WON) else state


def backup_races(
    views: list[ShardView],
    current: list[AttemptView],
    completed: list[AttemptView],
    records: dict[str, BackupRecord],
    starts: dict[tuple[str, str], float],
    now: float,
) -> list[Backup]:
    """Every backup attempt of the `current` attempts, with how its race went (module docstring);
    `completed` are the done shards' successful attempts (the median time for a size)."""
    per_sec_per_byte = _seconds_per_byte(completed, starts)
    completions = {v.shard_id: v.completion for v in views if v.completion is not None}
    by_id = {(a.shard_id, a.attempt_id): a for a in current}
    found = []
    for backup in current:
        if backup.backup_of is None:
            continue
        original = by_id.get((backup.shard_id, backup.backup_of))
        completion = completions.get(backup.shard_id)
        state = _backup_state(backup, completion)
        won = state == BackupState.WON
        backup_secs = worked_secs(backup, starts, _end(backup, now))
        original_secs = factor = behind = saved = None
        nondeterministic = False
        if original is not None:
            stop = _end(original, now)
            if won and completion is not None:
                stop = min(stop, completion.finished_at)
            original_secs = worked_secs(original, starts, stop)
            typical = per_sec_per_byte * original.input_bytes if per_sec_per_byte else None
            factor = original_secs / typical if typical else None
            raced = not backup.promoted and original.outcome in _STILL_RACING
            behind = original_secs - backup_secs if won and raced else None
            loser = original if won else backup if state == BackupState.LOST else None
            if loser is not None and loser.output_sha256 is not None and completion is not None:
                nondeterministic = loser.output_sha256 != completion.output_sha256
                if won:
                    saved = _end(original, now) - _end(backup, now)
        record = records.get(backup.attempt_id)
        found.append(
            Backup(
                shard_id=backup.shard_id,
                attempt_id=backup.attempt_id,
                host=backup.host,
                pid=backup.pid,
                of_attempt_id=backup.backup_of,
                of_host=original.host if original is not None else None,
                started_at=backup.started_at,
                reason=record.reason if record is not None else None,
                state=state,
                promoted=backup.promoted,
                backup_secs=backup_secs,
                original_secs=original_secs,
                original_factor=factor,
                behind_secs=behind,
                saved_secs=saved,
                nondeterministic=nondeterministic,
            )
        )
    return found


def _seconds_per_byte(completed: list[AttemptView], starts: dict[tuple[str, str], float]) -> float | None:
    samples = [busy_secs(a, starts) / a.input_bytes for a in completed if a.input_bytes > 0]
    return statistics.median(samples) if samples else None


__all__ = ["Backup", "BackupCounts", "BackupState", "backup_races", "count_backups"]
