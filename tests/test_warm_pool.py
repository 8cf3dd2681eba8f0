"""The warm-operator bookkeeping that needs no Ray runtime: the all-instances-busy measure, how a
block is cut into pieces for the instances, the per-attempt recipe rewrite, and a worker whose
runner overlaps attempts (claims ahead on its first shard, begins the staged one, cancels it
when it is handed back)."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import pytest
from support.fakes import FakeRunner

from elastic_sharding.work.runners.actor_pool import BusyTracker
from elastic_sharding.work.runners.recipe_cache import _rewrite
from elastic_sharding.work.runners.warm_ops import _units
from elastic_sharding.work.worker import Worker, WorkerOptions


def test_all_busy_counts_only_the_time_every_slot_is_inside_a_call():
    busy = BusyTracker(2)
    busy.add(0, 0.0, 10.0)
    busy.add(1, 2.0, 4.0)
    busy.add(1, 5.0, 12.0)  # slot 0 idle from 10: 10..12 is not all-busy
    busy.add(0, 11.0, 12.0)
    assert busy.all_busy_secs == pytest.approx(2.0 + 5.0 + 1.0)
    assert busy.busy_secs == pytest.approx(10 + 2 + 7 + 1)
    assert busy.window_secs() == pytest.approx(12.0)


def test_all_busy_with_one_slot_is_its_busy_time_and_gaps_are_bubbles():
    busy = BusyTracker(1)
    for start in range(0, 10, 2):
        busy.add(0, float(start), start + 1.5)
    assert busy.all_busy_secs == pytest.approx(7.5)
    assert busy.window_secs() == pytest.approx(9.5)
    assert busy.intervals == [[]] or len(busy.intervals[0]) <= 1, "settled intervals are forgotten"


def test_all_busy_does_not_depend_on_how_the_slots_reports_interleave():
    """Each slot's calls are reported in order (an instance runs one call at a time and the
    reaper sees completions in submission order); across slots any interleaving may happen."""
    calls = [(0, 0.0, 3.0), (1, 1.0, 2.0), (2, 0.5, 2.5), (1, 2.2, 6.0), (0, 3.1, 7.0), (2, 2.6, 6.5)]
    orders = (calls, sorted(calls, key=lambda c: c[2]), sorted(calls, key=lambda c: c[0]), sorted(calls, key=lambda c: -c[0]))
    for order in orders:
        busy = BusyTracker(3)
        for slot, began, ended in order:
            busy.add(slot, began, ended)
        # all three busy in [1, 2], [2.2, 2.5], [2.6, 3] and [3.1, 6]
        assert busy.all_busy_secs == pytest.approx(1.0 + 0.3 + 0.4 + 2.9), order


@pytest.mark.parametrize(
    ("rows", "batch", "instances", "pieces"),
    [
        (20, 1, 1, [(0, 20)]),
        (20, 1, 2, [(0, 5), (5, 10), (10, 15), (15, 20)]),
        (10, 4, 2, [(0, 4), (4, 8), (8, 10)]),
        (3, 1, 8, [(0, 1), (1, 2), (2, 3)]),
        (0, 1, 2, []),
    ],
)
def test_a_block_is_cut_into_whole_batches_about_two_per_instance(rows, batch, instances, pieces):
    assert _units(0, rows, batch, instances) == pieces
    covered = [row for lo, hi in pieces for row in range(lo, hi)]
    assert covered == list(range(rows))
    assert all((hi - lo) % batch == 0 or hi == rows for lo, hi in pieces)


def test_a_cached_recipe_gets_the_attempts_paths_everywhere_and_the_template_stays():
    first = {"dataset": "/job/shards/part-00000-of-00002.jsonl", "attempt": "/job/attempts/part-00000-of-00002/A"}
    cfg = SimpleNamespace(
        dataset_path=first["dataset"],
        work_dir=f"{first['attempt']}/20261201_000000_abcdef",
        job_id="20261201_000000_abcdef",
        process=[{"op": {"work_dir": f"{first['attempt']}/20261201_000000_abcdef", "text_key": "text"}}],
        config=[SimpleNamespace(_absolute=f"{first['attempt']}/recipe.yaml")],
    )
    template = copy.deepcopy(cfg)
    pairs = [
        (first["attempt"], "/job/attempts/part-00001-of-00002/B"),
        (first["dataset"], "/job/shards/part-00001-of-00002.jsonl"),
        ("20261201_000000_abcdef", "20261201_000001_123456"),
    ]
    _rewrite(cfg, sorted(pairs, key=lambda p: -len(p[0])), set())
    assert cfg.dataset_path == "/job/shards/part-00001-of-00002.jsonl"
    assert cfg.work_dir == "/job/attempts/part-00001-of-00002/B/20261201_000001_123456"
    assert cfg.process[0]["op"] == {"work_dir": cfg.work_dir, "text_key": "text"}
    assert cfg.config[0]._absolute == "/job/attempts/part-00001-of-00002/B/recipe.yaml"
    assert template.work_dir.startswith(first["attempt"])


class OverlappingRunner(FakeRunner):
    """A fake runner with the warm runner's begin/cancel: records what the worker asked."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.begun: list[str] = []
        self.cancelled: list[str] = []
        self._lock = threading.Lock()

    def begin(self, ctx):
        with self._lock:
            self.begun.append(ctx.shard_id)

    def cancel(self, ctx):
        with self._lock:
            self.cancelled.append(ctx.shard_id)


def test_an_overlapping_runner_is_given_the_next_shard_during_the_first_one(make_job):
    job = make_job(rows=40, shards=4)
    runner = OverlappingRunner(delay=0.4)
    assert Worker(job, WorkerOptions(), runner=runner).run() == 0
    assert runner.begun, "the staged shard was begun at once"
    assert runner.begun[0] == "part-00001-of-00004", "claimed ahead during the very first shard"
    assert runner.cancelled == []


def test_a_begun_shard_that_is_handed_back_is_cancelled_in_the_runner(make_job):
    job = make_job(rows=40, shards=4)
    runner = OverlappingRunner(delay=1.0)
    worker = Worker(job, WorkerOptions(), runner=runner)
    threading.Timer(0.6, lambda: worker.request_stop("test drain")).start()
    assert worker.run() != 0
    assert runner.begun and runner.cancelled == runner.begun[-1:], (runner.begun, runner.cancelled)
