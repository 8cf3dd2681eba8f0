"""The HTML job report: a real job (fake runner) with a retry and a takeover, rendered and opened in Chromium."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from support.browser import needs_chromium, open_report
from support.fakes import FakeRunner
from support.jobs import SIMPLE_RECIPE, fast_settings, sample_rows, write_jsonl

from elastic_sharding import fsops
from elastic_sharding.claims.protocol import Claims
from elastic_sharding.errors import UsageError
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.html_report import render_report, write_report
from elastic_sharding.observe.snapshot import AttemptView, attempt_history
from elastic_sharding.observe.status import Status
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.records import AttemptRecord, Heartbeat, encode
from elastic_sharding.work.worker import Worker, WorkerOptions

HOSTILE = "<img src=x onerror=alert(1)>"


def _crashed_claim(layout: JobLayout, shard_id: str) -> None:
    """A worker on a hostile-named host claims, beats once and dies: a later worker takes it over."""
    claims = Claims(layout, host=HOSTILE, pid=4242)
    claim = claims.try_claim(shard_id)
    assert claim is not None
    attempt_dir = layout.attempt_dir(shard_id, claim.attempt_id)
    attempt_dir.mkdir(parents=True)
    files = attempt_files(attempt_dir)
    record = AttemptRecord(shard_id, claim.attempt_id, claim.token, HOSTILE, 4242, "fake", time.time(), input_rows=1)
    fsops.replace_atomic(files["record"], encode(record))
    time.sleep(0.3)
    fsops.replace_atomic(files["heartbeat"], encode(Heartbeat(claim.token, 1, time.time(), "processing", 4242)))


def _fails_once(shard_id: str):
    lock, failed = threading.Lock(), []

    def fail(shard: str) -> bool:
        with lock:
            if shard == shard_id and not failed:
                failed.append(shard)
                return True
            return False

    return fail


def _run_workers(job: Path, hosts: list[str], fail) -> list[int]:
    """Workers as threads, each posing as its own node, so the timeline has one lane per host."""
    codes: list[int] = []

    def run(host: str) -> None:
        worker = Worker(job, WorkerOptions(), runner=FakeRunner(delay=0.25, fail=fail))
        worker.host = host
        worker.claims = Claims(worker.layout, host, os.getpid())
        codes.append(worker.run())

    threads = [threading.Thread(target=run, args=(host,)) for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return codes


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """8 shards on two nodes: one fails once and succeeds on retry, one is taken over from a dead node."""
    root = tmp_path_factory.mktemp("timeline")
    dataset = write_jsonl(root / "input.jsonl", sample_rows(80))
    recipe = root / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=dataset))
    job = root / "job"
    settings = fast_settings(lock_timeout_secs=0.6, heartbeat_interval_secs=0.1, max_retries=1)
    prepare(PrepareRequest(recipe, None, job, 8, settings))
    layout = JobLayout(job)
    shards = [spec.shard_id for spec in layout.load_manifest().shards]
    _crashed_claim(layout, shards[0])
    assert _run_workers(job, ["node-a", "node-b"], _fails_once(shards[3])) == [0, 0]
    return job


def _history(job: Path) -> tuple[dict, list[AttemptView], float]:
    status = Status(job)
    now = time.time()
    return status.as_json(), attempt_history(status.layout, status.manifest, status.lock_timeout, now), now


def _bars(page: str) -> list[str]:
    return re.findall(r'<rect class="attempt [^>]*>', page)


def _view(shard: str, attempt: str, host: str, outcome: str, start: float, end: float | None, **extra) -> AttemptView:
    values = dict(
        shard_id=shard,
        attempt_id=attempt,
        host=host,
        pid=7,
        runner="fake",
        started_at=start,
        ended_at=end,
        outcome=outcome,
        error=None,
        input_rows=10,
        input_bytes=1000,
        output_rows=None if end is None else 10,
        phase="processing" if end is None else None,
        expected_secs=None,
        log=Path(f"/job/attempts/{shard}/{attempt}/process.log"),
    )
    values.update(extra)
    return AttemptView(**values)


def test_real_job_shows_every_attempt_with_its_retry_and_takeover(job):
    status, attempts, now = _history(job)
    outcomes = sorted(view.outcome for view in attempts)
    assert outcomes.count("superseded") == 1 and outcomes.count("failed") == 1
    assert outcomes.count("succeeded") == 8 and set(outcomes) <= {"succeeded", "failed", "superseded", "interrupted"}
    page = render_report(status, attempts, now)
    bars = _bars(page)
    assert len(bars) == len(attempts) == page.count('class="attempt ')
    kinds = [re.search(r'data-kind="(\w+)"', bar) for bar in bars]
    later = len(attempts) - len({view.shard_id for view in attempts})
    assert len([k for k in kinds if k]) == later == page.count('<path class="handoff ')
    takeover = next(bar for bar in bars if 'data-kind="takeover"' in bar)
    assert 'data-shard="part-00000-of-00008"' in takeover and "outcome-succeeded" in takeover
    retry = next(bar for bar in bars if 'data-kind="retry"' in bar)
    assert 'data-shard="part-00003-of-00008"' in retry
    assert "(takeover of an earlier attempt)" in page and "(retry of an earlier attempt)" in page
    lanes = re.findall(r'<text class="lane-label"[^>]*>([^<]*)<', page)
    assert lanes == sorted(lanes) and {"node-a", "node-b"} <= set(lanes)
    assert "fake operator failure" in page and str(job) in page


def test_hostile_record_text_is_escaped_everywhere(job):
    status, attempts, now = _history(job)
    error = "</script><script>alert(2)</script><!--"
    attempts.append(_view("part-00001-of-00008", "x-evil", HOSTILE, "failed", now - 1, now, error=error))
    status["failures"] = [{"shard_id": "part-00001-of-00008", "state": "failed", "failures": 1, "error": error, "log": HOSTILE}]
    status["nodes"] = [{"host": HOSTILE, "running": [{"shard_id": HOSTILE, "phase": error}]}]
    page = render_report(status, attempts, now)
    assert "<img" not in page and "alert(2)</script>" not in page and "<!--" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert page.count("<script") == 3 and page.count("</script>") == 3
    data = re.search(r'<script type="application/json" id="job-data">(.*?)</script>', page, re.S)
    payload = json.loads(data.group(1))
    assert payload["attempts"][-1]["host"] == HOSTILE and payload["attempts"][-1]["error"] == error
    assert len(payload["attempts"]) == len(_bars(page))


def test_render_is_deterministic(job):
    status, attempts, now = _history(job)
    assert render_report(status, attempts, now) == render_report(json.loads(json.dumps(status)), list(attempts), now)


def test_overlapping_attempts_on_one_host_stack_in_sub_rows():
    attempts = [
        _view("part-00000-of-00004", "a", "n1", "succeeded", 100.0, 110.0),
        _view("part-00001-of-00004", "b", "n1", "succeeded", 105.0, 115.0),  # claim-ahead overlap
        _view("part-00002-of-00004", "c", "n1", "succeeded", 110.0, 120.0),  # starts as the first ends
        _view("part-00003-of-00004", "d", "n0", "succeeded", 100.0, 120.0),
    ]
    bars = {re.search(r'data-attempt="(\w)"', bar).group(1): bar for bar in _bars(render_report({}, attempts, 200.0))}
    y = {key: float(re.search(r' y="([\d.]+)"', bar).group(1)) for key, bar in bars.items()}
    assert y["a"] == y["c"] != y["b"], "overlapping bars share no row; touching ones do"
    assert y["d"] < min(y["a"], y["b"], y["c"]), "lanes are sorted by host"


def test_runtime_start_up_is_hatched_over_the_start_of_its_attempt():
    attempts = [
        _view("part-00000-of-00002", "a", "n1", "succeeded", 100.0, 140.0, setup_secs=30.0),
        _view("part-00001-of-00002", "b", "n1", "succeeded", 140.0, 150.0),
    ]
    page = render_report({}, attempts, 200.0)
    (setup,) = re.findall(r'<rect class="setup" [^>]*>', page)
    (first, _) = _bars(page)
    width = float(re.search(r'width="([\d.]+)"', first).group(1))
    assert float(re.search(r'width="([\d.]+)"', setup).group(1)) == pytest.approx(width * 0.75, abs=0.2)
    assert "runtime start-up: 30" in page and "starting the node runtime" in page


def test_running_stale_and_takeover_after_stale():
    now = 1000.0
    attempts = [
        _view("part-00000-of-00002", "a", "n1", "stale", 900.0, 930.0),
        _view("part-00000-of-00002", "b", "n2", "running", 960.0, None),
        _view("part-00001-of-00002", "c", "n1", "interrupted", 900.0, 905.0),
        _view("part-00001-of-00002", "d", "n1", "running", 940.0, None),
    ]
    page = render_report({"counts": {"running": 2}}, attempts, now)
    bars = _bars(page)
    assert [re.search(r'data-outcome="(\w+)"', bar).group(1) for bar in bars] == ["stale", "running", "interrupted", "running"]
    assert 'data-kind="takeover"' in bars[1] and 'data-kind="retry"' in bars[3]
    assert ">0 takeover</text>" in page and ">1 retry</text>" in page
    assert 'class="now"' in page and "running for 40s" in page
    assert ">1:40</text>" in page, "the axis spans first start to now, labelled m:ss"


def test_a_backup_is_drawn_as_one_with_an_arrow_from_its_original_and_the_claims_next_attempt_follows_the_original():
    attempts = [
        _view("part-00000-of-00002", "orig", "n1", "beaten", 100.0, 160.0),
        _view("part-00000-of-00002", "bk", "n2", "succeeded", 140.0, 150.0, backup_of="orig"),
        _view("part-00001-of-00002", "slow", "n1", "failed", 100.0, 170.0),
        _view("part-00001-of-00002", "bk2", "n2", "failed", 150.0, 155.0, backup_of="slow"),
        _view("part-00001-of-00002", "again", "n2", "succeeded", 175.0, 185.0),
    ]
    page = render_report({}, attempts, 200.0)
    bars = {re.search(r'data-attempt="(\w+)"', bar).group(1): bar for bar in _bars(page)}
    assert 'data-kind="backup"' in bars["bk"] and 'data-kind="backup"' in bars["bk2"]
    assert 'data-kind="retry"' in bars["again"], "the claim's next attempt follows the original, not the backup"
    assert page.count('<rect class="backup-mark"') == 2
    links = re.findall(r'<path class="handoff (\w+)"[^>]*d="M([\d.]+),[\d.]+ [LC]', page)
    x = {key: float(re.search(r' x="([\d.]+)"', bar).group(1)) for key, bar in bars.items()}
    assert sorted(kind for kind, _ in links) == ["backup", "backup", "retry"]
    assert float(next(start for kind, start in links if kind == "backup")) == pytest.approx(x["bk"], abs=0.1)
    assert "outcome-beaten" in bars["orig"] and "beaten (1)" in page and "backup attempt of a straggler (2)" in page
    assert "(backup of attempt orig)" in page and "(retry of an earlier attempt)" in page


def test_empty_or_sparse_status_still_renders():
    page = render_report({}, [], 0.0)
    assert "No attempt has started yet" in page and not _bars(page)
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_write_report_creates_a_missing_output_directory_and_refuses_a_file_in_the_way(job, tmp_path):
    missing = tmp_path / "no-such-dir" / "deeper"
    assert write_report(job, missing / "report.html") >= 10 and [p.name for p in missing.iterdir()] == ["report.html"]
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UsageError, match=re.escape(f"{blocker} is not a directory")):
        write_report(job, blocker / "sub" / "report.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_write_report_replaces_the_output_atomically(job, tmp_path):
    output = tmp_path / "report.html"
    output.write_text("old")
    count = write_report(job, output)
    page = output.read_text()
    assert count == len(_bars(page)) >= 10 and [p.name for p in tmp_path.iterdir()] == ["report.html"]


@needs_chromium
def test_chromium_renders_the_report_without_errors(job, tmp_path):
    output = tmp_path / "report.html"
    count = write_report(job, output)
    dom = open_report(output, tmp_path / "profile", "report")
    assert dom.count('class="attempt ') == count == len(_history(job)[1])
    assert "<img" not in dom, "a hostile hostname must stay text"
