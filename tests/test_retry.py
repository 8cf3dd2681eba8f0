"""`retry` (fake runner): a shard the retry limit made terminally failed is archived and pending
again, and the job completes; bad ids, finished shards and shards with an active claim are
refused."""

from __future__ import annotations

import json

from support.fakes import FakeRunner
from support.jobs import cli, merged_rows, run, sample_rows

from elastic_sharding.claims.protocol import read_claim
from elastic_sharding.layout import JobLayout


def test_retry_limit_then_terminal_failure_then_retry(make_job, tmp_path):
    job = make_job(rows=20, shards=4, max_retries=1)
    bad = "part-00001-of-00004"
    runner = FakeRunner(fail=lambda shard: shard == bad)
    assert run(job, runner) == 2
    assert runner.calls.count(bad) == 2, "max_retries=1 allows two attempts"
    layout = JobLayout(job)
    assert read_claim(layout, bad).status == "failed"
    status = cli("status", "--job-dir", str(job), "--json")
    assert status.returncode == 2
    report = json.loads(status.stdout)
    failed = [s for s in report["shards"] if s["state"] == "failed"]
    assert [s["shard_id"] for s in failed] == [bad] and failed[0]["last_error"] == "fake operator failure"
    text = cli("status", "--job-dir", str(job))
    assert "fake operator failure" in text.stdout and "process.log" in text.stdout
    # A worker started on a failed job exits 2 at once, claiming nothing.
    idle = FakeRunner()
    assert run(job, idle) == 2 and idle.calls == []

    assert cli("retry", "--job-dir", str(job), "--all-failed").returncode == 0
    history = list(layout.history.glob(f"*/{bad}"))
    assert len(history) == 1 and len(list((history[0] / "attempts").iterdir())) == 2
    assert (history[0] / "failed.json").exists() and (history[0] / "lock.json").exists()
    assert cli("status", "--job-dir", str(job)).returncode == 1
    assert run(job) == 0
    assert merged_rows(job, tmp_path / "out.jsonl") == sample_rows(20)


def test_retry_refuses_bad_ids_done_and_running_shards(make_job):
    job = make_job(rows=10, shards=2)
    layout = JobLayout(job)
    assert run(job, max_shards=1) == 0
    cases = {
        ("--shard-id", "../../etc"): "is not a shard id",
        ("--shard-id", "part-00009-of-00002"): "not a shard of this job",
        ("--shard-id", "part-00000-of-00002"): "already done",
        (): "exactly one of",
        ("--all-failed", "--shard-id", "part-00001-of-00002"): "exactly one of",
    }
    for args, message in cases.items():
        proc = cli("retry", "--job-dir", str(job), *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    from elastic_sharding.claims.protocol import Claims

    Claims(layout, host="busy", pid=1).try_claim("part-00001-of-00002")
    proc = cli("retry", "--job-dir", str(job), "--shard-id", "part-00001-of-00002")
    assert proc.returncode == 2 and "active claim" in proc.stderr
