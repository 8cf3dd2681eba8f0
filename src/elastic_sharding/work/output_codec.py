"""How a shard's collected output is stored in the job directory: plain JSONL, or zstd-compressed.

The job directory lives on the shared filesystem, whose bytes are the scarce thing, and the
collected outputs are most of them (bench/ `parquet`: 2.0 of 2.7 bytes per input byte as plain
JSONL). Stored compressed they are about a third of that, and a shard's worker pays a fraction of
a second of one core per shard for it (`docs/concepts/outputs.md` has the figures).

Whatever the codec, a completion record's `output_rows`, `output_bytes` and `output_sha256`
describe the JSONL lines themselves, so merged outputs, indexes and deduplication stages never
depend on it; `stored_bytes` and `stored_sha256` describe the file as stored. Every read of a
stored output (`finish/shard_reader.py`) checks both, so neither a changed file nor a changed
record gets through.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import zstandard

from elastic_sharding import confined
from elastic_sharding.layout import PROCESSED_NAMES
from elastic_sharding.vocabulary import OutputCodec

# The level and frame options of every zstd file the tool writes (the `jsonl.zst` output too).
ZSTD_LEVEL = 3
MAX_ZSTD_THREADS = 32


assert set(PROCESSED_NAMES) == set(OutputCodec)


def compressor(threads: int = 1) -> zstandard.ZstdCompressor:
    """zstd in multi-threaded mode (at least one thread), whose bytes depend neither on the thread
    count nor on how the input is fed to it; each frame carries a checksum."""
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=max(1, min(threads, MAX_ZSTD_THREADS)), write_checksum=True)


@contextmanager
def encoder(codec: str, sink: BinaryIO) -> Iterator[BinaryIO]:
    """A writer of JSONL lines into `sink` as `codec` stores them; the frame ends when the block
    exits without an error, and `sink` stays open."""
    if OutputCodec(codec) is OutputCodec.NONE:
        yield sink
        return
    writer = compressor().stream_writer(sink, closefd=False)
    yield writer
    writer.close()


@contextmanager
def open_lines(path: Path, codec: str) -> Iterator[BinaryIO]:
    """A stored output opened for reading its JSONL lines (never through a link); a damaged zstd
    frame raises zstandard.ZstdError, a truncated one ends early (the caller's sha256 check sees it)."""
    with confined.open_read(path, buffering=1 << 20) as raw:
        if OutputCodec(codec) is OutputCodec.NONE:
            yield raw
            return
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        with io.BufferedReader(reader, buffer_size=1 << 20) as lines:
            yield lines
