"""Backup attempts (the claim state machine, with the fast fake processor in real processes):
an idle worker backs up a straggling shard, the first valid publish wins, the loser stops at
once and publishes nothing; the claim's owner of record marks it done. Also the retry rules
around them and a node that keeps failing for reasons of its own.

The real Data-Juicer + Ray runs are in test_backups_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fake_worker import worker_command
from support.fakes import FakeRunner
from support.jobs import fast_settings

from elastic_sharding.claims.history import count_failures
from elastic_sharding.claims.protocol import Claims, read_claim
from elastic_sharding.layout import PROCESSED_NAMES, JobLayout
from elastic_sharding.records import CompletionRecord, encode
from elastic_sharding.work.worker import Worker, WorkerOptions

REPO = Path(__file__).resolve().parents[1]
SHARDS = 6
LAST = f"part-{SHARDS - 1:05d}-of-{SHARDS:05d}"
# Backups as soon as a shard runs 1.5x the median and 0.5 s past it; a lease no stall reaches.
BACKUPS = dict(
    lock_timeout_secs=20.0,
    heartbeat_interval_secs=0.2,
    poll_interval_secs=0.1,
    backup_after=1.5,
    backup_min_secs=0.5,
    max_retries=2,
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}


def _start(job: Path, log: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen(worker_command(job, *options), env=_env(), stdout=subprocess.DEVNULL, stderr=log.open("wb"))


def _await(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _attempts(job: Path, shard_id: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((job / "attempts" / shard_id).glob("*/attempt.json"))]


def _claim(job: Path, shard_id: str) -> dict:
    return json.loads((job / "state" / "locks" / f"{shard_id}.json").read_text())


def _done(job: Path, shard_id: str) -> dict:
    return json.loads((job / "state" / "done" / f"{shard_id}.json").read_text())


def _merged_rows(job: Path, tmp_path: Path) -> list[bytes]:
    out = tmp_path / "merged.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_sharding", "merge", "--job-dir", str(job), "--output", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes().splitlines()


def _straggle(job: Path, tmp_path: Path, slow_secs: float, backer: tuple[str, ...]) -> tuple[int, int, float, str, str]:
    """Worker A runs every shard, its last one `slow_secs`; worker B (options `backer`) joins once
    A holds the last shard, finds nothing to claim and backs it up. Returns both exit codes, A's
    wall time from B's start, and both logs."""
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    procs = [_start(job, a_log, "--delay", "0.15", "--shard-delay", f"{LAST}={slow_secs}")]
    try:
        _await(lambda: (job / "state" / "locks" / f"{LAST}.json").exists(), what="A to claim the last shard")
        joined = time.monotonic()
        procs.append(_start(job, b_log, *backer))
        b_code = procs[1].wait(timeout=120)
        a_code = procs[0].wait(timeout=120)
        a_secs = time.monotonic() - joined
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return a_code, b_code, a_secs, a_log.read_text(), b_log.read_text()


def test_a_straggling_shard_is_backed_up_and_the_backup_wins(make_job, tmp_path):
    job = make_job(rows=60, shards=SHARDS, **BACKUPS)
    a_code, b_code, a_secs, a_log, b_log = _straggle(job, tmp_path, 60.0, ("--delay", "0.15"))
    assert (a_code, b_code) == (0, 0), a_log + b_log
    assert a_secs < 20, f"the slow attempt was not stopped when the backup won ({a_secs:.0f}s)\n{a_log}"
    attempts = {a["attempt_id"]: a for a in _attempts(job, LAST)}
    backup = next(a for a in attempts.values() if a["backup_of"])
    original = attempts[backup["backup_of"]]
    assert backup["status"] == "succeeded" and original["status"] == "beaten", attempts
    assert _done(job, LAST)["attempt_id"] == backup["attempt_id"]
    # The owner of record marked its claim done; nothing of the slow attempt remains.
    claim = _claim(job, LAST)
    assert claim["status"] == "done" and claim["attempt_id"] == original["attempt_id"]
    original_dir = job / "attempts" / LAST / original["attempt_id"]
    assert not any((original_dir / name).exists() for name in (*PROCESSED_NAMES.values(), "ray-output.jsonl"))
    assert count_failures(JobLayout(job), LAST)[0] == 0
    records = list((job / "state" / "backups").glob(f"{LAST}.*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["attempt_id"] == backup["attempt_id"]
    assert "starting a backup attempt" in b_log and "the backup attempt" in b_log
    rows = _merged_rows(job, tmp_path)
    assert [json.loads(r)["id"] for r in rows] == list(range(60))


def test_the_original_wins_and_the_backup_leaves_no_trace(make_job, tmp_path):
    job = make_job(rows=60, shards=SHARDS, **BACKUPS)
    # B is slow at everything: its backup starts (it has no shard of its own to judge it by) and
    # loses to the original, which ends after 4 s.
    a_code, b_code, _, a_log, b_log = _straggle(job, tmp_path, 4.0, ("--delay", "60"))
    assert (a_code, b_code) == (0, 0), a_log + b_log
    attempts = _attempts(job, LAST)
    backup = next(a for a in attempts if a["backup_of"])
    original = next(a for a in attempts if not a["backup_of"])
    assert original["status"] == "succeeded" and backup["status"] == "beaten"
    assert _done(job, LAST)["attempt_id"] == original["attempt_id"]
    assert _claim(job, LAST)["attempt_id"] == original["attempt_id"]
    backup_dir = job / "attempts" / LAST / backup["attempt_id"]
    assert not any((backup_dir / name).exists() for name in (*PROCESSED_NAMES.values(), "ray-output.jsonl"))
    assert count_failures(JobLayout(job), LAST)[0] == 0


def test_a_failed_original_hands_its_claim_to_the_backup(make_job, tmp_path):
    """The original fails (after the backup started): its failure counts, but the shard is not
    claimed afresh; the backup becomes the claim's own attempt and marks it done itself."""
    job = make_job(rows=60, shards=SHARDS, **BACKUPS)
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = _start(job, a_log, "--delay", "0.15", "--shard-delay", f"{LAST}=5", "--fail-shard", LAST, "--max-shards", str(SHARDS))
    _await(lambda: (job / "state" / "locks" / f"{LAST}.json").exists(), what="A to claim the last shard")
    b = _start(job, b_log, "--delay", "8")
    try:
        assert b.wait(timeout=120) == 0, b_log.read_text()
        assert a.wait(timeout=120) == 0, a_log.read_text()
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
    attempts = _attempts(job, LAST)
    backup = next(x for x in attempts if x["backup_of"])
    original = next(x for x in attempts if not x["backup_of"])
    assert original["status"] == "failed" and backup["status"] == "succeeded"
    claim = _claim(job, LAST)
    assert claim["status"] == "done" and claim["attempt_id"] == backup["attempt_id"]
    assert _done(job, LAST)["attempt_id"] == backup["attempt_id"]
    assert count_failures(JobLayout(job), LAST)[0] == 1
    assert "handed the claim to its backup attempt" in a_log.read_text()


def test_a_failed_backup_does_not_count_and_the_original_goes_on(make_job, tmp_path):
    job = make_job(rows=60, shards=SHARDS, **BACKUPS)
    a_code, b_code, _, a_log, b_log = _straggle(job, tmp_path, 4.0, ("--delay", "0.15", "--fail-shard", LAST))
    assert (a_code, b_code) == (0, 0), a_log + b_log
    attempts = _attempts(job, LAST)
    backup = next(a for a in attempts if a["backup_of"])
    assert backup["status"] == "failed" and not backup["promoted"]
    assert _done(job, LAST)["attempt_id"] == next(a for a in attempts if not a["backup_of"])["attempt_id"]
    assert count_failures(JobLayout(job), LAST)[0] == 0
    assert "goes on" in b_log


def test_backups_can_be_switched_off_per_worker(make_job, tmp_path):
    job = make_job(rows=60, shards=SHARDS, **BACKUPS)
    a_code, b_code, _, a_log, b_log = _straggle(job, tmp_path, 3.0, ("--delay", "0.15", "--backup-after", "0"))
    assert (a_code, b_code) == (0, 0), a_log + b_log
    assert all(not a["backup_of"] for a in _attempts(job, LAST))
    assert not list((job / "state" / "backups").iterdir())


class _OtherPublishesFirst(FakeRunner):
    """Both attempts finish within one heartbeat: while this one runs, the other attempt of the
    last shard (a backup) publishes its completion; this one's publish must then be refused."""

    def __init__(self, job: Path, output_sha256: str | None):
        super().__init__(delay=0.05)
        self.job = job
        self.output_sha256 = output_sha256

    def run(self, ctx) -> None:
        super().run(ctx)
        if ctx.shard_id != LAST:
            return
        layout = JobLayout(self.job)
        claim = read_claim(layout, LAST)
        backup = Claims(layout, "other-node", 4242).try_backup(claim, "a test's straggler")
        processed = (ctx.ray_output / "a_000000.json").read_bytes() + (ctx.ray_output / "b_000001.json").read_bytes()
        completion = CompletionRecord(
            shard_id=LAST,
            attempt_id=backup.attempt_id,
            token=backup.token,
            host="other-node",
            pid=4242,
            input_rows=10,
            input_sha256="0" * 64,
            output_rows=len(processed.splitlines()),
            output_bytes=len(processed),
            output_sha256=self.output_sha256 or "",
            started_at=time.time(),
            finished_at=time.time(),
        )
        assert Claims(layout, "other-node", 4242).publish_completion(backup, completion)


@pytest.mark.parametrize("same_output", [True, False])
@pytest.mark.usefixtures("own_log_handlers")  # caplog sees the package's records only while they propagate
def test_both_finish_at_once_exactly_one_completion(make_job, tmp_path, caplog, same_output):
    job = make_job(rows=60, shards=SHARDS, heartbeat_interval_secs=5.0, lock_timeout_secs=20.0)
    # A clean run of the same job gives the digest the other attempt reports (or a different one).
    clean = make_job(rows=60, shards=SHARDS, name="clean")
    assert Worker(clean, WorkerOptions(), runner=FakeRunner()).run() == 0
    digest = _done(clean, LAST)["output_sha256"] if same_output else "f" * 64
    assert Worker(job, WorkerOptions(), runner=_OtherPublishesFirst(job, digest)).run() == 0
    done = _done(job, LAST)
    assert done["host"] == "other-node"
    mine = next(a for a in _attempts(job, LAST) if a["host"] != "other-node")
    assert mine["status"] == "beaten" and mine["output_sha256"] == _done(clean, LAST)["output_sha256"]
    assert _claim(job, LAST)["status"] == "done"
    assert ("NOT DETERMINISTIC" in caplog.text) is (not same_output)


def _on_host(monkeypatch, host: str, job: Path, runner: FakeRunner, **options) -> int:
    with monkeypatch.context() as patch:
        patch.setattr("socket.gethostname", lambda: host)
        return Worker(job, WorkerOptions(**options), runner=runner).run()


def test_a_node_that_keeps_failing_for_its_own_reasons_stops_claiming(make_job, monkeypatch):
    """Once another node took part in the job: its two node-local failures hit two different
    shards (it leaves a failed one to others), it stops claiming with a refusal status shows, and
    a healthy worker finishes the job."""
    job = make_job(rows=50, shards=5, **{**BACKUPS, "max_retries": 1})
    assert _on_host(monkeypatch, "healthy-node", job, FakeRunner(), max_shards=1) == 0
    sick = Worker(job, WorkerOptions(), runner=FakeRunner(fail=lambda shard: True, node_local=True))
    assert sick.run() == 2
    failed = [a for shard in (job / "attempts").iterdir() for a in _attempts(job, shard.name) if a["status"] != "succeeded"]
    assert len(failed) == 2 and len({a["shard_id"] for a in failed}) == 2
    assert all(a["status"] == "failed" and a["node_local"] for a in failed)
    refusal = json.loads(next((job / "refusals").glob("*.json")).read_text())
    assert refusal["reason"] == "node-local failures" and "stops claiming" in refusal["message"]
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    assert not list((job / "refusals").glob("*.json"))


def test_a_worker_alone_in_its_job_goes_on_after_node_local_failures(make_job):
    """Nobody else would take the shards: it retries (as before), and a passing fault lets the job end."""
    job = make_job(rows=40, shards=4, **{**BACKUPS, "max_retries": 3})
    broken = {"part-00000-of-00004", "part-00001-of-00004", "part-00002-of-00004"}
    runner = FakeRunner(fail=lambda shard: shard in broken and not broken.discard(shard), node_local=True)
    assert Worker(job, WorkerOptions(), runner=runner).run() == 0
    assert not list(job.glob("refusals/*.json"))
    assert runner.calls.count("part-00000-of-00004") == 2


def test_a_failure_of_the_shard_is_retried_by_the_same_node(make_job):
    """Only node-local failures are left to other nodes: a shard's own failure is retried at once."""
    job = make_job(rows=20, shards=2, **{**BACKUPS, "max_retries": 1})
    runner = FakeRunner(fail=lambda shard: shard.startswith("part-00000"))
    assert Worker(job, WorkerOptions(), runner=runner).run() == 2
    assert runner.calls.count("part-00000-of-00002") == 2


def test_backup_settings_are_validated(make_job):
    for bad in (dict(backup_after=0.5), dict(backup_share=0.0), dict(backup_min_secs=-1.0)):
        with pytest.raises(Exception, match="--backup"):
            make_job(rows=10, shards=1, name="bad", **bad)
    assert fast_settings().backup_after == 1.5
    encode(fast_settings())
