"""The cut unit of a prepare: every scan merged in order into the one-pass schema, and the shard
boundaries placed by the one-pass rule.

Its own module because the cut is the one unit that reads every scan unit's result (and, for the
boundaries, their blobs of row weights): it turns many independent scans back into exactly the
answer of one pass over the whole input, errors included, which the other units (`units`) then
only follow. Parquet input is cut on row-group boundaries instead (`prepare.parquet`).
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Any

from elastic_sharding.errors import InputError, UsageError
from elastic_sharding.prepare.jsonl import Offload
from elastic_sharding.prepare.normalize import RowNormalizer, SchemaNode
from elastic_sharding.prepare.parquet import cut_row_groups, load_schema, schema_difference
from elastic_sharding.prepare.prepare_dir import PrepareDir
from elastic_sharding.prepare.scan import digits, read_blob, scan_pieces
from elastic_sharding.records import PrepareCuts, PreparePlan, ScanResult, ShardCut, encode

MAX_MARKS = 1 << 16  # rows of cumulative weights held at once while placing a shard boundary


class Cutter:
    """The cut of one plan, done by whichever participant claims the cut unit."""

    def __init__(self, pdir: PrepareDir, plan: PreparePlan, files: list[Path]):
        self.pdir = pdir
        self.plan = plan
        self.files = files
        # Where the last shard boundary was found: scan unit, its blob, chunk start, weight before it.
        self._reach: tuple[int, Any, int, int] | None = None

    def cut(self) -> bytes:
        """Merge the scans in order into the one-pass schema (re-scanning the first unit that
        failed or contradicts the ones before it, to raise exactly the one-pass error), fix the
        weights of added indices, and place the shard boundaries by the one-pass rule."""
        if self.plan.input_format == "parquet":
            return self._cut_parquet()
        import numpy as np

        plan = self.plan
        schema = SchemaNode()
        next_line = [1] * len(self.files)
        piece_lines: list[list[int]] = []
        piece_offsets: list[list[int]] = []
        unit_rows: list[int] = []
        unit_weights: list[int] = []
        results: list[ScanResult] = []
        rows = 0
        for index, pieces in enumerate(plan.units):
            result = self.pdir.scan_result(index)
            results.append(result)
            lines = [next_line[file] for file, _, _ in pieces]
            names = [str(self.files[file]) for file, _, _ in pieces]

            def origin(where: str, names: list[str] = names, lines: list[int] = lines) -> str:
                piece, _, line = where.partition(":")
                return f"{names[int(piece)]}:{lines[int(piece)] + int(line) - 1}"

            local = SchemaNode.unflatten(result.schema, origin) if result.ok else None
            if local is None or schema.conflicts_with(local):
                self._rescan(index, schema, rows, lines)
                raise InputError(result.error or "the input changed while prepare was reading it; rerun prepare")
            schema.absorb(local)
            for (file, _, _), (_, count, _) in zip(pieces, result.pieces):
                next_line[file] += count
            piece_lines.append(lines)
            piece_offsets.append([offset for offset, _, _ in result.pieces])
            weight = result.weight
            if plan.index_key is not None and result.rows:
                _, _, added = read_blob(self.pdir.blob(f"scan-{index:05d}"), result.rows)
                weight += int((added * (digits(rows, result.rows) - 1)).sum())
            unit_rows.append(result.rows)
            unit_weights.append(weight)
            rows += result.rows
        total_weight = sum(unit_weights)
        dataset_root = Path(plan.manifest["dataset_root"])
        if rows == 0:
            raise InputError("the input has no rows", dataset_root)
        if plan.num_shards > rows:
            raise UsageError(f"--num-shards {plan.num_shards} exceeds the number of input rows ({rows})")
        warnings = []
        int_nulls = schema.int_null_fields()
        if int_nulls:
            warnings.append(
                "integer field(s) null or missing in some rows: "
                + ", ".join(int_nulls[:5])
                + " - Ray's JSON export writes them as floats in blocks that hold a null"
            )
        firsts = self._cut_rows(rows, total_weight, unit_rows, unit_weights, np)
        shards = []
        unit_first = [0]
        for n in unit_rows:
            unit_first.append(unit_first[-1] + n)
        for k, first in enumerate(firsts):
            end = firsts[k + 1] if k + 1 < len(firsts) else rows
            shards.append(ShardCut(first, end - first, _segments(first, end, unit_first, results)))
        return encode(PrepareCuts(rows, total_weight, schema.flatten(), warnings, shards, piece_lines, piece_offsets))

    def _cut_parquet(self) -> bytes:
        """Every file's schema must be the first file's; shards are cut from the row groups."""
        plan = self.plan
        footers: dict[int, list[Any]] = {}
        for index in range(len(plan.units)):
            result = self.pdir.scan_result(index)
            if not result.ok:
                raise InputError(result.error or "the input changed while prepare was reading it; rerun prepare")
            for file, schema, groups in result.footers:
                footers[file] = [schema, groups]
        first = load_schema(footers[0][0])
        groups = []
        for file in range(len(self.files)):
            schema, file_groups = footers[file]
            why = schema_difference(first, load_schema(schema))
            if why is not None:
                raise InputError(
                    f"its schema differs from {self.files[0]}'s: {why}; every Parquet file of one input must have the same "
                    "columns and types (rewrite it to that schema, or prepare it as its own job)",
                    self.files[file],
                )
            groups.extend((file, g, rows, size) for g, (rows, size) in enumerate(file_groups))
        # Each segment carries its row group's rows as the footer said: the write unit checks the
        # decoded group against it without reading the scan results again.
        group_rows = {(file, g): rows for file, g, rows, _ in groups}
        rows = sum(g[2] for g in groups)
        if rows == 0:
            raise InputError("the input has no rows", Path(plan.manifest["dataset_root"]))
        shards = []
        first_row = 0
        for segments in cut_row_groups(groups, plan.num_shards):
            count = sum(seg.rows for seg in segments)
            shards.append(ShardCut(first_row, count, [[*seg, group_rows[seg.file, seg.group]] for seg in segments]))
            first_row += count
        weight = sum(g[3] for g in groups)
        return encode(PrepareCuts(rows, weight, [], [], shards, [], []))

    def _rescan(self, index: int, schema: SchemaNode, first_row: int, lines: list[int]) -> None:
        with Offload() as offload:
            scan_pieces(
                self.files,
                self.plan.units[index],
                self.plan.base,
                RowNormalizer.of(self.plan),
                offload,
                self.plan.max_line,
                schema=schema,
                first_row=first_row,
                first_lines=lines,
            )

    def _cut_rows(self, rows: int, total_weight: int, unit_rows: list[int], unit_weights: list[int], np: Any) -> list[int]:
        """The first row of every shard: shard i ends after the first row r at or after its start
        whose cumulative weight reaches (i+1)/count of the total, unless only as many rows as
        shards are left (exactly the one-pass rule)."""
        count = self.plan.num_shards
        ends = []
        acc = 0
        for w in unit_weights:
            acc += w
            ends.append(acc)
        firsts = [0]
        unit_first = [0]
        for n in unit_rows:
            unit_first.append(unit_first[-1] + n)
        for shard in range(count - 1):
            start = firsts[-1]
            threshold = math.ceil(total_weight * (shard + 1) / count)
            row = self._first_reaching(threshold, ends, unit_first, unit_weights, np)
            row = min(max(row, start), rows - count + shard)
            firsts.append(row + 1)
        return firsts

    def _first_reaching(self, threshold: int, ends: list[int], unit_first: list[int], unit_weights: list[int], np: Any) -> int:
        """The first row whose cumulative weight is at least `threshold`."""
        unit = bisect.bisect_left(ends, threshold)
        if unit >= len(ends):
            return unit_first[-1] - 1
        rows = unit_first[unit + 1] - unit_first[unit]
        if self._reach is None or self._reach[0] != unit:
            # The thresholds rise, so successive boundaries mostly fall in the same unit: its
            # blob is read once, and the search resumes at the chunk where the last one ended.
            blob = read_blob(self.pdir.blob(f"scan-{unit:05d}"), rows)
            self._reach = (unit, blob, 0, ends[unit] - unit_weights[unit])
        _, (_, weights, added), first_lo, cumulative = self._reach
        for lo in range(first_lo, rows, MAX_MARKS):
            hi = min(rows, lo + MAX_MARKS)
            part = weights[lo:hi].astype(np.int64)
            if self.plan.index_key is not None:
                part += added[lo:hi] * (digits(unit_first[unit] + lo, hi - lo) - 1)
            sums = np.cumsum(part) + cumulative
            at = int(np.searchsorted(sums, threshold, side="left"))
            if at < hi - lo:
                self._reach = (unit, self._reach[1], lo, cumulative)
                return unit_first[unit] + lo + at
            cumulative = int(sums[-1])
        return unit_first[unit + 1] - 1


def _segments(first: int, end: int, unit_first: list[int], results: list[ScanResult]) -> list[list[int]]:
    """Rows [first, end) as runs within one piece: [unit, piece, row in unit, row in piece, rows]."""
    out = []
    unit = bisect.bisect_right(unit_first, first) - 1
    row = first
    while row < end:
        while unit_first[unit + 1] <= row:
            unit += 1
        in_unit = row - unit_first[unit]
        piece_first = 0
        for piece, (_, count, _) in enumerate(results[unit].pieces):
            if in_unit < piece_first + count:
                take = min(end - row, piece_first + count - in_unit)
                out.append([unit, piece, in_unit, in_unit - piece_first, take])
                row += take
                break
            piece_first += count
    return out


__all__ = ["MAX_MARKS", "Cutter"]
