"""Worker lifecycle with the fake runner: ordering, max-shards, status, the version check, SIGTERM
and a stop while staged, attempt recipes, JSON outputs (`retry`, `merge`, `verify`: their own files)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from support.fake_worker import worker_command
from support.fakes import FakeRunner
from support.jobs import cli, merged_rows, run, sample_rows, wait_until_ready

from elastic_sharding.claims.protocol import read_claim
from elastic_sharding.errors import VersionMismatchError
from elastic_sharding.layout import JobLayout
from elastic_sharding.records import Manifest, encode, load
from elastic_sharding.work.worker import Worker, WorkerOptions


def test_parallel_workers_process_every_shard_once_and_merge_in_input_order(make_job, tmp_path):
    job = make_job(rows=90, shards=12)
    procs = [subprocess.Popen(worker_command(job, "--delay", "0.05"), stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    layout = JobLayout(job)
    attempts = [p for p in layout.attempts_root.glob("*/*") if p.is_dir()]
    assert len(attempts) == 12, "no shard may be processed twice without a failure"
    assert merged_rows(job, tmp_path / "out.jsonl") == sample_rows(90)


def test_filtered_rows_keep_order(make_job, tmp_path):
    job = make_job(rows=50, shards=4)
    assert run(job, FakeRunner(keep=lambda row: row["id"] % 3 != 0)) == 0
    assert merged_rows(job, tmp_path / "out.jsonl") == [r for r in sample_rows(50) if r["id"] % 3 != 0]


def test_max_shards_counts_claims_including_failures(make_job):
    job = make_job(rows=20, shards=4, max_retries=5)
    runner = FakeRunner(fail=lambda shard: True)
    assert run(job, runner, max_shards=3) == 0
    assert len(runner.calls) == 3
    good = FakeRunner()
    assert run(job, good, max_shards=2) == 0 and len(good.calls) == 2


def test_status_reports_pending_job_with_exit_1(make_job):
    job = make_job(rows=10, shards=2)
    proc = cli("status", "--job-dir", str(job), "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["counts"] == {"pending": 2, "running": 0, "stale": 0, "done": 0, "failed": 0}
    assert report["rows_total"] == 10 and report["complete"] is False
    assert {"shard_id", "state", "host", "attempt_id", "heartbeat_age_secs", "failures"} <= set(report["shards"][0])
    assert run(job) == 0
    proc = cli("status", "--job-dir", str(job), "--all")
    assert proc.returncode == 0 and "2 done" in proc.stdout and "part-00001-of-00002" in proc.stdout


def test_version_mismatch_is_refused_unless_allowed(make_job):
    job = make_job(rows=10, shards=2)
    layout = JobLayout(job)
    manifest = load(Manifest, layout.manifest)
    manifest.data_juicer_version = "0.0.1"
    layout.manifest.write_bytes(encode(manifest))
    with pytest.raises(VersionMismatchError, match="--allow-version-mismatch"):
        run(job)
    assert run(job, allow_version_mismatch=True) == 0


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("ray_version", "2.9.0", "Ray 2.60.0 but the job was prepared with Ray 2.9.0"),
        ("python_version", "CPython 3.10.14", "but the job was prepared with CPython 3.10.14"),
    ],
)
def test_a_node_with_another_ray_or_python_is_refused_unless_allowed(make_job, field, value, named):
    job = make_job(rows=10, shards=2)
    layout = JobLayout(job)
    manifest = load(Manifest, layout.manifest)
    setattr(manifest, field, value)
    layout.manifest.write_bytes(encode(manifest))
    with pytest.raises(VersionMismatchError, match=re.escape(named)):
        run(job)
    assert run(job, allow_version_mismatch=True) == 0


def test_another_python_patch_release_is_the_same_engine(make_job):
    job = make_job(rows=10, shards=2)
    layout = JobLayout(job)
    manifest = load(Manifest, layout.manifest)
    manifest.python_version = manifest.python_version.rsplit(".", 1)[0] + ".999"
    layout.manifest.write_bytes(encode(manifest))
    assert run(job) == 0


def test_sigterm_hands_the_current_shard_back_at_once(make_job, tmp_path):
    import signal

    job = make_job(rows=10, shards=1)
    layout = JobLayout(job)
    processing = tmp_path / "processing"
    proc = subprocess.Popen(
        worker_command(job, "--delay", "60", "--ready-file", str(processing)), stderr=subprocess.PIPE, text=True
    )
    wait_until_ready(processing, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert read_claim(layout, "part-00000-of-00001") is None, "the shard must be pending again at once"
    (attempt,) = layout.attempts_dir("part-00000-of-00001").iterdir()
    assert json.loads((attempt / "attempt.json").read_text())["status"] == "interrupted"
    assert run(job) == 0


def test_a_stop_that_arrives_while_an_attempt_is_staged_still_drains_it(make_job):
    """A signal landing between the claim and the start of processing must not be lost: the worker
    would otherwise run the whole shard before it noticed (a flaky drain under load)."""
    import time

    job = make_job(rows=10, shards=1)
    layout = JobLayout(job)
    worker = Worker(job, WorkerOptions(), runner=FakeRunner(delay=60))
    check_input = worker._check_input

    def stopped_while_staging(ctx, spec):
        worker.request_stop("received SIGTERM")
        check_input(ctx, spec)

    worker._check_input = stopped_while_staging
    started = time.monotonic()
    assert worker.run() == 2
    assert time.monotonic() - started < 10, "the shard must not run to its end"
    assert read_claim(layout, "part-00000-of-00001") is None, "the shard must be pending again at once"
    (attempt,) = layout.attempts_dir("part-00000-of-00001").iterdir()
    assert json.loads((attempt / "attempt.json").read_text())["status"] == "interrupted"


def test_attempt_recipe_overrides_and_cache_environment(make_job, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HF_HOME", "/models/hf")
    job = make_job(rows=10, shards=2)
    runner = FakeRunner()
    assert run(job, runner, ray_address="auto", max_shards=1) == 0
    config = runner.configs[0]
    layout = JobLayout(job)
    attempt = next(p for p in layout.attempts_dir("part-00000-of-00002").iterdir())
    assert config["dataset_path"] == str(layout.shard_input("part-00000-of-00002"))
    assert config["export_path"] == str(attempt / "ray-output.jsonl")
    assert config["work_dir"] == str(attempt)
    assert (config["executor_type"], config["ray_address"], config["skip_op_error"]) == ("ray", "auto", False)
    assert runner.envs[0]["XDG_CACHE_HOME"] == str(layout.cache_dir)
    assert "HF_HOME" not in runner.envs[0], "an explicitly set HF_HOME is left alone"


def test_json_outputs_of_prepare_merge_and_verify(tmp_path, recipe_file):
    from support.jobs import write_jsonl

    dataset = write_jsonl(tmp_path / "d.jsonl", sample_rows(12))
    job = tmp_path / "job"
    proc = cli("prepare", "--config", str(recipe_file(dataset)), "--job-dir", str(job), "--num-shards", "3", "--json")
    prepared = json.loads(proc.stdout)
    assert prepared["created"] is True and len(prepared["manifest"]["shards"]) == 3
    again = json.loads(
        cli("prepare", "--config", str(recipe_file(dataset)), "--job-dir", str(job), "--num-shards", "3", "--json").stdout
    )
    assert again["created"] is False
    assert run(job) == 0
    merged = json.loads(cli("merge", "--job-dir", str(job), "--output", str(tmp_path / "m.jsonl"), "--json").stdout)
    assert merged["rows"] == 12 and [s["shard_id"] for s in merged["shards"]] == [f"part-0000{i}-of-00003" for i in range(3)]
    verified = json.loads(cli("verify", "--job-dir", str(job), "--output", str(tmp_path / "m.jsonl"), "--json").stdout)
    assert verified["pass"] is True and verified["shards"] == 3
