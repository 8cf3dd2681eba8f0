"""The units of one prepare plan (`cooperate`): scan, cut, recipe, write and final.

Pass two re-reads (detecting any change since pass one) and writes each row in normalized form
into the shards the cut unit placed (`cut`): exactly `num_shards` contiguous, non-empty shards
balanced by normalized bytes. Shards and manifest go into the plan's staging directory; the final
unit publishes the job by renaming it onto the job directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from elastic_sharding import crashpoints, fsops
from elastic_sharding.engine import engine_identity
from elastic_sharding.errors import InputError, JobStateError, RecipeError
from elastic_sharding.layout import JobLayout, shard_suffix
from elastic_sharding.prepare.cooperate import WRITE, unit_names, write_range
from elastic_sharding.prepare.cut import Cutter
from elastic_sharding.prepare.fingerprints import sha256_concatenated, sha256_range
from elastic_sharding.prepare.inputs import relpath, stat_input
from elastic_sharding.prepare.jsonl import BLOCK_SIZE, HashingLineReader, Offload, parse_object
from elastic_sharding.prepare.normalize import RowNormalizer, SchemaNode
from elastic_sharding.prepare.parquet import ParquetShardWriter, Segment, check_media_columns, load_schema, read_footer
from elastic_sharding.prepare.prepare_dir import PrepareDir
from elastic_sharding.prepare.recipe import load_recipe
from elastic_sharding.prepare.scan import read_blob, scan_pieces, unit_blob
from elastic_sharding.prepare.shard_writer import HashingOutput, ShardLineTooLong, ShardWriter
from elastic_sharding.records import (
    ROW_KEY,
    InputFile,
    Manifest,
    PrepareCuts,
    PreparePlan,
    RecipeJudged,
    ScanResult,
    ShardSpec,
    ShardWritten,
    WriteDone,
    encode,
    from_dict,
    load,
    shard_id_for,
)

MIN_READ = 1 << 12  # the smallest read of a write unit's segment
COMMIT_THREADS = 16


class UnitWork:
    """The five kinds of unit (`cooperate`) over one plan; any process can do any of them."""

    def __init__(self, pdir: PrepareDir, plan: PreparePlan):
        self.pdir = pdir
        self.plan = plan
        self.files = [Path(f) for f in plan.files]
        self.stage = JobLayout(pdir.stage)
        self._cut_result: PrepareCuts | None = None

    def _cuts(self) -> PrepareCuts:
        """The cut unit's result, read and decoded once per process (every write unit and the
        final unit need it; it grows with the shard count)."""
        if self._cut_result is None:
            self._cut_result = load(PrepareCuts, self.pdir.result("cut"))
        return self._cut_result

    # ---- scan -------------------------------------------------------------------------------

    def scan(self, index: int) -> bytes:
        if self.plan.input_format == "parquet":
            return self._scan_parquet(index)
        host, pid = socket.gethostname(), os.getpid()
        normalizer = RowNormalizer.of(self.plan)
        try:
            with Offload() as offload:
                scan = scan_pieces(self.files, self.plan.units[index], self.plan.base, normalizer, offload, self.plan.max_line)
        except InputError as exc:
            return encode(ScanResult(index, host, pid, False, str(exc), 0, 0, 0, [], []))
        fsops.publish_once(self.pdir.blob(f"scan-{index:05d}"), unit_blob(scan))
        record = ScanResult(
            index, host, pid, True, None, scan.rows, scan.weight, normalizer.added_keys, scan.pieces, scan.schema.flatten()
        )
        return encode(record)

    def _scan_parquet(self, index: int) -> bytes:
        """Footers only, and the sha256 of the unit's byte ranges (the files' fingerprints)."""
        host, pid = socket.gethostname(), os.getpid()
        pieces, footers = [], []
        try:
            for file, start, end in self.plan.units[index]:
                path = self.files[file]
                size = self.plan.sizes[file]
                digest = sha256_range(path, start, None if end is None else end - start)
                rows = 0
                if start == 0:
                    footer = read_footer(path, size, (ROW_KEY,))
                    check_media_columns(load_schema(footer.schema), self.plan.media_keys, self.plan.index_key, path)
                    footers.append([file, footer.schema, footer.groups])
                    rows = sum(g[0] for g in footer.groups)
                pieces.append([start, rows, digest])
        except InputError as exc:
            return encode(ScanResult(index, host, pid, False, str(exc), 0, 0, 0, [], []))
        rows = sum(p[1] for p in pieces)
        weight = sum(g[1] for f in footers for g in f[2])
        return encode(ScanResult(index, host, pid, True, None, rows, weight, 0, pieces, [], footers))

    # ---- cut --------------------------------------------------------------------------------

    def cut(self) -> bytes:
        """The shard boundaries (`cut.Cutter`)."""
        return Cutter(self.pdir, self.plan, self.files).cut()

    # ---- write ------------------------------------------------------------------------------

    def write(self, unit: int) -> bytes:
        """Pass two for the shards of write unit `unit`."""
        cuts = self._cuts()
        if self.plan.input_format == "parquet":
            return self._write_parquet(unit, cuts)
        shape = SchemaNode.unflatten(cuts.schema).shaper() or (lambda row: row)
        normalize = RowNormalizer.of(self.plan).normalize
        blobs: dict[int, Any] = {}
        written: list[tuple[ShardWritten, ShardWriter]] = []
        try:
            with Offload() as offload:
                for index in write_range(self.plan, unit):
                    written.append(self._write_shard(index, cuts, shape, normalize, blobs, offload))
        except BaseException:
            for _, writer in written:
                writer.abort()
            raise
        return self._commit(written)

    def _commit(self, written: list[tuple[ShardWritten, Any]]) -> bytes:
        # Synced and published together, the fsyncs in parallel: a journaling filesystem
        # commits concurrent syncs together and a NAS client pipelines them, so a unit of many
        # tiny shards costs a few syncs' time, not one each.
        try:
            with ThreadPoolExecutor(min(COMMIT_THREADS, len(written)), thread_name_prefix="elastic-sync") as pool:
                for done in [pool.submit(writer.commit, False) for _, writer in written]:
                    done.result()
        except BaseException:
            for _, writer in written:
                writer.abort()
            raise
        fsops.fsync_dir(self.stage.shards_dir)  # once for the unit's shards, before its result
        return encode(WriteDone(socket.gethostname(), os.getpid(), [shard for shard, _ in written]))

    def _write_parquet(self, unit: int, cuts: PrepareCuts) -> bytes:
        """Pass two for the Parquet shards of write unit `unit`: their row groups re-read, shaped
        and written as Parquet (`prepare.parquet`)."""
        plan = self.plan
        source = ParquetShardWriter(self.files, plan.base, plan.media_keys, plan.index_key, ROW_KEY)
        seen: set[int] = set()
        written: list[tuple[ShardWritten, Any]] = []
        try:
            for index in write_range(plan, unit):
                cut = cuts.shards[index]
                tables = []
                row = cut.first_row
                for file, group, first, rows, group_rows in cut.segments:
                    if file not in seen:
                        stat_input(self.files[file])
                        seen.add(file)
                    table = source.read(Segment(file, group, first, rows), group_rows)
                    tables.append(source.shape(table, row))
                    row += rows
                shard_id = shard_id_for(index, plan.num_shards)
                out = HashingOutput(self.stage.shards_dir / f"{shard_id}.parquet")
                try:
                    source.write(out, tables)
                except BaseException:
                    out.abort()
                    raise
                written.append((ShardWritten(index, cut.rows, out.size, out.digest.hexdigest()), out))
        except BaseException:
            for _, writer in written:
                writer.abort()
            raise
        finally:
            source.close()
        return self._commit(written)

    def _write_shard(
        self, index: int, cuts: PrepareCuts, shape: Any, normalize: Any, blobs: dict[int, Any], offload: Offload
    ) -> tuple[ShardWritten, ShardWriter]:
        """Pass two for one shard: re-read its rows, write them normalized in the schema's shape,
        into a temporary file the caller commits."""
        cut = cuts.shards[index]
        plan = self.plan
        dumps = orjson.dumps
        max_shard_line = plan.max_line + 1  # with its newline
        shard_id = shard_id_for(index, plan.num_shards)
        row_index = cut.first_row
        writer = ShardWriter(self.stage.shards_dir / f"{shard_id}.jsonl", offload)
        try:
            for file in sorted({plan.units[unit][piece][0] for unit, piece, *_ in cut.segments}):
                stat_input(self.files[file])
            for unit, piece, in_unit, in_piece, count in cut.segments:
                file, start, _ = plan.units[unit][piece]
                path = self.files[file]
                if unit not in blobs:
                    blobs[unit] = read_blob(self.pdir.blob(f"scan-{unit:05d}"), self.pdir.scan_result(unit).rows)[0]
                lengths = blobs[unit]
                piece_start = in_unit - in_piece
                offset = cuts.piece_offsets[unit][piece] + int(lengths[piece_start:in_unit].sum()) + in_piece
                line0 = cuts.piece_lines[unit][piece] + in_piece
                # Read about what the segment holds, not a whole block: a tiny shard must not
                # cost a read of 8 MB of its neighbours' rows.
                need = int(lengths[in_unit : in_unit + count].sum()) + count + 1
                reader = HashingLineReader(
                    path,
                    offload,
                    block_size=min(BLOCK_SIZE, max(need, MIN_READ)),
                    max_line=plan.max_line,
                    start=offset,
                    first_line=line0,
                    hashing=False,
                )
                left = count
                at = in_unit
                for first, lines in reader.blocks():
                    for lineno, line in enumerate(lines, first):
                        if len(line) != lengths[at]:
                            raise InputError(
                                "changed while prepare was reading it; rerun prepare when the input is stable", path, lineno
                            )
                        row = normalize(parse_object(line, path, lineno), plan.base, row_index, path, lineno)
                        shaped = {ROW_KEY: row_index}
                        shaped.update(shape(row))
                        out = dumps(shaped) + b"\n"
                        if len(out) > max_shard_line:
                            raise ShardLineTooLong(len(out) - 1, plan.max_line, path, lineno)
                        writer.add(out)
                        row_index += 1
                        at += 1
                        left -= 1
                        if not left:
                            break
                    if not left:
                        break
                if left:
                    raise InputError("lost rows while prepare was reading it; rerun prepare when the input is stable", path)
            spec = writer.finish()
        except ShardLineTooLong as exc:
            writer.abort()
            raise exc.error() from None
        except InputError as exc:
            writer.abort()
            if "while prepare was reading it" in str(exc):
                raise
            raise InputError(f"{exc} (the input changed while prepare was reading it?)") from None
        except BaseException:
            writer.abort()
            raise
        rows, size, sha = spec
        return ShardWritten(index, rows, size, sha), writer

    # ---- recipe -----------------------------------------------------------------------------

    def recipe(self) -> bytes:
        """Data-Juicer's judgement of the recipe the plan was made from (its registry and config
        parser); the final unit waits for it, so no job is published with a recipe it rejects."""
        request = self.plan.manifest["request"]
        recipe = load_recipe(Path(request["config_path"]), Path(self.plan.recipe_base))
        if recipe.sha256 != request["config_sha256"]:
            raise RecipeError(f"{recipe.source}: the recipe changed while prepare was running; run prepare again")
        identity = engine_identity()
        judged = RecipeJudged(
            socket.gethostname(), os.getpid(), identity.data_juicer_version, recipe.packages, recipe.package_warnings
        )
        return encode(judged)

    # ---- final ------------------------------------------------------------------------------

    def final(self) -> bytes:
        """Fingerprints, the manifest, and the job published by renaming the stage onto it."""
        plan = self.plan
        cuts = self._cuts()
        scans = [self.pdir.scan_result(i) for i in range(len(plan.units))]
        per_file: list[list[str]] = [[] for _ in self.files]
        rows_of = [0] * len(self.files)
        for pieces, result in zip(plan.units, scans):
            for (file, _, _), (_, count, digest) in zip(pieces, result.pieces):
                per_file[file].append(digest)
                rows_of[file] += count
        kind, root = plan.manifest["dataset_kind"], Path(plan.manifest["dataset_root"])
        if kind == "file":
            root = root.parent
        inputs = []
        for i, path in enumerate(self.files):
            st = stat_input(path, " (it disappeared while prepare was reading it)")
            if st.st_size != plan.sizes[i] or st.st_mtime_ns != plan.mtimes[i]:
                raise InputError("changed while prepare was reading it; rerun prepare when the input is stable", path)
            digests = per_file[i]
            chunked = len(digests) > 1
            sha = hashlib.sha256(b"".join(bytes.fromhex(d) for d in digests)).hexdigest() if chunked else digests[0]
            inputs.append(
                InputFile(
                    path=str(path),
                    relpath=relpath(path, kind, root),
                    size=st.st_size,
                    mtime_ns=st.st_mtime_ns,
                    sha256=sha,
                    rows=rows_of[i],
                    chunk_bytes=plan.unit_bytes if chunked else 0,
                    chunks=digests if chunked else [],
                )
            )
        writes = [load(WriteDone, self.pdir.result(name)) for name in unit_names(plan)[WRITE]]
        shards_written = [shard for done in writes for shard in done.shards]
        if [w.index for w in shards_written] != list(range(plan.num_shards)):
            raise JobStateError(
                f"{self.pdir.units}: the write units' results do not cover every shard once; prepare a new --job-dir"
            )
        specs = []
        for k, (cut, written) in enumerate(zip(cuts.shards, shards_written)):
            shard_id = shard_id_for(k, plan.num_shards)
            name = f"shards/{shard_id}{shard_suffix(plan.input_format)}"
            specs.append(ShardSpec(shard_id, k, name, cut.first_row, written.rows, written.bytes, written.sha256))
        normalized = sha256_concatenated([self.stage.base / s.path for s in specs])
        layout = self.stage
        for sub in (*layout.skeleton, layout.cache_dir):
            fsops.ensure_dir(sub)
        recipe_bytes = plan.recipe_text.encode()
        if not layout.recipe.exists():
            with fsops.atomic_output(layout.recipe, replace=True) as out:
                out.write(recipe_bytes)
                out.commit()
        judged = load(RecipeJudged, self.pdir.result("recipe"))
        fields = dict(plan.manifest)
        fields.update(
            packages=[dataclasses.asdict(p) for p in judged.packages],
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            inputs=[dataclasses.asdict(f) for f in inputs],
            total_rows=cuts.total_rows,
            total_bytes=sum(s.bytes for s in specs),
            normalized_sha256=normalized,
            shards=[dataclasses.asdict(s) for s in specs],
            warnings=[*fields.get("warnings", []), *judged.warnings, *cuts.warnings],
            prepared_by=self._participants(scans, writes),
        )
        manifest = from_dict(Manifest, fields, "manifest")
        # Every write unit is done: a temporary file left in shards/ is a partial shard of a writer
        # that lost its unit (killed, or fenced and still writing to an inode nobody will link).
        for entry in os.listdir(layout.shards_dir):
            if entry.startswith(".") and ".tmp-" in entry:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(layout.shards_dir / entry)
        fsops.publish_once(layout.manifest, encode(manifest))
        crashpoints.reached("prepare-staged")
        if not fsops.rename_dir(self.pdir.stage, self.pdir.job_root):
            raise JobStateError(
                f"could not publish {self.pdir.job_root}: it exists; run prepare again to use it, or choose another --job-dir"
            )
        return b"{}\n"

    def _participants(self, scans: list[ScanResult], writes: list[WriteDone]) -> list[str]:
        who = {f"{r.host}:{r.pid}" for r in (*scans, *writes)}
        who.add(f"{socket.gethostname()}:{os.getpid()}")
        return sorted(who)
