"""merge: revalidate every published shard output and publish them in manifest order, as one
merged file or as a directory of one file per shard, in JSONL or (converted as they are read and
proven, `converted.py`) zstd-compressed JSONL or Parquet. Shard outputs stored plain (workers'
`--shard-output-codec none`) are published as JSONL by the kernel, as follows; those stored
compressed are decompressed as they are read, through `converted.py` too.

A file is built under a temporary name with `copy_file_range` at offsets known from the completion
records (one thread per shard, bounded by the CPUs; each range's writeback started as soon as it
is copied), fsynced, and then renamed (or, without
`--overwrite`, linked create-once) onto the output path. A directory is built in a hidden staging
directory beside the output (each shard output hard-linked, or copied where it cannot be), its
index written last, and renamed into place (`directory_output.py`). Either way no reader ever
sees a partial merge.

Every shard output is first proven to be its completion record's (`validate.py`; a conversion
proves each on the very read it converts, `shard_reader.py`). The sha256 of a merged JSONL file
(for `merge.json`) covers every byte in order and so runs on one core; it is computed from the
same read as the shards' own (see `parallel_copy.OrderedHasher`), overlapping the copies and the
fsync.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from elastic_sharding import confined, fsops
from elastic_sharding.destination import (
    check_target,
    output_form,
    prepare_destination,
    refuse_existing_directory,
)
from elastic_sharding.errors import IntegrityError, UsageError, next_step
from elastic_sharding.finish import converted
from elastic_sharding.finish.directory_output import publish_directory_output, reached_merging
from elastic_sharding.finish.parallel_copy import (
    COPY_CHUNK,
    Content,
    DestinationError,
    OrderedHasher,
    SourceError,
    Stopped,
    check_same,
    copy_range,
    hash_range,
    open_source,
    run_all,
    start_writeback,
    thread_count,
    write_at,
)
from elastic_sharding.finish.shard_reader import blocks
from elastic_sharding.finish.validate import (
    SHARD_CHANGED,
    LockedProgress,
    Source,
    Trusted,
    completed_outputs,
    explain_mismatch,
    recorded_content,
    source_error,
    sources_of,
)
from elastic_sharding.layout import JobLayout
from elastic_sharding.output_formats import JSONL, choose_format
from elastic_sharding.prepare.jsonl import BLOCK_SIZE
from elastic_sharding.progress import Progress
from elastic_sharding.records import MergeShard, PublishRecord, encode

log = logging.getLogger(__name__)


def merge(
    job_dir: Path,
    output: Path | str,
    overwrite: bool = False,
    lock_timeout: float | None = None,
    *,
    quiet: bool = False,
    directory: bool | None = None,
    output_format: str | None = None,
) -> PublishRecord:
    """Merge every shard output in manifest order into `output`, atomically; missing directories
    of `output` are created (and removed again if the merge fails).

    `output` is a directory output if `directory` says so or, with `directory` None, if it ends
    in `/` or is an existing directory. `output_format` (`output_formats.FORMATS`) defaults to
    the one the file name says, else JSONL. `quiet` turns off the progress bar on stderr (drawn
    only on a terminal)."""
    return publish(job_dir, output, overwrite, lock_timeout, quiet=quiet, directory=directory, output_format=output_format)[0]


def publish(
    job_dir: Path,
    output: Path | str,
    overwrite: bool = False,
    lock_timeout: float | None = None,
    *,
    quiet: bool = False,
    directory: bool | None = None,
    output_format: str | None = None,
) -> tuple[PublishRecord, Trusted]:
    """`merge`, also returning the published files that are shard outputs themselves (linked),
    whose bytes it has just checked: a verify right after it need not hash them again."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    named = output
    output, directory = output_form(output, directory)
    fmt = choose_format(named, output_format, directory)
    output = check_target(output, layout, directory)
    if directory:
        refuse_existing_directory(output, overwrite)
    elif confined.lexists(output) and not overwrite:
        raise UsageError(f"{output} already exists; pass --overwrite to replace it")
    shards = completed_outputs(layout, lock_timeout)
    destination = prepare_destination(output, create_once=not overwrite, directory=directory)
    trusted: Trusted = {}
    try:
        with (
            next_step(SHARD_CHANGED, IntegrityError),
            ThreadPoolExecutor(thread_count(len(shards)), thread_name_prefix="elastic-merge") as pool,
        ):
            sources = sources_of(shards, pool)
            where = "/ (one file per shard)" if directory else ""
            log.info("merging %d shard(s) into %s%s as %s", len(sources), output, where, fmt)
            index = None
            if directory:
                job_id = layout.load_manifest().job_id
                sha256, size, index, trusted = publish_directory_output(sources, output, overwrite, quiet, job_id, pool, fmt)
            elif fmt == JSONL and all(s.record.is_plain for s in sources):
                sha256, size = _write_merged(sources, output, overwrite, quiet), sum(s.identity.size for s in sources)
            elif fmt == JSONL:
                sha256, size = _write_decoded(sources, output, overwrite, quiet), sum(s.record.output_bytes for s in sources)
            else:
                sha256, size = converted.write_file(fmt, sources, output, overwrite, quiet)
    except BaseException:
        destination.discard()
        raise
    rows = sum(s.record.output_rows for s in sources)
    result = PublishRecord(
        output=str(output),
        rows=rows,
        bytes=size,
        sha256=sha256,
        merged_at=time.time(),
        host=socket.gethostname(),
        shards=[MergeShard(r.shard_id, r.attempt_id, r.output_rows, r.output_bytes, r.output_sha256) for r, _ in shards],
        form="directory" if directory else "file",
        index=str(index) if index is not None else None,
        output_format=fmt,
    )
    fsops.replace_atomic(layout.merge_record, encode(result))
    log.info("merged %d rows (%d bytes of %s) into %s", rows, size, fmt, f"{output}/" if directory else output)
    return result, trusted


def _write_merged(sources: list[Source], output: Path, overwrite: bool, quiet: bool) -> str:
    """Copy every shard output into `output` under a temporary name (in parallel, at its offset),
    check each against its record and hash the whole (from one read), fsync, publish; returns
    the merged file's sha256."""
    block = BLOCK_SIZE
    stop = threading.Event()
    total = sum(s.identity.size for s in sources)
    with (
        fsops.atomic_output(output, replace=overwrite) as out,
        Progress("merge", total, quiet) as progress,
        ThreadPoolExecutor(thread_count(len(sources)), thread_name_prefix="elastic-copy") as pool,  # shut down first
    ):
        fd = out.file.fileno()
        copies = _start_copies(sources, fd, block, stop, pool)
        digests: list[Future[Content] | None] = [None] * len(sources)
        hash_failure: tuple[int, BaseException] | None = None

        def on_file(index: int, digest: Future[Content]) -> None:
            digests[index] = digest
            expected = recorded_content(sources[index].record)
            digest.add_done_callback(lambda done: stop.set() if done.exception() or done.result() != expected else None)
            progress.update(0, sources[index].record.output_rows)

        hasher = OrderedHasher(block, stop, progress.update)
        merged = None
        try:
            merged = hasher.run([(s.path, s.identity) for s in sources], on_file)
        except Stopped:
            pass
        except SourceError as exc:
            hash_failure = (hasher.failed_at, exc)
        except BaseException:
            stop.set()
            wait(copies)
            raise
        if hash_failure is not None:
            stop.set()
        wait(copies)
        _raise_first_failure(sources, digests, hash_failure, copies, output)
        assert merged is not None
        if not out.commit():
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    return merged


def _write_decoded(sources: list[Source], output: Path, overwrite: bool, quiet: bool) -> str:
    """JSONL from shard outputs stored compressed (some may be plain): each one decompressed and
    proven on a thread of its own and written at its offset of `output`'s temporary file; the
    merged file's sha256 is then read back in order (from the page cache), fsynced, published."""
    stop = threading.Event()
    total = sum(s.record.output_bytes for s in sources)
    with (
        fsops.atomic_output(output, replace=overwrite) as out,
        LockedProgress("merge", total, quiet) as progress,
        ThreadPoolExecutor(thread_count(len(sources)), thread_name_prefix="elastic-decode") as pool,
    ):
        fd = out.file.fileno()

        def decode(source: Source) -> None:
            position = source.offset
            for view in blocks(source, stop):
                write_at(fd, view, position)
                position += len(view)
                progress.update(len(view))
            start_writeback(fd, source.offset, source.record.output_bytes)
            reached_merging()
            progress.update(0, source.record.output_rows)

        try:
            run_all(pool, decode, sources, stop)
            with fsops.reported_as(output, "reading its temporary file back"):
                reader = os.open(out.tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                merged = hash_range(reader, total, BLOCK_SIZE)
            finally:
                os.close(reader)
        except DestinationError as exc:
            with fsops.reported_as(output, "writing its temporary file"):
                raise exc.cause from None
        if not out.commit():
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    return merged


def _start_copies(
    sources: list[Source], fd: int, block: int, stop: threading.Event, pool: ThreadPoolExecutor
) -> list[Future[None]]:
    """One copy per shard range, its writeback started as it goes; the last one to finish fsyncs
    the file, while hashing goes on."""
    remaining = [len(sources)]
    lock = threading.Lock()

    def copy(source: Source) -> None:
        if stop.is_set():
            raise Stopped
        if source.identity.size:
            handle = open_source(source.path, source.identity)
            try:
                done = 0
                while done < source.identity.size:  # in chunks, each sent on to the disk at once
                    count = min(COPY_CHUNK, source.identity.size - done)
                    copy_range(handle, fd, count, done, source.offset + done, block, stop)
                    start_writeback(fd, source.offset + done, count)
                    done += count
                check_same(handle, source.path, source.identity)
            finally:
                os.close(handle)
        reached_merging()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise DestinationError(exc) from None

    return [pool.submit(copy, source) for source in sources]


def _raise_first_failure(
    sources: list[Source],
    digests: list[Future[Content] | None],
    hash_failure: tuple[int, BaseException] | None,
    copies: list[Future[None]],
    output: Path,
) -> None:
    """The failure to report: the first shard (in manifest order) that could not be read or does
    not match its record, else the first copy that failed (a write names the merged file)."""
    problems: dict[int, BaseException | str] = {}
    if hash_failure is not None:
        problems[hash_failure[0]] = hash_failure[1]
    for index, digest in enumerate(digests):
        if digest is not None and digest.done() and not digest.cancelled():
            error = digest.exception()
            if error is not None:
                problems.setdefault(index, error)
            elif digest.result() != recorded_content(sources[index].record):
                problems.setdefault(index, "mismatch")
    if problems:
        index = min(problems)
        source, problem = sources[index], problems[index]
        if isinstance(problem, SourceError):
            raise source_error(source.record, source.path, problem)
        if isinstance(problem, BaseException):
            raise problem
        explain_mismatch(source.record, source.path)
    for source, copy in zip(sources, copies):
        error = None if copy.cancelled() else copy.exception()
        if error is None or isinstance(error, Stopped):
            continue
        if isinstance(error, SourceError):
            raise source_error(source.record, source.path, error)
        if isinstance(error, DestinationError):
            with fsops.reported_as(output, "writing its temporary file"):
                raise error.cause
        raise error
    if any(digest is None for digest in digests):
        raise IntegrityError(
            "merge stopped before every shard was read; run merge again and report this as a bug"
        )  # a bug: nothing failed
