"""One deduplication stage: its plan and each unit's work, over the create-once record files
that `layout.StageLayout` names: a unit run twice (a takeover, a fenced straggler) writes
identical bytes and the late copy is discarded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elastic_sharding import fsops
from elastic_sharding.dedup import arrays, buckets, components
from elastic_sharding.dedup.arrays import KEYS, PAIRS, POSITIONS, position
from elastic_sharding.dedup.rules import DedupKind, DedupRule
from elastic_sharding.layout import StageLayout

RECORDS_PER_BUCKET_UNIT = 1 << 21  # 64 MiB of key records: what one bucket unit sorts
ROWS_PER_NODE_PART = 1 << 22  # rows one components unit covers (it holds only their edges)
MAX_PARTS = 4096


@dataclass(frozen=True)
class DedupPlan:
    """How one stage's work is cut; fixed before its first key file is written."""

    rule: DedupRule
    num_shards: int
    bucket_parts: int
    node_parts: int

    @classmethod
    def for_rows(cls, rule: DedupRule, fanout: int, num_shards: int, rows: int) -> DedupPlan:
        """Bucket units bounded by the records they sort; node partitions by the rows they cover."""
        bucket_parts = min(MAX_PARTS, max(1, math.ceil(rows * fanout / RECORDS_PER_BUCKET_UNIT)))
        node_parts = min(num_shards, MAX_PARTS, max(1, math.ceil(rows / ROWS_PER_NODE_PART)))
        return cls(rule, num_shards, bucket_parts, node_parts)

    @property
    def needs_components(self) -> bool:
        return self.rule.kind != DedupKind.EXACT

    def node_part_of_shard(self, shard_index: int) -> int:
        return shard_index * self.node_parts // self.num_shards


class DedupStage:
    """The units of one stage in the directory `root`; `dedup.cooperate` decides who runs which."""

    def __init__(self, root: Path, plan: DedupPlan):
        self.root = root
        self.plan = plan
        self.files = StageLayout(root)

    # -- units --------------------------------------------------------------------------------

    def write_keys(self, op: Any, shard_index: int, rows: list[dict]) -> int:
        """Unit (a): the operator's hash of every row of one shard, as bucket records."""
        keys = self.plan.rule.key_records(op, rows, shard_index)
        self._write(
            self.files.key_file(shard_index), keys, buckets.bucket_parts(keys, self.plan.bucket_parts), self.plan.bucket_parts
        )
        return len(keys)

    def run_bucket(self, part: int) -> int:
        """Unit (b): one bucket partition of every shard's keys; returns the records written."""
        plan = self.plan
        keys = arrays.read_all_parts([self.files.key_file(s) for s in range(plan.num_shards)], part, KEYS)
        distance = plan.rule.simhash_blocks()[1] if plan.rule.kind == DedupKind.SIMHASH else 0
        out = buckets.reduce_bucket(plan.rule.kind, keys, distance)
        if plan.needs_components:
            out = buckets.both_directions(out)
            parts = buckets.node_parts(out["node"], plan.num_shards, plan.node_parts)
        else:
            parts = buckets.node_parts(out, plan.num_shards, plan.node_parts)
        self._write(self.files.bucket_file(part), out, parts, plan.node_parts)
        return len(out)

    def run_round(self, round_number: int, part: int) -> int:
        """Unit (c): one node partition's round of label propagation; returns the messages sent."""
        plan = self.plan
        if round_number == 0:
            edges = arrays.read_all_parts([self.files.bucket_file(p) for p in range(plan.bucket_parts)], part, PAIRS)
            adjacency, state, messages = components.first_round(edges)
            self._write(self.files.adjacency_file(part), adjacency)
        else:
            adjacency = arrays.read(self.files.adjacency_file(part))
            state = arrays.read(self.files.labels_file(round_number - 1, part))
            inbox = arrays.read_all_parts(
                [self.files.messages_file(round_number - 1, q) for q in range(plan.node_parts)], part, PAIRS
            )
            state, messages = components.next_round(adjacency, state, inbox)
        self._write(self.files.labels_file(round_number, part), state)
        targets = buckets.node_parts(messages["node"], plan.num_shards, plan.node_parts)
        self._write(self.files.messages_file(round_number, part), messages, targets, plan.node_parts)
        return len(messages)

    def drops(self, shard_index: int, final_round: int | None) -> np.ndarray:
        """Unit (d)'s input: the row indices of one shard that the operator drops, sorted."""
        plan = self.plan
        part = plan.node_part_of_shard(shard_index)
        if plan.needs_components:
            if final_round is None:  # no edges at all: every row is kept
                return np.empty(0, dtype=POSITIONS)
            dropped = components.dropped(arrays.read(self.files.labels_file(final_round, part)))
        else:
            dropped = np.sort(
                arrays.read_all_parts([self.files.bucket_file(p) for p in range(plan.bucket_parts)], part, POSITIONS)
            )
        low, high = np.searchsorted(dropped, [position(shard_index, 0), position(shard_index + 1, 0)])
        return dropped[low:high] - position(shard_index, 0)

    def _write(self, target: Path, data: np.ndarray, parts: np.ndarray | None = None, num_parts: int = 1) -> None:
        fsops.make_dirs(target.parent)
        arrays.write(target, data, parts, num_parts)
