"""Reading a shard output for a conversion (`jsonl.zst`, `parquet`), proven on the same read.

A converter reads every byte of a shard output anyway, so it hashes them as it goes: once the
last block is read the shard is proven to be its completion record's output, or the merge fails
naming it (before anything is published). An output edited in place, keeping its size and time,
is caught as surely as by `validate.py`, and a conversion never rests on an earlier read.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator

import zstandard

from elastic_sharding.finish.parallel_copy import Content, SourceError, Stopped, check_same, open_source
from elastic_sharding.finish.validate import Source, check_digest, check_file, explain_mismatch, source_error
from elastic_sharding.prepare.jsonl import BLOCK_SIZE


def blocks(source: Source, stop: threading.Event | None = None, block_size: int = BLOCK_SIZE) -> Iterator[memoryview]:
    """Every byte of `source`'s JSONL lines in order (decompressed if it is stored compressed), in
    blocks (each valid only until the next is asked for); after the last one, an IntegrityError
    if the bytes, or the file as stored, are not the record's."""
    digest = hashlib.sha256()
    stored = None if source.record.is_plain else hashlib.sha256()
    decoder = None if stored is None else zstandard.ZstdDecompressor().decompressobj()
    rows = size = 0
    buffer = bytearray(block_size)
    try:
        fd = open_source(source.path, source.identity)
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise Stopped
                try:
                    n = os.readv(fd, [buffer])
                except OSError as exc:
                    raise SourceError(exc) from None
                if not n:
                    break
                view = memoryview(buffer)[:n]
                if decoder is None:
                    rows += buffer.count(b"\n", 0, n)
                else:
                    stored.update(view)  # type: ignore[union-attr]
                    try:
                        data = decoder.decompress(view)
                    except zstandard.ZstdError as exc:
                        raise SourceError(f"{source.path}: not a valid zstd frame ({exc})") from None
                    rows += data.count(b"\n")
                    view = memoryview(data)
                digest.update(view)
                size += len(view)
                if view:
                    yield view
            check_same(fd, source.path, source.identity)
            if decoder is None and size != source.identity.size:
                raise SourceError(f"{source.path} changed while it was being merged")
        finally:
            os.close(fd)
    except SourceError as exc:
        raise source_error(source.record, source.path, exc) from None
    if stored is not None:
        check_file(source, Content(stored.hexdigest(), rows))
    if size != source.record.output_bytes:
        explain_mismatch(source.record, source.path)
    check_digest(source, Content(digest.hexdigest(), rows))


def lines(source: Source, stop: threading.Event | None = None, block_size: int = BLOCK_SIZE) -> Iterator[tuple[int, list[bytes]]]:
    """The lines of `source` (without their newline), a block's worth at a time, each batch with
    the 1-based number of its first line; proven like `blocks`."""
    rest = b""
    number = 1
    for view in blocks(source, stop, block_size):
        data = rest + view.tobytes() if rest else view.tobytes()
        batch = data.split(b"\n")
        rest = batch.pop()
        if batch:
            yield number, batch
            number += len(batch)
    if rest:
        yield number, [rest]
