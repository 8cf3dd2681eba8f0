"""The job's manifest (`manifest.json`): what was asked of `prepare`, the input files and the shards."""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic_sharding.records.codec import SHARD_ID_RE
from elastic_sharding.settings import Settings


@dataclass
class InputFile:
    path: str
    relpath: str
    size: int
    mtime_ns: int
    sha256: str
    rows: int
    # A plain file larger than `chunk_bytes` is read in parallel chunks: `sha256` is then the
    # sha256 of its chunks' binary sha256 digests in order (`chunks`, the hex digests).
    chunk_bytes: int = 0
    chunks: list[str] = field(default_factory=list)


@dataclass
class ShardSpec:
    shard_id: str
    index: int
    path: str
    first_row: int
    rows: int
    bytes: int
    sha256: str


@dataclass
class SegmentSpec:
    """A run of the recipe between deduplicators: `process[first_op:end_op]`, run shard by shard.
    Segment k > 0 starts after the deduplication stage of `process[dedup_op]`, whose kept rows
    are its input; segment 0 reads the prepared shards."""

    index: int
    first_op: int
    end_op: int
    dedup_op: int | None = None

    @property
    def has_ops(self) -> bool:
        return self.end_op > self.first_op


@dataclass
class PackageRecord:
    """A Python package the recipe's operators import (Data-Juicer's declarations, read by
    `dependencies.operators`), as the preparing node had it. Every worker finds it again and
    refuses to claim when it is missing (`required`) or another version."""

    package: str  # what Data-Juicer would install: a name, a requirement, or a git URL
    module: str | None  # what the operator imports, where Data-Juicer's declaration says
    distribution: str | None
    version: str | None
    operators: list[str]  # "process[3] chinese_convert_mapper", ...
    required: bool = True  # False: needed only on a branch prepare could not decide
    wanted: str = ""  # the requirement Data-Juicer asks for, for the install command


@dataclass
class AnalysisSpec:
    """What `--analyze` made of the recipe: the job computes `dj-analyze`'s statistics instead of
    processing. The job's recipe keeps only the operators `dj-analyze` runs (`operators`), and
    the filters among them only compute their statistics; `skipped` are the others."""

    percentiles: list[float]  # the extra percentiles asked for (`--percentiles`, else the recipe's)
    save_stats_in_one_file: bool  # the recipe's: also draw `all-stats.png`
    export_stem: str  # the stats export is `<export_stem>_stats.jsonl`, as dj-analyze names it
    operators: list[str]  # "process[3] words_num_filter", in recipe order
    skipped: list[str] = field(default_factory=list)


@dataclass
class Request:
    """What was asked of `prepare`; an identical request on an existing job is a no-op."""

    config_path: str
    config_sha256: str
    dataset_path: str
    num_shards: int
    settings: Settings
    analyze: bool = False
    percentiles: list[float] | None = None  # `--percentiles`; None: the recipe's


@dataclass
class Manifest:
    format_version: int
    job_id: str
    created_at: str
    created_on: str
    request: Request
    recipe_sha256: str
    recipe_file: str
    data_juicer_version: str
    data_juicer_commit: str | None
    ray_version: str
    python_version: str
    dataset_kind: str
    dataset_root: str
    inputs: list[InputFile]
    total_rows: int
    total_bytes: int
    normalized_sha256: str
    index_key: str | None
    media_keys: list[str]
    shards: list[ShardSpec]
    warnings: list[str] = field(default_factory=list)
    prepared_by: list[str] = field(default_factory=list)  # host:pid of every process that did a prepare unit
    # The recipe cut at its deduplicators; empty in a job prepared before they were supported
    # (one segment: the whole recipe).
    segments: list[SegmentSpec] = field(default_factory=list)
    # The packages the operators import; empty in a job prepared before they were recorded.
    packages: list[PackageRecord] = field(default_factory=list)
    # "parquet": the inputs are Parquet files and the shards are Parquet files of their row groups.
    input_format: str = "jsonl"
    # Set for a job prepared with `--analyze`: it computes dj-analyze's analysis of the recipe.
    analysis: AnalysisSpec | None = None

    def shard(self, shard_id: str) -> ShardSpec:
        """The spec of `shard_id`, found by the index its id names (no scan of 20,000 specs)."""
        match = SHARD_ID_RE.match(shard_id)
        index = int(match.group(1)) if match else -1
        if 0 <= index < len(self.shards) and self.shards[index].shard_id == shard_id:
            return self.shards[index]
        raise KeyError(shard_id)
