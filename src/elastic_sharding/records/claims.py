"""Records of claiming and running a shard: the claim, heartbeats, attempts and their ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastic_sharding.records.codec import from_dict
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus


@dataclass
class ClaimRecord:
    """The claim (lock) of one shard. `status` becomes terminal in place (P6)."""

    shard_id: str
    token: str
    attempt_id: str
    host: str
    pid: int
    claimed_at: float
    status: str = ClaimStatus.RUNNING
    updated_at: float = 0.0


@dataclass
class OperatorStats:
    """One warm operator's instances in one warm runtime, counted since the runtime started.

    `window_secs` runs from the first call's start to the last call's end on any instance;
    `all_busy_secs` is the part of it in which every instance was inside a call at once (the
    CPU analogue of "all GPUs busy"). `started` counts instances built (the first ones plus
    replacements of `deaths`), so it is also the number of model loads."""

    op: str
    runtime_pid: int
    instances: int
    started: int
    deaths: int = 0
    calls: int = 0
    rows: int = 0
    busy_secs: float = 0.0
    all_busy_secs: float = 0.0
    window_secs: float = 0.0
    busy_now: int = 0


def operator_stats(raw: list[dict[str, Any]] | None) -> list[OperatorStats] | None:
    """The warm runtime's figures (JSON from its events) as records; None when there are none."""
    if not raw:
        return None
    return [from_dict(OperatorStats, item, "warm operator figures") for item in raw]


@dataclass
class Heartbeat:
    """Rewritten by the claim owner every heartbeat; observers watch `seq` change.

    It also carries the attempt's progress, so `status` learns it without another file per
    worker: the phase and since when (owner's clock), the owner's own estimate of the attempt's
    processing time (from its previous shards' throughput; None before its first), and rows or
    bytes done once they are known (Ray does not report rows mid-run, so they stay None while
    processing).
    """

    token: str
    seq: int
    wall_time: float
    phase: str
    pid: int
    phase_since: float | None = None
    attempt_started_at: float | None = None
    expected_secs: float | None = None
    rows_done: int | None = None
    bytes_done: int | None = None
    operators: list[OperatorStats] | None = None  # the warm runtime's operators, live


@dataclass
class AttemptRecord:
    shard_id: str
    attempt_id: str
    token: str
    host: str
    pid: int
    runner: str
    started_at: float
    status: str = AttemptStatus.RUNNING
    finished_at: float | None = None
    error: str | None = None
    input_rows: int = 0
    output_rows: int | None = None
    output_bytes: int | None = None
    output_sha256: str | None = None
    exit_code: int | None = None
    setup_secs: float | None = None  # spent starting the node's runtime (a warm runner's first shard)
    operators: list[OperatorStats] | None = None  # the warm runtime's operators when it ended
    # A backup attempt names the attempt it backs up; it becomes the claim's own attempt (and its
    # failure counts) only once that owner handed the claim to it (`promoted`).
    backup_of: str | None = None
    promoted: bool = False
    node_local: bool = False  # it failed for a reason of its node (runtime start-up, OOM, a dead runtime)


@dataclass
class SupersededRecord:
    """Written (create-once) into an attempt dir by the worker that took its claim over."""

    shard_id: str
    attempt_id: str
    by_token: str
    by_host: str
    by_pid: int
    at: float
    reason: str


@dataclass
class CompletionRecord:
    shard_id: str
    attempt_id: str
    token: str
    host: str
    pid: int
    input_rows: int
    input_sha256: str
    output_rows: int
    output_bytes: int
    output_sha256: str
    started_at: float
    finished_at: float
    # Seconds the shard had its worker's processing to itself (the publisher's clock; overlap
    # with the worker's previous shard left out): what backups compare shards by.
    processing_secs: float | None = None
    # How the output is stored (`work/output_codec.py`): the `output_*` fields describe its JSONL
    # lines, these the file on disk. Records written before compressed outputs are plain JSONL.
    output_codec: str = "none"
    stored_bytes: int | None = None
    stored_sha256: str | None = None

    @property
    def is_plain(self) -> bool:
        """Whether the output file is its JSONL lines themselves."""
        return self.output_codec == "none"

    @property
    def file_bytes(self) -> int:
        return self.output_bytes if self.is_plain or self.stored_bytes is None else self.stored_bytes

    @property
    def file_sha256(self) -> str:
        return self.output_sha256 if self.is_plain or self.stored_sha256 is None else self.stored_sha256


@dataclass
class BackupRecord:
    """A backup attempt of one running claim: `state/backups/<shard>.<claim token>.json`, published
    create-once, so a claim gets at most one backup; never rewritten or removed while the job runs.

    The backup runs the shard in its own attempt directory and may publish the shard's completion
    while the claim it backs up (`of_token`) is still running, or once that claim was handed to it;
    the completion being create-once, the first valid publish wins (docs/concepts/claims.md)."""

    shard_id: str
    token: str
    attempt_id: str
    host: str
    pid: int
    of_token: str
    of_attempt_id: str
    at: float
    reason: str


@dataclass
class FailureRecord:
    shard_id: str
    failures: int
    last_attempt_id: str
    last_error: str
    host: str
    at: float


@dataclass
class NodeRefusal:
    """A worker that refused to claim because its node cannot run the job as prepared
    (`refusals/<host>.json`, replaced by the next refusal on that host, removed by the next worker
    there that passes the checks). `at` is wall-clock time, for display only."""

    host: str
    pid: int
    at: float
    reason: str  # vocabulary.Refusal
    message: str
