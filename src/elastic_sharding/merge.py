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
from pathlib import Path
from typing import BinaryIO

from . import fsops
from .errors import IntegrityError, JobStateError, UsageError
from .layout import JobLayout, attempt_files
from .output import file_stats
from .records import CompletionRecord, MergeRecord, MergeShard, encode
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
        if view.completion is None:
            raise JobStateError(
                f"{view.shard_id}: claim says done but no completion record exists in {layout.done(view.shard_id)}"
            )
        record = view.completion
        if record.shard_id != view.shard_id:
            raise IntegrityError(f"{layout.done(view.shard_id)}: completion record names shard {record.shard_id}")
        if record.input_sha256 != view.spec.sha256 or record.input_rows != view.spec.rows:
            raise IntegrityError(f"{view.shard_id}: completion record does not match the manifest's shard input")
        output = attempt_files(layout.attempt_dir(view.shard_id, record.attempt_id))["processed"]
        result.append((record, output))
    return result


class _HashingSink:
    """Passes bytes to the merged file while hashing them, so merge reads every byte once."""

    def __init__(self, target: BinaryIO):
        self.target = target
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self.target.write(data)
        self.sha256.update(data)
        self.bytes += len(data)


def _copy_validated(record: CompletionRecord, source: Path, sink: _HashingSink) -> None:
    try:
        stats = file_stats(source, sink)  # type: ignore[arg-type]
    except FileNotFoundError:
        raise IntegrityError(f"{record.shard_id}: output {source} is missing") from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{record.shard_id}: {exc}") from None
    if (stats.rows, stats.bytes, stats.sha256) != (record.output_rows, record.output_bytes, record.output_sha256):
        raise IntegrityError(
            f"{record.shard_id}: output {source} does not match its completion record "
            f"(rows {stats.rows} vs {record.output_rows}, bytes {stats.bytes} vs {record.output_bytes}, "
            f"sha256 {stats.sha256[:12]} vs {record.output_sha256[:12]})"
        )


def merge(job_dir: Path, output: Path, overwrite: bool = False, lock_timeout: float | None = None) -> MergeRecord:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    output = Path(os.path.abspath(output))
    if output.exists() and not overwrite:
        raise UsageError(f"{output} already exists; pass --overwrite to replace it")
    if output.is_dir():
        raise UsageError(f"{output} is a directory")
    if not output.parent.is_dir():
        raise UsageError(f"output directory {output.parent} does not exist")
    shards = completed_outputs(layout, lock_timeout)
    merged: list[MergeShard] = []
    log.info("merging %d shard(s) into %s", len(shards), output)
    rows = 0
    with fsops.atomic_output(output, replace=overwrite) as out:
        sink = _HashingSink(out.file)
        for record, source in shards:
            _copy_validated(record, source, sink)
            rows += record.output_rows
            merged.append(
                MergeShard(record.shard_id, record.attempt_id, record.output_rows, record.output_bytes, record.output_sha256)
            )
        if not out.commit():
            raise UsageError(f"{output} appeared while merging; pass --overwrite to replace it")
    size = sink.bytes
    result = MergeRecord(
        output=str(output),
        rows=rows,
        bytes=size,
        sha256=sink.sha256.hexdigest(),
        merged_at=time.time(),
        host=socket.gethostname(),
        shards=merged,
    )
    fsops.replace_atomic(layout.merge_record, encode(result))
    log.info("merged %d rows (%d bytes) into %s", rows, size, output)
    return result
