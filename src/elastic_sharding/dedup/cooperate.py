"""A deduplication stage shared by any number of processes: its units, in order, claimed through
`claims/units.py` (claims, heartbeats, takeover, fencing, create-once results).

Phases: `keys` (one unit per shard), `buckets` (one per bucket partition), then, for near
duplicates, rounds of `components` (one unit per node partition) until a round sends nothing.
Every participant decides the same next step from what is published: the plan is a function of
the job, and whether another round is needed is the sum of the round's published results. The
stage's end is `stage.json`, published create-once by whoever first sees it complete; then come
the `keep` units, one per shard, which read the final round from it (what a kept shard becomes
is the caller's: `keep`). A unit that fails publishes `failed.json`, and every participant ends
with that error.

No phase waits where work is available: a participant that finds every unit of a phase held by
others polls until they publish (a round's units need the whole previous round), and a worker
still waiting for the last shards of the previous segment hashes the finished ones meanwhile
(`help_with_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from elastic_sharding import fsops
from elastic_sharding.claims.units import SharedStage, unit_index
from elastic_sharding.dedup.arrays import STAGE_AND_AFTER
from elastic_sharding.dedup.stage import DedupStage
from elastic_sharding.errors import JobStateError
from elastic_sharding.layout import StageLayout
from elastic_sharding.records import DedupStageDone, KeptShard, decode, encode

KEYS, BUCKETS, COMPONENTS, KEEP = "keys", "buckets", "components", "keep"
PHASES = (KEYS, BUCKETS, COMPONENTS, KEEP)
MAX_ROUNDS = 10_000  # a bound no real component reaches (rounds ~ its diameter)

unit_name = StageLayout.unit_name
# What the caller makes of one kept shard: (shard index, the row indices dropped) -> its record.
Keep = Callable[[int, np.ndarray], KeptShard]


def read_done(paths: StageLayout) -> DedupStageDone | None:
    return fsops.read_record(paths.done, lambda data: decode(DedupStageDone, data, paths.done))


class StageParticipant:
    """One process's share of a stage; `rows_of(shard_index)` gives a shard's rows as the
    previous segment of the recipe left them."""

    def __init__(
        self,
        stage: DedupStage,
        rows_of: Callable[[int], Iterable[dict]],
        lease_secs: float,
        heartbeat_secs: float,
        poll_secs: float,
        stop: Callable[[], bool] = lambda: False,
        what: str = "dedup",
        keep: Keep | None = None,
        op: Any = None,
    ):
        self.stage = stage
        self.rows_of = rows_of
        self.keep = keep
        self.paths = stage.files
        self.shared = SharedStage(self.paths, what, lease_secs, heartbeat_secs, poll_secs, stop)
        self.units = self.shared.units
        self._op: Any = op

    def run(self) -> DedupStageDone:
        """Take part until the stage is complete (and, with `keep`, every shard kept); raises the
        error a participant published, or `Interrupted` when asked to stop."""
        done = read_done(self.paths)
        if done is None:
            done = self._find_duplicates()
        if self.keep is not None:
            keep = self.keep
            names = [unit_name(KEEP, i) for i in range(self.stage.plan.num_shards)]
            drops = self.stage.drops
            self.shared.run_phase(names, self.shared.counted(lambda i: keep(i, drops(i, done.final_round))), f"dedup-{KEEP}")
        return done

    def help_with_keys(self, ready: Callable[[int], bool]) -> bool:
        """Do one keys unit whose shard is `ready` and nobody holds; False if there is none."""
        if read_done(self.paths) is not None:
            return False
        names = [unit_name(KEYS, i) for i in range(self.stage.plan.num_shards)]
        return self.shared.help_once(
            names, lambda name: ready(unit_index(name)), self.shared.counted(self._keys), f"dedup-{KEYS}"
        )

    def _find_duplicates(self) -> DedupStageDone:
        plan = self.stage.plan
        self._phase(KEYS, plan.num_shards, self._keys)
        bucket_records = self._phase(BUCKETS, plan.bucket_parts, self._bucket)
        final_round, rounds = None, 0
        if plan.needs_components and bucket_records:
            for round_number in range(MAX_ROUNDS):
                rounds += 1
                sent = self._phase(COMPONENTS, plan.node_parts, lambda q, r=round_number: self._round(r, q), round_number)
                if sent == 0:
                    final_round = round_number
                    break
            else:
                raise JobStateError(
                    f"{self.stage.root}: label propagation did not settle in {MAX_ROUNDS} rounds (more than any component's "
                    f"diameter should need); keep the directory for a bug report, then remove {STAGE_AND_AFTER}"
                )
        fsops.publish_once(self.paths.done, encode(DedupStageDone(final_round, bucket_records, rounds)))
        return read_done(self.paths) or DedupStageDone(final_round, bucket_records, rounds)

    def _phase(self, phase: str, count: int, do: Callable[[int], int], round_number: int | None = None) -> int:
        """Run a phase's units to completion; the sum of their counts."""
        names = [unit_name(phase, i, round_number) for i in range(count)]
        self.shared.run_phase(names, self.shared.counted(do), f"dedup-{phase}")
        return self.shared.count(names)

    def _keys(self, shard_index: int) -> int:
        if self._op is None:
            self._op = self.stage.plan.rule.build()
        return self.stage.write_keys(self._op, shard_index, list(self.rows_of(shard_index)))

    def _bucket(self, part: int) -> int:
        return self.stage.run_bucket(part)

    def _round(self, round_number: int, part: int) -> int:
        return self.stage.run_round(round_number, part)
