"""The directory form of a merge: one file per shard in manifest order plus the index, built in a
hidden staging directory beside the output and renamed into place whole (`destination.py`).

A part whose shard output is stored in the part's own format is a hard link to it (a copy where
linking fails) once its bytes are proven against the completion record; any other part is
converted on the read that proves it (`converted.py`). A shard without rows gets no file (an
empty one trips up some readers), only its index entry. The index is written last.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from elastic_sharding import crashpoints, fsops
from elastic_sharding.destination import INDEX_FORMAT, INDEX_NAME, make_staging_dir, publish_directory, remove_tree
from elastic_sharding.errors import UsageError
from elastic_sharding.finish import converted
from elastic_sharding.finish.parallel_copy import Content, DestinationError, hash_file, link_or_copy, run_all, thread_count
from elastic_sharding.finish.shard_reader import blocks
from elastic_sharding.finish.validate import EMPTY_SHA256, LockedProgress, Source, Trusted, check_digest, guarded
from elastic_sharding.output_formats import JSONL, JSONL_ZST, PARQUET, part_name
from elastic_sharding.prepare.jsonl import BLOCK_SIZE
from elastic_sharding.records import IndexEntry, OutputIndex, encode
from elastic_sharding.vocabulary import OutputCodec

log = logging.getLogger(__name__)

PARQUET_PART_THREADS = 4  # converting rows holds the GIL: more threads would only hold more row groups in memory
# The directory-output formats whose part is a shard output stored one way, byte for byte
# (`work/output_codec.py`, `zstd_output`): such a part is a hard link to it.
LINKED_PARTS = {JSONL: OutputCodec.NONE, JSONL_ZST: OutputCodec.ZSTD}
_crash_lock = threading.Lock()


def reached_merging() -> None:
    """The `merging` crash point, reached by one copying thread at a time."""
    with _crash_lock:
        crashpoints.reached("merging")


def publish_directory_output(
    sources: list[Source], output: Path, overwrite: bool, quiet: bool, job_id: str, pool: ThreadPoolExecutor, fmt: str = JSONL
) -> tuple[str, int, Path, Trusted]:
    """Put every validated shard output (linked or copied; or converted to `fmt`) into a staging
    directory beside `output`, write the index last, and rename the directory into place;
    returns the index's sha256, the parts' bytes, the index's path and the linked files."""
    stage = make_staging_dir(output)
    try:
        if fmt in LINKED_PARTS:
            placed = _link_parts(sources, output, stage, quiet, pool, fmt)
        else:
            placed = _convert_parts(sources, output, stage, quiet, fmt)
        entries = [entry for entry, _ in placed]
        index = OutputIndex(
            format=INDEX_FORMAT,
            format_version=1,
            job_id=job_id,
            rows=sum(e.rows for e in entries),
            bytes=sum(e.bytes for e in entries),
            files=sum(1 for e in entries if e.name is not None),
            entries=entries,
            published_at=time.time(),
            host=socket.gethostname(),
            output_format=fmt,
        )
        data = encode(index)
        fsops.replace_atomic(stage / INDEX_NAME, data)
        links = sum(1 for _, was_linked in placed if was_linked)
        if not publish_directory(stage, output, overwrite):
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    except BaseException:
        remove_tree(stage)
        raise
    if fmt in LINKED_PARTS:
        log.info("%d of %d file(s) hard-linked to their shard output, %d written", links, index.files, index.files - links)
    trusted = {
        (s.identity.dev, s.identity.ino): (s.identity.size, s.identity.mtime_ns, s.record.file_sha256)
        for s, (_, was_linked) in zip(sources, placed)
        if was_linked
    }
    return hashlib.sha256(data).hexdigest(), index.bytes, output / INDEX_NAME, trusted


def _prove_empty(source: Source, stop: threading.Event) -> None:
    """A shard output without rows is what its record says (stored compressed: its frame is read)."""
    if source.record.is_plain:
        check_digest(source, Content(EMPTY_SHA256, 0))
    else:
        for _ in blocks(source, stop):
            pass


def _entry(source: Source, name: str | None, size: int, sha256: str) -> IndexEntry:
    record = source.record
    return IndexEntry(name, record.shard_id, record.attempt_id, record.output_rows, size, sha256)


def _link_parts(
    sources: list[Source], output: Path, stage: Path, quiet: bool, pool: ThreadPoolExecutor, fmt: str
) -> list[tuple[IndexEntry, bool]]:
    """Every shard output stored as `fmt`'s part hard-linked (or copied) into `stage` once its
    bytes are proven; one stored otherwise is converted into its part (the same bytes)."""
    block = BLOCK_SIZE
    stop = threading.Event()
    with LockedProgress("merge", sum(s.identity.size for s in sources), quiet) as progress:

        def place(source: Source) -> tuple[IndexEntry, bool]:
            record = source.record
            name = part_name(record.shard_id, fmt) if record.output_bytes else None
            if name is None:
                _prove_empty(source, stop)  # no rows: no file (an empty one trips up some readers)
                progress.update(source.identity.size)
                return _entry(source, None, 0, EMPTY_SHA256), False
            if record.output_codec != LINKED_PARTS[fmt]:
                sha256, size = converted.write_part(fmt, source, stage / name, output / name, None, stop)
                reached_merging()
                progress.update(source.identity.size, record.output_rows)
                return _entry(source, name, size, sha256), False
            if record.is_plain:
                check_digest(source, guarded(source, lambda: hash_file(source.path, source.identity, block, stop)))
            else:
                for _ in blocks(source, stop):  # the stored file and its lines, against the record
                    pass
            try:
                linked = guarded(source, lambda: link_or_copy(source.path, source.identity, stage / name, block, stop))
            except DestinationError as exc:
                with fsops.reported_as(output / name, "copying the shard output into it"):
                    raise exc.cause from None
            reached_merging()
            progress.update(source.identity.size, record.output_rows)
            return _entry(source, name, record.file_bytes, record.file_sha256), linked

        return run_all(pool, place, sources, stop)


def _convert_parts(sources: list[Source], output: Path, stage: Path, quiet: bool, fmt: str) -> list[tuple[IndexEntry, bool]]:
    """Every shard output converted to a `fmt` part in `stage`, proven on the read it is converted
    from; Parquet parts all get the schema of the whole output, so they read back as one table."""
    stop = threading.Event()
    schema = converted.schema_of(fmt, sources, quiet, stop)
    threads = thread_count(len(sources))
    if fmt == PARQUET:
        threads = min(threads, PARQUET_PART_THREADS)
    with (
        LockedProgress("merge", sum(s.identity.size for s in sources), quiet) as progress,
        ThreadPoolExecutor(threads, thread_name_prefix="elastic-convert") as pool,
    ):

        def place(source: Source) -> tuple[IndexEntry, bool]:
            name = part_name(source.record.shard_id, fmt) if source.record.output_bytes else None
            if name is None:
                _prove_empty(source, stop)  # no rows: no file, as for JSONL
                return _entry(source, None, 0, EMPTY_SHA256), False
            sha256, size = converted.write_part(fmt, source, stage / name, output / name, schema, stop)
            reached_merging()
            progress.update(source.identity.size, source.record.output_rows)
            return _entry(source, name, size, sha256), False

        return run_all(pool, place, sources, stop)
