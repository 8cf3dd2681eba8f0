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
    """`merge.json`: a MergeRecord that also says which form and format were published. `form`
    "file": one merged file at `output`; `bytes` and `sha256` are that file's. `form` "directory":
    one file per shard in the directory `output`, listed by its index file `index`, and `sha256`
    is the index file's. `output_format` (jsonl, jsonl.zst, parquet; records written before
    formats existed are jsonl) says what the file or the parts hold; `rows` is always the rows."""

    form: str = "file"  # file | directory
    index: str | None = None
    output_format: str = "jsonl"


@dataclass
class IndexEntry:
    """One shard of a directory output; `name` is None for a shard without rows (no file).
    `bytes` and `sha256` are the file's: for JSONL the shard output's own, for another format
    the converted part's."""

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
    output_format: str = "jsonl"  # what every part holds; indexes written before formats existed are jsonl
