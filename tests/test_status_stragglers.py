"""One straggler rule: `status` (text, JSON, Prometheus, the report) flags exactly the shards an
idle worker's `BackupPolicy` would back up, by the job's own `--backup-after` and
`--backup-min-secs`; and what status says about the job's output (rows so far, the merged file),
and `report`'s default output (records written as workers write them, times chosen)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from jsonschema import Draft202012Validator
from support.jobs import STATUS_SCHEMA

from elastic_sharding import fsops
from elastic_sharding.claims.backups import BackupPolicy
from elastic_sharding.claims.protocol import Claims, new_attempt_id, new_token
from elastic_sharding.claims.takeover import StalenessObserver
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.html_report import write_report
from elastic_sharding.observe.status import Status
from elastic_sharding.records import AttemptRecord, ClaimRecord, CompletionRecord, Heartbeat, encode
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus

pytestmark = pytest.mark.usefixtures("own_log_handlers")

SECS_PER_BYTE = 0.01  # every done shard processed at this rate: the median


def _validate(report: dict) -> None:
    errors = sorted(Draft202012Validator(STATUS_SCHEMA).iter_errors(report), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


class _Records:
    """A job's shards done or running, written as their workers write them."""

    def __init__(self, root: Path):
        self.layout = JobLayout(root)
        self.manifest = self.layout.load_manifest()
        self.specs = self.manifest.shards
        self.now = time.time()

    def _attempt(self, index: int, host: str, pid: int, status: str, start: float) -> tuple[ClaimRecord, str]:
        spec = self.specs[index]
        token = new_token()
        attempt_id = new_attempt_id(host, token)
        finished = None if status == AttemptStatus.RUNNING else self.now - 1
        record = AttemptRecord(
            spec.shard_id, attempt_id, token, host, pid, "fake", start, status=status, finished_at=finished, input_rows=spec.rows
        )
        attempt_dir = self.layout.attempt_dir(spec.shard_id, attempt_id)
        attempt_dir.mkdir(parents=True)
        fsops.replace_atomic(attempt_files(attempt_dir)["record"], encode(record))
        claim_status = ClaimStatus.RUNNING if status == AttemptStatus.RUNNING else ClaimStatus.DONE
        claim = ClaimRecord(spec.shard_id, token, attempt_id, host, pid, start, claim_status, start)
        fsops.replace_atomic(self.layout.lock(spec.shard_id), encode(claim))
        return claim, attempt_id

    def done(self, index: int) -> None:
        spec = self.specs[index]
        secs = SECS_PER_BYTE * spec.bytes
        claim, attempt_id = self._attempt(index, "node-c", 100 + index, AttemptStatus.SUCCEEDED, self.now - 200)
        completion = CompletionRecord(
            spec.shard_id, attempt_id, claim.token, "node-c", claim.pid, spec.rows, spec.sha256, spec.rows - 1,
            spec.bytes, "0" * 64, self.now - 200, self.now - 200 + secs, processing_secs=secs,
        )  # fmt: skip
        fsops.replace_atomic(self.layout.done(spec.shard_id), encode(completion))

    def running(self, index: int, host: str, processing_secs: float, phase: str = "processing") -> tuple[ClaimRecord, Heartbeat]:
        """Running for `processing_secs` in `phase` by its owner's clock, its heartbeat 1 s old."""
        claim, attempt_id = self._attempt(index, host, 200 + index, AttemptStatus.RUNNING, self.now - processing_secs - 5)
        beat = self.now - 1
        heartbeat = Heartbeat(claim.token, 7, beat, phase, claim.pid, phase_since=beat - processing_secs)
        fsops.replace_atomic(attempt_files(self.layout.attempt_dir(claim.shard_id, attempt_id))["heartbeat"], encode(heartbeat))
        return claim, heartbeat

    def expected(self, index: int) -> float:
        """The median shard's time for this shard's size."""
        return SECS_PER_BYTE * self.specs[index].bytes

    def backed_up_by_an_idle_worker(self, running: dict[str, tuple[ClaimRecord, Heartbeat]]) -> list[str]:
        """The shards a worker that found nothing to claim backs up, one after another (its own
        settings: the job's), having seen each heartbeat unchanged for no time at all."""
        scanner = SimpleNamespace(
            running=dict(running),
            observer=StalenessObserver(600.0),
            terminal={s.shard_id: ClaimStatus.DONE for s in self.specs if self.layout.done(s.shard_id).exists()},
        )
        settings = self.manifest.request.settings
        settings.backup_share = 1.0  # as many backups at once as live workers: each straggler gets its own
        backed = []
        for pid in range(len(running)):
            claims = Claims(self.layout, f"idle-{pid}", 900 + pid)
            policy = BackupPolicy(claims, scanner, self.manifest, settings)  # type: ignore[arg-type]
            claim = policy.pick()
            if claim is not None:
                backed.append(claim.shard_id)
        return sorted(backed)


def _job(make_job, **settings) -> _Records:
    records = _Records(make_job(rows=200, shards=8, lock_timeout_secs=600.0, **settings))
    for index in range(4):
        records.done(index)
    return records


@pytest.mark.parametrize(("backup_after", "backup_min_secs"), [(1.5, 3.0), (3.0, 3.0), (1.5, 40.0)])
def test_status_flags_exactly_the_shards_an_idle_worker_backs_up(make_job, backup_after, backup_min_secs):
    records = _job(make_job, backup_after=backup_after, backup_min_secs=backup_min_secs)
    e = records.expected
    running = {
        records.specs[4].shard_id: records.running(4, "node-a", 2.0 * e(4)),  # 2x, just past the median time
        records.specs[5].shard_id: records.running(5, "node-a", 4.0 * e(5)),  # 4x
        records.specs[6].shard_id: records.running(6, "node-b", e(6) + 45.0),  # 45 s past it
        records.specs[7].shard_id: records.running(7, "node-b", 0.5 * e(7)),  # fast
    }
    flagged = sorted(r.shard_id for r in Status(records.layout.root).metrics.stragglers)
    assert flagged == records.backed_up_by_an_idle_worker(running)
    expected = {
        (1.5, 3.0): [4, 5, 6],
        (3.0, 3.0): [5, 6],
        (1.5, 40.0): [6] if 3.0 * e(5) < 40.0 else [5, 6],
    }[(backup_after, backup_min_secs)]
    assert flagged == [records.specs[i].shard_id for i in expected]


def test_an_attempt_still_starting_gets_the_same_start_up_allowance_as_for_a_backup(make_job):
    records = _job(make_job)
    e = records.expected
    running = {
        records.specs[4].shard_id: records.running(4, "node-a", 2.0 * e(4) + 10.0, phase="starting warm runtime"),
        records.specs[5].shard_id: records.running(5, "node-a", 60.0 + 3.0 * e(5) + 5.0, phase="starting warm runtime"),
    }
    flagged = sorted(r.shard_id for r in Status(records.layout.root).metrics.stragglers)
    assert flagged == [records.specs[5].shard_id] == records.backed_up_by_an_idle_worker(running)


def test_every_view_of_status_states_the_rule_and_why_each_shard_straggles(make_job, run_cli, tmp_path):
    records = _job(make_job, backup_after=2.0, backup_min_secs=5.0)
    records.running(4, "node-a", 3.0 * records.expected(4) + 6.0)
    records.running(5, "node-b", 0.5 * records.expected(5))
    shard = records.specs[4].shard_id
    text = run_cli("status", "--job-dir", str(records.layout.root)).stdout
    assert (
        "stragglers (processing over 2x the median shard's time for their size and 5s past it, once 3 shards are done; "
        "an idle worker backs them up):" in text
    )
    line = rf"^  {shard} on node-a \(pid 204\): processing for \d+s, 3\.\dx the median shard's \d+\.\ds for its size$"
    assert re.search(line, text, re.M)
    assert re.search(rf"{shard} \(processing, \S+, STRAGGLER\)", text)
    report = json.loads(run_cli("status", "--job-dir", str(records.layout.root), "--json").stdout)
    _validate(report)
    (straggler,) = report["stragglers"]
    assert straggler["shard_id"] == shard and 3.0 <= straggler["factor"] < 4.0
    assert straggler["straggler_reason"].startswith("processing for ")
    rule = report["straggler_rule"]
    assert (rule["backups"], rule["factor"], rule["min_secs"], rule["min_done"]) == (True, 2.0, 5.0, 3)
    assert rule["median_secs_per_byte"] == pytest.approx(SECS_PER_BYTE)
    target = tmp_path / "job.prom"
    run_cli("status", "--job-dir", str(records.layout.root), "--prometheus", str(target))
    metrics = dict(re.findall(r"^(elastic_shard_[a-z_]+)\{[^}]*\} (\S+)$", target.read_text(), re.M))
    assert (metrics["elastic_shard_stragglers"], metrics["elastic_shard_backups_enabled"]) == ("1", "1")
    write_report(records.layout.root, tmp_path / "report.html")
    problems = (tmp_path / "report.html").read_text().split("<h3>Stragglers</h3>", 1)[1].split("<h3>", 1)[0]
    assert "Processing over 2× the median shard&#x27;s time for its size and 5s past it: an idle worker backs it up." in problems
    assert problems.count(f'<tr data-shard="{shard}">') == 1 and "processing for " in problems


def test_with_backups_off_status_still_flags_stragglers_and_says_none_will_start(make_job, run_cli, tmp_path):
    records = _job(make_job, backup_after=0.0)
    records.running(4, "node-a", 2.0 * records.expected(4) + 5.0)
    text = run_cli("status", "--job-dir", str(records.layout.root)).stdout
    assert "1.5x the median shard's time" in text and "backups are off for this job (--backup-after 0): none starts" in text
    report = json.loads(run_cli("status", "--job-dir", str(records.layout.root), "--json").stdout)
    _validate(report)
    assert len(report["stragglers"]) == 1 and report["straggler_rule"]["backups"] is False
    assert records.backed_up_by_an_idle_worker({records.specs[4].shard_id: records.running(5, "node-b", 1.0)}) == []
    target = tmp_path / "job.prom"
    run_cli("status", "--job-dir", str(records.layout.root), "--prometheus", str(target))
    assert re.search(r"^elastic_shard_backups_enabled\{[^}]*\} 0$", target.read_text(), re.M)


# -- the job's output ------------------------------------------------------------------------


def test_status_shows_the_output_rows_so_far_then_the_merged_output(done_job, run_cli, tmp_path):
    layout = JobLayout(done_job)
    rows = sum(json.loads(layout.done(s.shard_id).read_text())["output_rows"] for s in layout.load_manifest().shards)
    text = run_cli("status", "--job-dir", str(done_job)).stdout
    assert f"output rows so far: {rows:,} from 2 done shard(s); not merged yet" in text.splitlines()
    report = json.loads(run_cli("status", "--job-dir", str(done_job), "--json").stdout)
    _validate(report)
    assert (report["output_rows"], report["merged"]) == (rows, None)

    output = tmp_path / "out" / "merged.jsonl.zst"
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(output)).returncode == 0
    lines = run_cli("status", "--job-dir", str(done_job)).stdout.splitlines()
    (merged_line,) = [line for line in lines if line.startswith("merged: ")]
    assert merged_line.startswith(f"merged: {output}; jsonl.zst, {rows:,} rows (merged ")
    assert not any(line.startswith("output rows so far") for line in lines)
    report = json.loads(run_cli("status", "--job-dir", str(done_job), "--json").stdout)
    _validate(report)
    merged = report["merged"]
    assert (merged["output"], merged["form"], merged["output_format"], merged["rows"], merged["shards"]) == (
        str(output), "file", "jsonl.zst", rows, 2
    )  # fmt: skip
    assert merged["bytes"] == output.stat().st_size
    write_report(done_job, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert f"<dt>Merged output</dt><dd><code>{output}</code> (jsonl.zst, {rows:,} rows)</dd>" in page


def test_a_directory_output_shows_as_one(done_job, run_cli, tmp_path):
    output = tmp_path / "parts"
    assert run_cli("merge", "--job-dir", str(done_job), "--output", f"{output}/").returncode == 0
    text = run_cli("status", "--job-dir", str(done_job)).stdout
    assert f"merged: {output}/ (a directory, one file per shard); jsonl, " in text
    report = json.loads(run_cli("status", "--job-dir", str(done_job), "--json").stdout)
    _validate(report)
    assert report["merged"]["form"] == "directory" and report["merged"]["index"] is not None


def test_an_unreadable_merge_record_is_no_merge(done_job, run_cli):
    JobLayout(done_job).merge_record.write_text("{damaged")
    report = json.loads(run_cli("status", "--job-dir", str(done_job), "--json").stdout)
    assert report["merged"] is None and "output rows so far" in run_cli("status", "--job-dir", str(done_job)).stdout


# -- report's default output -----------------------------------------------------------------


def test_report_writes_report_html_in_the_job_directory_by_default_and_says_where(done_job, run_cli, tmp_path):
    proc = run_cli("report", "--job-dir", str(done_job))
    assert proc.returncode == 0, proc.stderr
    page = done_job / "report.html"
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert proc.stdout == f"wrote {page} (2 attempts on the timeline)\n"
    elsewhere = tmp_path / "pages" / "r.html"
    proc = run_cli("report", "--job-dir", str(done_job), "--output", str(elsewhere))
    assert proc.returncode == 0 and elsewhere.exists() and proc.stdout.startswith(f"wrote {elsewhere} ")
    # The page in the job directory is no file of the job's: status and merge go on as before.
    assert run_cli("status", "--job-dir", str(done_job)).returncode == 0
    assert run_cli("merge", "--job-dir", str(done_job), "--output", str(tmp_path / "m.jsonl")).returncode == 0
