"""Data-Juicer's groupers and aggregators across shards.

- `key_value_grouper`: one output row per distinct value of `group_by_keys` (Data-Juicer's own
  `nested_access` and `dict_to_hash`), in order of each group's first row, holding every row of
  the group in input order as lists. `keys`: each shard's distinct group hashes with their first
  position; `buckets`: per hash partition, each group's first position over all shards, and which
  shards send rows to which (a shard with a group's rows to the shard of its first row); `place`:
  each row sent to the shard of its group's first row, ranked (first position, position); `keep`
  gathers from the shards that send it rows and folds each run of one group into its row.
- `naive_reverse_grouper` (one row per element of a grouped row's lists) and the aggregators
  (`process_single` on each grouped row) change each row on its own: in place.
- `naive_grouper` (the whole dataset into one row) is refused by `operators.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import orjson

from elastic_sharding.dedup import arrays, buckets
from elastic_sharding.dedup.arrays import KEYS, position
from elastic_sharding.global_ops import files
from elastic_sharding.global_ops.operators import PARTS, Entry, GlobalOp, Row, StageContext

BATCH_META = "__dj__batch_meta__"


class KeyValueGrouper(GlobalOp):
    has_keys = True
    reduce_units = PARTS
    reorders = True

    def _keys_of(self, rows: Iterable[dict]) -> np.ndarray:
        from data_juicer.utils.common_utils import dict_to_hash, nested_access

        hexes = [dict_to_hash({key: nested_access(row, key) for key in self.op.group_by_keys})[:32] for row in rows]
        digests = np.frombuffer(bytes.fromhex("".join(hexes)), dtype=">u8").reshape(-1, 2)
        records = np.zeros(len(hexes), dtype=KEYS)
        if hexes:
            records["k1"], records["k2"] = digests[:, 0], digests[:, 1]
        return records

    def keys(self, ctx: StageContext, shard_index: int, rows: Iterable[dict]) -> int:
        records = self._keys_of(rows)
        records["pos"] = position(shard_index, 0) + np.arange(len(records))
        _, first = np.unique(np.stack([records["k1"], records["k2"]], axis=1), axis=0, return_index=True)
        firsts = records[np.sort(first)]
        files.write_records(
            ctx.shard_file("keys", shard_index, ".rec"), firsts, buckets.bucket_parts(firsts, ctx.parts), ctx.parts
        )
        return len(firsts)

    def reduce(self, ctx: StageContext, unit: int) -> int:
        keys = arrays.read_all_parts([ctx.shard_file("keys", s, ".rec") for s in range(ctx.num_shards)], unit, KEYS)
        keys = keys[np.lexsort((keys["pos"], keys["k2"], keys["k1"]))]
        starts = np.ones(len(keys), dtype=bool)
        starts[1:] = (keys["k1"][1:] != keys["k1"][:-1]) | (keys["k2"][1:] != keys["k2"][:-1])
        groups = keys[starts]
        # Every shard holding a group sends its rows to the shard of the group's first row.
        first_of = groups["pos"][np.cumsum(starts) - 1]
        files.write_sources(
            self._sources_file(ctx, unit), arrays.shard_of(keys["pos"]), arrays.shard_of(first_of), ctx.num_shards
        )
        files.write_records(ctx.data("groups", f"{unit:05d}.rec"), groups)
        return len(groups)

    def _sources_file(self, ctx: StageContext, unit: int) -> Path:
        return ctx.data("sources", f"{unit:05d}.rec")

    def sources(self, ctx: StageContext, target: int) -> list[int]:
        return files.read_sources([self._sources_file(ctx, unit) for unit in range(ctx.parts)], target)

    def place(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[Entry]:
        rows = list(rows)
        records = self._keys_of(row for _line, row in rows)
        parts = buckets.bucket_parts(records, ctx.parts)
        first = np.empty(len(records), dtype=np.int64)
        for part in np.unique(parts).tolist():
            table = arrays.read(ctx.data("groups", f"{part:05d}.rec"))  # sorted by (k1, k2) as `reduce` wrote it
            mine = np.flatnonzero(parts == part)
            wanted = records[mine]
            low = np.searchsorted(table["k1"], wanted["k1"], side="left")
            for i, start in zip(mine.tolist(), low.tolist()):
                while table["k2"][start] != records["k2"][i] or table["k1"][start] != records["k1"][i]:
                    start += 1
                first[i] = table["pos"][start]
        for row, (line, _parsed) in enumerate(rows):
            group = int(first[row])
            yield int(arrays.shard_of(np.int64(group))), group, position(shard_index, row), line

    def gather(self, ctx: StageContext, target: int, entries: Iterator[tuple[int, int, bytes]]) -> Iterator[bytes]:
        group: list[dict] = []
        current = None
        for major, _minor, line in entries:
            if major != current and group:
                yield orjson.dumps(_columns(group))
                group = []
            current = major
            group.append(orjson.loads(line))
        if group:
            yield orjson.dumps(_columns(group))


def _columns(samples: list[dict]) -> dict[str, list]:
    """Rows as one row of lists (Data-Juicer's `convert_list_dict_to_dict_list`), over every
    field any of them has: in its dataset every row has every column, null where it had none."""
    fields: dict[str, None] = {}
    for sample in samples:
        fields.update(dict.fromkeys(sample))
    return {name: [sample.get(name) for sample in samples] for name in fields}


class ReverseGrouper(GlobalOp):
    def apply(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[bytes]:
        from data_juicer.ops.base_op import convert_dict_list_to_list_dict

        for i, (_line, row) in enumerate(rows):
            row.pop(BATCH_META, None)
            lengths = {len(v) if isinstance(v, list) else -1 for v in row.values()}
            if not row or len(lengths) != 1 or -1 in lengths:
                raise self.fail(
                    f"row {i + 1} of shard {shard_index} is not a grouped row (every field a list, all of one length); "
                    "put a grouper before naive_reverse_grouper"
                )
            for sample in convert_dict_list_to_list_dict(row):
                yield orjson.dumps(sample)


class PerGroupAggregator(GlobalOp):
    """An aggregator on each grouped row, with the batch meta field Data-Juicer adds first."""

    def apply(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[bytes]:
        for i, (_line, row) in enumerate(rows):
            if row.get(BATCH_META) is None:
                row[BATCH_META] = {}
            try:
                result = self.op.process(row)
            except Exception as exc:  # noqa: BLE001 - the operator's own code: any error is the row's
                raise self.fail(f"failed on row {i + 1} of shard {shard_index}: {type(exc).__name__}: {exc}") from None
            yield orjson.dumps(result)
