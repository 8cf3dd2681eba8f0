"""The job's vocabulary: the states and phases records carry, and views derive, as enums.

Each is a `StrEnum`, so a member is the very string the records hold on disk (`"done"`,
`"verifying input"`) and compares equal to it: the formats do not change, and a misspelt name
is an AttributeError at import instead of a silently wrong comparison. Producers (worker,
runners, heartbeats) and consumers (status, metrics, report) name the same member.
"""

from __future__ import annotations

from enum import StrEnum


class ClaimStatus(StrEnum):
    """`state/locks/<shard>.json`: a terminal status is recorded in the claim itself (P6)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class AttemptStatus(StrEnum):
    """What an attempt's own `attempt.json` records about how it ended."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    FENCED = "fenced"
    INTERRUPTED = "interrupted"
    BEATEN = "beaten"  # another attempt of its shard published first; stopped, not a failure


class AttemptOutcome(StrEnum):
    """What became of an attempt, as status and the timeline report show it: its recorded status,
    or `superseded` (its claim was taken over) and `stale` (its heartbeat stopped)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    INTERRUPTED = "interrupted"
    BEATEN = "beaten"
    RUNNING = "running"
    STALE = "stale"


class ShardState(StrEnum):
    """A shard as one look at the job directory sees it (`claims.shard_state`)."""

    PENDING = "pending"
    RUNNING = "running"
    STALE = "stale"
    DONE = "done"
    FAILED = "failed"


class Phase(StrEnum):
    """Where a running attempt is, as its heartbeat says; the ETA counts only `PROCESSING` time."""

    STARTING = "starting"
    VERIFYING_INPUT = "verifying input"
    QUEUED = "queued"
    STARTING_WARM_RUNTIME = "starting warm runtime"
    PROCESSING = "processing"
    COLLECTING_OUTPUT = "collecting output"
    PUBLISHING = "publishing"


class Refusal(StrEnum):
    """Why a worker's node refused to claim (`work.node_check`), as `status` shows it."""

    MISSING_PACKAGES = "missing packages"
    VERSION_MISMATCH = "version mismatch"
    NODE_FAILURES = "node-local failures"  # its attempts kept failing for reasons of the node


class OutputCodec(StrEnum):
    """How a shard's collected output is stored in the job directory (`work/output_codec.py`)."""

    NONE = "none"
    ZSTD = "zstd"


# Claimed ahead: not started, so it has no age yet.
WAITING_PHASES = frozenset({Phase.QUEUED})
# Started but not processing rows yet.
STARTING_PHASES = frozenset({Phase.STARTING, Phase.VERIFYING_INPUT, Phase.STARTING_WARM_RUNTIME})

# In their display order (status counts, the report's legend).
SHARD_STATES = tuple(ShardState)
OUTCOMES = tuple(AttemptOutcome)
