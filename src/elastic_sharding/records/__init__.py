"""On-disk records of a job directory, as dataclasses, and their JSON encoding.

Every record is written whole (create-once or atomic replace, see `fsops`), so a reader sees
either nothing or a complete record. Decoding validates types and names the file on error, and
every field that becomes part of a path (shard and attempt ids, tokens) against its pattern, so a
record can never lead the tool outside the job directory.

The records live in modules by subject (`codec` for the encoding, `job`, `claims`, `outputs`,
`submission`, `prepare`, `dedup`); this package re-exports every public name, which is the interface the
rest of the tool imports.
"""

from __future__ import annotations

from elastic_sharding.records.claims import (
    AttemptRecord,
    BackupRecord,
    ClaimRecord,
    CompletionRecord,
    FailureRecord,
    Heartbeat,
    NodeRefusal,
    OperatorStats,
    SupersededRecord,
    operator_stats,
)
from elastic_sharding.records.codec import (
    ATTEMPT_ID_RE,
    FORMAT_VERSION,
    MAX_SHARDS,
    PATH_FIELDS,
    ROW_KEY,
    SHARD_ID_RE,
    STATS_EXPORT_FIELDS,
    TOKEN_RE,
    decode,
    encode,
    from_dict,
    load,
    shard_id_for,
)
from elastic_sharding.records.dedup import DedupStageDone, DedupUnitDone, KeptShard, StageFailure
from elastic_sharding.records.job import AnalysisSpec, InputFile, Manifest, PackageRecord, Request, SegmentSpec, ShardSpec
from elastic_sharding.records.outputs import IndexEntry, MergeRecord, MergeShard, OutputIndex, PublishRecord
from elastic_sharding.records.prepare import (
    PrepareCuts,
    PrepareFailure,
    PreparePlan,
    RecipeJudged,
    ScanResult,
    ShardCut,
    ShardWritten,
    UnitClaim,
    WriteDone,
)
from elastic_sharding.records.submission import Outcome, PhaseLock, PhaseResult, RunRecord
from elastic_sharding.settings import Settings

__all__ = [
    "AnalysisSpec",
    # codec
    "ATTEMPT_ID_RE",
    "FORMAT_VERSION",
    "MAX_SHARDS",
    "PATH_FIELDS",
    "ROW_KEY",
    "STATS_EXPORT_FIELDS",
    "SHARD_ID_RE",
    "TOKEN_RE",
    "decode",
    "encode",
    "from_dict",
    "load",
    "shard_id_for",
    # job
    "InputFile",
    "Manifest",
    "PackageRecord",
    "Request",
    "Settings",
    "SegmentSpec",
    "ShardSpec",
    # claims
    "AttemptRecord",
    "BackupRecord",
    "ClaimRecord",
    "CompletionRecord",
    "FailureRecord",
    "Heartbeat",
    "NodeRefusal",
    "OperatorStats",
    "SupersededRecord",
    "operator_stats",
    # outputs
    "IndexEntry",
    "MergeRecord",
    "MergeShard",
    "OutputIndex",
    "PublishRecord",
    # submission
    "Outcome",
    "PhaseLock",
    "PhaseResult",
    "RunRecord",
    # prepare
    "PrepareCuts",
    "PrepareFailure",
    "PreparePlan",
    "RecipeJudged",
    "ScanResult",
    "ShardCut",
    "ShardWritten",
    "WriteDone",
    "UnitClaim",
    # dedup
    "StageFailure",
    "DedupStageDone",
    "DedupUnitDone",
    "KeptShard",
]
