"""Which whole-dataset operators run as stages across all shards, and what each stage does.

Every operator's own Data-Juicer code is built from the recipe and used where the rule depends
on it (hashes, stats_to_number, nested access, group rows); what is ours is only how the rows
that its `process` would look at together are brought together across shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elastic_sharding.errors import RecipeError

Row = tuple[bytes, dict]  # a row's line as read, and the row parsed
Entry = tuple[int, int, int, bytes]  # (destination shard, major rank, minor rank, line)

BYTES_PER_PART = 64 << 20  # input bytes per bucket partition of a keyed stage


@dataclass
class StageContext:
    """What every unit of a stage may read: its directory, the number of shards, the job's input
    bytes (which fixes the partitions before the first key file exists), and, once the previous
    segment has finished, each shard's rows."""

    root: Path
    num_shards: int
    input_bytes: int
    shard_rows: list[int] = field(default_factory=list)

    @property
    def total_rows(self) -> int:
        return sum(self.shard_rows)

    @property
    def parts(self) -> int:
        return min(4096, max(1, math.ceil(self.input_bytes / BYTES_PER_PART)))

    def data(self, *names: str) -> Path:
        return self.root.joinpath("data", *names)

    def shard_file(self, kind: str, shard_index: int, suffix: str) -> Path:
        return self.data(kind, f"{shard_index:05d}{suffix}")


class GlobalOp:
    """One whole-dataset operator as a stage. Subclasses set which phases they have and fill
    them in; `op` is the operator Data-Juicer built from the recipe entry."""

    has_keys = False  # a `keys` unit per shard
    reduce_units = 0  # `buckets` units: 0, 1 (a plan) or `PARTS` (one per partition)
    reorders = False  # rows leave their shard: `place` units, then keep gathers

    def __init__(self, name: str, params: dict[str, Any], op: Any):
        self.name = name
        self.params = params
        self.op = op

    def reduce_count(self, ctx: StageContext) -> int:
        return ctx.parts if self.reduce_units == PARTS else self.reduce_units

    def keys(self, ctx: StageContext, shard_index: int, rows: Iterable[dict]) -> int:
        raise NotImplementedError

    def reduce(self, ctx: StageContext, unit: int) -> int:
        raise NotImplementedError

    def apply(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[bytes]:
        """An in-place operator: the next segment's lines of one shard, from its own rows."""
        raise NotImplementedError

    def place(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[Entry]:
        """A reordering operator: where each row of one shard goes, and its rank there."""
        raise NotImplementedError

    def sources(self, ctx: StageContext, target: int) -> list[int]:
        """The shards whose `place` units give shard `target` rows: the only placements its keep
        unit opens. Every shard unless the operator knows better (each reordering operator does:
        its `buckets` units write the lists, `files.write_sources`)."""
        return list(range(ctx.num_shards))

    def gather(self, ctx: StageContext, target: int, entries: Iterator[tuple[int, int, bytes]]) -> Iterator[bytes]:
        """The next segment's lines of shard `target` from its placed entries in rank order."""
        return (line for _major, _minor, line in entries)

    def fail(self, what: str) -> RecipeError:
        return RecipeError(f"{self.name}: {what}")


PARTS = -1


def rank_target(rank: int, total: int, num_shards: int) -> int:
    """Output rank r of `total` goes to shard r * shards // total: the next segment's shards even."""
    return rank * num_shards // max(total, 1)


def rank_targets(ranks: np.ndarray, total: int, num_shards: int) -> np.ndarray:
    """`rank_target` of each rank of an array."""
    return np.asarray(ranks, dtype=np.int64) * num_shards // max(total, 1)


def span_targets(start: int, stop: int, total: int, num_shards: int) -> np.ndarray:
    """The distinct shards that output ranks start..stop-1 go to, ascending, without one entry
    per rank: where there are at least as many ranks as shards, consecutive ranks go to the same
    or the next shard, so the shards are a range; otherwise the ranks are fewer than the shards."""
    if stop <= start:
        return np.empty(0, dtype=np.int64)
    if total >= num_shards:
        return np.arange(rank_target(start, total, num_shards), rank_target(stop - 1, total, num_shards) + 1, dtype=np.int64)
    return np.unique(rank_targets(np.arange(start, stop), total, num_shards))
