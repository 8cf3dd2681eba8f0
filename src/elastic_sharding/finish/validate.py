"""Which shard outputs a merge (or verify, or a launcher's finalize) may use, and proof that
each is the very output its completion record names.

Every output is read once, on several threads, and its size, rows and sha256 checked against its
completion record; a mismatch names the shard, the file and what to do. Outputs proven so are
remembered by (device, inode) as `Trusted`, so a directory merge's hard links, or a verify right
after a merge, need not hash them again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from elastic_sharding import confined
from elastic_sharding.errors import IntegrityError, JobStateError, next_step
from elastic_sharding.finish.parallel_copy import (
    Content,
    Identity,
    SourceError,
    hash_file,
    identify,
    run_all,
    thread_count,
)
from elastic_sharding.layout import JobLayout, processed_file
from elastic_sharding.observe.snapshot import counts, job_views
from elastic_sharding.prepare.jsonl import BLOCK_SIZE
from elastic_sharding.progress import Progress
from elastic_sharding.records import CompletionRecord, KeptShard, Manifest, load
from elastic_sharding.segments import job_segments, kept_shards, segment_input, segment_specs
from elastic_sharding.vocabulary import ShardState
from elastic_sharding.work.collect import file_stats

log = logging.getLogger(__name__)

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# Shard outputs whose bytes were hashed and found to match their completion record, by
# (device, inode): (size, mtime_ns, sha256). A file linked to one of them need not be hashed again.
Trusted = dict[tuple[int, int], tuple[int, int, str]]


# What to do when a published shard output no longer is what its completion record says.
SHARD_CHANGED = (
    "the job directory was changed after the shard was published (a manual edit, a restored backup, a failing disk): "
    "restore the file, or run the job again into a new --job-dir"
)


@next_step(SHARD_CHANGED, IntegrityError)
def completed_outputs(layout: JobLayout, lock_timeout: float | None = None) -> list[tuple[CompletionRecord, Path]]:
    """Every shard's completion record and output path in the job's last recipe segment, in
    manifest order; the job must be done."""
    manifest = layout.load_manifest()
    last = job_segments(manifest)[-1]
    if last.index == 0:
        return _segment_outputs(layout, manifest, lock_timeout)
    kept = kept_shards(layout, manifest, last.index)
    if kept is None:
        raise JobStateError(
            f"job is not complete: stage {last.index} has not kept every shard yet. Run workers (or `retry` what failed) first"
        )
    if last.has_ops:
        view = dataclasses.replace(manifest, shards=segment_specs(kept))
        return _segment_outputs(layout.segment(last.index), view, lock_timeout)
    return [(_kept_as_completion(k), segment_input(layout, last.index, k.shard_id)) for k in kept]


def _kept_as_completion(kept: KeptShard) -> CompletionRecord:
    """A keep unit's result read as the completion of a last segment without operators (what a
    keep has no counterpart for, the processing time, keeps its default)."""
    fields = {f.name: getattr(kept, f.name) for f in dataclasses.fields(CompletionRecord) if hasattr(kept, f.name)}
    return CompletionRecord(**fields)


def _segment_outputs(layout: JobLayout, manifest: Manifest, lock_timeout: float | None) -> list[tuple[CompletionRecord, Path]]:
    timeout = lock_timeout if lock_timeout is not None else manifest.request.settings.lock_timeout_secs
    views = job_views(layout, manifest, timeout)
    summary = counts(views)
    if summary[ShardState.DONE] != len(views):
        missing = [v.shard_id for v in views if v.state != ShardState.DONE]
        detail = ", ".join(f"{state} {n}" for state, n in summary.items() if n)
        where = f" in recipe segment {layout.segment_index}" if layout.segment_index else ""
        raise JobStateError(
            f"job is not complete ({detail}{where}); first unfinished shard: {missing[0]}. Run workers (or `retry` failed shards) first"
        )
    result = []
    for view in views:
        record = view.completion or read_completion(layout, view.shard_id)
        if record.shard_id != view.shard_id:
            raise IntegrityError(f"{layout.done(view.shard_id)}: completion record names shard {record.shard_id}")
        if record.input_sha256 != view.spec.sha256 or record.input_rows != view.spec.rows:
            raise IntegrityError(f"{view.shard_id}: completion record does not match the manifest's shard input")
        try:
            attempt_dir = layout.existing_attempt_dir(view.shard_id, record.attempt_id)
        except confined.LinkRefused as exc:
            raise IntegrityError(f"{view.shard_id}: {exc}") from None
        result.append((record, processed_file(attempt_dir, record.output_codec)))
    return result


def read_completion(layout: JobLayout, shard_id: str) -> CompletionRecord:
    """The completion record of a shard whose claim says done, read strictly: a missing, corrupt
    or symlinked one is a JobStateError naming the file."""
    path = layout.done(shard_id)
    if not confined.lexists(path):
        raise JobStateError(f"{shard_id}: claim says done but no completion record exists in {path}")
    return load(CompletionRecord, path)


# -- shard outputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A shard output about to be merged: what its file was when first looked at, and where its
    JSONL lines go."""

    record: CompletionRecord
    path: Path
    identity: Identity
    offset: int  # in a merged JSONL file


def source_error(record: CompletionRecord, path: Path, exc: SourceError) -> IntegrityError:
    cause = exc.cause
    if isinstance(cause, FileNotFoundError):
        return IntegrityError(f"{record.shard_id}: output {path} is missing")
    return IntegrityError(f"{record.shard_id}: {cause}")


def explain_mismatch(record: CompletionRecord, source: Path) -> NoReturn:
    """Re-read (and parse) an output whose size or sha256 differs from its record, to say how."""
    try:
        if not record.is_plain:
            _explain_stored(record, source)
        stats = file_stats(source, codec=record.output_codec)
    except FileNotFoundError:
        raise IntegrityError(f"{record.shard_id}: output {source} is missing") from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{record.shard_id}: {exc}") from None
    raise IntegrityError(
        f"{record.shard_id}: output {source} does not match its completion record "
        f"(rows {stats.rows} vs {record.output_rows}, bytes {stats.bytes} vs {record.output_bytes}, "
        f"sha256 {stats.sha256[:12]} vs {record.output_sha256[:12]})"
    )


def _explain_stored(record: CompletionRecord, source: Path) -> None:
    """A compressed output that is not the file its record stored is described as stored (a
    truncated zstd frame decompresses to whatever it still holds, which says nothing); one that
    is returns, and its lines are compared."""
    digest = hashlib.sha256()
    with confined.open_read(source, buffering=0) as handle:
        for block in iter(lambda: handle.read(BLOCK_SIZE), b""):
            digest.update(block)
    size = source.stat().st_size
    if (size, digest.hexdigest()) == (record.file_bytes, record.file_sha256):
        return
    raise IntegrityError(
        f"{record.shard_id}: output {source} does not match its completion record "
        f"(stored {record.output_codec}: bytes {size} vs {record.file_bytes}, sha256 {digest.hexdigest()[:12]} vs {record.file_sha256[:12]})"
    )


def identify_output(record: CompletionRecord, path: Path) -> Identity:
    """The output's identity, refused at once (and explained) if its size is not the record's."""
    try:
        identity = identify(path)
    except FileNotFoundError:
        raise IntegrityError(f"{record.shard_id}: output {path} is missing") from None
    except SourceError as exc:
        raise source_error(record, path, exc) from None
    except OSError as exc:
        raise IntegrityError(f"{record.shard_id}: {exc}") from None
    if identity.size != record.file_bytes:
        explain_mismatch(record, path)
    return identity


def sources_of(shards: list[tuple[CompletionRecord, Path]], pool: ThreadPoolExecutor) -> list[Source]:
    identities = run_all(pool, lambda shard: identify_output(*shard), shards, threading.Event())
    sources, offset = [], 0
    for (record, path), identity in zip(shards, identities):
        sources.append(Source(record, path, identity, offset))
        offset += record.output_bytes
    return sources


def guarded(source: Source, work: Callable[[], Any]) -> Any:
    try:
        return work()
    except SourceError as exc:
        raise source_error(source.record, source.path, exc) from None


def recorded_content(record: CompletionRecord) -> Content:
    """What a read of a plain output's file must find."""
    return Content(record.output_sha256, record.output_rows)


def file_matches(record: CompletionRecord, content: Content) -> bool:
    """Whether one read of an output's file as stored proves it (a compressed file: by its own
    sha256, which was taken as it was written)."""
    return content == recorded_content(record) if record.is_plain else content.sha256 == record.file_sha256


def check_digest(source: Source, content: Content) -> None:
    """`content`, read from the output's JSONL lines, must be the record's."""
    if content != recorded_content(source.record):
        explain_mismatch(source.record, source.path)


def check_file(source: Source, content: Content) -> None:
    """`content`, read from the output's file as stored, must be the record's."""
    if not file_matches(source.record, content):
        explain_mismatch(source.record, source.path)


@next_step(SHARD_CHANGED, IntegrityError)
def validate_outputs(shards: list[tuple[CompletionRecord, Path]], quiet: bool = True) -> Trusted:
    """Hash every shard output (in parallel) and check it against its completion record.

    The record's sha256 was taken over a fully validated file when the shard was published, so a
    match proves every line is still that validated JSON object: one read, no per-line parsing
    (a compressed output is decompressed on that read: its record's rows, bytes and sha256 of the
    lines are proven with the stored file's). Only a mismatch re-reads the file, to say which
    line is wrong."""
    from elastic_sharding.finish.shard_reader import blocks  # it reads through this module's checks

    block = BLOCK_SIZE
    with ThreadPoolExecutor(thread_count(len(shards)), thread_name_prefix="elastic-verify") as pool:
        sources = sources_of(shards, pool)
        stop = threading.Event()
        with LockedProgress("verify", sum(s.identity.size for s in sources), quiet) as progress:

            def check(source: Source) -> None:
                if source.record.is_plain:
                    check_file(source, guarded(source, lambda: hash_file(source.path, source.identity, block, stop)))
                else:
                    for _ in blocks(source, stop):
                        pass
                progress.update(source.identity.size, source.record.output_rows)

            run_all(pool, check, sources, stop)
    return {(s.identity.dev, s.identity.ino): (s.identity.size, s.identity.mtime_ns, s.record.file_sha256) for s in sources}


class LockedProgress(Progress):
    """A progress bar that several threads update."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def update(self, done: int, rows: int = 0) -> None:
        with self._lock:
            super().update(done, rows)
