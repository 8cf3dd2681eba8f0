"""Backup attempts in every observer: `status --json` (against the schema), the text, Prometheus
and the HTML report, on a job directory whose records are written as workers write them (times
chosen, so every figure is known)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from support.browser import needs_chromium, open_report
from support.fakes import FakeRunner
from support.jobs import STATUS_SCHEMA

from elastic_sharding import fsops
from elastic_sharding.claims.protocol import new_attempt_id, new_token
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.html_report import write_report
from elastic_sharding.observe.status import Status
from elastic_sharding.records import (
    AttemptRecord,
    BackupRecord,
    ClaimRecord,
    CompletionRecord,
    Heartbeat,
    NodeRefusal,
    ShardSpec,
    encode,
)
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus, Refusal
from elastic_sharding.work.worker import Worker, WorkerOptions

pytestmark = pytest.mark.usefixtures("own_log_handlers")

HOSTILE = "<img src=x onerror=alert(1)>"
PUBLISHED, OTHER = "a" * 64, "b" * 64


@dataclass
class _Attempt:
    token: str
    attempt_id: str


@dataclass
class _Job:
    """Writes a shard's records as its workers would; times are seconds after `t0`."""

    layout: JobLayout
    specs: list[ShardSpec]
    t0: float
    pids: list[int] = field(default_factory=lambda: [100])

    def attempt(
        self, index: int, host: str, start: float, end: float | None, status: str, pid: int | None = None, **extra
    ) -> _Attempt:
        spec = self.specs[index]
        token = new_token()
        attempt_id = new_attempt_id(host, token)
        if pid is None:
            self.pids.append(self.pids[-1] + 1)  # a worker of its own: no earlier attempt moves its start
            pid = self.pids[-1]
        record = AttemptRecord(
            spec.shard_id,
            attempt_id,
            token,
            host,
            pid,
            "fake",
            self.t0 + start,
            status=status,
            finished_at=None if end is None else self.t0 + end,
            input_rows=spec.rows,
            **extra,
        )
        attempt_dir = self.layout.attempt_dir(spec.shard_id, attempt_id)
        attempt_dir.mkdir(parents=True)
        files = attempt_files(attempt_dir)
        fsops.replace_atomic(files["record"], encode(record))
        if end is None:
            beat = Heartbeat(token, 3, time.time() - 1, "processing", pid, phase_since=self.t0 + start)
            fsops.replace_atomic(files["heartbeat"], encode(beat))
        return _Attempt(token, attempt_id)

    def claim(self, index: int, owner: _Attempt, host: str, status: str) -> None:
        spec = self.specs[index]
        record = ClaimRecord(spec.shard_id, owner.token, owner.attempt_id, host, 1, self.t0, status, self.t0)
        fsops.replace_atomic(self.layout.lock(spec.shard_id), encode(record))

    def complete(self, index: int, winner: _Attempt, host: str, start: float, end: float, sha256: str = PUBLISHED) -> None:
        spec = self.specs[index]
        record = CompletionRecord(
            spec.shard_id, winner.attempt_id, winner.token, host, 1, spec.rows, spec.sha256,
            spec.rows, spec.bytes, sha256, self.t0 + start, self.t0 + end, processing_secs=end - start,
        )  # fmt: skip
        fsops.replace_atomic(self.layout.done(spec.shard_id), encode(record))

    def backup_record(self, index: int, backup: _Attempt, host: str, of: _Attempt, start: float, reason: str) -> None:
        spec = self.specs[index]
        record = BackupRecord(
            spec.shard_id, backup.token, backup.attempt_id, host, 2, of.token, of.attempt_id, self.t0 + start, reason
        )
        path = self.layout.backup(spec.shard_id, of.token)
        path.parent.mkdir(parents=True, exist_ok=True)
        fsops.replace_atomic(path, encode(record))

    def done(self, index: int, host: str, start: float, end: float, pid: int = 100) -> None:
        attempt = self.attempt(index, host, start, end, AttemptStatus.SUCCEEDED, pid, output_sha256=PUBLISHED)
        self.claim(index, attempt, host, ClaimStatus.DONE)
        self.complete(index, attempt, host, start, end)

    def backed_up(
        self,
        index: int,
        original: tuple[float, float | None, str],
        backup: tuple[float, float | None, str],
        winner: str | None,
        reason: str = "processing for 30s, 6.0x the median shard's 5.0s for its size",
        original_sha256: str | None = None,
        **backup_extra,
    ) -> tuple[_Attempt, _Attempt]:
        """A shard's original on node-a and its backup on node-b, (start, end, status) each; the
        one `winner` names ("original", "backup" or None) published the shard."""
        first = self.attempt(index, "node-a", *original, output_sha256=original_sha256)
        second = self.attempt(index, "node-b", *backup, backup_of=first.attempt_id, **backup_extra)
        self.backup_record(index, second, "node-b", first, backup[0], reason)
        if winner is None:
            self.claim(index, first, "node-a", ClaimStatus.RUNNING)
            return first, second
        if backup_extra.get("promoted"):
            self.claim(index, second, "node-b", ClaimStatus.DONE)
        else:
            self.claim(index, first, "node-a", ClaimStatus.DONE)
        won, host, (start, end, _) = (first, "node-a", original) if winner == "original" else (second, "node-b", backup)
        self.complete(index, won, host, start, end)  # type: ignore[arg-type]
        return first, second


@pytest.fixture
def job(make_job) -> Path:
    """Ten shards; node-c did 0-3 in 5 s each (the median). Then:
    4: the backup (6.5 s) won; the original, 41.5 s in at the win, stopped without output.
    5: the backup won; the original finished too, 5 s later, with another output.
    6: the original published first; the backup stopped (lost).
    7: the backup failed; the original still runs (and the backup record is unreadable).
    8: the backup runs beside its running original.
    9: the original failed; the claim was handed to its backup, which won."""
    root = make_job(rows=100, shards=10, lock_timeout_secs=600.0)
    layout = JobLayout(root)
    w = _Job(layout, layout.load_manifest().shards, float(int(time.time()) - 300))
    for index in range(4):
        w.done(index, "node-c", 5.0 * index, 5.0 * index + 5)
    S, B, F, R = AttemptStatus.SUCCEEDED, AttemptStatus.BEATEN, AttemptStatus.FAILED, AttemptStatus.RUNNING
    w.backed_up(4, (10.0, 52.0, B), (45.0, 51.5, S), "backup", reason=f"slow {HOSTILE}", output_sha256=PUBLISHED)
    w.backed_up(5, (20.0, 60.0, B), (50.0, 55.0, S), "backup", original_sha256=OTHER, output_sha256=PUBLISHED)
    w.backed_up(6, (30.0, 62.0, S), (58.0, 63.0, B), "original")
    original, _ = w.backed_up(7, (40.0, None, R), (70.0, 75.0, F), None, error="fake operator failure")
    layout.backup(w.specs[7].shard_id, original.token).write_text("{damaged")
    w.backed_up(8, (50.0, None, R), (280.0, None, R), None)
    w.backed_up(9, (60.0, 90.0, F), (80.0, 100.0, S), "backup", promoted=True, output_sha256=PUBLISHED)
    message = "2 attempts in a row failed for reasons of this node (last: OutOfMemoryError)\nsecond line"
    fsops.ensure_dir(layout.refusals)
    fsops.replace_atomic(layout.refusal("node-a"), encode(NodeRefusal("node-a", 106, w.t0 + 90, Refusal.NODE_FAILURES, message)))
    return root


def _status(run_cli, job: Path) -> dict:
    proc = run_cli("status", "--job-dir", str(job), "--json")
    assert proc.returncode == 1, proc.stderr  # shards 7 and 8 still run
    report = json.loads(proc.stdout)
    errors = sorted(Draft202012Validator(STATUS_SCHEMA).iter_errors(report), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    return report


def _shard(index: int) -> str:
    return f"part-{index:05d}-of-00010"


def test_status_json_lists_each_backup_and_how_its_race_went(run_cli, job):
    report = _status(run_cli, job)
    backups = {b["shard_id"]: b for b in report["backups"]}
    assert report["backup_counts"] == {"started": 6, "running": 1, "won": 3, "lost": 1, "failed": 1}
    assert {s: b["state"] for s, b in backups.items()} == {
        _shard(4): "won", _shard(5): "won", _shard(6): "lost", _shard(7): "failed", _shard(8): "running", _shard(9): "won"
    }  # fmt: skip
    won = backups[_shard(4)]
    assert (won["host"], won["of_host"], won["reason"]) == ("node-b", "node-a", f"slow {HOSTILE}")
    assert (won["backup_secs"], won["original_secs"], won["behind_secs"]) == (6.5, 41.5, 35.0)
    assert won["saved_secs"] is None and not won["nondeterministic"] and not won["promoted"]
    assert 6 < won["original_factor"] < 11, "41.5 s over the median shard's 5 s, scaled to its size"
    both = backups[_shard(5)]
    assert (both["behind_secs"], both["saved_secs"], both["nondeterministic"]) == (30.0, 5.0, True)
    lost = backups[_shard(6)]
    assert (lost["original_secs"], lost["behind_secs"], lost["saved_secs"], lost["nondeterministic"]) == (32.0, None, None, False)
    assert backups[_shard(7)]["reason"] is None, "an unreadable backup record only loses the reason"
    promoted = backups[_shard(9)]
    assert promoted["promoted"] and promoted["behind_secs"] is None and promoted["original_secs"] == 30.0
    # A shard and its backup are one running shard; a failed backup or a beaten attempt is no failure.
    shards = {s["shard_id"]: s for s in report["shards"]}
    assert report["counts"]["running"] == 2 and report["counts"]["done"] == 8
    assert shards[_shard(7)]["failures"] == 0 and shards[_shard(7)]["attempts"] == 2
    assert shards[_shard(9)]["failures"] == 1, "the promoted backup's original failed as the claim's own attempt"
    assert [f["shard_id"] for f in report["failures"]] == []
    nodes = {n["host"]: n for n in report["nodes"]}
    assert (nodes["node-a"]["shards_done"], nodes["node-a"]["failures"]) == (1, 1)
    assert (nodes["node-b"]["shards_done"], nodes["node-b"]["failures"]) == (3, 0)
    running = {r["shard_id"]: r for r in nodes["node-b"]["running"]}
    assert running[_shard(8)]["backup_of"] == backups[_shard(8)]["of_attempt_id"]
    assert all(r["backup_of"] is None for r in nodes["node-a"]["running"])
    (refused,) = report["refused_nodes"]
    assert refused["reason"] == "node-local failures" and refused["message"].startswith("2 attempts in a row")


def test_status_text_shows_backups_and_flags_a_nondeterministic_pair_first(run_cli, job):
    text = run_cli("status", "--job-dir", str(job)).stdout
    lines = text.splitlines()
    head = lines.index("backups (6 started: 1 running, 3 won, 1 lost, 1 failed):")
    section = lines[head + 1 : head + 7]
    assert section[0].startswith(f"  {_shard(5)}: backup on node-b won after 5s") and "NOT DETERMINISTIC" in section[0]
    assert "saved 5s (the original finished too)" in section[0]
    assert re.search(
        rf"{_shard(4)}: backup on node-b won after 6s; the original on node-a had run 41s \(\d+\.\dx the median\), 35s behind$",
        text,
        re.M,
    )
    assert f"{_shard(6)}: backup on node-b lost after 5s: the original on node-a published first, after 32s (" in text
    assert f"{_shard(7)}: backup on node-b failed after 5s (not counted against the shard's retries)" in text
    assert re.search(
        rf"{_shard(8)}: backup on node-b running for \d+s; the original on node-a has run \S+ \(\d+\.\dx the median\)$",
        text,
        re.M,
    )
    assert (
        f"{_shard(9)}: backup on node-b won after 20s (the original on node-a had ended: the claim was handed to the backup)"
        in text
    )
    assert re.search(rf"{_shard(8)} \(processing, \d+s, BACKUP[,)]", text)
    assert re.search(
        r"refused node: node-a \(pid 106, \S+ ago\) claims nothing: node-local failures: 2 attempts in a row failed for reasons "
        r"of this node \(last: OutOfMemoryError\) \(\+1 more line\(s\): status --json\)",
        text,
    )


def test_a_straggler_names_the_node_its_backup_runs_on(run_cli, job):
    """Shards 7 and 8 straggle (their originals still process); 8's backup runs, 7's failed."""
    lines = run_cli("status", "--job-dir", str(job)).stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("stragglers ("))
    assert lines[head].endswith("an idle worker backs them up):")
    listed = {line.split()[0]: line for line in lines[head + 1 : head + 3]}
    assert re.fullmatch(
        rf"  {_shard(8)} on node-a \(pid \d+\): processing for \d+s, .*; backup running on node-b", listed[_shard(8)]
    )
    assert "backup running" not in listed[_shard(7)]


def test_no_backups_section_without_backups(run_cli, make_job):
    job = make_job(rows=20, shards=2)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    assert "backups (" not in run_cli("status", "--job-dir", str(job)).stdout
    report = json.loads(run_cli("status", "--job-dir", str(job), "--json").stdout)
    assert report["backups"] == [] and report["backup_counts"]["started"] == 0


def test_prometheus_counts_backups(run_cli, job, tmp_path):
    target = tmp_path / "job.prom"
    assert run_cli("status", "--job-dir", str(job), "--prometheus", str(target)).returncode == 1
    samples = dict(re.findall(r"^(elastic_shard_backups_[a-z]+)\{[^}]*\} (\S+)$", target.read_text(), re.M))
    assert samples == {
        "elastic_shard_backups_started": "6",
        "elastic_shard_backups_running": "1",
        "elastic_shard_backups_won": "3",
        "elastic_shard_backups_nondeterministic": "1",
        "elastic_shard_backups_enabled": "1",
    }
    assert 'elastic_shard_host_refused{job_id="' in target.read_text() and 'reason="node-local failures"} 1' in target.read_text()


def test_report_draws_backups_as_backups_and_tables_them(job, tmp_path):
    output = tmp_path / "report.html"
    count = write_report(job, output)
    page = output.read_text()
    bars = re.findall(r'<rect class="attempt [^>]*>', page)
    assert len(bars) == count == 16
    backups = [bar for bar in bars if 'data-kind="backup"' in bar]
    assert len(backups) == 6 == page.count('<rect class="backup-mark"') == page.count('<path class="handoff backup"')
    beaten = [bar for bar in bars if 'data-outcome="beaten"' in bar]
    assert len(beaten) == 3 and all("outcome-beaten" in bar for bar in beaten)
    assert ".outcome-beaten{fill:" in page and ".sw-beaten{" in page, "beaten has a colour of its own"
    assert "beaten (3)" in page and "backup attempt of a straggler (6)" in page
    assert "(backup of attempt " in page and "another attempt of the shard published first" in page
    table = page.split("<h2>Backups</h2>", 1)[1].split("</section>", 1)[0]
    assert table.count("<tr data-shard=") == 6 and table.count('class="flag">NOT DETERMINISTIC') == 1
    assert "slow &lt;img src=x onerror=alert(1)&gt;" in table and "<img" not in page
    row = re.search(rf'<tr data-shard="{_shard(4)}">(.*?)</tr>', table).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[1:7] == ["node-a", "node-b", "won", "6.5s", "42s", "35s"]
    assert "Backups</dt><dd>6 started: 1 running, 3 won, 1 lost, 1 failed" in page


def test_a_backup_still_running_after_its_original_published_has_lost_not_gone_stale(make_job):
    """The original published and marked its claim done; its backup stops at its next heartbeat."""
    root = make_job(rows=40, shards=4, lock_timeout_secs=600.0)
    layout = JobLayout(root)
    w = _Job(layout, layout.load_manifest().shards, float(int(time.time()) - 60))
    for index in range(3):
        w.done(index, "node-c", 5.0 * index, 5.0 * index + 5)
    w.backed_up(3, (10.0, 40.0, AttemptStatus.SUCCEEDED), (30.0, None, AttemptStatus.RUNNING), "original")
    status = Status(root)
    (backup,) = status.metrics.backups
    assert (backup.state, backup.original_secs, backup.behind_secs) == ("lost", 30.0, None)
    assert status.counts["done"] == 4 and dataclasses.asdict(status.metrics.backup_counts)["lost"] == 1
    assert [a.outcome for a in status.attempts if a.backup_of] == ["running"]


@needs_chromium
def test_chromium_renders_the_report_with_backups_without_errors(job, tmp_path):
    output = tmp_path / "report.html"
    count = write_report(job, output)
    dom = open_report(output, tmp_path / "profile", "report-backups")
    assert dom.count('class="attempt ') == count and dom.count('class="backup-mark"') == 6
