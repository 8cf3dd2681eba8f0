"""Partitioned record files: one numpy record array, sorted by partition, behind a small header.

A reader maps the file and reads one partition's slice without touching the rest, which keeps a
unit's memory bounded by its partition. Files are published create-once under their final name
(`fsops.atomic_output`), so a reader never sees a partial file and a late duplicate writer loses
to identical bytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from elastic_sharding import fsops
from elastic_sharding.errors import JobStateError

# A damaged stage is recomputed, not repaired: its directory also holds the segment after it, whose
# inputs came from it, and every later stage read that segment.
STAGE_AND_AFTER = (
    "that stage's directory (stages/<k>/ of the job, which also holds the recipe segment after it) and "
    "every later stages/<j>/, then run the workers again; the segments before it are kept"
)

MAGIC = b"ESDDREC1"
_HEAD = struct.Struct("<8sQQ")  # magic, partitions, length of the dtype description

# Positions are (shard index << 32) | row index within the shard's output: their integer order is
# the order of the rows in one Data-Juicer run over the same segment of the recipe.
POSITION_BITS = 32

KEYS = np.dtype([("k1", "<u8"), ("k2", "<u8"), ("pos", "<i8"), ("val", "<u8")])
PAIRS = np.dtype([("node", "<i8"), ("other", "<i8")])
POSITIONS = np.dtype("<i8")


def position(shard_index: int, row: int) -> int:
    return (shard_index << POSITION_BITS) | row


def shard_of(positions: np.ndarray) -> np.ndarray:
    return positions >> POSITION_BITS


def write(target: Path, records: np.ndarray, parts: np.ndarray | None = None, num_parts: int = 1) -> bool:
    """Write `records` grouped by `parts` (the partition of each record), stable within a part.

    Returns False when another writer published the file first (it holds the same records).
    """
    if parts is None:
        parts = np.zeros(len(records), dtype=np.int64)
    order = np.argsort(parts, kind="stable")
    records = records[order]
    offsets = np.zeros(num_parts + 1, dtype="<i8")
    np.cumsum(np.bincount(parts, minlength=num_parts), out=offsets[1:])
    descr = json.dumps(np.lib.format.dtype_to_descr(records.dtype)).encode()
    header = _HEAD.pack(MAGIC, num_parts, len(descr)) + descr
    header += b"\0" * (-len(header) % 8)
    with fsops.atomic_output(target, replace=False) as out:
        out.write(header)
        out.write(offsets.tobytes())
        out.write(np.ascontiguousarray(records).tobytes())
        return out.commit()


def read(path: Path, part: int | None = None) -> np.ndarray:
    """The records of one partition (all of them when `part` is None), as an in-memory array."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD.size)
            magic, num_parts, descr_len = _HEAD.unpack(head) if len(head) == _HEAD.size else (b"", 0, 0)
            if magic != MAGIC:
                raise JobStateError(f"{path}: not a dedup record file (or a truncated one); remove {STAGE_AND_AFTER}")
            descr = handle.read(descr_len)
            dtype = np.lib.format.descr_to_dtype(json.loads(descr))
            base = _HEAD.size + descr_len + (-(_HEAD.size + descr_len) % 8)
            offsets = np.fromfile(handle, dtype="<i8", count=num_parts + 1, offset=base - handle.tell())
            if part is not None and not 0 <= part < num_parts:
                raise JobStateError(
                    f"{path}: has {num_parts} partition(s), not {part + 1}; the stage's plan changed: remove {STAGE_AND_AFTER}"
                )
            first, last = (0, int(offsets[-1])) if part is None else (int(offsets[part]), int(offsets[part + 1]))
            start = base + 8 * (num_parts + 1) + first * dtype.itemsize
            records = np.fromfile(handle, dtype=dtype, count=last - first, offset=start - handle.tell())
    except FileNotFoundError as exc:
        raise JobStateError(f"{path}: missing; the job directory is incomplete: restore it, or prepare a new --job-dir") from exc
    if len(records) != last - first:
        raise JobStateError(f"{path}: truncated ({len(records)} of {last - first} records); remove {STAGE_AND_AFTER}")
    return records


def read_all_parts(paths: list[Path], part: int, dtype: np.dtype) -> np.ndarray:
    """Partition `part` of every file in `paths`, concatenated in the order given."""
    return np.concatenate([read(path, part) for path in paths] or [np.empty(0, dtype=dtype)])
