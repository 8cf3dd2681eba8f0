"""Warm operators with the real Data-Juicer + Ray: an actor-mode operator's instances live for the
whole worker, its "model" loads once per instance whatever the shard count, the output equals one
plain `dj-process` run, and a killed, a frozen or a superseded instance costs only the attempts
that had rows in it.

The operator is the bench's stand-in model (`bench/ops/bench_ops`, `bench_model_mapper`): the
first row a process handles sleeps `load_secs` and appends the process id to `load_log`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml
from support.e2e_support import SHARD_JOB, baseline_rows, needs_unshare, prepare_job, processes_with, shard_job, start_node
from support.jobs import REPO, write_jsonl

pytestmark = pytest.mark.e2e

BENCH_OPS = REPO / "bench" / "ops" / "bench_ops"
QUICK = ("--heartbeat-interval-secs", "1", "--poll-interval-secs", "0.5")


def _job(tmp_path: Path, rows: int = 120, **op: object) -> tuple[Path, Path, Path]:
    dataset = write_jsonl(tmp_path / "data.jsonl", [{"id": i, "text": f"row {i} " + "x" * (i % 13)} for i in range(rows)])
    loads = tmp_path / "loads.log"
    settings = {"load_secs": 1.0, "ms_per_row": 10, "load_log": str(loads), "ray_execution_mode": "actor", "num_proc": 1}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "executor_type": "ray",
                "ray_address": "local",
                "dataset_path": str(dataset),
                "custom_operator_paths": [str(BENCH_OPS)],
                "process": [{"bench_model_mapper": {**settings, **op}}],
            }
        )
    )
    return recipe, dataset, loads


def _loads(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _attempts(job: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(job.glob("attempts/*/*/attempt.json"))]


def _merged_ids(job: Path, out: Path) -> list[int]:
    shard_job("merge", "--job-dir", str(job), "--output", str(out), "--overwrite")
    return [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]


def _wait_for(predicate, what: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"worker ended while waiting for {what}: " + log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}: " + log.read_text()[-4000:]
        time.sleep(0.2)


def _worker(job: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SHARD_JOB), "worker", "--job-dir", str(job), "--runner", "warm"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def test_instances_load_once_survive_a_kill_and_a_hang_and_the_output_matches_dj_process(tmp_path):
    """One worker, 6 shards, one instance. The instance is killed (kill -9) while it has rows,
    then its replacement is frozen (SIGSTOP): each costs only the attempts with rows in it, the
    runtime stays up, every instance loads the model once, and the merged output is byte for
    byte one plain `dj-process` run's."""
    flag, seen = tmp_path / "stall", tmp_path / "seen"
    recipe, dataset, loads = _job(tmp_path, stall_flag=str(flag), stall_seen=str(seen))
    job = tmp_path / "job"
    prepare_job(recipe, job, "--num-shards", "6", "--max-retries", "3", *QUICK)
    flag.touch()
    log = tmp_path / "worker.log"
    worker = _worker(job, log)
    try:
        _wait_for(seen.exists, "rows inside the first instance", worker, log)
        first = int(seen.read_text())
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: seen.read_text().strip() not in ("", str(first)), "a replacement instance", worker, log)
        second = int(seen.read_text())
        os.kill(second, signal.SIGSTOP)
        _wait_for(lambda: "did not answer" in _runtime_logs(job), "hang detection", worker, log, timeout=60)
        _wait_for(lambda: seen.read_text().strip() not in ("", str(first), str(second)), "a third instance", worker, log)
        flag.unlink()
        assert worker.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert log.read_text().count("starting warm runtime pid") == 1, "the runtime itself stayed up"
    records = _attempts(job)
    failed = [a for a in records if a["status"] == "failed"]
    assert failed and all("died" in a["error"] for a in failed), [a["error"] for a in failed]
    assert len(failed) <= 4, "only the attempts with rows in a lost instance (at most two each time)"
    assert len(_loads(loads)) == 3, f"one load per instance: first, after the kill, after the hang: {_loads(loads)}"
    final = max(records, key=lambda a: a["finished_at"])["operators"]
    assert [(o["op"], o["instances"], o["started"], o["deaths"]) for o in final] == [("bench_model_mapper", 1, 3, 2)]
    assert final[0]["rows"] >= 120 and 0 < final[0]["all_busy_secs"] <= final[0]["window_secs"]
    report = json.loads(shard_job("status", "--job-dir", str(job), "--json").stdout)
    assert report["complete"]
    (node,) = report["nodes"]
    (figures,) = node["warm_operators"]
    assert (figures["op"], figures["instances"], figures["loads"], figures["deaths"]) == ("bench_model_mapper", 1, 3, 2)
    assert 0 < figures["all_busy_fraction"] <= 1
    assert "warm op bench_model_mapper: 1 instance(s), 3 load(s), 2 replaced" in shard_job("status", "--job-dir", str(job)).stdout
    out = tmp_path / "merged.jsonl"
    assert _merged_ids(job, out) == list(range(120))
    baseline_dir = tmp_path / "baseline"
    baseline_dir.mkdir()
    recipe.write_text(recipe.read_text().replace(str(flag), ""))  # the baseline must not stall
    loads.unlink()
    assert out.read_bytes().splitlines(keepends=True) == baseline_rows(recipe, dataset, baseline_dir)
    assert len(_loads(loads)) == 1  # Ray Data's own pool, for the one plain run


def _runtime_logs(job: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (job / "logs").glob("warm-*.log"))


@needs_unshare
def test_a_superseded_attempt_whose_rows_are_inside_a_warm_instance_publishes_nothing(tmp_path):
    """Node A's worker is stopped while its shard's rows sit in A's warm instance; node B takes
    the shard over after one lease. Resumed, A cancels the attempt in its runtime (the runtime
    and its instance stay up), publishes nothing, and B's rows are the ones merged."""
    flag, seen = tmp_path / "stall", tmp_path / "seen"
    recipe, _, _ = _job(tmp_path, rows=20, stall_flag=str(flag), stall_seen=str(seen))
    job = tmp_path / "job"
    prepare_job(recipe, job, "--num-shards", "1", "--lock-timeout-secs", "8", *QUICK)
    flag.touch()
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = start_node("node-a", "worker", "--job-dir", str(job), "--runner", "warm", log=log_a)
    try:
        _wait_for(seen.exists, "rows inside node A's instance", a, log_a)
        instance_a = int(seen.read_text())
        a.send_signal(signal.SIGSTOP)
        b = start_node("node-b", "worker", "--job-dir", str(job), "--runner", "warm", log=log_b)
        _wait_for(lambda: seen.read_text().strip() not in ("", str(instance_a)), "node B's instance", b, log_b)
        a.send_signal(signal.SIGCONT)
        _wait_for(lambda: "fenced" in json.dumps(_attempts(job)), "node A to notice", a, log_a, timeout=60)
        time.sleep(1.0)
        assert Path(f"/proc/{instance_a}").exists(), "node A's warm instance outlived the cancelled attempt"
        flag.unlink()
        assert b.wait(timeout=300) == 0, log_b.read_text()[-4000:]
        assert a.wait(timeout=120) == 0, log_a.read_text()[-4000:]
    finally:
        for proc in (a, locals().get("b")):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
    text_a = log_a.read_text()
    assert "is replaced" not in text_a, "cancelling one attempt did not cost node A its runtime"
    mine = [x for x in _attempts(job) if x["host"] == "node-a"]
    assert [x["status"] for x in mine] == ["fenced"], mine
    report = json.loads(shard_job("status", "--job-dir", str(job), "--json").stdout)
    assert {s["host"] for s in report["shards"]} == {"node-b"}
    assert _merged_ids(job, tmp_path / "merged.jsonl") == list(range(20))
    deadline = time.monotonic() + 60
    while processes_with(str(job)):
        assert time.monotonic() < deadline, f"processes of the job outlived both workers: {processes_with(str(job))}"
        time.sleep(0.5)
