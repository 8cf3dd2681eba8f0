"""A whole-dataset operator's stage shared by any number of processes, through the units of
`claims/units.py`, in the phases `keys`, `buckets`, `place` and `keep` (each only where the
operator has it; see `operators.GlobalOp`). The end of the last phase before `keep` is
`stage.json` (a `DedupStageDone`, so `status` reads every stage alike); the `keep` units then
hand each shard of the next segment its rows through the caller's `keep`. A reordering
operator's keep unit opens only the placements of the shards that give it rows
(`GlobalOp.sources`), so a stage opens about as many files as it has shards, not their square.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from elastic_sharding import fsops
from elastic_sharding.claims.units import SharedStage, unit_index
from elastic_sharding.global_ops import files
from elastic_sharding.global_ops.operators import GlobalOp, Row, StageContext
from elastic_sharding.layout import StageLayout
from elastic_sharding.records import DedupStageDone, KeptShard, decode, encode

KEYS, BUCKETS, PLACE, KEEP = "keys", "buckets", "place", "keep"
unit_name = StageLayout.unit_name
# The caller's shared last step: (shard index, the next segment's lines of it) -> its record.
Keep = Callable[[int, Iterator[bytes]], KeptShard]


def read_done(paths: StageLayout) -> DedupStageDone | None:
    return fsops.read_record(paths.done, lambda data: decode(DedupStageDone, data, paths.done))


class GlobalParticipant:
    """One process's share of the stage. `rows_of(i)` gives shard i's rows as the previous
    segment left them (line and parsed row), `shard_rows()` how many each shard has (called only
    once the previous segment is complete)."""

    def __init__(
        self,
        op: GlobalOp,
        ctx: StageContext,
        rows_of: Callable[[int], Iterable[Row]],
        shard_rows: Callable[[], list[int]],
        keep: Keep,
        lease_secs: float,
        heartbeat_secs: float,
        poll_secs: float,
        stop: Callable[[], bool] = lambda: False,
        what: str = "stage",
    ):
        self.op = op
        self.ctx = ctx
        self.rows_of = rows_of
        self.shard_rows = shard_rows
        self.keep = keep
        self.paths = StageLayout(ctx.root)
        self.shared = SharedStage(self.paths, what, lease_secs, heartbeat_secs, poll_secs, stop)

    def run(self) -> DedupStageDone:
        done = read_done(self.paths)
        if not self.ctx.shard_rows:
            self.ctx.shard_rows = self.shard_rows()
        if done is None:
            done = self._prepare()
        names = [unit_name(KEEP, i) for i in range(self.ctx.num_shards)]
        self.shared.run_phase(names, self.shared.counted(self._keep_one), f"global-{KEEP}")
        return done

    def help_with_keys(self, ready: Callable[[int], bool]) -> bool:
        """Do one keys unit whose shard is `ready` and nobody holds; False if there is none."""
        if not self.op.has_keys or read_done(self.paths) is not None:
            return False
        names = [unit_name(KEYS, i) for i in range(self.ctx.num_shards)]
        return self.shared.help_once(
            names, lambda name: ready(unit_index(name)), self.shared.counted(self._keys), f"global-{KEYS}"
        )

    def _prepare(self) -> DedupStageDone:
        count = 0
        if self.op.has_keys:
            count += self._phase(KEYS, self.ctx.num_shards, self._keys)
        count += self._phase(BUCKETS, self.op.reduce_count(self.ctx), lambda unit: self.op.reduce(self.ctx, unit))
        if self.op.reorders:
            count += self._phase(PLACE, self.ctx.num_shards, self._place)
        fsops.make_dirs(self.paths.root)
        fsops.publish_once(self.paths.done, encode(DedupStageDone(None, count, 0)))
        return read_done(self.paths) or DedupStageDone(None, count, 0)

    def _phase(self, phase: str, count: int, do: Callable[[int], int]) -> int:
        names = [unit_name(phase, i) for i in range(count)]
        if names:
            self.shared.run_phase(names, self.shared.counted(do), f"global-{phase}")
        return self.shared.count(names)

    def _keys(self, shard_index: int) -> int:
        return self.op.keys(self.ctx, shard_index, (row for _line, row in self.rows_of(shard_index)))

    def _place(self, shard_index: int) -> int:
        entries = self.op.place(self.ctx, shard_index, self.rows_of(shard_index))
        blob, index = self._placement(shard_index)
        return files.write_placement(blob, index, entries, self.ctx.num_shards)

    def _placement(self, shard_index: int) -> tuple[Path, Path]:
        return self.ctx.shard_file("place", shard_index, ".bin"), self.ctx.shard_file("place", shard_index, ".idx")

    def _keep_one(self, target: int) -> KeptShard:
        if self.op.reorders:
            sources = [self._placement(s) for s in self.op.sources(self.ctx, target)]
            lines = self.op.gather(self.ctx, target, files.gather(sources, target))
        else:
            lines = self.op.apply(self.ctx, target, self.rows_of(target))
        return self.keep(target, lines)
