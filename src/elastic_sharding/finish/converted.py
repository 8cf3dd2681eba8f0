"""merge's files that are not plain shard outputs put together: the merged file, or one part per
shard, converted from the shard outputs as they are read and proven (`zstd_output`,
`parquet_output`, or JSONL decompressed from outputs stored compressed).

JSONL from plain shard outputs is published by the kernel (copied at known offsets, or
hard-linked); these are written by this process instead, through `HashingSink`, so the published
file's sha256 and size come from the very bytes written. Either way a file appears only complete: the merged file under a
temporary name committed at the end, a part inside the staging directory that is renamed whole.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from elastic_sharding import confined, crashpoints, fsops
from elastic_sharding.errors import UsageError
from elastic_sharding.finish import parquet_output, zstd_output
from elastic_sharding.finish.shard_reader import blocks
from elastic_sharding.finish.validate import Source
from elastic_sharding.hashing_sink import HashingSink
from elastic_sharding.output_formats import JSONL, JSONL_ZST, PARQUET
from elastic_sharding.progress import Progress


def schema_of(output_format: str, sources: list[Source], quiet: bool, stop: threading.Event | None = None) -> pa.Schema | None:
    """What a format needs to know of all rows before it writes any (Parquet: the union schema)."""
    if output_format != PARQUET:
        return None
    rows = sum(s.record.output_rows for s in sources)
    with Progress("schema", rows, quiet, unit="rows") as progress:
        return parquet_output.infer_schema(sources, stop, progress.update)


def write(
    output_format: str,
    sources: list[Source],
    sink: BinaryIO,
    schema: pa.Schema | None,
    workers: int,
    advance: Callable[[int], None] = lambda n: None,
    stop: threading.Event | None = None,
    part: bool = False,
) -> None:
    """`sources`, in order, as one file of `output_format` into `sink` (a directory output's
    `part`, or the merged file); `advance` is told the bytes (jsonl.zst) or rows (parquet) done,
    as `progress_units` counts them."""
    if output_format == JSONL:
        for source in sources:
            for view in blocks(source, stop):
                sink.write(view)
                advance(len(view))
    elif output_format == JSONL_ZST:
        zstd_output.write_zst(sources, sink, workers, stop, advance, part)
    elif output_format == PARQUET:
        assert schema is not None
        parquet_output.write_parquet(sources, schema, sink, stop, advance)
    else:
        raise AssertionError(f"{output_format} is not converted")


def progress_units(output_format: str, sources: list[Source]) -> tuple[int, str]:
    """The total and unit of a conversion's progress: JSONL lines' bytes read, or Parquet rows written."""
    if output_format == PARQUET:
        return sum(s.record.output_rows for s in sources), "rows"
    return sum(s.record.output_bytes for s in sources), "B"


def write_file(output_format: str, sources: list[Source], output: Path, overwrite: bool, quiet: bool) -> tuple[str, int]:
    """Publish `sources` as the single file `output`; returns its sha256 and size."""
    schema = schema_of(output_format, sources, quiet)
    total, unit = progress_units(output_format, sources)
    with (
        fsops.atomic_output(output, replace=overwrite) as out,
        Progress("merge", total, quiet, unit=unit) as progress,
    ):
        sink = HashingSink(out.file)
        with fsops.reported_as(output, "writing its temporary file"):
            write(output_format, sources, sink, schema, os.cpu_count() or 1, progress.update)
        crashpoints.reached("merging")
        if not out.commit():
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    return sink.digest.hexdigest(), sink.size


def write_part(
    output_format: str, source: Source, target: Path, shown: Path, schema: pa.Schema | None, stop: threading.Event | None = None
) -> tuple[str, int]:
    """Write one shard's part `target` (a new file in a staging directory), fsynced; returns its
    sha256 and size. An OSError about it names `shown`, the part's name in the published output."""
    with fsops.reported_as(shown, "writing it", target):
        fd = confined.open_nofollow(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb", buffering=1 << 20) as file:
            sink = HashingSink(file)
            write(output_format, [source], sink, schema, 1, stop=stop, part=True)
            file.flush()
            os.fsync(file.fileno())
    return sink.digest.hexdigest(), sink.size
