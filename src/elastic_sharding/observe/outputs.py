"""What a job has put out, as `status` shows it: the merged output, or the rows published so far.

After `merge` (or a launcher's finalize) `merge.json` in the job directory records the merged
output: where (`output`, a file, or a directory with its index), in which format, and its rows.
It is the last merge's record; `status` shows it as recorded and does not check the output
again (`verify` does). Before a merge, the rows the done shards published (their completion
records' `output_rows`) are the output so far; in a recipe with deduplicators those are the
current segment's.
"""

from __future__ import annotations

import time
from typing import Any

from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.snapshot import ShardView, read_leniently
from elastic_sharding.records import PublishRecord


def merged_record(layout: JobLayout) -> PublishRecord | None:
    """The last merge's record (None before a merge, or when it cannot be read)."""
    return read_leniently(layout.merge_record, PublishRecord)


def output_rows(views: list[ShardView]) -> int:
    """The rows the done shards published."""
    return sum(v.completion.output_rows for v in views if v.completion is not None)


def merged_json(record: PublishRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "output": record.output,
        "form": record.form,
        "index": record.index,
        "output_format": record.output_format,
        "rows": record.rows,
        "bytes": record.bytes,
        "sha256": record.sha256,
        "merged_at": record.merged_at,
        "host": record.host,
        "shards": len(record.shards),
    }


def output_lines(record: PublishRecord | None, views: list[ShardView], segment: int | None = None) -> list[str]:
    """`merged: ...` once merged; else `output rows so far: ...` once a shard is done; else none."""
    if record is not None:
        where = f"{record.output}/ (a directory, one file per shard)" if record.form == "directory" else record.output
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.merged_at))
        return [f"merged: {where}; {record.output_format}, {record.rows:,} rows (merged {at} on {record.host})"]
    done = [v for v in views if v.completion is not None]
    if not done:
        return []
    of = f" of segment {segment}" if segment is not None else ""
    return [f"output rows so far: {output_rows(views):,} from {len(done)} done shard(s){of}; not merged yet"]


__all__ = ["merged_json", "merged_record", "output_lines", "output_rows"]
