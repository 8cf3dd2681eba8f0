"""Confinement to the job directory: planted symbolic links are never followed, ids read from
records never leave it, and created files get sane modes (fake runner only, fast).

Each planted link points at a copy outside the job directory that would *change the result* if
it were read (a valid record, the real data), so a passing test shows it was not followed; the
outside copy is also checked to be unchanged, so nothing was written through it either.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from support.fakes import FakeRunner
from support.jobs import refused, snapshot
from support.outputs import output_path

import elastic_sharding.work.worker
from elastic_sharding import confined, fsops
from elastic_sharding.claims.heartbeat import read_heartbeat
from elastic_sharding.claims.history import count_failures
from elastic_sharding.claims.protocol import Claims, read_claim
from elastic_sharding.claims.submission import Generation, coordination_root, generations
from elastic_sharding.errors import JobStateError
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.snapshot import job_snapshot
from elastic_sharding.records import (
    AttemptRecord,
    ClaimRecord,
    CompletionRecord,
    FailureRecord,
    Heartbeat,
    PhaseLock,
    decode,
    encode,
    from_dict,
    load,
)
from elastic_sharding.work.worker import Worker, WorkerOptions

S0, S1 = "part-00000-of-00002", "part-00001-of-00002"


pytestmark = pytest.mark.usefixtures("own_log_handlers")


@pytest.fixture
def fake_runner(monkeypatch):
    """The `worker` command (run in-process by run_cli) with the fake runner."""
    runner = FakeRunner()
    monkeypatch.setattr(elastic_sharding.work.worker, "get_runner", lambda name, runtime=None: runner)
    return runner


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


def plant(link: Path, target: Path) -> None:
    """Move what `link` names to `target` (outside), and put a symbolic link to it in its place."""
    if link.exists():
        shutil.move(str(link), str(target))
    link.symlink_to(target)


def only_attempt(job: Path, shard: str) -> Path:
    (attempt,) = (JobLayout(job).attempts_dir(shard)).iterdir()
    return attempt


# -- links planted in state/ ---------------------------------------------------------------------


def test_a_linked_claim_is_unreadable_to_workers_and_status_never_free_never_followed(make_job, outside, run_cli, fake_runner):
    job = make_job(rows=20, shards=2)
    layout = JobLayout(job)
    # Followed, this claim would make the shard terminally failed (worker exit 2, status exit 2).
    foreign = Claims(layout, "elsewhere", 1).try_claim(S0)
    plant(layout.lock(S0), outside / "claim.json")
    (outside / "claim.json").write_bytes(encode(replace(foreign.record, status="failed")))
    before = snapshot(outside)

    with pytest.raises(ValueError, match="symbolic link"):
        read_claim(layout, S0)
    proc = run_cli("worker", "--job-dir", str(job), "--max-shards", "1")
    assert proc.returncode == 0, proc.stderr
    assert fake_runner.calls == [S1], "the linked claim is skipped, not taken as free"
    assert f"unreadable claim of {S0}" in proc.stderr and "symbolic link" in proc.stderr
    assert layout.lock(S0).is_symlink(), "never replaced or taken over"

    status = run_cli("status", "--job-dir", str(job), "--json")
    assert status.returncode == 1, status.stderr
    states = {shard["shard_id"]: shard["state"] for shard in json.loads(status.stdout)["shards"]}
    assert states == {S0: "pending", S1: "done"}
    assert snapshot(outside) == before


def test_a_linked_completion_record_makes_merge_and_verify_refuse(done_job, outside, run_cli, tmp_path):
    layout = JobLayout(done_job)
    plant(layout.done(S0), outside / "done.json")  # the real record: followed, merge would succeed
    before = snapshot(outside)
    refused(
        run_cli("merge", "--job-dir", str(done_job), "--output", str(tmp_path / "m.jsonl")), str(layout.done(S0)), "symbolic link"
    )
    assert not (tmp_path / "m.jsonl").exists()
    refused(run_cli("verify", "--job-dir", str(done_job)), str(layout.done(S0)), "symbolic link")
    status = run_cli("status", "--job-dir", str(done_job))
    assert status.returncode == 0, "the claim says done; status shows the job without following the link"
    assert snapshot(outside) == before


def test_a_linked_state_directory_makes_every_command_refuse(make_job, outside, run_cli, fake_runner):
    job = make_job(rows=20, shards=2)
    layout = JobLayout(job)
    plant(layout.state / "locks", outside / "locks")
    before = snapshot(outside)
    for command in (["worker"], ["status"], ["retry", "--all-failed"], ["verify"], ["merge", "--output", str(outside / "m")]):
        refused(run_cli(*command, "--job-dir", str(job)), str(layout.state / "locks"), "symbolic link")
    assert fake_runner.calls == []
    assert snapshot(outside) == before


# -- links planted in attempts/ ------------------------------------------------------------------


def test_a_linked_shard_output_makes_merge_and_verify_refuse(done_job, outside, run_cli, tmp_path):
    processed = output_path(done_job, orjson.loads(JobLayout(done_job).done(S1).read_bytes()))
    assert processed.parent == only_attempt(done_job, S1) and processed.is_file()
    plant(processed, outside / processed.name)  # identical content: followed, both would pass
    before = snapshot(outside)
    refused(
        run_cli("merge", "--job-dir", str(done_job), "--output", str(tmp_path / "m.jsonl")), S1, str(processed), "symbolic link"
    )
    refused(run_cli("verify", "--job-dir", str(done_job)), S1, str(processed), "symbolic link")
    assert snapshot(outside) == before


def test_a_linked_attempt_dir_makes_merge_and_verify_refuse(done_job, outside, run_cli, tmp_path):
    attempt = only_attempt(done_job, S0)
    plant(attempt, outside / attempt.name)
    before = snapshot(outside)
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(tmp_path / "m.jsonl")), str(attempt), "symbolic link")
    refused(run_cli("verify", "--job-dir", str(done_job)), str(attempt), "symbolic link")
    assert snapshot(outside) == before


def test_a_linked_attempts_dir_of_a_finished_shard(done_job, outside, run_cli, tmp_path):
    attempts = JobLayout(done_job).attempts_dir(S0)
    plant(attempts, outside / S0)
    before = snapshot(outside)
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(tmp_path / "m.jsonl")), str(attempts), "symbolic link")
    refused(run_cli("verify", "--job-dir", str(done_job)), str(attempts), "symbolic link")
    status = run_cli("status", "--job-dir", str(done_job), "--json")
    assert status.returncode == 0 and "symbolic link" in status.stderr, "status shows the job and warns"
    assert {s["shard_id"]: s["attempts"] for s in json.loads(status.stdout)["shards"]} == {S0: 0, S1: 1}
    assert snapshot(outside) == before


def test_a_worker_never_creates_attempts_through_a_linked_attempts_dir(make_job, outside, run_cli, fake_runner):
    job = make_job(rows=20, shards=2)
    layout = JobLayout(job)
    layout.attempts_dir(S0).symlink_to(outside, target_is_directory=True)
    proc = run_cli("worker", "--job-dir", str(job))
    refused(proc, str(layout.attempts_dir(S0)), "symbolic link")
    assert fake_runner.calls == [] and list(outside.iterdir()) == []
    assert not confined.lexists(layout.lock(S0)), "the claim was handed back, not left to go stale"


def test_a_stale_claim_is_never_taken_over_through_a_linked_attempts_dir(make_job, outside, tmp_path):
    job = make_job(rows=20, shards=2)
    layout = JobLayout(job)
    stale = Claims(layout, "gone", 1).try_claim(S0)
    layout.attempts_dir(S0).symlink_to(outside, target_is_directory=True)
    assert read_heartbeat(layout.attempt_dir(S0, stale.attempt_id)) is None
    with pytest.raises(confined.LinkRefused):
        Claims(layout, "me", 2).take_over(stale.record, 10.0)
    assert list(outside.iterdir()) == [], "no superseded marker written through the link"


def test_linked_or_misnamed_entries_in_an_attempts_dir_are_skipped(make_job, outside, run_cli, fake_runner):
    job = make_job(rows=20, shards=2, max_retries=1)
    layout = JobLayout(job)
    attempts = layout.attempts_dir(S0)
    attempts.mkdir()
    # Two failed attempts outside: counted, they would make S0 terminally failed (max_retries=1).
    for n in range(2):
        attempt_id = f"20240101T00000{n}Z-elsewhere-0000000{n}"
        record = AttemptRecord(S0, attempt_id, "a" * 32, "elsewhere", 1, "fake", 0.0, status="failed", error="planted")
        target = outside / attempt_id
        target.mkdir()
        (target / "attempt.json").write_bytes(encode(record))
        (attempts / attempt_id).symlink_to(target, target_is_directory=True)
    (attempts / "not-an-attempt").mkdir()
    before = snapshot(outside)
    assert count_failures(layout, S0) == (0, None, None)
    proc = run_cli("worker", "--job-dir", str(job))
    assert proc.returncode == 0, proc.stderr
    assert sorted(fake_runner.calls) == [S0, S1]
    assert "not an attempt directory" in proc.stderr
    _, attempts_seen = job_snapshot(layout, layout.load_manifest(), 60.0)
    assert [a.error for a in attempts_seen if a.shard_id == S0] == [None]
    assert snapshot(outside) == before


def test_a_linked_heartbeat_reads_as_no_heartbeat(make_job, outside, run_cli):
    job = make_job(rows=20, shards=2)
    layout = JobLayout(job)
    claim = Claims(layout, "elsewhere", 1).try_claim(S0)
    fsops.replace_atomic(layout.lock(S0), encode(replace(claim.record, claimed_at=time.time() - 100)))
    attempt = layout.attempt_dir(S0, claim.attempt_id)
    attempt.mkdir(parents=True)
    # A fresh heartbeat of this very claim: followed, the shard would look running, not stale.
    (outside / "heartbeat.json").write_bytes(encode(Heartbeat(claim.token, 7, time.time(), "processing", 1)))
    attempt_files(attempt)["heartbeat"].symlink_to(outside / "heartbeat.json")
    assert read_heartbeat(attempt) is None
    status = run_cli("status", "--job-dir", str(job), "--json")
    states = {shard["shard_id"]: shard["state"] for shard in json.loads(status.stdout)["shards"]}
    assert states[S0] == "stale"


class LinkingRunner(FakeRunner):
    """Leaves its output (or one part of it) as a symbolic link to a valid copy outside."""

    def __init__(self, outside: Path, whole: bool):
        super().__init__()
        self.outside, self.whole = outside, whole

    def run(self, ctx) -> None:
        super().run(ctx)
        if self.whole:
            plant(ctx.ray_output, self.outside / f"{ctx.shard_id}-output")
        else:
            part = sorted(ctx.ray_output.iterdir())[0]
            plant(part, self.outside / f"{ctx.shard_id}-{part.name}")


@pytest.mark.parametrize("whole", [True, False], ids=["output-dir", "part-file"])
def test_a_linked_runner_output_fails_the_attempt(make_job, outside, whole):
    job = make_job(rows=20, shards=2, max_retries=0)
    runner = LinkingRunner(outside, whole)
    assert Worker(job, WorkerOptions(), runner=runner).run() == 2
    failed = load(FailureRecord, JobLayout(job).failed(S0))
    assert "symbolic link" in failed.last_error and "output" in failed.last_error


# -- shards/ and the job's own files ----------------------------------------------------------------


def test_a_linked_shard_input_fails_its_attempts(make_job, outside, run_cli, fake_runner):
    job = make_job(rows=20, shards=2, max_retries=1)
    layout = JobLayout(job)
    plant(layout.shard_input(S0), outside / "input.jsonl")  # the real shard: its sha256 matches
    before = snapshot(outside)
    proc = run_cli("worker", "--job-dir", str(job))
    assert proc.returncode == 2
    assert fake_runner.calls == [], "the linked input never reached the engine (and S0 failing first ends the worker)"
    failed = load(FailureRecord, layout.failed(S0))
    assert failed.failures == 2 and "cannot read shard input" in failed.last_error and "symbolic link" in failed.last_error
    assert snapshot(outside) == before


@pytest.mark.parametrize("name", ["manifest.json", "recipe.yaml"])
def test_a_linked_manifest_or_recipe_is_refused(make_job, outside, run_cli, fake_runner, name):
    job = make_job(rows=20, shards=2)
    plant(job / name, outside / name)  # the real file: followed, every command would work
    before = snapshot(outside)
    commands = [["worker"]]
    if name == "manifest.json":
        commands += [["status"], ["retry", "--all-failed"], ["verify"], ["merge", "--output", str(outside / "m")]]
    for command in commands:
        refused(run_cli(*command, "--job-dir", str(job)), str(job / name), "symbolic link")
    assert fake_runner.calls == []
    assert snapshot(outside) == before


def test_a_linked_merged_output_is_never_verified_nor_written_through(done_job, outside, run_cli):
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(done_job / "merged.jsonl")).returncode == 0
    merged = done_job / "merged.jsonl"
    plant(merged, outside / "merged.jsonl")  # the real merge: followed, verify would pass
    before = snapshot(outside)
    refused(run_cli("verify", "--job-dir", str(done_job)), str(merged), "symbolic link")
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(merged)), "already exists")
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(merged), "--overwrite").returncode == 0
    assert not merged.is_symlink(), "--overwrite replaces the link itself"
    assert snapshot(outside) == before
    assert run_cli("verify", "--job-dir", str(done_job)).returncode == 0


def test_a_linked_merge_record_is_refused(done_job, outside, run_cli):
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(done_job / "merged.jsonl")).returncode == 0
    plant(JobLayout(done_job).merge_record, outside / "merge.json")
    refused(run_cli("verify", "--job-dir", str(done_job)), "merge.json", "symbolic link")


def test_history_links_are_skipped_by_status(done_job, outside, run_cli):
    layout = JobLayout(done_job)
    archived = outside / "20240101T000000Z-00000000" / S0 / "attempts"
    shutil.copytree(only_attempt(done_job, S0).parent, archived)
    (layout.history / "20240101T000000Z-00000000").symlink_to(archived.parent.parent, target_is_directory=True)
    _, attempts = job_snapshot(layout, layout.load_manifest(), 60.0)
    assert [a.archive for a in attempts] == [None, None]
    assert run_cli("status", "--job-dir", str(done_job)).returncode == 0


def test_linked_coordination_directories_are_never_followed(make_job, outside):
    job = make_job(rows=20, shards=2)
    gen = Generation(job, "run-1")
    gen.open()
    real = coordination_root(job)
    shutil.move(str(real), str(outside / "coordination"))
    real.symlink_to(outside / "coordination", target_is_directory=True)
    assert generations(job) == [], "status never reads through the link"
    with pytest.raises(confined.LinkRefused):
        Generation(job, "run-1").open()
    real.unlink()
    gen = Generation(job, "run-2")
    gen.open()
    (real / "0123456789abcdef").symlink_to(outside / "coordination" / gen.root.name, target_is_directory=True)
    assert [run["run_id"] for run in generations(job)] == ["run-2"]


# -- ids read from records -------------------------------------------------------------------------

HOSTILE_IDS = ["..", "../../outside", "/etc/passwd", "20240101T000000Z-host-00000000/../..", "a/b", ""]


@pytest.mark.parametrize("value", HOSTILE_IDS)
def test_records_with_path_like_ids_or_tokens_are_refused(value):
    claim = {"shard_id": S0, "token": "a" * 32, "attempt_id": "20240101T000000Z-host-00000000", "host": "h", "pid": 1}
    claim["claimed_at"] = 0.0
    from_dict(ClaimRecord, claim)
    for field in ("shard_id", "token", "attempt_id"):
        with pytest.raises(ValueError, match=f"{field}: .* is not a valid"):
            from_dict(ClaimRecord, {**claim, field: value})
    failure = {"shard_id": S0, "failures": 1, "last_attempt_id": value, "last_error": "x", "host": "h", "at": 0.0}
    with pytest.raises(ValueError, match="last_attempt_id"):
        from_dict(FailureRecord, failure)
    lock = {"run_id": "r", "phase": "prepare", "token": value, "host": "h", "pid": 1, "acquired_at": 0.0}
    with pytest.raises(ValueError, match="token"):
        from_dict(PhaseLock, lock)
    if "/" in value or not value:  # a suffix without "/" stays inside state/stale_locks whatever it is
        with pytest.raises(JobStateError, match="not a valid"):
            JobLayout(Path("/job")).stale_lock(S0, value)


def test_a_claim_naming_an_attempt_outside_is_unreadable_not_followed(make_job, outside, run_cli, fake_runner):
    job = make_job(rows=20, shards=2)
    layout = JobLayout(job)
    hostile = {"shard_id": S0, "token": "b" * 32, "attempt_id": f"../../../{outside.name}", "host": "h", "pid": 1}
    layout.lock(S0).write_bytes(orjson.dumps({**hostile, "claimed_at": time.time()}))
    proc = run_cli("worker", "--job-dir", str(job), "--max-shards", "1")
    assert proc.returncode == 0 and fake_runner.calls == [S1], proc.stderr
    assert "is not a valid attempt id" in proc.stderr
    assert list(outside.iterdir()) == []


def test_a_completion_naming_an_attempt_outside_is_refused_by_merge(done_job, outside, run_cli, tmp_path):
    layout = JobLayout(done_job)
    record = orjson.loads(layout.done(S0).read_bytes())
    shutil.copytree(only_attempt(done_job, S0), outside / "attempt")
    fsops.replace_atomic(layout.done(S0), orjson.dumps({**record, "attempt_id": "../../outside/attempt"}))
    with pytest.raises(ValueError, match="attempt_id"):
        decode(CompletionRecord, layout.done(S0).read_bytes(), "done.json")
    refused(run_cli("merge", "--job-dir", str(done_job), "--output", str(tmp_path / "m.jsonl")), "not a valid attempt id")


# -- the job directory itself may be a link ----------------------------------------------------------


def test_a_job_dir_given_through_a_symbolic_link_works(make_job, tmp_path, run_cli, fake_runner):
    """Users put jobs on big disks and link to them: only links planted inside a job are refused."""
    job = make_job(rows=20, shards=2)
    link = tmp_path / "job-link"
    link.symlink_to(job, target_is_directory=True)
    assert run_cli("worker", "--job-dir", str(link)).returncode == 0
    assert run_cli("status", "--job-dir", str(link)).returncode == 0
    assert run_cli("merge", "--job-dir", str(link), "--output", str(link / "merged.jsonl")).returncode == 0
    assert run_cli("verify", "--job-dir", str(link)).returncode == 0
    assert (job / "merged.jsonl").is_file()


# -- permissions -------------------------------------------------------------------------------------


@pytest.fixture
def umask():
    previous = os.umask(0o022)
    os.umask(previous)

    def set_umask(value: int) -> None:
        os.umask(value)

    yield set_umask
    os.umask(previous)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("mask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_created_files_and_dirs_follow_the_umask(make_job, tmp_path, run_cli, umask, mask):
    """0644/0755 under umask 022; group-writable 0664/0775 under a group-shared 002."""
    umask(mask)
    job = make_job(rows=20, shards=2, max_retries=1)
    runner = FakeRunner(fail=lambda shard: shard == S0)
    assert Worker(job, WorkerOptions(), runner=runner).run() == 2
    assert run_cli("retry", "--job-dir", str(job), "--all-failed").returncode == 0
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    assert run_cli("merge", "--job-dir", str(job), "--output", str(job / "merged.jsonl")).returncode == 0
    assert run_cli("status", "--job-dir", str(job), "--prometheus", str(tmp_path / "job.prom")).returncode == 0
    assert run_cli("report", "--job-dir", str(job), "--output", str(tmp_path / "report.html")).returncode == 0
    found = {**modes(job), "job.prom": modes(tmp_path)["job.prom"], "report.html": modes(tmp_path)["report.html"]}
    assert {"state/history", "merged.jsonl", "merge.json"} <= set(found)
    for name, mode in found.items():
        expected = 0o775 & ~mask if (job / name).is_dir() else 0o664 & ~mask
        assert mode == expected, f"{name}: {mode:o} under umask {mask:03o}"


def test_nothing_the_tool_writes_is_world_writable_even_under_umask_000(done_job, tmp_path, run_cli, umask):
    umask(0)
    scratch = tmp_path / "scratch"
    fsops.ensure_dir(scratch)
    assert fsops.make_dir_exclusive(scratch / "exclusive")
    fsops.publish_once(scratch / "once.json", b"{}")
    fsops.replace_atomic(scratch / "replaced.json", b"{}")
    with fsops.atomic_output(scratch / "large.jsonl") as out:
        out.file.write(b"{}\n")
        out.commit()
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(scratch / "merged.jsonl")).returncode == 0
    assert run_cli("status", "--job-dir", str(done_job), "--prometheus", str(scratch / "job.prom")).returncode == 0
    assert run_cli("report", "--job-dir", str(done_job), "--output", str(scratch / "report.html")).returncode == 0
    found = modes(scratch)
    assert len(found) == 8
    for name, mode in found.items():
        assert mode == (0o775 if (scratch / name).is_dir() else 0o664), f"{name}: {mode:o}"
    assert stat.S_IMODE(JobLayout(done_job).merge_record.stat().st_mode) == 0o664
    prepared = tmp_path / "prepared-under-000"
    recipe = next(done_job.parent.glob("*.yaml"), None) or (done_job / "recipe.yaml")
    assert run_cli("prepare", "--config", str(recipe), "--job-dir", str(prepared), "--num-shards", "2").returncode == 0
    for name, mode in modes(prepared).items():
        assert mode == (0o775 if (prepared / name).is_dir() else 0o664), f"prepare wrote {name} as {mode:o}"
