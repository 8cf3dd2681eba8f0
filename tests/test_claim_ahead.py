"""Claim-ahead: the next shard is claimed and staged while the current one runs, never more than
one ahead, within --max-shards, and handed back at once when the worker stops or the job fails."""

from __future__ import annotations

import json
import threading
import time

from support.fakes import FakeRunner

from elastic_sharding.claims.protocol import Claims
from elastic_sharding.work.worker import Worker, WorkerOptions


def _records(job) -> list[dict]:
    records = [json.loads(p.read_text()) for p in job.glob("attempts/*/*/attempt.json")]
    return sorted(records, key=lambda r: r["started_at"])


def _overlaps(records: list[dict]) -> int:
    """How many attempts were claimed before the previous one finished."""
    return sum(1 for prev, nxt in zip(records, records[1:]) if nxt["started_at"] < prev["finished_at"])


def test_next_shard_is_staged_while_the_current_one_runs(make_job):
    job = make_job(rows=40, shards=5, lock_timeout_secs=4.0, claim_ahead_secs=10.0)
    runner = FakeRunner(delay=0.3)
    assert Worker(job, WorkerOptions(), runner=runner).run() == 0
    records = _records(job)
    assert [r["status"] for r in records] == ["succeeded"] * 5
    assert runner.calls == sorted(runner.calls)
    # No rate is known during the first shard; from the second on, the next one is staged early.
    assert _overlaps(records) == 3
    locks = list((job / "state" / "locks").glob("*.json"))
    assert len(locks) == 5 and all(json.loads(p.read_text())["status"] == "done" for p in locks)


def test_claim_ahead_can_be_turned_off(make_job):
    job = make_job(rows=40, shards=4, lock_timeout_secs=4.0, claim_ahead_secs=0.0)
    assert Worker(job, WorkerOptions(), runner=FakeRunner(delay=0.2)).run() == 0
    assert _overlaps(_records(job)) == 0


def test_claim_ahead_never_exceeds_max_shards(make_job):
    job = make_job(rows=40, shards=6, lock_timeout_secs=4.0)
    worker = Worker(job, WorkerOptions(max_shards=3), runner=FakeRunner(delay=0.2))
    assert worker.run() == 0
    records = _records(job)
    assert len(records) == 3 and all(r["status"] == "succeeded" for r in records)
    assert _overlaps(records) >= 1


def _run_until_staged(worker: Worker) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()))
    thread.start()
    deadline = time.monotonic() + 30
    while worker.staged is None:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    return thread, result


def test_stop_hands_back_the_running_and_the_staged_shard(make_job):
    job = make_job(rows=40, shards=6, lock_timeout_secs=4.0)
    worker = Worker(job, WorkerOptions(), runner=FakeRunner(delay=0.5))
    thread, result = _run_until_staged(worker)
    staged = worker.staged.claim.shard_id
    worker.request_stop("test says stop")
    thread.join(30)
    assert result == [2]
    assert not list((job / "state" / "locks").glob(f"{staged}.json"))
    by_shard = {r["shard_id"]: r for r in _records(job)}
    assert by_shard[staged]["status"] == "interrupted"
    assert all(r["status"] in ("succeeded", "interrupted") for r in by_shard.values())
    # Handed back, not failed: a new worker finishes the job with no failure counted.
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    report = [json.loads(p.read_text()) for p in (job / "state" / "done").glob("*.json")]
    assert len(report) == 6


def test_a_terminal_failure_hands_back_the_staged_shard(make_job):
    job = make_job(rows=40, shards=4, lock_timeout_secs=4.0, max_retries=0)
    failing = "part-00002-of-00004"
    worker = Worker(job, WorkerOptions(), runner=FakeRunner(delay=0.3, fail=lambda shard: shard == failing))
    assert worker.run() == 2
    records = {r["shard_id"]: r["status"] for r in _records(job)}
    assert records[failing] == "failed"
    assert records.get("part-00003-of-00004") in (None, "interrupted")
    assert not (job / "state" / "locks" / "part-00003-of-00004.json").exists()


def test_nothing_is_claimed_ahead_once_fewer_shards_are_pending_than_workers_are_busy(make_job):
    job = make_job(rows=40, shards=4, lock_timeout_secs=4.0)
    worker = Worker(job, WorkerOptions(), runner=FakeRunner())
    others = Claims(worker.layout, "other-host", 1)
    assert not worker._in_the_tail()
    for n in range(2):
        assert others.try_claim(f"part-0000{n}-of-00004") is not None
    assert not worker._in_the_tail()  # 2 pending, 2 busy
    assert others.try_claim("part-00002-of-00004") is not None
    assert worker._in_the_tail()  # 1 pending, 3 busy: an idle worker would take it sooner
