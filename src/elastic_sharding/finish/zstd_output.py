"""The `jsonl.zst` format: the merged JSONL byte stream as one zstd frame.

Deterministic by construction: a fixed level, and zstd's multi-threaded mode (at least one
worker), whose output does not depend on the number of workers nor on how the input is fed to
it (single-threaded mode, zero workers, cuts blocks otherwise). So the file is the same bytes
for any shard count, any CPU count and any zstandard build of one zstd version. Every frame
carries a checksum, so a reader detects damage; the merged file's frame also carries the content
size, so a reader can allocate once. A directory output's part is a frame without it, exactly as
a worker stores a shard output (`work/output_codec.py`: a stream whose size is known only at its
end), so the part of an output stored that way is a hard link to it and every other part is the
same bytes it would have been.
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
    part: bool = False,
) -> None:
    """Compress every shard output in order into `sink` as one frame (a `part`'s without its
    content size), each proven on the same read. On failure the frame is left unfinished: the
    caller discards the file."""
    size = -1 if part else sum(source.record.output_bytes for source in sources)
    writer = compressor(workers).stream_writer(sink, size=size, closefd=False)
    for source in sources:
        for view in blocks(source, stop):
            writer.write(view)
            on_block(len(view))
    writer.close()  # ends the frame; `closefd=False` leaves `sink` open
