"""The records of a deduplication stage's units (`dedup/cooperate.py`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DedupUnitDone:
    """A unit's result: how many records it wrote (keys, buckets) or messages it sent (rounds)."""

    unit: str
    count: int
    host: str
    pid: int
    secs: float


@dataclass
class DedupStageDone:
    """The stage is complete; `final_round` is the components round whose labels are final
    (None for exact duplicates, or when no row has a near duplicate)."""

    final_round: int | None
    bucket_records: int
    rounds: int


@dataclass
class StageFailure:
    """A unit failed: the stage ends for every participant with this error."""

    unit: str
    error: str  # the exception's class name in errors.py
    message: str
    host: str
    pid: int


@dataclass
class KeptShard:
    """A keep unit's result: one shard's rows as the previous segment left them, less those the
    deduplicator drops, written as the next segment's input (`stages/<k>/shards/<shard>.jsonl`)."""

    unit: str
    shard_id: str
    attempt_id: str  # names this keep in a merge index when the segment after it is empty
    token: str
    input_rows: int
    input_sha256: str
    output_rows: int
    output_bytes: int
    output_sha256: str
    host: str
    pid: int
    started_at: float
    finished_at: float
