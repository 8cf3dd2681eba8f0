"""merge: revalidate every published shard output and publish them in manifest order, as one
merged JSONL file or as a directory of one JSONL per shard.

A file is built under a temporary name with `copy_file_range` at offsets known from the completion
records (one thread per shard, bounded by the CPUs; each range's writeback started as soon as it
is copied), fsynced, and then renamed (or, without
`--overwrite`, linked create-once) onto the output path. A directory is built in a hidden staging
directory beside the output (each shard output hard-linked, or copied where it cannot be), its
index written last, and renamed into place. Either way no reader ever sees a partial merge.

Every shard output is read once, on several threads, and its sha256 checked against its completion
record. The sha256 of a merged file (for `merge.json`) covers every byte in order and so runs on
one core; it is computed from the same read as the shards' own (see `parallel_copy.OrderedHasher`),
overlapping the copies and the fsync.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from elastic_sharding import crashpoints, fsops
from elastic_sharding.destination import (
    INDEX_FORMAT,
    INDEX_NAME,
    check_target,
    make_staging_dir,
    output_form,
    part_name,
    prepare_destination,
    publish_directory,
    refuse_existing_directory,
    remove_tree,
)
from elastic_sharding.errors import IntegrityError, JobStateError, UsageError
from elastic_sharding.finish.parallel_copy import (
    COPY_CHUNK,
    Content,
    DestinationError,
    Identity,
    OrderedHasher,
    SourceError,
    Stopped,
    check_same,
    copy_range,
    hash_file,
    identify,
    link_or_copy,
    open_source,
    run_all,
    start_writeback,
    thread_count,
)
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.snapshot import counts, job_views
from elastic_sharding.prepare.jsonl import BLOCK_SIZE
from elastic_sharding.progress import Progress
from elastic_sharding.records import CompletionRecord, IndexEntry, MergeShard, OutputIndex, PublishRecord, encode, load
from elastic_sharding.vocabulary import ShardState
from elastic_sharding.work.collect import file_stats

log = logging.getLogger(__name__)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Shard outputs whose bytes were hashed and found to match their completion record, by
# (device, inode): (size, mtime_ns, sha256). A file linked to one of them need not be hashed again.
Trusted = dict[tuple[int, int], tuple[int, int, str]]


def completed_outputs(layout: JobLayout, lock_timeout: float | None = None) -> list[tuple[CompletionRecord, Path]]:
    """Every shard's completion record and output path, in manifest order; the job must be done."""
    manifest = layout.load_manifest()
    timeout = lock_timeout if lock_timeout is not None else manifest.request.settings.lock_timeout_secs
    views = job_views(layout, manifest, timeout)
    summary = counts(views)
    if summary[ShardState.DONE] != len(views):
        missing = [v.shard_id for v in views if v.state != ShardState.DONE]
        detail = ", ".join(f"{state} {n}" for state, n in summary.items() if n)
        raise JobStateError(
            f"job is not complete ({detail}); first unfinished shard: {missing[0]}. Run workers (or `retry` failed shards) first"
        )
    result = []
    for view in views:
        record = view.completion or _completion(layout, view.shard_id)
        if record.shard_id != view.shard_id:
            raise IntegrityError(f"{layout.done(view.shard_id)}: completion record names shard {record.shard_id}")
        if record.input_sha256 != view.spec.sha256 or record.input_rows != view.spec.rows:
            raise IntegrityError(f"{view.shard_id}: completion record does not match the manifest's shard input")
        try:
            attempt_dir = layout.existing_attempt_dir(view.shard_id, record.attempt_id)
        except fsops.LinkRefused as exc:
            raise IntegrityError(f"{view.shard_id}: {exc}") from None
        result.append((record, attempt_files(attempt_dir)["processed"]))
    return result


def _completion(layout: JobLayout, shard_id: str) -> CompletionRecord:
    """The completion record of a shard whose claim says done, read strictly: a missing, corrupt
    or symlinked one is a JobStateError naming the file."""
    path = layout.done(shard_id)
    if not fsops.lexists(path):
        raise JobStateError(f"{shard_id}: claim says done but no completion record exists in {path}")
    return load(CompletionRecord, path)


# -- shard outputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A shard output about to be merged: what it was when first looked at, and where it goes."""

    record: CompletionRecord
    path: Path
    identity: Identity
    offset: int  # in a merged file


def _source_error(record: CompletionRecord, path: Path, exc: SourceError) -> IntegrityError:
    cause = exc.cause
    if isinstance(cause, FileNotFoundError):
        return IntegrityError(f"{record.shard_id}: output {path} is missing")
    return IntegrityError(f"{record.shard_id}: {cause}")


def _explain_mismatch(record: CompletionRecord, source: Path) -> NoReturn:
    """Re-read (and parse) an output whose size or sha256 differs from its record, to say how."""
    try:
        stats = file_stats(source)
    except FileNotFoundError:
        raise IntegrityError(f"{record.shard_id}: output {source} is missing") from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{record.shard_id}: {exc}") from None
    raise IntegrityError(
        f"{record.shard_id}: output {source} does not match its completion record "
        f"(rows {stats.rows} vs {record.output_rows}, bytes {stats.bytes} vs {record.output_bytes}, "
        f"sha256 {stats.sha256[:12]} vs {record.output_sha256[:12]})"
    )


def _identify(record: CompletionRecord, path: Path) -> Identity:
    """The output's identity, refused at once (and explained) if its size is not the record's."""
    try:
        identity = identify(path)
    except FileNotFoundError:
        raise IntegrityError(f"{record.shard_id}: output {path} is missing") from None
    except SourceError as exc:
        raise _source_error(record, path, exc) from None
    except OSError as exc:
        raise IntegrityError(f"{record.shard_id}: {exc}") from None
    if identity.size != record.output_bytes:
        _explain_mismatch(record, path)
    return identity


def _sources(shards: list[tuple[CompletionRecord, Path]], pool: ThreadPoolExecutor) -> list[Source]:
    identities = run_all(pool, lambda shard: _identify(*shard), shards, threading.Event())
    sources, offset = [], 0
    for (record, path), identity in zip(shards, identities):
        sources.append(Source(record, path, identity, offset))
        offset += identity.size
    return sources


def _guarded(source: Source, work: Callable[[], Any]) -> Any:
    try:
        return work()
    except SourceError as exc:
        raise _source_error(source.record, source.path, exc) from None


def _recorded(record: CompletionRecord) -> Content:
    return Content(record.output_sha256, record.output_rows)


def _check_digest(source: Source, content: Content) -> None:
    if content != _recorded(source.record):
        _explain_mismatch(source.record, source.path)


def validate_outputs(shards: list[tuple[CompletionRecord, Path]], quiet: bool = True) -> Trusted:
    """Hash every shard output (in parallel) and check it against its completion record.

    The record's sha256 was taken over a fully validated file when the shard was published, so a
    match proves every line is still that validated JSON object: one read, no per-line parsing.
    Only a mismatch re-reads the file, to say which line is wrong."""
    block = BLOCK_SIZE
    with ThreadPoolExecutor(thread_count(len(shards)), thread_name_prefix="elastic-verify") as pool:
        sources = _sources(shards, pool)
        stop = threading.Event()
        with _LockedProgress("verify", sum(s.identity.size for s in sources), quiet) as progress:

            def check(source: Source) -> None:
                digest = _guarded(source, lambda: hash_file(source.path, source.identity, block, stop))
                _check_digest(source, digest)
                progress.update(source.identity.size, source.record.output_rows)

            run_all(pool, check, sources, stop)
    return {(s.identity.dev, s.identity.ino): (s.identity.size, s.identity.mtime_ns, s.record.output_sha256) for s in sources}


class _LockedProgress(Progress):
    """A progress bar that several threads update."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def update(self, done: int, rows: int = 0) -> None:
        with self._lock:
            super().update(done, rows)


# -- merge -----------------------------------------------------------------------------------------


def merge(
    job_dir: Path,
    output: Path | str,
    overwrite: bool = False,
    lock_timeout: float | None = None,
    *,
    quiet: bool = False,
    directory: bool | None = None,
) -> PublishRecord:
    """Merge every shard output in manifest order into `output`, atomically; missing directories
    of `output` are created (and removed again if the merge fails).

    `output` is a directory output if `directory` says so or, with `directory` None, if it ends
    in `/` or is an existing directory. `quiet` turns off the progress bar on stderr (drawn only
    on a terminal)."""
    return publish(job_dir, output, overwrite, lock_timeout, quiet=quiet, directory=directory)[0]


def publish(
    job_dir: Path,
    output: Path | str,
    overwrite: bool = False,
    lock_timeout: float | None = None,
    *,
    quiet: bool = False,
    directory: bool | None = None,
) -> tuple[PublishRecord, Trusted]:
    """`merge`, also returning the published files that are shard outputs themselves (linked),
    whose bytes it has just checked: a verify right after it need not hash them again."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    output, directory = output_form(output, directory)
    output = check_target(output, layout, directory)
    if directory:
        refuse_existing_directory(output, overwrite)
    elif fsops.lexists(output) and not overwrite:
        raise UsageError(f"{output} already exists; pass --overwrite to replace it")
    shards = completed_outputs(layout, lock_timeout)
    destination = prepare_destination(output, create_once=not overwrite, directory=directory)
    trusted: Trusted = {}
    try:
        with ThreadPoolExecutor(thread_count(len(shards)), thread_name_prefix="elastic-merge") as pool:
            sources = _sources(shards, pool)
            log.info("merging %d shard(s) into %s%s", len(sources), output, "/ (one file per shard)" if directory else "")
            if directory:
                job_id = layout.load_manifest().job_id
                sha256, index, trusted = _publish_directory(sources, output, overwrite, quiet, job_id, pool)
            else:
                sha256, index = _write_merged(sources, output, overwrite, quiet), None
    except BaseException:
        destination.discard()
        raise
    rows = sum(s.record.output_rows for s in sources)
    size = sum(s.identity.size for s in sources)
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
    )
    fsops.replace_atomic(layout.merge_record, encode(result))
    log.info("merged %d rows (%d bytes) into %s", rows, size, f"{output}/" if directory else output)
    return result, trusted


_crash_lock = threading.Lock()


def _reached_merging() -> None:
    with _crash_lock:
        crashpoints.reached("merging")


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
            expected = _recorded(sources[index].record)
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
        _reached_merging()
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
            elif digest.result() != _recorded(sources[index].record):
                problems.setdefault(index, "mismatch")
    if problems:
        index = min(problems)
        source, problem = sources[index], problems[index]
        if isinstance(problem, SourceError):
            raise _source_error(source.record, source.path, problem)
        if isinstance(problem, BaseException):
            raise problem
        _explain_mismatch(source.record, source.path)
    for source, copy in zip(sources, copies):
        error = None if copy.cancelled() else copy.exception()
        if error is None or isinstance(error, Stopped):
            continue
        if isinstance(error, SourceError):
            raise _source_error(source.record, source.path, error)
        if isinstance(error, DestinationError):
            with fsops.reported_as(output, "writing its temporary file"):
                raise error.cause
        raise error
    if any(digest is None for digest in digests):
        raise IntegrityError("merge stopped before every shard was read")  # a bug: nothing failed


def _publish_directory(
    sources: list[Source], output: Path, overwrite: bool, quiet: bool, job_id: str, pool: ThreadPoolExecutor
) -> tuple[str, Path, Trusted]:
    """Link (or copy) every validated shard output into a staging directory beside `output`, write
    the index last, and rename the directory into place; returns the index's sha256 and path,
    and the linked files."""
    block = BLOCK_SIZE
    stop = threading.Event()
    stage = make_staging_dir(output)
    try:
        with _LockedProgress("merge", sum(s.identity.size for s in sources), quiet) as progress:

            def place(source: Source) -> tuple[IndexEntry, bool]:
                record = source.record
                name = part_name(record.shard_id) if source.identity.size else None
                linked = False
                if name is None:
                    _check_digest(source, Content(EMPTY_SHA256, 0))  # no rows: no file (an empty one trips up some readers)
                else:
                    _check_digest(source, _guarded(source, lambda: hash_file(source.path, source.identity, block, stop)))
                    try:
                        linked = _guarded(source, lambda: link_or_copy(source.path, source.identity, stage / name, block, stop))
                    except DestinationError as exc:
                        with fsops.reported_as(output / name, "copying the shard output into it"):
                            raise exc.cause from None
                    _reached_merging()
                progress.update(source.identity.size, record.output_rows)
                entry = IndexEntry(
                    name, record.shard_id, record.attempt_id, record.output_rows, record.output_bytes, record.output_sha256
                )
                return entry, linked

            placed = run_all(pool, place, sources, stop)
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
        )
        data = encode(index)
        fsops.replace_atomic(stage / INDEX_NAME, data)
        links = sum(1 for _, was_linked in placed if was_linked)
        if not publish_directory(stage, output, overwrite):
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    except BaseException:
        remove_tree(stage)
        raise
    log.info("%d of %d file(s) hard-linked to their shard output, %d copied", links, index.files, index.files - links)
    trusted = {
        (s.identity.dev, s.identity.ino): (s.identity.size, s.identity.mtime_ns, s.record.output_sha256)
        for s, (_, was_linked) in zip(sources, placed)
        if was_linked
    }
    return hashlib.sha256(data).hexdigest(), output / INDEX_NAME, trusted
