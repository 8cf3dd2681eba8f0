"""Cooperative prepare records (`.<job>.preparing/`; removed when the job is published)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from elastic_sharding.records.job import PackageRecord


@dataclass
class PreparePlan:
    """What every participant of one prepare needs, without the recipe or Data-Juicer: the input
    files as listed (with size and time, to detect a change) and the scan units over them."""

    key: str
    files: list[str]
    sizes: list[int]
    mtimes: list[int]
    units: list[list[list[int | None]]]  # per unit: [file, start, end (None: to the end)] pieces
    unit_bytes: int
    base: str
    media_keys: list[str]
    index_key: str | None
    max_line: int
    num_shards: int
    lease_secs: float
    heartbeat_secs: float
    poll_secs: float
    manifest: dict[str, Any]  # the manifest's fields known before the scan (request, recipe, engine...)
    recipe_text: str
    recipe_base: str  # where the recipe's relative paths resolve from, for its `recipe` unit
    shards_per_write: int = 1  # shards one write unit writes (several where shards are tiny)
    input_format: str = "jsonl"  # or "parquet": every input file is one or the other


@dataclass
class RecipeJudged:
    """The `recipe` unit's result: Data-Juicer accepted the plan's recipe."""

    host: str
    pid: int
    data_juicer_version: str | None
    packages: list[PackageRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class UnitClaim:
    token: str
    host: str
    pid: int
    at: float


@dataclass
class ScanResult:
    unit: int
    host: str
    pid: int
    ok: bool
    error: str | None
    rows: int
    weight: int  # normalized bytes, with every added index counted as one digit (fixed at the cut)
    added_keys: int
    pieces: list[list[Any]]  # per piece: [first line offset, lines, sha256 of its bytes]
    schema: list[list[Any]]  # flattened SchemaNode tree, origins as "<piece>:<line>"
    # Parquet input: per file whose footer the unit read, [file, schema, [[rows, bytes], ...]].
    footers: list[list[Any]] = field(default_factory=list)


@dataclass
class ShardCut:
    first_row: int
    rows: int
    # [unit, piece, first row in the unit, first row in the piece, rows]; for Parquet input
    # [file, row group, first row in the row group, rows, the row group's rows].
    segments: list[list[int]]


@dataclass
class PrepareCuts:
    total_rows: int
    total_weight: int
    schema: list[list[Any]]
    warnings: list[str]
    shards: list[ShardCut]
    piece_lines: list[list[int]]  # per unit, per piece: the number of its first line in its file
    piece_offsets: list[list[int]]


@dataclass
class ShardWritten:
    index: int
    rows: int
    bytes: int
    sha256: str


@dataclass
class WriteDone:
    """A write unit's result: the shards it wrote, in order."""

    host: str
    pid: int
    shards: list[ShardWritten]


@dataclass
class PrepareFailure:
    error: str  # the exception's class name in errors.py
    message: str
    host: str
    pid: int
