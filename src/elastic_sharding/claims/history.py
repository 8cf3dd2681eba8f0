"""A shard's attempt history: which attempts count against its retry limit, and the last error.

Counted from the attempts' own records at every decision, so a `retry` (which archives the
attempts) resets the count and no counter can drift from what the directory holds.
"""

from __future__ import annotations

from pathlib import Path

from elastic_sharding import confined, fsops
from elastic_sharding.layout import JobLayout, attempt_files, attempt_ids
from elastic_sharding.records import AttemptRecord, decode
from elastic_sharding.vocabulary import AttemptStatus


def read_attempt(attempt_dir: Path) -> AttemptRecord | None:
    path = attempt_files(attempt_dir)["record"]
    try:
        return fsops.read_record(path, lambda data: decode(AttemptRecord, data, path), attempts=2)
    except ValueError:
        return None


SUPERSEDED_ERROR = "worker stopped heartbeating (crashed, hung or cut off); claim taken over"


def attempt_failure(record: AttemptRecord | None, superseded: bool) -> tuple[bool, str | None]:
    """Whether an attempt counts against the shard's retry limit, and the error to report for it."""
    status = record.status if record else None
    if status == AttemptStatus.SUCCEEDED or not (status == AttemptStatus.FAILED or superseded):
        return False, None
    if record is not None and record.backup_of and not record.promoted and not superseded:
        return False, None  # a backup that failed while the claim was another's: that one goes on
    if record is not None and record.error:
        return True, record.error
    return True, SUPERSEDED_ERROR if superseded else None


def count_failures(layout: JobLayout, shard_id: str) -> tuple[int, str | None, str | None]:
    """Failed or superseded attempts of a shard since its last `retry`, with the latest error.

    Raises LinkRefused if attempts/<shard> is a symbolic link: the shard cannot be judged."""
    root = layout.attempts_dir(shard_id)
    failures, last_id, last_error = 0, None, None
    for name in attempt_ids(root):
        attempt_dir = root / name
        record = read_attempt(attempt_dir)
        if record is not None and record.status == AttemptStatus.SUCCEEDED:
            continue
        counts, error = attempt_failure(record, confined.lexists(attempt_files(attempt_dir)["superseded"]))
        if counts:
            failures += 1
            last_id = name
            last_error = error or last_error
    return failures, last_id, last_error
