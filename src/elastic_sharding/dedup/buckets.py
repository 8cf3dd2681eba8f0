"""The bucket unit: one partition of the bucket space, from every shard's key file.

Rows sharing a bucket are brought together by sorting; what the unit writes depends on whether
the operator's groups are already its components:
- exact duplicates: equal md5 is the whole relation, so the unit writes the rows to drop (every
  row of a bucket but its first) and no later stage is needed;
- near duplicates: the relation chains across buckets, so the unit writes edges, each from the
  first row of its group, and the components stage joins them.
Edges and drops are written partitioned by the position they belong to (`node_parts`), so the
next unit reads only its own slice of every bucket file.
"""

from __future__ import annotations

import numpy as np

from elastic_sharding.dedup.arrays import PAIRS, POSITIONS, shard_of
from elastic_sharding.dedup.rules import DedupKind

_MIX1 = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)


def bucket_parts(records: np.ndarray, num_parts: int) -> np.ndarray:
    """The bucket partition of each key record: a mix of both key words (simhash keys are masked
    values, so their low bits alone would not spread)."""
    with np.errstate(over="ignore"):
        h = (records["k1"] * _MIX1) ^ records["k2"]
        h ^= h >> np.uint64(31)
        h *= _MIX2
        h ^= h >> np.uint64(29)
    return (h % np.uint64(num_parts)).astype(np.int64)


def node_parts(positions: np.ndarray, num_shards: int, num_parts: int) -> np.ndarray:
    """Contiguous ranges of shards: a shard's positions all live in one node partition."""
    return (shard_of(positions) * num_parts // num_shards).astype(np.int64)


def _group_starts(*columns: np.ndarray) -> np.ndarray:
    """True where a run of equal (sorted) keys begins."""
    starts = np.zeros(len(columns[0]), dtype=bool)
    if len(starts):
        starts[0] = True
        for column in columns:
            starts[1:] |= column[1:] != column[:-1]
    return starts


def exact_drops(records: np.ndarray) -> np.ndarray:
    """Every row of an md5 bucket after its first: `document_deduplicator`'s rule."""
    records = records[np.lexsort((records["pos"], records["k2"], records["k1"]))]
    first = _group_starts(records["k1"], records["k2"])
    return np.sort(records["pos"][~first]).astype(POSITIONS)


def _star_edges(positions: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Edges from the first row of each group (positions sorted within groups) to the others."""
    group_first = positions[first][np.cumsum(first) - 1]
    edges = np.empty(int((~first).sum()), dtype=PAIRS)
    edges["node"] = group_first[~first]
    edges["other"] = positions[~first]
    return edges


def minhash_edges(records: np.ndarray) -> np.ndarray:
    """Rows that share a band bucket, each joined to the bucket's first row: the union-find of
    `document_minhash_deduplicator` joins the same sets, and joining is transitive."""
    records = records[np.lexsort((records["pos"], records["k2"], records["k1"]))]
    return _star_edges(records["pos"], _group_starts(records["k1"], records["k2"]))


def simhash_edges(records: np.ndarray, distance: int) -> np.ndarray:
    """Rows with equal values, and distinct values within `distance` bits that share a bucket."""
    # Equal values: every row appears once under the first block choice (k1 == 0).
    same = records[records["k1"] == 0]
    same = same[np.lexsort((same["pos"], same["val"]))]
    edges = [_star_edges(same["pos"], _group_starts(same["val"]))]
    # Distinct values: one record per (bucket, value), carrying the value's first row here.
    records = records[np.lexsort((records["pos"], records["val"], records["k2"], records["k1"]))]
    records = records[_group_starts(records["k1"], records["k2"], records["val"])]
    group = np.cumsum(_group_starts(records["k1"], records["k2"]))
    values, positions = records["val"], records["pos"]
    offset = 1
    while offset < len(records):
        together = group[offset:] == group[:-offset]
        if not together.any():
            break
        near = together & (np.bitwise_count(values[offset:] ^ values[:-offset]) <= distance)
        pairs = np.empty(int(near.sum()), dtype=PAIRS)
        pairs["node"] = positions[:-offset][near]
        pairs["other"] = positions[offset:][near]
        edges.append(pairs)
        offset += 1
    return np.concatenate(edges)


def reduce_bucket(kind: DedupKind, records: np.ndarray, distance: int = 0) -> np.ndarray:
    """Drops (exact) or edges (near duplicates) of one bucket partition's records."""
    if kind == DedupKind.EXACT:
        return exact_drops(records)
    edges = minhash_edges(records) if kind == DedupKind.MINHASH else simhash_edges(records, distance)
    lower = np.minimum(edges["node"], edges["other"])
    edges["other"] = np.maximum(edges["node"], edges["other"])
    edges["node"] = lower
    return np.unique(edges)


def both_directions(edges: np.ndarray) -> np.ndarray:
    """Each edge as a record of each of its ends, so either end's partition holds it."""
    flipped = np.empty(len(edges), dtype=PAIRS)
    flipped["node"], flipped["other"] = edges["other"], edges["node"]
    return np.concatenate([edges, flipped])
