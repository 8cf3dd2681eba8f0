"""Bookkeeping that does not grow with the shard count: what prepare decodes per write unit, and
what a claim costs in filesystem metadata operations, counted (never timed) at two shard counts.

The timed figures at 1,000 and 20,000 shards are `bench/run --only many_shards`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.jobs import fast_settings, sample_rows, write_jsonl

from elastic_sharding.claims.protocol import Claims
from elastic_sharding.claims.takeover import TAIL_WINDOW, ShardScanner
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.prepare.plan import UNIT_BYTES_ENV
from elastic_sharding.records import PrepareCuts, PreparePlan, codec
from elastic_sharding.vocabulary import ClaimStatus
from elastic_sharding.work.worker import Worker, WorkerOptions

RECIPE = "dataset_path: {dataset}\nprocess:\n  - whitespace_normalization_mapper:\n"


def _prepare(tmp_path: Path, shards: int) -> Path:
    dataset = write_jsonl(tmp_path / f"in-{shards}.jsonl", sample_rows(2 * shards))
    recipe = tmp_path / f"r-{shards}.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    job = tmp_path / f"job-{shards}"
    prepare(PrepareRequest(recipe, None, job, shards, fast_settings(), procs=1), quiet=True)
    return job


@pytest.mark.parametrize("shards", [40, 400])
def test_prepare_decodes_the_cut_once_whatever_the_shard_count(tmp_path, monkeypatch, shards):
    """One process: every write unit and the final unit need the cut, which grows with the shard
    count; decoding it per unit made prepare quadratic (issue 29). Tiny shards also share write
    units."""
    decoded: Counter = Counter()
    real = codec.from_dict

    def counting(cls, data, where="record"):
        decoded[cls.__name__] += 1
        return real(cls, data, where)

    monkeypatch.setattr(codec, "from_dict", counting)
    job = _prepare(tmp_path, shards)
    assert len(JobLayout(job).load_manifest().shards) == shards
    assert decoded[PrepareCuts.__name__] == 1, decoded


class MetadataOps:
    """Counts the filesystem metadata operations this process makes under `root`: opens,
    renames, links, removals, directory creations (audit events), stats, and every directory
    entry a listing returns (a listing of 20,000 claims is 20,000 entries' work on a NAS)."""

    EVENTS = ("open", "os.rename", "os.link", "os.remove", "os.rmdir", "os.mkdir", "os.symlink")

    def __init__(self, root: Path):
        self.root = str(root)
        self.count = 0
        self.on = False

    def _under(self, path) -> bool:
        return isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith(self.root)

    def audit(self, event: str, args: tuple) -> None:
        if self.on and event in self.EVENTS and args and self._under(args[0]):
            self.count += 1

    @contextmanager
    def counting(self, monkeypatch):
        real_stat, real_lstat, real_listdir, real_scandir = os.stat, os.lstat, os.listdir, os.scandir

        def stat(path, *a, **k):
            self.count += self.on and self._under(path)
            return real_stat(path, *a, **k)

        def lstat(path, *a, **k):
            self.count += self.on and self._under(path)
            return real_lstat(path, *a, **k)

        def listdir(path=".", *a, **k):
            names = real_listdir(path, *a, **k)
            if self.on and (self._under(path) or isinstance(path, int)):
                self.count += 1 + len(names)
            return names

        def scandir(path=".", *a, **k):
            entries = list(real_scandir(path, *a, **k))
            if self.on and (self._under(path) or isinstance(path, int)):
                self.count += 1 + len(entries)
            return _Entries(entries)

        for name, fn in (("stat", stat), ("lstat", lstat), ("listdir", listdir), ("scandir", scandir)):
            monkeypatch.setattr(os, name, fn)
        self.on = True
        try:
            yield self
        finally:
            self.on = False


class _Entries(list):
    """A listing that is also the context manager `os.scandir` returns."""

    def __enter__(self):
        return iter(self)

    def __exit__(self, *exc):
        return False

    def close(self) -> None:
        """Nothing is held open."""


_HOOKED: list[MetadataOps] = []


def _ops_for(root: Path) -> MetadataOps:
    """Audit hooks cannot be removed: one is installed per session and pointed at each test's counter."""
    ops = MetadataOps(root)
    if not _HOOKED:
        sys.addaudithook(lambda event, args: _HOOKED[-1].audit(event, args))
    _HOOKED.append(ops)
    return ops


def _ops_per_claim(job: Path, monkeypatch) -> float:
    """A worker and another claimer take turns over the whole job: the worker's pass, its
    claim-ahead decision, and the terminal status of each shard it claimed, per claim."""
    worker = Worker(job, WorkerOptions(), runner=FakeRunner())
    layout = worker.layout
    ids = [spec.shard_id for spec in worker.manifest.shards]
    other = ShardScanner(layout, ids, Claims(layout, "other-host", 1), 60.0, 1, lambda shard: None)
    ops = _ops_for(layout.root)
    claims = 0
    with ops.counting(monkeypatch):
        while True:
            theirs, _ = other.next_claim()
            if theirs is not None:
                other.claims.finish(theirs, ClaimStatus.DONE)
            mine, _ = worker.scan()
            if mine is None:
                break
            claims += 1
            worker._in_the_tail()
            worker.claims.finish(mine, ClaimStatus.DONE)
    assert claims >= len(ids) // 2 - 1
    return ops.count / claims


def test_a_claim_costs_the_same_metadata_operations_at_any_shard_count(tmp_path, monkeypatch):
    """Far from the end of the job, a claim reads what it claims and what other workers run now,
    never a listing of every claim (issue 29: claims/s halved from 2,000 to 20,000 shards)."""
    small = _ops_per_claim(_prepare(tmp_path, 40), monkeypatch)
    large = _ops_per_claim(_prepare(tmp_path, 400), monkeypatch)
    assert large <= small * 1.25, f"{small:.1f} metadata operations per claim at 40 shards, {large:.1f} at 400"


def _ops_per_claim_among(job: Path, others: int, monkeypatch) -> float:
    """`others` workers on other hosts and this one take turns, each holding one running claim
    (finishing it at its next turn, as a busy node does): this worker's metadata operations per
    claim in the body of the job (its first pass, which reads every claim it has not seen, and the
    tail are left out). Between two of its claims `others` shards were claimed: the number that
    grows with the node count. The launchers' lease (600 s)."""
    worker = Worker(job, WorkerOptions(lock_timeout_secs=600.0), runner=FakeRunner())
    layout = worker.layout
    ids = [spec.shard_id for spec in worker.manifest.shards]
    peers = [ShardScanner(layout, ids, Claims(layout, f"node{k}", 1), 600.0, 1, lambda shard: None) for k in range(others)]
    held: dict[int, object] = {}
    ops = _ops_for(layout.root)
    claims = 0
    body_ends = len(ids) - TAIL_WINDOW - 2 * (others + 1)
    with ops.counting(monkeypatch):
        while True:
            ops.on = False
            for k, peer in enumerate(peers):
                if held.get(k) is not None:
                    peer.claims.finish(held[k], ClaimStatus.DONE)
                held[k], _ = peer.next_claim()
            ops.on = 0 < worker.scanner.position < body_ends
            mine, _ = worker.scan()
            if mine is None or worker.scanner.position >= body_ends:
                break
            claims += ops.on
            worker._in_the_tail()
            worker.claims.finish(mine, ClaimStatus.DONE)
    assert claims >= body_ends // (others + 1) - 2
    return ops.count / claims


def test_a_claim_costs_about_the_same_metadata_operations_among_many_busy_workers(tmp_path, monkeypatch):
    """Between two claims of one worker, every other worker claimed a shard: reading each of
    those claims (and its heartbeat) made a claim cost O(nodes) reads, so the filesystem's load
    per shard grew with the node count (issue 44). The search past the frontier reads O(log nodes)."""
    job = _prepare(tmp_path, 800)
    again = shutil.copytree(job, tmp_path / "again", symlinks=True)
    few = _ops_per_claim_among(job, 3, monkeypatch)
    many = _ops_per_claim_among(again, 31, monkeypatch)
    assert many <= few * 1.3, f"{few:.1f} metadata operations per claim among 4 workers, {many:.1f} among 32"


def test_an_idle_worker_polls_with_one_stat_and_sees_every_change(tmp_path, monkeypatch):
    """Nothing is claimable: a poll costs one stat of the claims directory, not a read of every
    running claim and its heartbeat (a 64-node job at its tail or at a stage barrier polled
    O(nodes²) reads a second, issue 44); a claim handed back or finished is still seen at once."""
    job = _prepare(tmp_path, 40)
    worker = Worker(job, WorkerOptions(lock_timeout_secs=600.0), runner=FakeRunner())
    others = Claims(worker.layout, "other-host", 1)
    held = [others.try_claim(spec.shard_id) for spec in worker.manifest.shards]
    assert all(held)
    assert worker.scan() == (None, [])  # the first pass reads them all
    ops = _ops_for(worker.layout.root)
    with ops.counting(monkeypatch):
        for _ in range(10):
            assert worker.scan() == (None, [])
            assert worker.backups.pick() is None
    assert ops.count <= 10, f"{ops.count} metadata operations in 10 idle polls"
    others.finish(held[3], ClaimStatus.DONE)  # a change: the next poll passes over them again
    opened = _ops_for(worker.layout.locks_dir)
    opened.EVENTS = ("open",)
    opened.on = True
    assert worker.scan() == (None, [])
    opened.on = False
    assert opened.count <= 2, f"{opened.count} claims opened again; only the one that changed should be"
    assert worker.scanner.terminal.get(held[3].shard_id) == ClaimStatus.DONE
    others.release(held[7])
    mine, _ = worker.scan()
    assert mine is not None and mine.shard_id == held[7].shard_id
    worker.claims.finish(mine, ClaimStatus.DONE)
    for claim in held[:3] + held[4:7] + held[8:]:
        others.finish(claim, ClaimStatus.DONE)
    assert worker.scan() == (None, [])
    assert worker.scanner.all_terminal()


def test_workers_passing_over_a_finished_job_together_start_at_different_blocks(tmp_path):
    """At the end of a job every worker runs out of work at once and passes over every claim to
    learn that it is done; in manifest order they read the same blocks at the same time, before any
    of them publishes a done-block marker (nodes x shards reads, issue 44). A pass visits the blocks
    wholly behind its frontier in a random order, each shard exactly once, and the rest in order."""
    job = _prepare(tmp_path, 700)
    layout = JobLayout(job)
    ids = [spec.shard_id for spec in layout.load_manifest().shards]
    claims = Claims(layout, "other-host", 1)
    for shard_id in ids:
        claims.finish(claims.try_claim(shard_id), ClaimStatus.DONE)
    orders = []
    for k in range(8):
        scanner = ShardScanner(layout, ids, Claims(layout, f"node{k}", 1), 600.0, 1, lambda shard: None)
        scanner._first, scanner._frontier = 70, 650  # blocks 1 to 9 are wholly behind the frontier
        order = list(scanner._pass_order())
        assert sorted(order) == list(range(70, 700)), "every shard from the first non-terminal one, once"
        assert order[-60:] == list(range(640, 700)), "past the last whole block, in order"
        orders.append(order)
    assert len({order[0] for order in orders}) > 1, "the passes start at different blocks"
    assert all(order[0] % 64 == 0 or order[0] == 70 for order in orders)
    scanner = ShardScanner(layout, ids, Claims(layout, "late", 1), 600.0, 1, lambda shard: None)
    scanner._frontier = len(ids)  # it found nothing left past its frontier: the end-of-job pass
    assert scanner.next_claim() == (None, [])
    assert scanner.all_terminal() and scanner._first == len(ids), "the next pass starts past every terminal shard"


@pytest.mark.parametrize("point", ["prepare-write@2", "prepare-write-done@1"])
def test_a_write_unit_of_several_shards_is_taken_over_whole(tmp_path, point):
    """Tiny shards share write units; a participant killed inside one (before its work, or after
    writing every shard of it but before its result) costs that unit, and the job is the one a
    single process writes."""
    rows = sample_rows(600)
    dataset = write_jsonl(tmp_path / "in.jsonl", rows)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    env = {**os.environ, UNIT_BYTES_ENV: "2048"}

    def start(job: Path, **extra: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "elastic_sharding", "prepare", "--config", str(recipe), "--job-dir", str(job)]
        argv += ["--num-shards", "60", "--prepare-procs", "1", "--lock-timeout-secs", "2", "--poll-interval-secs", "0.05"]
        return subprocess.Popen(argv, env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    reference = start(tmp_path / "ref")
    assert reference.wait(timeout=120) == 0, reference.stderr.read()
    job = tmp_path / "job"
    victim = start(job, ELASTIC_SHARD_CRASH_AT=point)
    assert victim.wait(timeout=120) == -9
    recorded = codec.decode(PreparePlan, (tmp_path / ".job.preparing" / "plan.json").read_bytes(), "plan")
    assert 1 < recorded.shards_per_write < 60  # several shards per write unit, several units
    survivor = start(job)
    _, err = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, err

    def shards(root: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted((root / "shards").iterdir())}

    assert shards(job) == shards(tmp_path / "ref")
    manifest, expected = JobLayout(job).load_manifest(), JobLayout(tmp_path / "ref").load_manifest()
    assert [dataclasses.astuple(s) for s in manifest.shards] == [dataclasses.astuple(s) for s in expected.shards]
    assert not (tmp_path / ".job.preparing").exists()
