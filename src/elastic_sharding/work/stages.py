"""A worker's part in a whole-dataset stage of its job (a deduplicator, `dedup/`; any other
whole-dataset operator, `global_ops/`), between two segments of the recipe.

The stage reads every shard as the previous segment left it: the output its completion record
names (or, after a segment without operators, that segment's input), checked against the
record's sha256 as it is read, so no unit ever reads rows that are not the published ones. Its
keep units write the next segment's input through one writer (`_write_next`): a deduplicator's
the same lines less the dropped rows, another operator's whatever lines it gives for that shard,
each row's index in the shard as the ordering key when the next segment has operators to run
(`work/collect.py` sorts on it), else exactly as they will be merged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import orjson

from elastic_sharding import confined, fsops
from elastic_sharding.claims.protocol import new_attempt_id, new_token
from elastic_sharding.dedup.cooperate import KEEP, StageParticipant
from elastic_sharding.dedup.rules import SUPPORTED, DedupRule
from elastic_sharding.dedup.stage import DedupPlan, DedupStage
from elastic_sharding.errors import IntegrityError, JobStateError
from elastic_sharding.global_ops.cooperate import GlobalParticipant
from elastic_sharding.global_ops.operators import StageContext
from elastic_sharding.global_ops.registry import build as build_global
from elastic_sharding.layout import JobLayout, StageLayout, processed_file
from elastic_sharding.records import ROW_KEY, CompletionRecord, KeptShard, Manifest, SegmentSpec, ShardSpec, load
from elastic_sharding.settings import Settings
from elastic_sharding.vocabulary import OutputCodec
from elastic_sharding.work.collect import strip_row_key
from elastic_sharding.work.output_codec import open_lines

log = logging.getLogger(__name__)

_ROW_PREFIX = b'{"' + ROW_KEY.encode() + b'":'


def with_row_key(index: int, line: bytes) -> bytes:
    """`line` (a JSON object) with the ordering key first, as prepare writes shard lines."""
    body = line[1:].lstrip()
    return _ROW_PREFIX + str(index).encode() + (b"" if body.startswith(b"}") else b",") + body


class SegmentOutput:
    """Where shard i of one segment's output is, and what its bytes must hash to."""

    def __init__(self, layout: JobLayout, segment: SegmentSpec, manifest: Manifest):
        self.layout = layout.segment(segment.index)
        self.segment = segment
        self.manifest = manifest

    def source(self, shard_index: int) -> tuple[Path, str, int, str]:
        """(file, sha256 and rows of its lines, codec it is stored in) of one shard's output, from
        its validated completion record."""
        spec: ShardSpec = self.manifest.shards[shard_index]
        if not self.segment.has_ops:
            return self.layout.shard_input(spec.shard_id), spec.sha256, spec.rows, OutputCodec.NONE
        record = load(CompletionRecord, self.layout.done(spec.shard_id))
        if record.shard_id != spec.shard_id or record.input_sha256 != spec.sha256 or record.input_rows != spec.rows:
            raise IntegrityError(
                f"{self.layout.done(spec.shard_id)}: the completion record does not match shard {spec.shard_id}; "
                "restore the job directory as it was, or run the job again into a new --job-dir"
            )
        attempt_dir = self.layout.existing_attempt_dir(spec.shard_id, record.attempt_id)
        return processed_file(attempt_dir, record.output_codec), record.output_sha256, record.output_rows, record.output_codec

    def is_ready(self, shard_index: int) -> bool:
        return not self.segment.has_ops or confined.lexists(self.layout.done(self.manifest.shards[shard_index].shard_id))

    def lines(self, shard_index: int) -> Iterator[bytes]:
        """The shard's output lines (no newline, no ordering key); IntegrityError at the end if
        the file is not the one its record names."""
        path, sha256, rows, codec = self.source(shard_index)
        digest = hashlib.sha256()
        count = 0
        with open_lines(path, codec) as handle:
            for lineno, line in enumerate(handle, 1):
                digest.update(line)
                count += 1
                body = line.rstrip(b"\r\n")
                yield strip_row_key(body, f"{path}:{lineno}")[1] if body.startswith(_ROW_PREFIX) else body
        if digest.hexdigest() != sha256 or count != rows:
            raise IntegrityError(
                f"{path}: {count} rows with sha256 {digest.hexdigest()[:12]}, but its record says {rows} rows with "
                f"{sha256[:12]}: the job directory was changed after the shard was published; restore it, or run the "
                "job again into a new --job-dir"
            )


class StageWork:
    """Stage `segment.index` of a job, as one worker takes part in it."""

    def __init__(
        self,
        layout: JobLayout,
        manifest: Manifest,
        previous: SegmentSpec,
        previous_manifest: Manifest,
        segment: SegmentSpec,
        process: list[tuple[str, dict]],
        settings: Settings,
        stop: Callable[[], bool],
        custom_paths: Sequence[str] = (),
    ):
        if segment.dedup_op is None:
            raise JobStateError(f"segment {segment.index} follows no deduplicator; report this as a bug")
        self.index = segment.index
        self.segment = segment
        self.layout = layout
        self.output = SegmentOutput(layout, previous, previous_manifest)
        self.next_layout = layout.segment(segment.index)
        name, params = process[segment.dedup_op]
        self.shard_ids = [spec.shard_id for spec in previous_manifest.shards]
        root = layout.stage_dir(segment.index)
        lease, beat, poll = settings.lock_timeout_secs, settings.heartbeat_interval_secs, min(settings.poll_interval_secs, 0.5)
        self.participant: StageParticipant | GlobalParticipant
        if name not in SUPPORTED:
            op = build_global(name, params, custom_paths)
            ctx = StageContext(root, len(manifest.shards), manifest.total_bytes)
            self.participant = GlobalParticipant(
                op,
                ctx,
                self._parsed_rows,
                self._shard_rows,
                self._write_next,
                lease,
                beat,
                poll,
                stop,
                what=f"stage {segment.index} ({name})",
            )
        else:
            rule = DedupRule(name, params)
            dedup_op = rule.build()
            # The plan must be the same for every participant before the first key file exists: it
            # is sized by the job's input rows, a bound the previous segment's outputs rarely exceed.
            plan = DedupPlan.for_rows(rule, rule.fanout(dedup_op), len(manifest.shards), manifest.total_rows)
            self.stage = DedupStage(root, plan)
            self.participant = StageParticipant(
                self.stage,
                self._rows,
                lease,
                beat,
                poll,
                stop,
                what=f"dedup stage {segment.index} ({name})",
                keep=self._keep,
                op=dedup_op,
            )
        self.host = socket.gethostname()

    def help(self) -> bool:
        """Hash one finished shard of the previous segment, if one is waiting; False if none is."""
        return self.participant.help_with_keys(self.output.is_ready)

    def run(self) -> None:
        started = time.monotonic()
        done = self.participant.run()
        log.info(
            "stage %d done here in %.1fs (%d records, %d rounds)",
            self.index,
            time.monotonic() - started,
            done.bucket_records,
            done.rounds,
        )

    def _rows(self, shard_index: int) -> Iterator[dict]:
        return (orjson.loads(line) for line in self.output.lines(shard_index))

    def _parsed_rows(self, shard_index: int) -> Iterator[tuple[bytes, dict]]:
        return ((line, orjson.loads(line)) for line in self.output.lines(shard_index))

    def _shard_rows(self) -> list[int]:
        return [self.output.source(i)[2] for i in range(len(self.shard_ids))]

    def _keep(self, shard_index: int, drops: np.ndarray) -> KeptShard:
        dropped = set(drops.tolist())
        lines = (line for row, line in enumerate(self.output.lines(shard_index)) if row not in dropped)
        return self._write_next(shard_index, lines)

    def _write_next(self, shard_index: int, lines: Iterator[bytes]) -> KeptShard:
        """The one step every stage ends with: shard `shard_index` of the next segment, written
        create-once from `lines` (each kept row's index as its ordering key when that segment has
        operators to run), and the record that publishes it."""
        started = time.time()
        shard_id = self.shard_ids[shard_index]
        target = self.next_layout.shard_input(shard_id)
        fsops.ensure_dir(self.next_layout.shards_dir)
        _, input_sha256, input_rows, _ = self.output.source(shard_index)
        keyed = self.segment.has_ops
        digest = hashlib.sha256()
        rows = size = 0
        with fsops.atomic_output(target) as out:
            for line in lines:
                data = (with_row_key(rows, line) if keyed else line) + b"\n"
                out.write(data)
                digest.update(data)
                size += len(data)
                rows += 1
            out.commit()
        token = new_token()
        return KeptShard(
            unit=StageLayout.unit_name(KEEP, shard_index),
            shard_id=shard_id,
            attempt_id=new_attempt_id(f"keep-{self.index}", token),
            token=token,
            input_rows=input_rows,
            input_sha256=input_sha256,
            output_rows=rows,
            output_bytes=size,
            output_sha256=digest.hexdigest(),
            host=self.host,
            pid=os.getpid(),
            started_at=started,
            finished_at=time.time(),
        )
