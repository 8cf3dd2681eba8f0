"""A job's recipe segments, and the shards of each.

`prepare` cuts the recipe at every supported deduplicator (`Manifest.segments`). Segment 0 reads
the prepared shards; segment k reads what deduplication stage k kept of segment k-1's output,
shard by shard, so it has the same shard ids, and its specs are the keep units' results (known
once the stage has kept every shard). A segment without operators (a deduplicator first, last,
or two in a row) runs no attempt: its input is its output.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from elastic_sharding import fsops
from elastic_sharding.layout import JobLayout, StageLayout
from elastic_sharding.records import KeptShard, Manifest, SegmentSpec, ShardSpec, StageFailure, decode

WHOLE_RECIPE = 1 << 30  # the end of a segment that runs to the end of `process`, however long


def job_segments(manifest: Manifest) -> list[SegmentSpec]:
    """The segments in order; a job prepared before segments existed has one: the whole recipe."""
    return list(manifest.segments) or [SegmentSpec(0, 0, WHOLE_RECIPE)]


def stage_files(layout: JobLayout, index: int) -> StageLayout:
    return StageLayout(layout.stage_dir(index))


def read_kept(layout: JobLayout, stage: int, shard_index: int) -> KeptShard | None:
    path = stage_files(layout, stage).kept(shard_index)
    return fsops.read_record(path, lambda data: decode(KeptShard, data, path))


def kept_shards(layout: JobLayout, manifest: Manifest, stage: int) -> list[KeptShard] | None:
    """Every shard's keep result of a stage, in shard order; None until the last is published."""
    found = []
    for spec in manifest.shards:
        kept = read_kept(layout, stage, spec.index)
        if kept is None:
            return None
        found.append(kept)
    return found


def segment_specs(kept: list[KeptShard]) -> list[ShardSpec]:
    """The shards of the segment after a stage. A kept row's ordering key is its index in the
    shard (`first_row` 0): the shard order alone orders the segment's outputs."""
    return [
        ShardSpec(k.shard_id, index, f"shards/{k.shard_id}.jsonl", 0, k.output_rows, k.output_bytes, k.output_sha256)
        for index, k in enumerate(kept)
    ]


def segment_manifest(layout: JobLayout, manifest: Manifest, index: int) -> Manifest | None:
    """The manifest as segment `index` sees it (its own shard specs); None before it has them."""
    if index == 0:
        return manifest
    kept = kept_shards(layout, manifest, index)
    return None if kept is None else dataclasses.replace(manifest, shards=segment_specs(kept))


def segment_input(layout: JobLayout, index: int, shard_id: str) -> Path:
    return layout.segment(index).shard_input(shard_id)


def stage_failure(layout: JobLayout, stage: int) -> str | None:
    """What made a stage fail, in one line (None if it has not): `retry --all-failed` requeues it."""
    path = stage_files(layout, stage).failed
    failure = fsops.read_record(path, lambda data: decode(StageFailure, data, path))
    if failure is None:
        return None
    return (
        f"stage {stage} failed in unit {failure.unit} on host={failure.host} pid={failure.pid}: "
        f"{failure.error}: {failure.message}; fix the cause, then `retry --all-failed`"
    )
