"""The claim/lease protocol (docs/design/protocol.md, P1-P6) with the fake runner and real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from support.fakes import FakeRunner
from support.jobs import wait_until_ready

from elastic_sharding import confined
from elastic_sharding.claims.heartbeat import HeartbeatThread
from elastic_sharding.claims.history import count_failures
from elastic_sharding.claims.protocol import Claims, read_claim
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.records import CompletionRecord
from elastic_sharding.work.worker import Worker, WorkerOptions

RACER = r"""
import json, sys, time
from pathlib import Path
from elastic_sharding.layout import JobLayout
from elastic_sharding.claims.protocol import Claims
job, go, index = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
layout = JobLayout(job)
ids = [s.shard_id for s in layout.load_manifest().shards]
claims = Claims(layout, host=f"racer{index}", pid=1000 + index)
(go.parent / f"ready-{index}").touch()  # at the start line: the parent says go once all 16 are here
while not go.exists():
    time.sleep(0.001)
won = [shard for shard in ids if claims.try_claim(shard) is not None]
print(json.dumps(won))
"""


def test_sixteen_processes_race_for_every_claim_and_each_shard_has_one_winner(make_job, tmp_path):
    job = make_job(rows=60, shards=30)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", RACER, str(job), str(go), str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(16)
    ]
    wait_until_ready([tmp_path / f"ready-{i}" for i in range(16)], *procs, timeout=120)
    go.touch()
    won = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    flat = [shard for shards in won for shard in shards]
    assert sorted(flat) == sorted(s.shard_id for s in JobLayout(job).load_manifest().shards)
    assert len(flat) == len(set(flat)) == 30


def _claim_with_attempt_dir(layout: JobLayout, shard: str, host: str) -> tuple[Claims, object]:
    claims = Claims(layout, host=host, pid=4242)
    claim = claims.try_claim(shard)
    assert claim is not None
    layout.attempt_dir(shard, claim.attempt_id).mkdir(parents=True)
    return claims, claim


def test_dead_claim_is_taken_over_after_one_observed_lease_and_old_owner_is_fenced(make_job):
    job = make_job(rows=4, shards=1)
    layout = JobLayout(job)
    shard = "part-00000-of-00001"
    old_claims, old = _claim_with_attempt_dir(layout, shard, "crashed-node")
    worker = Worker(job, WorkerOptions(lock_timeout_secs=0.4, heartbeat_interval_secs=0.1), runner=FakeRunner())
    claim, _ = worker.scan()
    assert claim is None, "a claim must be watched for a whole lease before takeover"
    time.sleep(0.5)
    claim, _ = worker.scan()
    assert claim is not None and claim.shard_id == shard and claim.token != old.token
    assert attempt_files(layout.attempt_dir(shard, old.attempt_id))["superseded"].exists()
    assert not old_claims.owns(old)
    record = CompletionRecord(shard, old.attempt_id, old.token, "crashed-node", 1, 4, "x", 0, 0, "x", 0.0, 0.0)
    assert old_claims.publish_completion(old, record) is False
    assert not layout.done(shard).exists()
    assert count_failures(layout, shard)[0] == 1


def test_live_heartbeat_is_never_taken_over_however_long_it_runs(make_job):
    job = make_job(rows=4, shards=1)
    layout = JobLayout(job)
    claims, claim = _claim_with_attempt_dir(layout, "part-00000-of-00001", "busy-node")
    beat = HeartbeatThread(claims, claim, layout.attempt_dir(claim.shard_id, claim.attempt_id), 0.1, 1.0, on_lost=lambda r: None)
    beat.beat()
    beat.start()
    try:
        worker = Worker(job, WorkerOptions(lock_timeout_secs=1.0, heartbeat_interval_secs=0.1), runner=FakeRunner())
        deadline = time.monotonic() + 4.0  # four leases
        while time.monotonic() < deadline:
            assert worker.scan()[0] is None
            time.sleep(0.02)
        assert claims.owns(claim)
    finally:
        beat.stop()


def test_owner_notices_lost_claim_at_next_heartbeat(make_job):
    job = make_job(rows=4, shards=1)
    layout = JobLayout(job)
    claims, claim = _claim_with_attempt_dir(layout, "part-00000-of-00001", "slow-node")
    lost: list[str] = []
    beat = HeartbeatThread(claims, claim, layout.attempt_dir(claim.shard_id, claim.attempt_id), 0.05, 10, on_lost=lost.append)
    beat.start()
    thief = Claims(layout, host="other", pid=7)
    assert thief.take_over(read_claim(layout, claim.shard_id), 99.0)
    assert thief.try_claim(claim.shard_id) is not None
    deadline = time.monotonic() + 2
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.stop()
    assert lost and "superseded" in lost[0]
    assert not claims.finish(claim, "done")


def test_takeover_does_not_remove_a_claim_it_did_not_judge(make_job):
    job = make_job(rows=4, shards=1)
    layout = JobLayout(job)
    _, first = _claim_with_attempt_dir(layout, "part-00000-of-00001", "a")
    judged = read_claim(layout, first.shard_id)
    rival = Claims(layout, host="b", pid=2)
    assert rival.take_over(judged, 1.0)
    newer = rival.try_claim(first.shard_id)
    late = Claims(layout, host="c", pid=3)
    assert late.take_over(judged, 1.0) is False, "the stale claim was already replaced by a live one"
    assert read_claim(layout, first.shard_id).token == newer.token


def test_a_late_takeover_on_a_caching_client_removes_nothing_it_did_not_judge(make_job, monkeypatch):
    """Fault matrix seed 84113, trial 82: a client whose name cache still maps the lock to the
    dead claim renames the new claim away (the server goes by name) and reads the moved name
    through its cache as the dead record. The token check after the rename cannot catch that;
    the removal ticket decides before anything moves."""
    job = make_job(rows=4, shards=1)
    layout = JobLayout(job)
    _, dead = _claim_with_attempt_dir(layout, "part-00000-of-00001", "a")
    judged = read_claim(layout, dead.shard_id)
    stale_bytes = layout.lock(dead.shard_id).read_bytes()
    rival = Claims(layout, host="b", pid=2)
    assert rival.take_over(judged, 1.0)
    newer = rival.try_claim(dead.shard_id)
    real_read = confined.read_bytes_nofollow

    def cached_read(path):
        return stale_bytes if path.parent == layout.state / "stale_locks" and ".stale-" in path.name else real_read(path)

    monkeypatch.setattr(confined, "read_bytes_nofollow", cached_read)
    late = Claims(layout, host="c", pid=3)
    assert late.take_over(judged, 1.0) is False, "a second takeover of one dead claim"
    monkeypatch.undo()
    assert read_claim(layout, dead.shard_id).token == newer.token


def test_finished_shard_stays_done_even_without_its_done_record(make_job):
    job = make_job(rows=8, shards=2)
    layout = JobLayout(job)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    assert read_claim(layout, "part-00000-of-00002").status == "done"
    layout.done("part-00000-of-00002").rename(job / "hidden.json")  # a stale negative lookup
    runner = FakeRunner()
    assert Worker(job, WorkerOptions(), runner=runner).run() == 0
    assert runner.calls == []


def test_attempt_ids_are_safe_path_names_for_any_hostname():
    from elastic_sharding.claims.protocol import new_attempt_id, new_token
    from elastic_sharding.records import ATTEMPT_ID_RE

    for host in ["node-a", "节点", "a b/../c", "x" * 300, ""]:
        attempt_id = new_attempt_id(host, new_token())
        assert ATTEMPT_ID_RE.match(attempt_id) and "/" not in attempt_id and ".." not in attempt_id.split("-")
