"""status: progress, per-node throughput, ETA and stragglers (synthetic histories with known
answers), the documented JSON schema on real jobs mid-run and after, --watch, --prometheus."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from support.fake_worker import worker_command
from support.fakes import FakeRunner
from support.jobs import STATUS_SCHEMA, cli, fast_settings

from elastic_sharding.claims.backups import StragglerRule
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.metrics import job_metrics
from elastic_sharding.observe.snapshot import AttemptView, ShardView, attempt_history
from elastic_sharding.records import CompletionRecord, ShardSpec
from elastic_sharding.vocabulary import ShardState
from elastic_sharding.work.worker import Worker, WorkerOptions

SHARD_BYTES = 1000
SHARD_ROWS = 100


def _spec(i: int, n: int = 10) -> ShardSpec:
    return ShardSpec(
        f"part-{i:05d}-of-{n:05d}", i, f"shards/part-{i:05d}-of-{n:05d}.jsonl", i * 100, SHARD_ROWS, SHARD_BYTES, "0"
    )


def _attempt(i: int, host: str, pid: int, start: float, end: float | None, *, staged: float | None = None, **kw) -> AttemptView:
    values = dict(
        shard_id=_spec(i).shard_id,
        attempt_id=f"a{i}-{host}",
        host=host,
        pid=pid,
        runner="fake",
        started_at=staged if staged is not None else start,
        ended_at=end,
        outcome="succeeded" if end is not None else "running",
        error=None,
        input_rows=SHARD_ROWS,
        input_bytes=SHARD_BYTES,
        output_rows=None,
        phase=None if end is not None else "processing",
        expected_secs=None,
        log=Path("/dev/null"),
    )
    values.update(kw)
    return AttemptView(**values)  # type: ignore[arg-type]


def _views(states: dict[int, str], n: int = 10) -> list[ShardView]:
    return [ShardView(_spec(i, n), states.get(i, ShardState.PENDING), None, None, None, None, 0, None, None) for i in range(n)]


def _completion(i: int, processing_secs: float | None) -> CompletionRecord:
    spec = _spec(i)
    return CompletionRecord(
        spec.shard_id, f"a{i}", "t", "a", 1, SHARD_ROWS, "0", SHARD_ROWS, SHARD_BYTES, "0", 0.0, 1.0, processing_secs
    )  # fmt: skip


def _done_views(processing: list[float | None], running: tuple[int, ...] = (6,)) -> list[ShardView]:
    """Shards 0.. done with these completion records' processing seconds, `running` running."""
    views = _views({i: ShardState.DONE for i in range(len(processing))} | {i: ShardState.RUNNING for i in running})
    for view, secs in zip(views, processing):
        view.completion = _completion(int(view.shard_id[5:10]), secs)
    return views


MEDIAN_10S = [10.0, 10.0, 10.0, 10.0, 20.0, 20.0]  # the median completed shard: 10 s per 1000 B


def _history() -> list[AttemptView]:
    """Worker a/1 does a shard in 10 s (100 B/s) and claimed shard 3 ahead at t=25; worker b/2 needs
    20 s (50 B/s). At t=45 each runs one more shard, 5 s in."""
    return [
        _attempt(0, "a", 1, 0, 10),
        _attempt(1, "a", 1, 10, 20),
        _attempt(2, "a", 1, 20, 30),
        _attempt(3, "a", 1, 30, 40, staged=25),
        _attempt(4, "b", 2, 0, 20),
        _attempt(5, "b", 2, 20, 40),
        _attempt(6, "a", 1, 40, None, expected_secs=10.0),
        _attempt(7, "b", 2, 40, None, expected_secs=20.0),
    ]


def test_eta_is_remaining_bytes_over_the_running_workers_recent_rates():
    views = _views({i: ShardState.DONE for i in range(6)} | {6: ShardState.RUNNING, 7: ShardState.RUNNING})
    m = job_metrics(views, _history(), now=45.0)
    # Remaining: shards 8, 9 whole, 6 half done (5 of 10 s), 7 a quarter (5 of 20 s).
    remaining = 2 * SHARD_BYTES + 0.5 * SHARD_BYTES + 0.75 * SHARD_BYTES
    assert m.bytes_per_sec == pytest.approx(150.0)  # the claimed-ahead wait of shard 3 is not counted
    assert m.eta.secs == pytest.approx(remaining / 150.0)
    assert m.eta.at == pytest.approx(45.0 + remaining / 150.0)
    assert m.rows_per_sec == pytest.approx(15.0)
    assert m.rows_done == 600 and m.percent == pytest.approx(60.0)
    assert m.elapsed_secs == pytest.approx(45.0) and m.overall_rows_per_sec == pytest.approx(600 / 45)
    nodes = {n.host: n for n in m.nodes}
    assert (nodes["a"].shards_done, nodes["a"].rows_per_sec, nodes["a"].active_workers) == (4, pytest.approx(10.0), 1)
    assert (nodes["b"].shards_done, nodes["b"].rows_per_sec) == (2, pytest.approx(5.0))
    assert [r.est_fraction for r in nodes["a"].running + nodes["b"].running] == [pytest.approx(0.5), pytest.approx(0.25)]


def test_a_running_worker_without_a_finished_shard_counts_with_the_mean_rate_in_eta_and_rows_per_sec():
    """a (10 rows/s) and b (5 rows/s) are done and idle; c, on a new node, runs its first shard:
    both the ETA and the job's rows/s now count c at the mean of all workers, so they agree."""
    history = _history()[:6] + [_attempt(6, "c", 3, 40, None)]
    views = _views({i: ShardState.DONE for i in range(6)} | {6: ShardState.RUNNING})
    m = job_metrics(views, history, now=45.0)
    assert m.active_workers == 1
    assert m.rows_per_sec == pytest.approx(7.5) and m.bytes_per_sec == pytest.approx(75.0)
    assert m.eta.secs == pytest.approx(4 * SHARD_BYTES / 75.0)
    assert {n.host: n.rows_per_sec for n in m.nodes}["c"] is None, "a node's own rate is only what it measured"


def test_runtime_start_up_is_left_out_of_a_workers_rate():
    """b's first shard took 40 s, 20 of them starting its warm runtime: b does 1000 B in 20 s."""
    history = _history()
    history[4] = _attempt(4, "b", 2, 0, 40, setup_secs=20.0)
    history[5] = _attempt(5, "b", 2, 40, 60)
    history[7] = _attempt(7, "b", 2, 60, None, expected_secs=20.0)
    views = _views({i: ShardState.DONE for i in range(6)} | {6: ShardState.RUNNING, 7: ShardState.RUNNING})
    m = job_metrics(views, history, now=65.0)
    assert {n.host: n.rows_per_sec for n in m.nodes}["b"] == pytest.approx(5.0)
    # A cold first shard (Ray starting its workers) is slower still; with a warm one to go by it is left out.
    history[4] = _attempt(4, "b", 2, 0, 50, setup_secs=20.0)
    history[5] = _attempt(5, "b", 2, 50, 60)
    history[7] = _attempt(7, "b", 2, 60, None)
    m = job_metrics(views, history, now=65.0)
    assert {n.host: n.rows_per_sec for n in m.nodes}["b"] == pytest.approx(10.0)
    assert job_metrics(views, history[:5] + [_attempt(5, "b", 2, 50, None)], now=55.0).nodes[1].rows_per_sec == pytest.approx(
        100 / 30
    )


def test_eta_in_the_tail_waits_for_the_slowest_running_shard():
    history = _history()[:6] + [
        _attempt(8, "b", 2, 40, None, expected_secs=20.0),
        _attempt(9, "a", 1, 40, None, expected_secs=10.0),
    ]
    views = _views(
        {i: ShardState.DONE for i in range(6)}
        | {6: ShardState.DONE, 7: ShardState.DONE, 8: ShardState.RUNNING, 9: ShardState.RUNNING}
    )
    history[:0] = [_attempt(6, "c", 3, 0, 10), _attempt(7, "c", 3, 10, 20)]
    m = job_metrics(views, history, now=41.0)
    assert m.eta.secs == pytest.approx(19.0)  # b's shard: 20 s expected, 1 s in
    assert "tail" in m.eta.basis


def test_eta_unknown_says_why():
    assert job_metrics(_views({}), [], now=1.0).eta.basis == "no worker is running"
    first = [_attempt(0, "a", 1, 0, None)]
    m = job_metrics(_views({0: ShardState.RUNNING}), first, now=5.0)
    assert m.eta.secs is None and m.eta.basis == "no shard has finished yet"
    m = job_metrics(_views({i: ShardState.DONE for i in range(10)}), [_attempt(i, "a", 1, i, i + 1) for i in range(10)], now=50.0)
    assert (m.eta.secs, m.eta.basis) == (0.0, "complete") and m.elapsed_secs == pytest.approx(10.0)


def test_a_worker_without_a_finished_shard_counts_with_its_nodes_mean_rate():
    history = _history() + [_attempt(8, "a", 9, 44, None)]
    views = _views({i: ShardState.DONE for i in range(6)} | {6: ShardState.RUNNING, 7: ShardState.RUNNING, 8: ShardState.RUNNING})
    m = job_metrics(views, history, now=45.0)
    assert m.active_workers == 3 and m.bytes_per_sec == pytest.approx(250.0)


@pytest.mark.parametrize(
    ("rule", "secs", "straggler"),
    [
        (StragglerRule(), 16.0, True),  # the defaults: over 1.5x the median's 10 s, and 3 s past it
        (StragglerRule(), 15.0, False),
        (StragglerRule(factor=2.0, min_secs=10.0), 20.5, True),
        (StragglerRule(factor=2.0, min_secs=10.0), 19.5, False),
        (StragglerRule(factor=1.0, min_secs=8.0), 17.5, False),  # past 1x, but not 8 s past the median time
        (StragglerRule(factor=1.0, min_secs=8.0), 18.0, True),
    ],
)
def test_straggler_rule_is_the_backup_trigger_with_the_jobs_settings(rule, secs, straggler):
    """The median comes from the completion records' processing seconds (as a worker reads them),
    not from attempt times: here the attempts say 10 s for shards a and 20 s for b's either way."""
    history = _history()[:6] + [_attempt(6, "a", 1, 40, None, phase_secs=secs)]
    m = job_metrics(_done_views(MEDIAN_10S), history, now=40.0 + secs, rule=rule)
    assert m.median_secs_per_byte == pytest.approx(10.0 / SHARD_BYTES)
    assert [r.shard_id for r in m.stragglers] == ([_spec(6).shard_id] if straggler else [])
    if straggler:
        assert m.stragglers[0].factor == pytest.approx(secs / 10.0)
        reason = f"processing for {secs:.0f}s, {secs / 10:.1f}x the median shard's 10.0s for its size"
        assert m.stragglers[0].straggling.reason() == reason


def test_the_median_is_of_the_completion_records_processing_seconds():
    """A shard's whole attempt took 10 s, but it processed for 2 s of it (the rest: verifying,
    starting): 2 s is what a worker compares by, so 5 s of processing straggles."""
    history = _history()[:6] + [_attempt(6, "a", 1, 40, None, phase_secs=5.0)]
    assert [r.shard_id for r in job_metrics(_done_views([2.0] * 6), history, now=45.0).stragglers] == [_spec(6).shard_id]
    # Records without processing seconds (written before backups existed) do not count.
    assert job_metrics(_done_views([2.0, 2.0, None, None, None, None]), history, now=45.0).stragglers == []


def test_with_backups_off_stragglers_are_still_flagged_by_the_default_factor():
    settings = fast_settings(backup_after=0.0, backup_min_secs=1.0)
    rule = StragglerRule.of(settings)
    assert (rule.backs_up, rule.factor, rule.min_secs) == (False, 1.5, 1.0)
    assert StragglerRule.of(fast_settings(backup_after=3.0)).backs_up
    history = _history()[:6] + [_attempt(6, "a", 1, 40, None, phase_secs=16.0)]
    m = job_metrics(_done_views(MEDIAN_10S), history, now=56.0, rule=rule)
    assert [r.shard_id for r in m.stragglers] == [_spec(6).shard_id] and not m.straggler_rule.backs_up


def test_no_stragglers_before_three_shards_finish_or_while_queued():
    history = [_attempt(0, "a", 1, 0, 10), _attempt(1, "a", 1, 10, 20), _attempt(2, "b", 2, 0, None, phase_secs=100.0)]
    assert job_metrics(_done_views([10.0, 10.0], running=(2,)), history, now=100.0).stragglers == []
    history = _history()[:6] + [_attempt(6, "a", 1, 40, None, phase="queued", phase_secs=60.0)]
    assert job_metrics(_done_views(MEDIAN_10S), history, now=100.0).stragglers == []


def test_stragglers_are_judged_by_the_owners_own_clock_with_the_backups_start_up_allowance():
    done = _history()[:6]
    views = _done_views(MEDIAN_10S)
    # Starting its runtime: judged as a worker judges it, once 60 s longer than a processing shard.
    starting = done + [_attempt(6, "a", 1, 40, None, phase="starting warm runtime", phase_secs=75.0)]
    assert job_metrics(views, starting, now=140.0).stragglers == []
    starting = done + [_attempt(6, "a", 1, 40, None, phase="starting warm runtime", phase_secs=80.0)]
    (straggler,) = job_metrics(views, starting, now=140.0).stragglers
    assert straggler.factor == pytest.approx(2.0) and "(60s allowed for starting)" in straggler.straggling.reason()
    # 100 s by this machine's clock, but the owner's heartbeat says 15 s of processing: skew.
    skewed = done + [_attempt(6, "a", 1, 40, None, phase_secs=15.0)]
    assert job_metrics(views, skewed, now=140.0).stragglers == []
    # A heartbeat without its phase's start cannot be judged (a worker does not back it up either).
    assert job_metrics(views, done + [_attempt(6, "a", 1, 40, None)], now=140.0).stragglers == []
    slow = done + [_attempt(6, "a", 1, 40, None, phase_secs=35.0)]
    (straggler,) = job_metrics(views, slow, now=50.0).stragglers
    assert straggler.factor == pytest.approx(3.5)


def test_a_backup_attempt_is_not_judged_unless_the_claim_was_handed_to_it():
    original = _attempt(6, "a", 1, 40, None, phase_secs=12.0)
    backup = _attempt(6, "b", 2, 45, None, phase_secs=40.0, attempt_id="a6-backup", backup_of=original.attempt_id)
    m = job_metrics(_done_views(MEDIAN_10S), _history()[:6] + [original, backup], now=90.0)
    assert m.stragglers == []
    backup.promoted = True
    assert [r.attempt_id for r in job_metrics(_done_views(MEDIAN_10S), _history()[:6] + [backup], now=90.0).stragglers] == [
        "a6-backup"
    ]


def test_a_backup_and_its_original_are_one_running_shard_in_the_eta():
    """Only shard 6 is left: a/1 is 9 s into its 10 s; b/2 started a backup of it 1 s ago and
    expects 20 s. The shard ends with the original, in 1 s: neither the backup's done part nor its
    expected end counts again."""
    history = _history()[:6]
    original = _attempt(6, "a", 1, 40, None, expected_secs=10.0)
    backup = _attempt(6, "b", 2, 48, None, expected_secs=20.0, attempt_id="a6-backup", backup_of=original.attempt_id)
    views = _views({i: ShardState.DONE for i in range(10) if i != 6} | {6: ShardState.RUNNING})
    m = job_metrics(views, history + [original, backup], now=49.0)
    assert m.eta.secs == pytest.approx(1.0) and m.active_workers == 2
    assert [(r.shard_id, r.backup_of) for n in m.nodes for r in n.running] == [
        (original.shard_id, None),
        (original.shard_id, original.attempt_id),
    ]
    (view,) = m.backups
    assert (view.state, view.backup_secs, view.original_secs, view.behind_secs) == ("running", 1.0, 9.0, None)
    assert (m.backup_counts.started, m.backup_counts.running) == (1, 1)


def test_a_beaten_attempt_is_neither_a_completion_nor_a_failure():
    history = _history()[:6]
    original = _attempt(6, "a", 1, 40, 60, outcome="beaten")
    backup = _attempt(6, "b", 2, 45, 50, attempt_id="a6-backup", backup_of=original.attempt_id)
    views = _views({i: ShardState.DONE for i in range(7)})
    with_race = job_metrics(views, history + [original, backup], now=70.0)
    nodes = {n.host: n for n in with_race.nodes}
    assert (nodes["a"].shards_done, nodes["a"].failures, nodes["b"].shards_done) == (4, 0, 3)
    assert nodes["a"].rows_per_sec == pytest.approx(10.0), "a's rate is its completed shards'"
    assert with_race.stragglers == [] and with_race.shards_done == 7
    (view,) = with_race.backups
    assert (view.state, view.original_secs, view.backup_secs, view.behind_secs) == ("won", 20.0, 5.0, 15.0)
    assert view.saved_secs is None and not view.nondeterministic


# -- real jobs (fake processor) --------------------------------------------------------------


def _validate(report: dict) -> None:
    errors = sorted(Draft202012Validator(STATUS_SCHEMA).iter_errors(report), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def _status(job: Path, *extra: str) -> dict:
    proc = cli("status", "--job-dir", str(job), "--json", *extra)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)


def _start_workers(job: Path, delays: list[float]) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            worker_command(job, "--delay", str(delay)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for delay in delays
    ]


def test_status_mid_run_shows_throughput_eta_and_matches_the_schema(make_job):
    job = make_job(rows=120, shards=12, claim_ahead_secs=0.0)
    _validate(_status(job))
    workers = _start_workers(job, [0.4, 0.4, 1.2])
    try:
        mid = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            report = _status(job)
            _validate(report)
            if report["counts"]["done"] >= 4 and report["counts"]["running"] and report["eta"]["secs"] is not None:
                mid = report
                break
            time.sleep(0.1)
        assert mid is not None, "never saw a job mid-run with an ETA"
        assert mid["throughput"]["rows_per_sec"] > 0 and mid["throughput"]["active_workers"] >= 1
        assert 0 < mid["progress"]["percent"] < 100
        assert mid["eta"]["secs"] > 0 and mid["eta"]["at"] > mid["generated_at"]
        assert sum(n["shards_done"] for n in mid["nodes"]) == mid["counts"]["done"]
        assert any(n["running"] for n in mid["nodes"])
        assert all(n["rows_per_sec"] is None or n["rows_per_sec"] > 0 for n in mid["nodes"])
        text = cli("status", "--job-dir", str(job)).stdout
        assert "progress: " in text and "rows/s" in text and "nodes:" in text
        for worker in workers:
            assert worker.wait(timeout=120) == 0
    finally:
        for worker in workers:
            worker.kill()
    done = _status(job)
    _validate(done)
    assert done["complete"] and done["eta"] == {"secs": 0.0, "at": done["eta"]["at"], "basis": "complete"}
    assert done["progress"]["percent"] == 100.0 and done["elapsed_secs"] > 0


def test_failed_shards_name_their_error_and_log_and_stale_claims_are_listed(make_job):
    job = make_job(rows=20, shards=4, max_retries=0)
    broken = "part-00001-of-00004"
    assert Worker(job, WorkerOptions(), runner=FakeRunner(fail=lambda s: s == broken)).run() == 2
    report = _status(job)
    _validate(report)
    (failure,) = report["failures"]
    assert failure["shard_id"] == broken and failure["state"] == "failed"
    assert "fake operator failure" in failure["error"] and Path(failure["log"]).is_file()
    assert report["nodes"][0]["failures"] == 1
    text = cli("status", "--job-dir", str(job)).stdout
    assert f"{broken} last error: fake operator failure (log: {failure['log']})" in text


def test_the_attempt_a_completion_names_succeeded_even_if_its_owner_never_recorded_it(make_job):
    """An owner cut off from the filesystem right after publishing leaves its attempt record at
    `running`; the completion record is the truth."""
    job = make_job(rows=20, shards=2)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    (attempt,) = (job / "attempts" / "part-00000-of-00002").iterdir()
    record = json.loads((attempt / "attempt.json").read_text())
    (attempt / "attempt.json").write_text(json.dumps({**record, "status": "running", "finished_at": None}))
    (attempt / "superseded.json").write_text("{}")  # a takeover racing the repair must not change it either
    layout = JobLayout(job)
    history = [view for view in attempt_history(layout, layout.load_manifest(), 600) if view.shard_id == "part-00000-of-00002"]
    assert [view.outcome for view in history] == ["succeeded"] and not history[0].counts_as_failure
    report = _status(job)
    _validate(report)
    assert report["shards"][0]["failures"] == 0


def test_watch_follows_a_job_to_its_end_in_plain_lines_and_json_lines(make_job):
    job = make_job(rows=40, shards=6)
    workers = _start_workers(job, [0.3, 0.3])
    try:
        plain = cli("status", "--job-dir", str(job), "--watch", "0.2", timeout=120)
        assert plain.returncode == 0, plain.stderr
        lines = plain.stdout.splitlines()
        assert "\x1b[" not in plain.stdout, "no redraw codes when stdout is not a terminal"
        assert sum(line.startswith("  progress: ") for line in lines) >= 2
        assert "6 done" in lines[-1] or any("6 done" in line for line in lines[-8:])
    finally:
        for worker in workers:
            worker.wait(timeout=60)
    follow = cli("status", "--job-dir", str(job), "--watch", "--json", timeout=60)
    (line,) = follow.stdout.splitlines()  # already complete: one object, then exit 0
    assert follow.returncode == 0 and json.loads(line)["complete"]


def _stderr_until(proc: subprocess.Popen, marker: str, timeout: float = 60.0) -> str:
    """The barrier for a process that says on stderr when it is ready: what it wrote up to `marker`
    (read from the pipe's file descriptor, so that `communicate()` gets the rest)."""
    fd, seen = proc.stderr.fileno(), b""
    deadline = time.monotonic() + timeout
    while marker.encode() not in seen:
        if select.select([fd], [], [], 0.1)[0] and (chunk := os.read(fd, 65536)):
            seen += chunk
            continue
        assert proc.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")
    return seen.decode()


def test_watch_started_before_prepare_waits_for_the_job(make_job, tmp_path):
    watch = subprocess.Popen(
        [sys.executable, "-m", "elastic_sharding", "status", "--job-dir", str(tmp_path / "job"), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    waiting = _stderr_until(watch, "waiting for prepare to publish the job")
    job = make_job(rows=20, shards=2)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    out, err = watch.communicate(timeout=60)
    err = waiting + err
    assert watch.returncode == 0, err
    assert "waiting for prepare to publish the job" in err and "2 done" in out


def test_watch_redraws_on_a_terminal_until_the_job_fails(make_job):
    job = make_job(rows=20, shards=2, max_retries=0)
    assert Worker(job, WorkerOptions(), runner=FakeRunner(fail=lambda s: True)).run() == 2
    leader, follower = pty.openpty()
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic_sharding", "status", "--job-dir", str(job), "--watch", "1"],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=30) == 2
    os.close(leader)
    assert b"\x1b[H\x1b[2J" in out and b"1 failed" in out and b"Ctrl-C" in out


_SAMPLE = re.compile(r'^(elastic_shard_[a-z_]+)\{((?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\} (-?[0-9.e+]+)$')


def test_prometheus_textfile_is_complete_and_replaced_atomically(make_job, tmp_path):
    job = make_job(rows=20, shards=4)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    target = tmp_path / "metrics" / "job.prom"
    refused = cli("status", "--job-dir", str(job), "--prometheus", str(target))
    assert refused.returncode == 2 and "does not exist" in refused.stderr
    target.parent.mkdir()
    assert cli("status", "--job-dir", str(job), "--prometheus", str(target)).returncode == 0
    assert os.listdir(target.parent) == ["job.prom"], "no temporary file is left behind"
    samples = {}
    for line in target.read_text().splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) elastic_shard_[a-z_]+ .+$", line), line
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', match.group(2)))
        samples[(match.group(1), labels.get("state") or labels.get("host"))] = float(match.group(3))
    assert samples[("elastic_shard_shards", "done")] == 4 and samples[("elastic_shard_shards", "pending")] == 0
    assert samples[("elastic_shard_rows_done", None)] == samples[("elastic_shard_rows_total", None)] == 20
    assert samples[("elastic_shard_complete", None)] == 1
    (host,) = {h for (name, h) in samples if name == "elastic_shard_host_rows_per_second"}
    assert samples[("elastic_shard_host_shards_done", host)] == 4
