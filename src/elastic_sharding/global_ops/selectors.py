"""Data-Juicer's selectors across shards, each with the rows and the row order of its `process`.

- `topk_specified_field_selector` keeps the first `int(select_num)` rows of `heapq.nlargest`
  (`reverse`) or `nsmallest` over row positions: ordered by value, ties by position. A row's rank
  in that order is counted exactly from every shard's sorted values (`keys`): each `buckets` unit
  merges one range of global ranks out of all of them and ranks its rows, so the `place` unit of
  a shard reads its kept rows and their ranks from one slice per partition, not every column.
- `range_specified_field_selector` keeps the first `upper` rows in ascending order, then of those
  the first `upper - lower` in descending order (ties by position each time): the ascending cut's
  largest value is a global order statistic (Step 14's `analysis.select.kth`), the rest counts.
- `frequency_specified_field_selector` groups rows by value (in order of first occurrence) and
  emits whole groups, largest first (a stable sort): value counts per shard, merged by one
  `buckets` unit, which gives each shard the rank each of its kept values starts at.
- `tags_specified_field_selector` keeps rows whose value is a target tag, in place.
- `random_selector` samples with Data-Juicer's fixed seed (42) through the dataset's
  `shuffle`: numpy's permutation of the whole dataset, made once by a `buckets` unit (8 bytes a
  row in that unit's memory).
Every selector returns its input unchanged when the dataset has at most one row, as Data-Juicer's do.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from elastic_sharding.analysis import select
from elastic_sharding.dedup import arrays
from elastic_sharding.global_ops import files
from elastic_sharding.global_ops.operators import (
    Entry,
    GlobalOp,
    Row,
    StageContext,
    rank_target,
    rank_targets,
    span_targets,
)

EXACT_INT = 1 << 53
RANDOM_SEED = 42  # data_juicer.utils.sample.random_sample's seed when none is given (random_selector gives none)
DRAWN = np.dtype([("row", "<i8"), ("rank", "<i8")])
# A ranking selector's buckets unit merges this many rows' values (about 100 bytes a row while it
# ranks them: 200 MB), and there are at most so many units.
RANKED_PER_UNIT = 1 << 21
MAX_RANK_UNITS = 4096
RANKED = np.dtype([("sorted", "<i8"), ("rank", "<i8")])  # a kept row: its index in its shard's sorted column, its rank


class FieldSelector(GlobalOp):
    """A selector on `field_key` (dot-separated for nested fields)."""

    @property
    def field_keys(self) -> list[str]:
        return str(self.op.field_key).split(".") if self.op.field_key else []

    def value(self, row: dict, where: str) -> Any:
        keys = self.field_keys
        value = row.get(keys[0])
        for depth, key in enumerate(keys[1:], 1):
            if not isinstance(value, dict) or key not in value:
                raise self.fail(f"{where} has no field {'.'.join(keys[: depth + 1])}; fix the data or field_key")
            value = value[key]
        return value

    def scalar(self, row: dict, where: str) -> Any:
        """The value, which Data-Juicer requires to be a string, a number or null."""
        value = self.value(row, where)
        if not (value is None or isinstance(value, (str, numbers.Number))):
            raise self.fail(f"{where}: {self.op.field_key} is a {type(value).__name__}, not a string, number or null")
        if isinstance(value, float) and math.isnan(value):
            raise self.fail(f"{where}: {self.op.field_key} is NaN, which matches nothing, not even itself; fix the data")
        return value

    def identity(self, ctx: StageContext) -> bool:
        return ctx.total_rows <= 1 or not self.field_keys

    @staticmethod
    def unchanged(shard_index: int, rows: Iterable[Row]) -> Iterator[Entry]:
        return ((shard_index, row, 0, line) for row, (line, _parsed) in enumerate(rows))


class RankSelector(FieldSelector):
    """topk and range: rows ranked by a number."""

    has_keys = True
    reorders = True

    def reduce_count(self, ctx: StageContext) -> int:
        """One `buckets` unit per `RANKED_PER_UNIT` rows: each place unit reads one slice per
        unit, so they are as few as a unit's memory allows, not one per partition of the keys."""
        return min(MAX_RANK_UNITS, max(1, math.ceil(ctx.total_rows / RANKED_PER_UNIT)))

    def number(self, row: dict, where: str) -> float:
        from data_juicer.utils.common_utils import stats_to_number

        value = self.value(row, where)
        if self.name == "topk_specified_field_selector" and len(self.field_keys) == 1:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or abs(value) > EXACT_INT
                and isinstance(value, int)
            ):
                raise self.fail(
                    f"{where}: {self.op.field_key} is {value!r}; only numbers (integers up to 2**53) are ranked across shards"
                )
            number = float(value)
        else:
            number = float(stats_to_number(value, getattr(self.op, "reverse", True)))
        if math.isnan(number):
            raise self.fail(f"{where}: {self.op.field_key} is NaN, which Python's heapq cannot order; fix the data")
        return number

    def keys(self, ctx: StageContext, shard_index: int, rows: Iterable[dict]) -> int:
        values = np.array(
            [self.number(row, f"row {i + 1} of shard {shard_index}") for i, row in enumerate(rows)] if self.field_keys else [],
            dtype=np.float64,
        )
        files.write_sorted(self._values(ctx, shard_index), self._rows(ctx, shard_index), values)
        return len(values)

    def _values(self, ctx: StageContext, shard_index: int) -> Path:
        return ctx.shard_file("sorted", shard_index, ".values.npy")

    def _rows(self, ctx: StageContext, shard_index: int) -> Path:
        return ctx.shard_file("sorted", shard_index, ".rows.npy")

    def _ranks_file(self, ctx: StageContext, unit: int) -> Path:
        return ctx.data("ranks", f"{unit:05d}.rec")

    def _sources_file(self, ctx: StageContext, unit: int) -> Path:
        return ctx.data("sources", f"{unit:05d}.rec")

    def _active(self, ctx: StageContext) -> tuple[int, int] | None:
        """The selection, or None where every row stays where it is."""
        return None if self.identity(ctx) else self._selection(ctx.total_rows)

    def reduce(self, ctx: StageContext, unit: int) -> int:
        """Partition `unit` of the rows in ascending (value, position) order: global ranks
        unit * N // units up to the next unit's, cut out of every shard's sorted column (each
        column's slice found by binary searches, the memory-mapped pages those touch) and merged.
        The rank of a row in that order, and the numbers of values below and up to its value
        (counted in the partition, and over every column only for the values at its two ends),
        give its rank in the operator's output. Written: the kept rows of the partition as
        (index in their shard's sorted column, output rank), partitioned by their shard, for the
        place units; and which shards give which shard rows, for the keep units. So a place unit
        reads one slice per partition rather than every shard's column."""
        selection = self._active(ctx)
        kept = np.empty(0, dtype=RANKED)
        shards = targets = np.empty(0, dtype=np.int64)
        if selection is not None:
            columns = [np.asarray(files.read_npy(self._values(ctx, s))) for s in range(ctx.num_shards)]
            total = sum(len(c) for c in columns)
            units = self.reduce_count(ctx)
            first, last = unit * total // units, (unit + 1) * total // units
            low, high = _split(columns, first, total), _split(columns, last, total)
            values = np.concatenate([c[lo:hi] for c, lo, hi in zip(columns, low.tolist(), high.tolist())] or [np.empty(0)])
            shard = np.repeat(np.arange(ctx.num_shards, dtype=np.int64), high - low)
            index = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(low.tolist(), high.tolist())] or [shard])
            order = np.argsort(values, kind="stable")  # concatenated in (shard, row) order: ties stay in dataset order
            values, shard, index = values[order], shard[order], index[order]
            below = first + np.searchsorted(values, values, side="left")
            upto = first + np.searchsorted(values, values, side="right")
            if len(values):
                below[values == values[0]] = select.count_below(columns, float(values[0]), side="left")
                upto[values == values[-1]] = select.count_below(columns, float(values[-1]), side="right")
            order_rank = first + np.arange(len(values), dtype=np.int64)
            rank, keep = self._ranks(columns, values, order_rank - below, below, upto, total, selection)
            kept = np.empty(int(keep.sum()), dtype=RANKED)
            kept["sorted"], kept["rank"] = index[keep], rank[keep]
            shards = shard[keep]
            targets = rank_targets(kept["rank"], self._count(selection), ctx.num_shards)
        files.write_records(self._ranks_file(ctx, unit), kept, shards, ctx.num_shards)
        files.write_sources(self._sources_file(ctx, unit), shards, targets, ctx.num_shards)
        return len(kept)

    def place(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[Entry]:
        selection = self._active(ctx)
        if selection is None:
            yield from self.unchanged(shard_index, rows)
            return
        ranked = np.concatenate(
            [arrays.read(self._ranks_file(ctx, unit), shard_index) for unit in range(self.reduce_count(ctx))]
            or [np.empty(0, dtype=RANKED)]
        )
        in_order = files.read_npy(self._rows(ctx, shard_index), mmap=False)
        kept_rows = dict(zip(in_order[ranked["sorted"]].tolist(), ranked["rank"].tolist()))
        count = self._count(selection)
        for row, (line, _parsed) in enumerate(rows):
            rank = kept_rows.get(row)
            if rank is not None:
                yield rank_target(rank, count, ctx.num_shards), rank, 0, line

    def sources(self, ctx: StageContext, target: int) -> list[int]:
        if self._active(ctx) is None:
            return [target] if ctx.shard_rows[target] else []
        return files.read_sources([self._sources_file(ctx, unit) for unit in range(self.reduce_count(ctx))], target)

    def _selection(self, total: int) -> tuple[int, int] | None:
        """(rows of the ascending cut, rows kept of it) or None when nothing is selected away."""
        op = self.op
        if self.name == "topk_specified_field_selector":
            if not op.top_ratio:
                if not op.topk:
                    return None
                select_num: float = op.topk
            else:
                select_num = op.top_ratio * total
                if op.topk and op.topk < select_num:
                    select_num = op.topk
            return total, max(0, int(select_num))
        if op.lower_percentile is None and op.lower_rank is None or op.upper_percentile is None and op.upper_rank is None:
            return None
        lower, upper = 0, total
        if op.lower_percentile is not None:
            lower = int(op.lower_percentile * total)
        if op.lower_rank is not None:
            lower = max(lower, op.lower_rank)
        if op.upper_percentile is not None:
            upper = int(op.upper_percentile * total)
        if op.upper_rank is not None:
            upper = min(upper, op.upper_rank)
        upper = max(lower, upper)
        return max(0, min(int(upper), total)), max(0, int(upper - lower))

    @staticmethod
    def _count(selection: tuple[int, int]) -> int:
        """How many rows the operator outputs."""
        cut, keep = selection
        return min(keep, cut)

    def _ranks(
        self,
        columns: list[np.ndarray],
        values: np.ndarray,
        ties_before: np.ndarray,
        below: np.ndarray,
        upto: np.ndarray,
        total: int,
        selection: tuple[int, int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows with these values (ascending), these numbers of equal values before them in
        dataset order, and these numbers of values below and up to theirs over the whole
        dataset: the rank of each in the operator's output order, and whether it is kept."""
        cut, keep = selection
        if self.name == "topk_specified_field_selector":
            rank = (total - upto if self.op.reverse else below) + ties_before
            return rank, rank < min(keep, cut)
        if cut == 0:
            return ties_before, np.zeros(len(values), dtype=bool)
        largest = select.kth(columns, cut - 1)
        lower = select.count_below(columns, largest, side="left")
        ties_in_cut = cut - lower
        smaller = values < largest
        rank = np.where(smaller, lower - upto + ties_in_cut + ties_before, ties_before)
        in_cut = smaller | ((values == largest) & (ties_before < ties_in_cut))
        return rank, in_cut & (rank < keep)


def _split(columns: list[np.ndarray], rank: int, total: int) -> np.ndarray:
    """Where global rank `rank` of the ascending (value, position) order cuts each sorted column:
    how many of each column's values come before it. Ties of the value at that rank are taken
    shard by shard, as positions order them."""
    if rank <= 0:
        return np.zeros(len(columns), dtype=np.int64)
    if rank >= total:
        return np.array([len(c) for c in columns], dtype=np.int64)
    value = select.kth(columns, rank)
    below = np.array([np.searchsorted(c, value, side="left") for c in columns], dtype=np.int64)
    equal = np.array([np.searchsorted(c, value, side="right") for c in columns], dtype=np.int64) - below
    wanted = rank - int(below.sum())
    return below + np.clip(wanted - (np.cumsum(equal) - equal), 0, equal)


class FrequencySelector(FieldSelector):
    has_keys = True
    reduce_units = 1
    reorders = True

    def keys(self, ctx: StageContext, shard_index: int, rows: Iterable[dict]) -> int:
        counts: dict[Any, int] = {}
        if self.field_keys:
            for i, row in enumerate(rows):
                value = self.scalar(row, f"row {i + 1} of shard {shard_index}")
                counts[value] = counts.get(value, 0) + 1
        files.write_json(ctx.shard_file("counts", shard_index, ".json"), [[value, n] for value, n in counts.items()])
        return len(counts)

    def reduce(self, ctx: StageContext, unit: int) -> int:
        shards = [orjson.loads(ctx.shard_file("counts", s, ".json").read_bytes()) for s in range(ctx.num_shards)]
        merged: dict[Any, int] = {}
        for pairs in shards:
            for value, n in pairs:
                merged[value] = merged.get(value, 0) + n
        op = self.op
        select_num: float | None = None
        if not self.identity(ctx):
            if not op.top_ratio:
                select_num = op.topk or None
            else:
                select_num = op.top_ratio * len(merged)
                if op.topk and op.topk < select_num:
                    select_num = op.topk
        starts: dict[Any, int] = {}
        kept = 0
        if select_num is not None:
            for value, n in sorted(merged.items(), key=lambda item: item[1], reverse=bool(op.reverse))[: int(select_num)]:
                starts[value] = kept
                kept += n
        sources: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        for s, pairs in enumerate(shards):
            plan = {"identity": select_num is None, "kept": kept, "starts": [[v, starts[v]] for v, _n in pairs if v in starts]}
            files.write_json(ctx.shard_file("plan", s, ".json"), plan)
            reached = [np.array([s])] if select_num is None and ctx.shard_rows[s] else []
            for value, n in pairs:
                if value in starts:
                    reached.append(span_targets(starts[value], starts[value] + n, kept, ctx.num_shards))
                    starts[value] += n
            mine = np.unique(np.concatenate(reached)) if reached else np.empty(0, dtype=np.int64)
            sources.append(np.full(len(mine), s, dtype=np.int64))
            targets.append(mine)
        files.write_sources(ctx.data("sources.rec"), np.concatenate(sources), np.concatenate(targets), ctx.num_shards)
        return kept

    def place(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[Entry]:
        plan = orjson.loads(ctx.shard_file("plan", shard_index, ".json").read_bytes())
        if plan["identity"]:
            yield from self.unchanged(shard_index, rows)
            return
        starts = {value: start for value, start in plan["starts"]}
        for i, (line, row) in enumerate(rows):
            value = self.scalar(row, f"row {i + 1} of shard {shard_index}")
            if value in starts:
                rank = starts[value]
                starts[value] = rank + 1
                yield rank_target(rank, plan["kept"], ctx.num_shards), rank, 0, line

    def sources(self, ctx: StageContext, target: int) -> list[int]:
        return files.read_sources([ctx.data("sources.rec")], target)


class TagsSelector(FieldSelector):
    def apply(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[bytes]:
        identity = self.identity(ctx)
        tags = self.op.target_tags
        for i, (line, row) in enumerate(rows):
            if identity or self.scalar(row, f"row {i + 1} of shard {shard_index}") in tags:
                yield line


class RandomSelector(GlobalOp):
    reduce_units = 1
    reorders = True

    def reduce(self, ctx: StageContext, unit: int) -> int:
        total = ctx.total_rows
        drawn = np.empty(0, dtype=DRAWN)
        parts = np.empty(0, dtype=np.int64)
        count = self._sample_number(total)
        if count is not None:
            permutation = np.random.default_rng(RANDOM_SEED).permutation(total)
            sources = permutation[np.arange(count) % total]
            starts = np.concatenate([[0], np.cumsum(ctx.shard_rows)])
            parts = np.searchsorted(starts, sources, side="right") - 1
            drawn = np.empty(count, dtype=DRAWN)
            drawn["row"] = sources - starts[parts]
            drawn["rank"] = np.arange(count)
            order = np.lexsort((drawn["rank"], drawn["row"], parts))
            drawn, parts = drawn[order], parts[order]
            targets = rank_targets(drawn["rank"], count, ctx.num_shards)
            files.write_sources(ctx.data("sources.rec"), parts, targets, ctx.num_shards)
        else:
            placing = np.flatnonzero(np.asarray(ctx.shard_rows, dtype=np.int64) > 0)
            files.write_sources(ctx.data("sources.rec"), placing, placing, ctx.num_shards)
        files.write_records(ctx.data("drawn.rec"), drawn, parts, ctx.num_shards)
        files.write_json(ctx.data("drawn.json"), {"identity": count is None, "count": count or 0})
        return count or 0

    def _sample_number(self, total: int) -> int | None:
        """How many rows `random_sample` draws, or None where it returns the dataset as it is."""
        op = self.op
        if total <= 1 or op.select_ratio is None and op.select_num is None:
            return None
        if not op.select_ratio:
            number = op.select_num
        else:
            number = int(op.select_ratio * total)
            if op.select_num and op.select_num < number:
                number = op.select_num
        if number is None:
            raise self.fail("select_ratio is 0 and select_num is not set: Data-Juicer fails on this too; set one of them")
        if number <= 0:
            number = total
        return None if number == total else int(number)

    def place(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[Entry]:
        plan = orjson.loads(ctx.data("drawn.json").read_bytes())
        if plan["identity"]:
            yield from FieldSelector.unchanged(shard_index, rows)
            return
        drawn = arrays.read(ctx.data("drawn.rec"), shard_index)
        at = 0
        for row, (line, _parsed) in enumerate(rows):
            while at < len(drawn) and drawn["row"][at] == row:
                rank = int(drawn["rank"][at])
                yield rank_target(rank, plan["count"], ctx.num_shards), rank, 0, line
                at += 1

    def sources(self, ctx: StageContext, target: int) -> list[int]:
        return files.read_sources([ctx.data("sources.rec")], target)
