"""status and report of recipes with deduplicators: the current segment, each stage's state,
phase, units, failure and ETA (text, JSON against docs/status.schema.json, the HTML timeline).

A finished three-segment job (a real worker in this process: the fake processor runs the
segments' attempts, the stages are the real units over Data-Juicer's operators), stage
directories written by hand for each state (waiting, running with held and stale units, failed,
done), and one real Data-Juicer + Ray run through the command line (e2e).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from jsonschema import Draft202012Validator
from support.browser import needs_chromium, open_report
from support.dedup_corpus import prose_rows
from support.fakes import FakeRunner
from support.jobs import STATUS_SCHEMA, cli, fast_settings, write_jsonl

from elastic_sharding.dedup import arrays, cooperate
from elastic_sharding.errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK
from elastic_sharding.layout import JobLayout, StageLayout
from elastic_sharding.observe import stages as stage_reader
from elastic_sharding.observe.html_report import render_report, write_report
from elastic_sharding.observe.status import Status
from elastic_sharding.observe.status_text import status_text
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.records import DedupStageDone, DedupUnitDone, Heartbeat, KeptShard, StageFailure, UnitClaim, encode
from elastic_sharding.work.worker import Worker, WorkerOptions

HEAD = """\
project_name: stages
dataset_path: {dataset}
export_path: /tmp/ignored-by-workers.jsonl
executor_type: ray
ray_address: local
text_keys: text
process:
"""
# Three segments: a mapper, the exact deduplicator, a filter, the simhash deduplicator, nothing after.
THREE_SEGMENTS = (
    HEAD
    + """\
  - whitespace_normalization_mapper:
  - document_deduplicator:
      lowercase: true
  - text_length_filter:
      min_len: 10
  - document_simhash_deduplicator:
      tokenization: space
      window_size: 3
"""
)
# Segment 0 without operators: stage 1 reads the prepared shards.
DEDUP_FIRST = (
    HEAD
    + """\
  - document_deduplicator:
  - text_length_filter:
      min_len: 10
"""
)
# Segment 0 with an operator, segment 1 without: the job is complete once stage 1 kept every shard.
DEDUP_LAST = (
    HEAD
    + """\
  - whitespace_normalization_mapper:
  - document_deduplicator:
"""
)
SHARDS = 4
HOST = socket.gethostname()
VALIDATOR = Draft202012Validator(STATUS_SCHEMA)


def _rows() -> list[dict]:
    """Prose with planted exact and near duplicates of earlier rows, across shard boundaries."""
    return prose_rows(120, seed=7)


def _prepare(root: Path, recipe_text: str, name: str = "job") -> Path:
    dataset = write_jsonl(root / f"{name}-input.jsonl", _rows())
    recipe = root / f"{name}-recipe.yaml"
    recipe.write_text(recipe_text.format(dataset=dataset))
    job = root / name
    prepare(PrepareRequest(recipe, None, job, SHARDS, fast_settings()))
    return job


def _json(status: Status) -> dict:
    report = json.loads(json.dumps(status.as_json()))
    errors = sorted(VALIDATOR.iter_errors(report), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    return report


def _units_of(job: Path, stage: int) -> list[str]:
    """The units whose result is published, from the listing (what the report must draw)."""
    return sorted(p.name[:-5] for p in (job / "stages" / str(stage) / "units").glob("*.json"))


# -- a finished job --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    job = _prepare(tmp_path_factory.mktemp("stages-finished"), THREE_SEGMENTS)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    return job


def test_a_finished_recipe_shows_its_last_segment_and_every_stage_done(finished, run_cli):
    report = _json(Status(finished))
    assert report["schema_version"] == 3 and report["complete"] and report["exit_code"] == EXIT_OK and not report["failed"]
    assert (report["segment"], report["segments_total"]) == (1, 3), "segment 2 has no operators: segment 1 is the last run"
    assert report["counts"]["done"] == report["shards_total"] == SHARDS
    first, second = report["stages"]
    assert [first["operator"], second["operator"]] == ["document_deduplicator", "document_simhash_deduplicator"]
    for stage in (first, second):
        assert (stage["state"], stage["phase"], stage["round"], stage["error"], stage["eta_secs"]) == (
            "done",
            None,
            None,
            None,
            0,
        )
        units = stage["units"]
        assert units["keys"] == units["keep"] == {"done": SHARDS, "held": 0, "total": SHARDS}
        assert units["buckets"]["done"] == units["buckets"]["total"] >= 1 and units["buckets"]["held"] == 0
        assert stage["started_at"] <= stage["finished_at"] <= report["generated_at"]
    assert first["units"]["components"] == {"done": 0, "held": 0, "total": 0}, "an exact deduplicator has no rounds"
    assert second["units"]["components"]["done"] == second["units"]["components"]["total"] >= 1
    assert first["finished_at"] <= second["started_at"], "stage 2 reads segment 1, which reads what stage 1 kept"
    # The shard rows are segment 1's: what stage 1 kept, fewer than the job's input.
    kept = sum(json.loads((finished / "stages/1/units" / f"keep-{i:05d}.json").read_text())["output_rows"] for i in range(SHARDS))
    assert report["rows_total"] == report["progress"]["rows_total"] == kept < len(_rows())

    out = run_cli("status", "--job-dir", str(finished))
    assert out.returncode == EXIT_OK
    lines = out.stdout.splitlines()
    assert lines[1].startswith("progress: ") and "segment 1 of 0-2" in lines[0]
    assert lines[2] == "segment 1 of 0-2 (text_length_filter): the shards above are this segment's"
    assert re.match(r"stage 1 document_deduplicator: done in \d+s; keys 4/4, buckets \d+/\d+, keep 4/4$", lines[3]), lines[3]
    assert re.match(
        r"stage 2 document_simhash_deduplicator: done in \d+s; keys 4/4, buckets \d+/\d+, "
        r"components \d+/\d+ \(the last of \d+ rounds\), keep 4/4$",
        lines[4],
    ), lines[4]


def test_the_report_draws_every_unit_of_every_stage_and_the_attempts_of_every_segment(finished, tmp_path):
    output = tmp_path / "report.html"
    bars = write_report(finished, output)
    page = output.read_text()
    attempts = re.findall(r'<rect class="attempt [^>]*>', page)
    assert bars == len(attempts) == 2 * SHARDS, "segments 0 and 1 ran every shard once"
    assert sum('data-segment="1"' in bar for bar in attempts) == SHARDS
    assert 'data-kind="' not in page, "a shard's attempt in the next segment is neither a retry nor a takeover"
    for stage in (1, 2):
        drawn = sorted(re.findall(rf'<rect class="unit [^>]*data-stage="{stage}" data-unit="([\w-]+)"', page))
        assert drawn == _units_of(finished, stage)
    lanes = re.findall(r'<text class="lane-label"[^>]*>([^<]*)<', page)
    assert lanes[-2:] == ["stage 1", "stage 2"] and "<title>stage 2: document_simhash_deduplicator</title>" in page
    assert "<h2>Deduplication stages</h2>" in page and "Recipe segment" in page
    payload = json.loads(re.search(r'<script type="application/json" id="job-data">(.*?)</script>', page, re.S).group(1))
    assert len(payload["units"]) == len(_units_of(finished, 1)) + len(_units_of(finished, 2))


@needs_chromium
def test_chromium_renders_a_report_with_stages(finished, tmp_path):
    output = tmp_path / "report.html"
    write_report(finished, output)
    dom = open_report(output, tmp_path / "profile", "stages-report")
    assert dom.count('class="unit ') == len(_units_of(finished, 1)) + len(_units_of(finished, 2))
    assert dom.count('class="attempt ') == 2 * SHARDS


# -- stage directories written by hand --------------------------------------------------------------


def _write(path: Path, record: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(record))


def _claim(files: StageLayout, unit: str, at: float, *, host: str = HOST, pid: int = 4242, beat: float | None = None) -> None:
    token = f"{abs(hash((unit, host, pid))):032x}"[-32:]
    _write(files.lock(unit), UnitClaim(token=token, host=host, pid=pid, at=at))
    if beat is not None:
        _write(files.beat(unit), Heartbeat(token, 3, beat, "working", pid))


def _done(files: StageLayout, unit: str, at: float, secs: float, *, host: str = HOST, pid: int = 4242, count: int = 10) -> None:
    _claim(files, unit, at, host=host, pid=pid)
    _write(files.result(unit), DedupUnitDone(unit, count, host, pid, secs))


def _record_file(path: Path, parts: int) -> None:
    """A key (bucket) file as the stage writes it: the partition count is in its header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = np.zeros(3, dtype=arrays.KEYS)
    assert arrays.write(path, records, np.array([0, parts - 1, 1]), parts)


def _kept(layout: JobLayout, files: StageLayout, index: int, at: float) -> None:
    spec = layout.load_manifest().shards[index]
    token = f"{index + 1:032x}"
    _claim(files, f"keep-{index:05d}", at)
    _write(
        files.kept(index),
        KeptShard(
            f"keep-{index:05d}", spec.shard_id, f"20260101T000000Z-keep-1-{token[:8]}", token,
            spec.rows, spec.sha256, spec.rows - 1, spec.bytes, "0" * 64, HOST, 4242, at, at + 0.5,
        ),
    )  # fmt: skip


@pytest.fixture
def dedup_first(tmp_path) -> Path:
    return _prepare(tmp_path, DEDUP_FIRST)


def test_the_header_of_a_record_file_gives_its_partitions_and_the_phases_are_the_stages(tmp_path):
    _record_file(tmp_path / "keys" / "00003.rec", 8)
    assert stage_reader._partitions(tmp_path / "keys") == 8 and stage_reader._partitions(tmp_path / "none") is None
    from elastic_sharding.global_ops import cooperate as global_cooperate

    global_phases = (global_cooperate.KEYS, global_cooperate.BUCKETS, global_cooperate.PLACE, global_cooperate.KEEP)
    assert [p for p in stage_reader.PHASES if p in cooperate.PHASES] == list(cooperate.PHASES)
    assert [p for p in stage_reader.PHASES if p in global_phases] == list(global_phases)
    assert stage_reader.RECORD_MAGIC == arrays.MAGIC


def test_a_running_stage_shows_its_phase_held_and_stale_units_and_an_eta(dedup_first, run_cli):
    now = time.time()
    files = StageLayout(JobLayout(dedup_first).stage_dir(1))
    for i in range(SHARDS):
        _done(files, f"keys-{i:05d}", now - 60 + i, 2.0, pid=100 + i % 2)
        _record_file(files.key_file(i), 8)
    for part in range(3):
        _done(files, f"buckets-{part:05d}", now - 40 + part, 1.0, pid=100)
    _claim(files, "buckets-00003", now - 5, pid=100, beat=now - 1)
    _claim(files, "buckets-00004", now - 5, host="node-b", pid=7, beat=now - 1)
    _claim(files, "buckets-00005", now - 600, host="node-c", pid=9)  # no heartbeat for ten minutes: stale
    status = Status(dedup_first)
    report = _json(status)
    assert (report["segment"], report["segments_total"], report["complete"], report["failed"]) == (0, 2, False, False)
    assert report["exit_code"] == status.exit_code == EXIT_INCOMPLETE
    assert report["counts"]["done"] == SHARDS, "segment 0 has no operators: its shards are its input, done"
    assert report["eta"]["secs"] is None and "stage 1 is running, phase buckets" in report["eta"]["basis"]
    (stage,) = report["stages"]
    assert (stage["stage"], stage["operator"], stage["state"], stage["phase"], stage["round"]) == (
        1, "document_deduplicator", "running", "buckets", None,
    )  # fmt: skip
    assert stage["units"] == {
        "keys": {"done": 4, "held": 0, "total": 4},
        "buckets": {"done": 3, "held": 3, "total": 8},
        "components": {"done": 0, "held": 0, "total": None},
        "place": {"done": 0, "held": 0, "total": None},
        "keep": {"done": 0, "held": 0, "total": 4},
    }
    # 4 keep units left x the median keys unit (2 s) / 2 participants holding a unit (the stale one is not)
    assert stage["eta_secs"] == pytest.approx(4.0)
    assert stage["started_at"] == pytest.approx(now - 600) and stage["finished_at"] is None and stage["error"] is None

    out = run_cli("status", "--job-dir", str(dedup_first))
    assert out.returncode == EXIT_INCOMPLETE
    assert "stage 1 document_deduplicator: running, phase buckets 3/8 units (3 held); keys 4/4; ETA 4s" in out.stdout
    assert "segment 0 of 0-1: no operators (its input is its output)" in out.stdout

    page = render_report(report, status.history(), status.at, status.stage_units())
    units = {m.group(1): m.group(0) for m in re.finditer(r'<rect class="unit [^>]*data-unit="([\w-]+)"[^>]*>', page)}
    assert len(units) == SHARDS + 6
    assert 'fill="url(#unit-held)"' in units["buckets-00004"] and 'data-outcome="held"' in units["buckets-00004"]
    assert 'fill="url(#stale-hatch)"' in units["buckets-00005"] and 'data-host="node-c"' in units["buckets-00005"]
    assert 'fill="#8250df"' in units["keys-00000"] and 'class="now"' in page
    assert "held for" in page and "stage unit held now" in page


def test_a_failed_stage_fails_the_job_naming_the_unit_host_and_error(dedup_first, run_cli):
    now = time.time()
    files = StageLayout(JobLayout(dedup_first).stage_dir(1))
    _done(files, "keys-00000", now - 10, 1.0)
    _claim(files, "keys-00002", now - 5, host="node-b", pid=77, beat=now - 4)
    _write(files.failed, StageFailure("keys-00002", "InputError", "row 3 of part-00002: text is not a string", "node-b", 77))
    status = Status(dedup_first)
    report = _json(status)
    assert report["failed"] and not report["complete"] and report["exit_code"] == status.exit_code == EXIT_ERROR
    (stage,) = report["stages"]
    assert (stage["state"], stage["phase"], stage["eta_secs"]) == ("failed", "keys", None)
    assert stage["units"]["keys"] == {"done": 1, "held": 0, "total": 4}, "the failed unit is no longer held"
    assert stage["error"] == "unit keys-00002 on host=node-b pid=77: InputError: row 3 of part-00002: text is not a string"
    assert any(line.startswith("stage 1 failed in unit keys-00002 on host=node-b") for line in status.errors(True))

    out = run_cli("status", "--job-dir", str(dedup_first))
    assert out.returncode == EXIT_ERROR
    assert "stage 1 document_deduplicator: failed in phase keys: unit keys-00002 on host=node-b pid=77" in out.stdout
    assert "retry --all-failed" in out.stdout
    page = render_report(report, status.history(), status.at, status.stage_units())
    assert 'data-unit="keys-00002" data-host="node-b" data-outcome="failed"' in page
    assert "text is not a string" in page and 'class="stage-failed"' in page


def test_a_stage_that_kept_every_shard_makes_the_next_segment_current(dedup_first):
    now = time.time()
    layout = JobLayout(dedup_first)
    files = StageLayout(layout.stage_dir(1))
    for i in range(SHARDS):
        _done(files, f"keys-{i:05d}", now - 30, 1.0)
    _done(files, "buckets-00000", now - 20, 1.0)
    _write(files.done, DedupStageDone(None, 5, 0))
    for i in range(SHARDS - 1):
        _kept(layout, files, i, now - 10)
    before = _json(Status(dedup_first))
    assert before["segment"] == 0 and before["stages"][0]["state"] == "running" and before["stages"][0]["phase"] == "keep"
    assert before["stages"][0]["units"]["keep"] == {"done": 3, "held": 0, "total": 4}
    assert before["stages"][0]["eta_secs"] == pytest.approx(1.0), "1 keep unit left x the median (1 s, 0.5 s) / 1 participant"

    _kept(layout, files, SHARDS - 1, now - 5)
    status = Status(dedup_first)
    report = _json(status)
    assert (report["segment"], report["complete"], report["exit_code"]) == (1, False, EXIT_INCOMPLETE)
    assert report["counts"]["pending"] == report["shards_total"] == SHARDS, "segment 1's shards, none run yet"
    assert report["rows_total"] == sum(spec.rows - 1 for spec in layout.load_manifest().shards), "what stage 1 kept"
    (stage,) = report["stages"]
    assert (stage["state"], stage["phase"], stage["eta_secs"]) == ("done", None, 0)
    assert stage["finished_at"] == pytest.approx(now - 4.5)
    assert "segment 1 of 0-1 (text_length_filter): the shards above are this segment's" in status_text(status, False)


def test_a_waiting_stage_hashes_ahead_and_a_last_segment_without_operators_completes_the_job(tmp_path):
    job = _prepare(tmp_path, DEDUP_LAST)
    layout = JobLayout(job)
    files = StageLayout(layout.stage_dir(1))
    now = time.time()
    _done(files, "keys-00001", now - 3, 0.5)
    status = Status(job)
    report = _json(status)
    assert (report["segment"], report["complete"], report["exit_code"]) == (0, False, EXIT_INCOMPLETE)
    (stage,) = report["stages"]
    assert (stage["state"], stage["phase"], stage["eta_secs"]) == ("waiting", "keys", None)
    assert stage["units"]["keys"] == {"done": 1, "held": 0, "total": 4}
    assert "stage 1 document_deduplicator: waiting for segment 0; hashed ahead: keys 1/4" in status_text(status, False)

    # Nothing was run, but a stage that kept every shard ends a recipe whose last segment is empty.
    for i in (0, 2, 3):
        _done(files, f"keys-{i:05d}", now - 3, 0.5)
    _write(files.done, DedupStageDone(None, 0, 0))
    for i in range(SHARDS):
        _kept(layout, files, i, now - 1)
    report = _json(Status(job))
    assert (report["segment"], report["segments_total"], report["complete"], report["exit_code"]) == (0, 2, True, EXIT_OK)
    assert report["stages"][0]["state"] == "done"


def test_a_recipe_without_deduplicators_has_one_segment_and_no_stages(done_job):
    report = _json(Status(done_job))
    assert (report["segment"], report["segments_total"], report["stages"], report["complete"]) == (0, 1, [], True)
    text = status_text(Status(done_job), False)
    assert "stage " not in text and "segment" not in text


def test_unreadable_recipe_or_planted_links_leave_the_operator_unknown(dedup_first, tmp_path):
    layout = JobLayout(dedup_first)
    outside = tmp_path / "outside.yaml"
    outside.write_text("process:\n  - secret_operator:\n")
    os.replace(layout.recipe, tmp_path / "moved.yaml")
    os.symlink(outside, layout.recipe)
    files = StageLayout(layout.stage_dir(1))
    files.units.mkdir(parents=True)
    os.symlink(outside, files.result("keys-00000"))
    report = _json(Status(dedup_first))
    assert report["stages"][0]["operator"] is None and report["stages"][0]["units"]["keys"]["done"] == 0
    assert "secret_operator" not in json.dumps(report)


# -- a real run ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_job(tmp_path_factory) -> Path:
    """The three-segment recipe, prepared and run by one real worker (Data-Juicer on a local Ray)."""
    root = tmp_path_factory.mktemp("stages-real")
    dataset = write_jsonl(root / "input.jsonl", _rows())
    recipe = root / "recipe.yaml"
    recipe.write_text(THREE_SEGMENTS.format(dataset=dataset))
    job = root / "job"
    cli(
        "prepare",
        "--config",
        str(recipe),
        "--dataset-path",
        str(dataset),
        "--job-dir",
        str(job),
        "--num-shards",
        str(SHARDS),
        check=True,
    )
    cli("worker", "--job-dir", str(job), check=True)
    return job


@pytest.mark.e2e
def test_a_real_run_reports_its_stages(real_job, tmp_path):
    proc = cli("status", "--job-dir", str(real_job), "--json")
    assert proc.returncode == EXIT_OK
    report = json.loads(proc.stdout)
    assert not sorted(VALIDATOR.iter_errors(report), key=lambda e: list(e.path))
    assert (report["segment"], report["segments_total"], report["complete"]) == (1, 3, True)
    assert [stage["state"] for stage in report["stages"]] == ["done", "done"]
    assert cli("report", "--job-dir", str(real_job), "--output", str(tmp_path / "r.html")).returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert page.count('<rect class="unit ') == len(_units_of(real_job, 1)) + len(_units_of(real_job, 2))
