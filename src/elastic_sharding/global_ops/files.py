"""The create-once data files of a whole-dataset stage: sorted columns and placements.

A placement is what a `place` unit leaves for the `keep` units: the rows of one source shard
that go elsewhere, each with its destination shard and a (major, minor) rank, stored as one
blob of lines sorted by (destination, major, minor) beside an index partitioned by destination
(`dedup.arrays`' format), so the keep unit of shard t reads one contiguous slice of each blob.

Which sources hold rows for a destination is known before any row is placed: the `buckets`
units, which see every shard's keys, write it as source lists partitioned by destination
(`write_sources`). The keep unit of shard t opens only those sources' placements: with every keep
unit opening every placement, a stage of S shards would open S² files where the rows touch a few
per shard.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import orjson

from elastic_sharding import fsops
from elastic_sharding.dedup import arrays
from elastic_sharding.errors import JobStateError

PLACED = np.dtype([("major", "<i8"), ("minor", "<i8"), ("offset", "<i8"), ("length", "<i8")])


def write_placement(blob: Path, index: Path, entries: Iterable[tuple[int, int, int, bytes]], num_targets: int) -> int:
    """Write (target, major, minor, line) entries; the number written."""
    ordered = sorted(entries, key=lambda entry: entry[:3])
    records = np.empty(len(ordered), dtype=PLACED)
    targets = np.fromiter((entry[0] for entry in ordered), dtype=np.int64, count=len(ordered))
    offset = 0
    fsops.make_dirs(blob.parent)
    with fsops.atomic_output(blob, replace=False) as out:
        for i, (_target, major, minor, line) in enumerate(ordered):
            records[i] = (major, minor, offset, len(line))
            out.write(line)
            offset += len(line)
        out.commit()
    write_records(index, records, targets, num_targets)
    return len(ordered)


def read_placed(blob: Path, index: Path, target: int) -> Iterator[tuple[int, int, bytes]]:
    """The entries of one source shard's placement that go to `target`, in rank order."""
    records = arrays.read(index, target)
    if not len(records):
        return iter(())
    start = int(records["offset"][0])
    end = int(records["offset"][-1] + records["length"][-1])
    with open(blob, "rb") as handle:
        handle.seek(start)
        data = handle.read(end - start)
    if len(data) != end - start:
        raise JobStateError(f"{blob}: truncated; remove the stage's directory and every later one, then run the workers again")
    return (
        (int(r["major"]), int(r["minor"]), data[int(r["offset"]) - start : int(r["offset"] + r["length"]) - start])
        for r in records
    )


def gather(sources: list[tuple[Path, Path]], target: int) -> Iterator[tuple[int, int, bytes]]:
    """Every source's entries for `target`, merged in (major, minor) order."""
    return heapq.merge(*(read_placed(blob, index, target) for blob, index in sources), key=lambda entry: entry[:2])


def write_sources(path: Path, sources: np.ndarray, targets: np.ndarray, num_targets: int) -> int:
    """Which source shard holds rows for which destination, from one (source, target) pair per
    placed row or group (repeats allowed): each destination's distinct sources, ascending, as a
    partition of a record file. Deterministic in the pairs, so a unit done again writes the same
    bytes. The number of distinct pairs."""
    pairs = np.unique(np.asarray(targets, dtype=np.int64) * num_targets + np.asarray(sources, dtype=np.int64))
    write_records(path, (pairs % num_targets).astype("<i8"), pairs // num_targets, num_targets)
    return len(pairs)


def read_sources(paths: Iterable[Path], target: int) -> list[int]:
    """The sources every file of `paths` lists for `target`, ascending, each once."""
    found: set[int] = set()
    for path in paths:
        found.update(arrays.read(path, target).tolist())
    return sorted(found)


def write_sorted(values_path: Path, rows_path: Path, values: np.ndarray) -> None:
    """One shard's values sorted, ties by row (a stable sort), and the row of each, as `.npy`
    files: the values alone, contiguous, are what other units' binary searches read."""
    order = np.argsort(values, kind="stable")
    for path, data in ((rows_path, order.astype("<i8")), (values_path, values[order].astype("<f8"))):
        fsops.make_dirs(path.parent)
        with fsops.atomic_output(path, replace=False) as out:
            np.save(out, data, allow_pickle=False)
            out.commit()


def read_npy(path: Path, mmap: bool = True) -> np.ndarray:
    """A shard's sorted values (memory-mapped: a unit reading every shard's touches only the
    pages its binary searches visit) or rows."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError as exc:
        raise JobStateError(f"{path}: missing; the stage is incomplete: remove its directory and run the workers again") from exc


def write_records(target: Path, records: np.ndarray, parts: np.ndarray | None = None, num_parts: int = 1) -> None:
    """`dedup.arrays.write`, into a directory made first."""
    fsops.make_dirs(target.parent)
    arrays.write(target, records, parts, num_parts)


def write_json(path: Path, value: object) -> None:
    """A plan or summary as JSON, create-once (a late identical writer loses to the first)."""
    fsops.make_dirs(path.parent)
    with fsops.atomic_output(path, replace=False) as out:
        out.write(orjson.dumps(value))
        out.commit()
