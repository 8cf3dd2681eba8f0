"""The `jsonl.zst` format: the merged JSONL byte stream as one zstd frame.

Deterministic by construction: a fixed level, and zstd's multi-threaded mode (at least one
worker), whose output does not depend on the number of workers nor on how the input is fed to
it (single-threaded mode, zero workers, cuts blocks otherwise). So the file is the same bytes
for any shard count, any CPU count and any zstandard build of one zstd version. The frame
carries the content size and a checksum, so a reader can allocate once and detect damage.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import BinaryIO

from elastic_sharding.finish.shard_reader import blocks
from elastic_sharding.finish.validate import Source
from elastic_sharding.work.output_codec import compressor


def write_zst(
    sources: list[Source],
    sink: BinaryIO,
    workers: int = os.cpu_count() or 1,
    stop: threading.Event | None = None,
    on_block: Callable[[int], None] = lambda n: None,
) -> None:
    """Compress every shard output in order into `sink` as one frame, each proven on the same
    read. On failure the frame is left unfinished: the caller discards the file."""
    size = sum(source.record.output_bytes for source in sources)
    writer = compressor(workers).stream_writer(sink, size=size, closefd=False)
    for source in sources:
        for view in blocks(source, stop):
            writer.write(view)
            on_block(len(view))
    writer.close()  # ends the frame; `closefd=False` leaves `sink` open
