"""Crashes, stalls and corruption, with the fake runner in real worker processes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import orjson
from support.fakes import FakeRunner
from support.jobs import cli, sample_rows, wait_until_ready
from support.processes import fake_worker, wait_for

from elastic_sharding.claims.protocol import read_claim
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.work.worker import Worker, WorkerOptions

SHARD = "part-00000-of-00001"


def merged(job: Path, tmp_path: Path) -> list[dict]:
    out = tmp_path / "merged.jsonl"
    cli("merge", "--job-dir", str(job), "--output", str(out), "--overwrite", check=True)
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def test_killed_worker_shard_is_taken_over_after_one_lease(make_job, tmp_path):
    job = make_job(rows=10, shards=1, lock_timeout_secs=1.0, heartbeat_interval_secs=0.1)
    layout = JobLayout(job)
    victim = fake_worker(job, "--delay", "60")
    wait_for(lambda: read_claim(layout, SHARD) is not None)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    started = time.monotonic()
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    assert time.monotonic() - started >= 1.0, "takeover must wait one whole lease"
    assert merged(job, tmp_path) == sample_rows(10)
    attempts = sorted(layout.attempts_dir(SHARD).iterdir())
    assert len(attempts) == 2
    assert [attempt_files(a)["superseded"].exists() for a in attempts].count(True) == 1


def test_stopped_worker_is_fenced_when_it_resumes(make_job, tmp_path):
    """P3: SIGSTOP a worker past its lease; another finishes the shard; the first, resumed,
    must not publish and must stop its work."""
    job = make_job(rows=10, shards=1, lock_timeout_secs=1.0, heartbeat_interval_secs=0.1)
    layout = JobLayout(job)
    processing = tmp_path / "processing"
    stalled = fake_worker(job, "--delay", "3", "--ready-file", str(processing))
    wait_until_ready(processing, stalled)
    first = read_claim(layout, SHARD)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    _, err = stalled.communicate(timeout=30)
    assert stalled.returncode == 0, err
    done = json.loads(layout.done(SHARD).read_text())
    assert done["token"] != first.token, "the stalled worker's attempt must not be the published one"
    record = json.loads((layout.attempt_dir(SHARD, first.attempt_id) / "attempt.json").read_text())
    assert record["status"] == "fenced", record
    assert "lost claim" in err
    assert merged(job, tmp_path) == sample_rows(10)


def test_long_shard_with_heartbeats_is_never_taken_over(make_job):
    job = make_job(rows=10, shards=1, lock_timeout_secs=1.0, heartbeat_interval_secs=0.1)
    slow = fake_worker(job, "--delay", "4")  # four leases
    wait_for(lambda: read_claim(JobLayout(job), SHARD) is not None)
    observer = Worker(job, WorkerOptions(), runner=FakeRunner())
    while slow.poll() is None:
        assert observer.scan()[0] is None
        time.sleep(0.05)
    assert slow.returncode == 0
    assert len(list(JobLayout(job).attempts_dir(SHARD).iterdir())) == 1


def test_corrupt_shard_input_fails_attempts_not_the_merge(make_job):
    job = make_job(rows=20, shards=2, max_retries=1)
    layout = JobLayout(job)
    path = layout.shard_input("part-00001-of-00002")
    path.write_bytes(path.read_bytes().replace(b"sample", b"SAMPLE", 1))
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 2
    report = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    failed = [s for s in report["shards"] if s["state"] == "failed"]
    assert len(failed) == 1 and "is corrupt: sha256" in failed[0]["last_error"]


def test_modified_job_recipe_stops_the_worker_and_hands_the_shard_back(make_job):
    job = make_job(rows=10, shards=1)
    layout = JobLayout(job)
    layout.recipe.write_text(layout.recipe.read_text() + "\n# edited\n")
    proc = cli("worker", "--job-dir", str(job))
    assert proc.returncode == 2 and "modified after prepare" in proc.stderr
    assert read_claim(layout, SHARD) is None


def test_status_estimates_stale_claims_from_recorded_heartbeats(make_job):
    job = make_job(rows=10, shards=1, lock_timeout_secs=1.0, heartbeat_interval_secs=0.1)
    victim = fake_worker(job, "--delay", "60")
    wait_for(lambda: read_claim(JobLayout(job), SHARD) is not None)
    running = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert running["shards"][0]["state"] == "running" and running["shards"][0]["host"]
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    time.sleep(1.2)
    proc = cli("status", "--job-dir", str(job))
    assert proc.returncode == 1 and "1 stale" in proc.stdout
    assert "0 stale" in cli("status", "--job-dir", str(job), "--lock-timeout-secs", "600").stdout


def test_owner_dying_between_publish_and_terminal_claim_is_repaired(make_job):
    job = make_job(rows=10, shards=1, lock_timeout_secs=0.3, heartbeat_interval_secs=0.05)
    layout = JobLayout(job)
    worker = Worker(job, WorkerOptions(max_shards=1), runner=FakeRunner())
    worker.claims.finish = lambda claim, status: False  # "dies" right after publishing
    assert worker.run() == 0
    assert read_claim(layout, SHARD).status == "running" and layout.done(SHARD).exists()
    repair = FakeRunner()
    assert Worker(job, WorkerOptions(), runner=repair).run() == 0
    assert repair.calls == [] and read_claim(layout, SHARD).status == "done"
    (attempt,) = layout.attempts_dir(SHARD).iterdir()
    assert json.loads((attempt / "attempt.json").read_text())["status"] == "succeeded", "the published attempt succeeded"
    assert not attempt_files(attempt)["superseded"].exists(), "the attempt whose output merge uses is not superseded"
