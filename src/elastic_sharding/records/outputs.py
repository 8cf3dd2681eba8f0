"""Records of the published outputs (`merge`): the merge record and a directory output's index."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MergeShard:
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class MergeRecord:
    output: str
    rows: int
    bytes: int
    sha256: str
    merged_at: float
    host: str
    shards: list[MergeShard]


@dataclass
class PublishRecord(MergeRecord):
    """`merge.json`: a MergeRecord that also says which form was published. `form` "file": one
    merged JSONL at `output`, `sha256` is that file's. `form` "directory": one JSONL per shard in
    the directory `output`, listed by its index file `index`, and `sha256` is the index file's."""

    form: str = "file"  # file | directory
    index: str | None = None


@dataclass
class IndexEntry:
    """One shard of a directory output; `name` is None for a shard without rows (no file)."""

    name: str | None
    shard_id: str
    attempt_id: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class OutputIndex:
    """The index of a directory output, written last: its presence commits the directory."""

    format: str
    format_version: int
    job_id: str
    rows: int
    bytes: int
    files: int
    entries: list[IndexEntry]
    published_at: float
    host: str
