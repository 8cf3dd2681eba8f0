"""The launchers end to end: real Data-Juicer + Ray, each simulated node a separate process with
its own hostname (`unshare --uts`), one shared job directory; MPIJob through real OpenMPI."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from support.e2e_support import DLC_JOB, TWO_NODE, needs_unshare, read_log, run_script, start_node, wait_all
from support.exhaustive import exhaustive_only
from support.jobs import TESTS, write_jsonl

from elastic_sharding.claims.submission import Generation

pytestmark = pytest.mark.e2e

NODES = ("node-a", "node-b", "node-c")
QUICK = ("--poll-interval-secs", "1", "--lock-timeout-secs", "120", "--coordinator-lease-secs", "4")


def start_dlc(name: str, tmp_path: Path, *args: str, script: Path = DLC_JOB) -> subprocess.Popen:
    return start_node(name, "dlc", *args, *QUICK, log=tmp_path / f"{name}.log", script=script)


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def status_json(job: Path) -> dict:
    return json.loads(run_script(DLC_JOB, "status", "--job-dir", str(job), "--json", check=False).stdout)


@needs_unshare
@exhaustive_only  # CI: test_launch.py takes a dead coordinator over with the fake processor
def test_killed_prepare_coordinator_is_taken_over_and_fewer_workers_than_nodes_finish(tmp_path, demo_baseline):
    job = tmp_path / "job"
    args = ("--job-dir", str(job), "--nodes", "3", "--num-shards", "4", "--run-id", "elastic-1")
    gen = Generation(job, "elastic-1")
    first = start_dlc("node-a", tmp_path, *args)
    deadline = time.monotonic() + 60
    while not gen.lock_path("prepare").exists():
        assert time.monotonic() < deadline and first.poll() is None, read_log(tmp_path, "node-a")[-3000:]
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not gen.result_path("prepare").exists(), "the coordinator must die before publishing its result"
    assert "elected as DLC prepare coordinator" in read_log(tmp_path, "node-a")

    codes = wait_all({name: start_dlc(name, tmp_path, *args) for name in ("node-b", "node-c")})
    logs = read_log(tmp_path, "node-b") + read_log(tmp_path, "node-c")
    assert codes == {"node-b": 0, "node-c": 0}, logs[-4000:]
    assert "DLC prepare coordinator host=node-a" in logs and "taking the phase over" in logs
    # The instance that moves the dead lock away is not always the one that wins the new lock.
    assert logs.count("elected as DLC prepare coordinator") == 1
    assert {s["host"] for s in status_json(job)["shards"]} <= {"node-b", "node-c"}
    assert lines(job / "merged.jsonl") == demo_baseline


def explode_job(tmp_path: Path) -> tuple[Path, Path, Path]:
    rows = [{"id": i, "text": f"a perfectly normal row number {i}"} for i in range(18)]
    rows[9]["text"] = "this row will EXPLODE in the operator"
    dataset = write_jsonl(tmp_path / "data" / "rows.jsonl", rows)
    fixed = tmp_path / "fixed"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"dataset_path: {dataset}\n"
        f"custom_operator_paths: [{TESTS / 'data' / 'explode_op'}]\n"
        f"process:\n  - explode_on_marker_mapper:\n      fixed_flag: {fixed}\n"
    )
    return recipe, dataset, fixed


def assert_failed_everywhere(tmp_path: Path, job: Path, run_id: str, codes: dict[str, int], expected: str) -> None:
    gen = Generation(job, run_id)
    abort = gen.abort_record()
    assert abort is not None and expected in abort.reason, abort
    assert set(codes.values()) == {abort.exit_code} == {2}, codes
    for name in codes:
        assert f"failed during {abort.phase}" in read_log(tmp_path, name)
    assert not gen.lock_path("finalize").exists(), "verify/merge must never run after a failure"
    assert not (job / "merged.jsonl").exists() and not (job / "merge.json").exists()


@needs_unshare
@exhaustive_only  # CI: test_launch.py ends every instance on a failed shard with the fake processor; the local failure below surfaces the real engine's error
def test_a_worker_failure_ends_every_node_with_one_code_and_a_new_run_id_recovers(tmp_path):
    recipe, _, fixed = explode_job(tmp_path)
    job = tmp_path / "job"
    common = ("--config", str(recipe), "--job-dir", str(job), "--num-shards", "3", "--max-retries", "0")
    codes = wait_all({name: start_dlc(name, tmp_path, *common, "--run-id", "run-1") for name in NODES})
    assert_failed_everywhere(tmp_path, job, "run-1", codes, "ValueError: row contains the marker EXPLODE")

    fixed.touch()
    codes = wait_all({name: start_dlc(name, tmp_path, *common, "--run-id", "run-2") for name in NODES})
    assert codes == dict.fromkeys(NODES, 0), read_log(tmp_path, "node-a")[-3000:]
    assert [orjson.loads(line)["id"] for line in lines(job / "merged.jsonl")] == list(range(18))


@needs_unshare
@exhaustive_only  # CI: test_launch.py ends every instance on a prepare failure with the fake processor
def test_a_prepare_failure_ends_every_node_with_one_code_and_a_new_run_id_recovers(tmp_path):
    recipe, dataset, fixed = explode_job(tmp_path)
    fixed.touch()
    good = dataset.read_bytes()
    dataset.write_bytes(good.replace(b'"id":4,', b'"id":4,,'))
    job = tmp_path / "job"
    common = ("--config", str(recipe), "--job-dir", str(job), "--num-shards", "3")
    codes = wait_all({name: start_dlc(name, tmp_path, *common, "--run-id", "run-1") for name in NODES})
    assert_failed_everywhere(tmp_path, job, "run-1", codes, f"{dataset}:5: ")
    assert not job.exists(), "a failed prepare leaves no job directory"

    dataset.write_bytes(good)
    codes = wait_all({name: start_dlc(name, tmp_path, *common, "--run-id", "run-2") for name in NODES})
    assert codes == dict.fromkeys(NODES, 0), read_log(tmp_path, "node-a")[-3000:]
    assert len(lines(job / "merged.jsonl")) == 18


@needs_unshare
@exhaustive_only  # CI: test_launch.py checks the wrapper's arguments; test_e2e.py runs two real nodes
def test_two_node_wrapper_runs_the_strict_two_node_job(tmp_path, demo_baseline):
    job = tmp_path / "two-node"
    nodes = {name: start_dlc(name, tmp_path, f"--job-dir={job}", "--run-id", "two", script=TWO_NODE) for name in NODES[:2]}
    codes = wait_all(nodes)
    assert codes == {"node-a": 0, "node-b": 0}, read_log(tmp_path, "node-a")[-3000:]
    assert "strict (2 nodes, at most 2 shard(s) per Worker)" in read_log(tmp_path, "node-a")
    assert lines(job / "two-node-merged.jsonl") == demo_baseline and not (job / "merged.jsonl").exists()
    verify = run_script(TWO_NODE, "verify", "--job-dir", str(job))
    assert "PASS: 4 shards were completed by 2 node(s)" in verify.stderr


@exhaustive_only  # CI: test_parquet_e2e.py runs `local` with two real workers, a new --output directory and a rerun
def test_local_mode_runs_a_whole_job_with_worker_processes(tmp_path, demo_baseline):
    job = tmp_path / "local-job"
    out = tmp_path / "out" / "new" / "result.jsonl"  # --output's directories are created
    proc = run_script(DLC_JOB, "local", "--job-dir", str(job), "--workers", "2", "--output", str(out))
    assert "PASS: 4 shards were completed by 1 node(s)" in proc.stderr
    assert (
        len({line.split("elastic-shard[")[1].split("]")[0] for line in proc.stderr.splitlines() if "] INFO done part-" in line})
        == 2
    )
    assert lines(out) == demo_baseline
    again = run_script(DLC_JOB, "local", "--job-dir", str(job), "--workers", "2", "--output", str(out))
    assert "already this job's verified merge" in again.stderr


def test_local_mode_failure_names_the_root_cause_and_a_rerun_resumes(tmp_path):
    recipe, _, fixed = explode_job(tmp_path)
    job = tmp_path / "job"
    args = ("local", "--config", str(recipe), "--job-dir", str(job), "--num-shards", "3", "--max-retries", "0")
    failed = run_script(DLC_JOB, *args, check=False)
    assert failed.returncode == 2
    error = failed.stderr.strip().splitlines()[-1]
    assert re.search(r"part-00001-of-00003 last error: .*ValueError: row contains the marker EXPLODE", error), error
    assert "run the same command again" in error and not (job / "merged.jsonl").exists()
    fixed.touch()
    again = run_script(DLC_JOB, *args)
    assert "requeued 1 shard(s) that failed in an earlier run" in again.stderr
    assert [orjson.loads(line)["id"] for line in lines(job / "merged.jsonl")] == list(range(18))
