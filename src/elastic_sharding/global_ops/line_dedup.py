"""`document_line_deduplicator` across shards: each line hash's document frequency over all of
them, then the frequent lines removed from every document, exactly as its `process` removes them.

`keys`: per shard, each distinct non-skipped line hash (Data-Juicer's own `compute_hash` and skip
rules) with the number of the shard's documents it is in, partitioned by hash. `buckets`: per
partition, the hashes in more than `frequency_threshold` documents of the whole dataset. `keep`:
every document's lines with one of those hashes removed (a document may be left empty: it stays,
with empty text, as in Data-Juicer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np
import orjson

from elastic_sharding.dedup import arrays, buckets
from elastic_sharding.dedup.arrays import KEYS
from elastic_sharding.global_ops import files
from elastic_sharding.global_ops.operators import PARTS, GlobalOp, Row, StageContext

LINE_HASHES = "__dj__line_hashes"


class LineDedup(GlobalOp):
    has_keys = True
    reduce_units = PARTS

    def _hashes(self, row: dict, where: str) -> list[str]:
        try:
            sample = self.op.compute_hash(dict(row))
        except Exception as exc:  # noqa: BLE001 - the operator's own code: any error is the row's
            raise self.fail(f"Data-Juicer's compute_hash failed on {where}: {type(exc).__name__}: {exc}; fix the data") from None
        return sample[LINE_HASHES]

    def keys(self, ctx: StageContext, shard_index: int, rows: Iterable[dict]) -> int:
        frequency: Counter[str] = Counter()
        for row_index, row in enumerate(rows):
            frequency.update({h for h in self._hashes(row, f"row {row_index + 1} of shard {shard_index}") if h})
        records = np.zeros(len(frequency), dtype=KEYS)
        if frequency:
            digests = np.frombuffer(b"".join(bytes.fromhex(h) for h in frequency), dtype=">u8").reshape(-1, 2)
            records["k1"], records["k2"] = digests[:, 0], digests[:, 1]
            records["val"] = np.fromiter(frequency.values(), dtype=np.uint64, count=len(frequency))
        target = ctx.shard_file("keys", shard_index, ".rec")
        files.write_records(target, records, buckets.bucket_parts(records, ctx.parts), ctx.parts)
        return len(records)

    def reduce(self, ctx: StageContext, unit: int) -> int:
        keys = arrays.read_all_parts([ctx.shard_file("keys", s, ".rec") for s in range(ctx.num_shards)], unit, KEYS)
        keys = keys[np.lexsort((keys["k2"], keys["k1"]))]
        starts = np.ones(len(keys), dtype=bool)
        starts[1:] = (keys["k1"][1:] != keys["k1"][:-1]) | (keys["k2"][1:] != keys["k2"][:-1])
        firsts = np.flatnonzero(starts)
        documents = np.add.reduceat(keys["val"], firsts) if len(keys) else np.empty(0, dtype=np.uint64)
        frequent = keys[firsts][documents > int(self.op.frequency_threshold)]
        files.write_records(ctx.data("frequent", f"{unit:05d}.rec"), frequent)
        return len(frequent)

    def _frequent(self, ctx: StageContext) -> set[str]:
        found: set[str] = set()
        for part in range(ctx.parts):
            records = arrays.read(ctx.data("frequent", f"{part:05d}.rec"))
            found.update(f"{int(a):016x}{int(b):016x}" for a, b in zip(records["k1"], records["k2"]))
        return found

    def apply(self, ctx: StageContext, shard_index: int, rows: Iterable[Row]) -> Iterator[bytes]:
        frequent = self._frequent(ctx) if ctx.total_rows > 1 else set()
        text_key = self.op.text_key
        for row_index, (line, row) in enumerate(rows):
            if not frequent:
                yield line
                continue
            hashes = self._hashes(row, f"row {row_index + 1} of shard {shard_index}")
            if not any(h and h in frequent for h in hashes):
                yield line
                continue
            lines = row[text_key].split("\n")
            row[text_key] = "\n".join(text for text, h in zip(lines, hashes) if not (h and h in frequent))
            yield orjson.dumps(row)
