"""merge: revalidate every published shard output and concatenate them in manifest order.

The merged file is written under a temporary name, fsynced, and then renamed (or, without
`--overwrite`, linked create-once) onto the output path: no reader ever sees a partial merge.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import crashpoints, fsops
from .destination import check_target, prepare_destination
from .errors import IntegrityError, JobStateError, UsageError
from .jsonl import BLOCK_SIZE, Offload
from .layout import JobLayout, attempt_files
from .output import file_stats
from .progress import Progress
from .records import CompletionRecord, MergeRecord, MergeShard, encode, load
from .state import DONE, counts, job_views

log = logging.getLogger(__name__)


def completed_outputs(layout: JobLayout, lock_timeout: float | None = None) -> list[tuple[CompletionRecord, Path]]:
    """Every shard's completion record and output path, in manifest order; the job must be done."""
    manifest = layout.load_manifest()
    timeout = lock_timeout if lock_timeout is not None else manifest.request.settings.lock_timeout_secs
    views = job_views(layout, manifest, timeout)
    summary = counts(views)
    if summary[DONE] != len(views):
        missing = [v.shard_id for v in views if v.state != DONE]
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


def _write_and_hash(out: fsops.AtomicOutput, block: bytes, merged: Any) -> None:
    out.write(block)
    merged.update(block)


def _read_blocks(record: CompletionRecord, source: Path) -> Iterator[bytes]:
    """The blocks of a shard output; a file that cannot be read is that shard's IntegrityError
    (errors writing the merged file are not: they name the merged file)."""
    try:
        with fsops.open_read(source, buffering=0) as handle:
            while block := handle.read(BLOCK_SIZE):
                yield block
    except FileNotFoundError:
        raise IntegrityError(f"{record.shard_id}: output {source} is missing") from None
    except OSError as exc:
        raise IntegrityError(f"{record.shard_id}: {exc}") from None


def _copy_validated(
    record: CompletionRecord, source: Path, out: fsops.AtomicOutput, merged: Any, offload: Offload, progress: Progress
) -> int:
    """Copy one shard output into the merged file in large blocks, checking rows, bytes and
    sha256 against its completion record on the way; returns the bytes copied.

    The record's sha256 was taken over a fully validated file when the shard was published, so a
    match proves every line is still that validated JSON object: one read, no per-line parsing.
    Only a mismatch re-reads the file, to say which line is wrong."""
    digest = hashlib.sha256()
    rows = size = 0
    for block in _read_blocks(record, source):
        offload.submit(_write_and_hash, out, block, merged)
        digest.update(block)
        count = block.count(b"\n")
        rows += count
        size += len(block)
        progress.update(len(block), count)
    if (rows, size, digest.hexdigest()) != (record.output_rows, record.output_bytes, record.output_sha256):
        _explain_mismatch(record, source)
    return size


def _explain_mismatch(record: CompletionRecord, source: Path) -> None:
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


def merge(
    job_dir: Path, output: Path, overwrite: bool = False, lock_timeout: float | None = None, *, quiet: bool = False
) -> MergeRecord:
    """Merge every shard output in manifest order into `output`, atomically; missing directories
    of `output` are created (and removed again if the merge fails).

    `quiet` turns off the progress bar on stderr (drawn only on a terminal)."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    output = check_target(output, layout)
    if fsops.lexists(output) and not overwrite:
        raise UsageError(f"{output} already exists; pass --overwrite to replace it")
    shards = completed_outputs(layout, lock_timeout)
    destination = prepare_destination(output, create_once=not overwrite)
    try:
        rows, size, merged_sha, merged = _write_merged(shards, output, overwrite, quiet)
    except BaseException:
        destination.discard()
        raise
    result = MergeRecord(
        output=str(output),
        rows=rows,
        bytes=size,
        sha256=merged_sha.hexdigest(),
        merged_at=time.time(),
        host=socket.gethostname(),
        shards=merged,
    )
    fsops.replace_atomic(layout.merge_record, encode(result))
    log.info("merged %d rows (%d bytes) into %s", rows, size, output)
    return result


def _write_merged(
    shards: list[tuple[CompletionRecord, Path]], output: Path, overwrite: bool, quiet: bool
) -> tuple[int, int, Any, list[MergeShard]]:
    """Copy every validated shard output into `output` under a temporary name, then publish it."""
    merged: list[MergeShard] = []
    log.info("merging %d shard(s) into %s", len(shards), output)
    rows = size = 0
    merged_sha = hashlib.sha256()
    total = sum(record.output_bytes for record, _ in shards)
    with (
        fsops.atomic_output(output, replace=overwrite) as out,
        Offload() as offload,
        Progress("merge", total, quiet) as progress,
    ):
        for record, source in shards:
            size += _copy_validated(record, source, out, merged_sha, offload, progress)
            rows += record.output_rows
            crashpoints.reached("merging")
            merged.append(
                MergeShard(record.shard_id, record.attempt_id, record.output_rows, record.output_bytes, record.output_sha256)
            )
        offload.drain()
        if not out.commit():
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    return rows, size, merged_sha, merged
