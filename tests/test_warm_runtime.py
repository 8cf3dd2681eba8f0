"""The warm runner with the real Data-Juicer + Ray: same output as the process runner, node caps,
an existing head, and a runtime that crashes, loses Ray or hangs mid-shard."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
from support.e2e_support import SHARD_JOB, prepare_demo, prepare_job, processes_with, shard_job
from support.exhaustive import exhaustive_only
from support.jobs import TESTS, write_jsonl

pytestmark = pytest.mark.e2e


@pytest.fixture
def ray_tmp():
    """A short private Ray temp dir (Ray's socket paths must stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="esray", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _merged(job: Path, out: Path) -> bytes:
    shard_job("merge", "--job-dir", str(job), "--output", str(out))
    return out.read_bytes()


def _attempts(job: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(job.glob("attempts/*/*/attempt.json"))]


def _gone(marker: str, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not processes_with(marker)


def test_warm_and_process_runners_give_identical_output_with_node_caps(tmp_path, demo_baseline, ray_tmp):
    caps = ["--ray-num-cpus", "1", "--ray-object-store-mb", "200", "--ray-temp-dir", str(ray_tmp)]
    outputs = {}
    for runner in ("process", "warm"):
        job = tmp_path / runner
        prepare_demo(job, "--num-shards", "2", "--lock-timeout-secs", "60", "--poll-interval-secs", "0.5", *caps)
        worker = shard_job("worker", "--job-dir", str(job), "--runner", runner)
        assert re.search(r"runner=" + runner, worker.stderr)
        outputs[runner] = _merged(job, tmp_path / f"{runner}.jsonl")
        records = _attempts(job)
        assert [r["runner"] for r in records] == [runner] * 2 and all(r["status"] == "succeeded" for r in records)
        for attempt in job.glob("attempts/*/*/"):
            assert "Processing data" in (attempt / "process.log").read_text()
    assert outputs["warm"] == outputs["process"] == b"".join(demo_baseline)

    warm = tmp_path / "warm"
    logs = [(a / "process.log").read_text().splitlines()[0] for a in sorted(warm.glob("attempts/*/*/"))]
    pids = {re.search(r"warm runtime pid (\d+)", line).group(1) for line in logs}
    assert len(pids) == 1, logs
    assert [re.search(r"shard (\d+) in it", line).group(1) for line in logs] == ["1", "2"]
    runtime_log = next((warm / "logs").glob("warm-*.log")).read_text()
    assert "--num-cpus 1 --object-store-mb 200" in runtime_log
    assert any(ray_tmp.glob("session_*")), "the Ray runtime did not use --ray-temp-dir"
    assert _gone(str(ray_tmp))


@exhaustive_only  # CI: the warm runtime's own Ray start is exercised by every e2e test; this is the `ray_address` branch
def test_warm_runner_uses_an_existing_ray_head(tmp_path, demo_baseline, ray_tmp):
    ray_cli = Path(sys.executable).parent / "ray"
    port = 26379 + os.getpid() % 1000
    # Ray >= 2.59 authenticates clients of a head: both sides get the same token, as users do.
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    head = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=1",
            f"--temp-dir={ray_tmp}",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
        ],
        stdout=open(tmp_path / "head.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **auth},
    )
    try:
        job = tmp_path / "job"
        prepare_demo(job, "--num-shards", "2", "--lock-timeout-secs", "60", "--poll-interval-secs", "0.5")
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (tmp_path / "head.log").read_text():
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(0.5)
        address = f"127.0.0.1:{port}"
        worker = subprocess.run(
            [sys.executable, str(SHARD_JOB), "worker", "--job-dir", str(job), "--runner", "warm", "--ray-address", address],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **auth},
        )
        assert worker.returncode == 0, worker.stderr[-3000:] + (tmp_path / "head.log").read_text()[-2000:]
        assert f"ray address {address}" in worker.stderr
        assert _merged(job, tmp_path / "out.jsonl") == b"".join(demo_baseline)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        for pid in processes_with(str(ray_tmp)):  # Ray's own processes of the head we started
            os.kill(pid, signal.SIGKILL)


def _wait_for(path: Path, worker: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)


def _next_runtime(log: Path, seen: Path, worker: subprocess.Popen, number: int) -> int:
    """Wait until the `number`-th warm runtime is ready and its shard is mid-processing; its pid."""
    deadline = time.monotonic() + 180
    while len(re.findall(r"warm runtime pid \d+ ready", log.read_text())) < number:
        assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)
    seen.unlink(missing_ok=True)
    _wait_for(seen, worker, log)
    return int(re.findall(r"warm runtime pid (\d+) ready", log.read_text())[-1])


def test_warm_runtime_crash_ray_death_and_hang_each_fail_one_attempt_then_the_job_completes(tmp_path, ray_tmp):
    rows = [{"id": i, "text": f"row number {i}"} for i in range(8)]
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    flag, seen = tmp_path / "stall", tmp_path / "seen"
    flag.touch()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"dataset_path: {dataset}\n"
        f"custom_operator_paths: [{TESTS / 'data' / 'stall_op'}]\n"
        f"process:\n  - stall_while_flag_mapper:\n      flag: {flag}\n      seen: {seen}\n"
    )
    job = tmp_path / "job"
    prepare_job(
        recipe,
        job,
        *("--num-shards", "2", "--max-retries", "3", "--lock-timeout-secs", "10"),
        *("--heartbeat-interval-secs", "1", "--poll-interval-secs", "0.5", "--ray-temp-dir", str(ray_tmp)),
    )
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, str(SHARD_JOB), "worker", "--job-dir", str(job), "--runner", "warm"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )
    try:
        # 1. Ray's raylet dies under a running shard.
        _next_runtime(log, seen, worker, 1)
        raylets = [pid for pid in processes_with(str(ray_tmp)) if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert raylets
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
        # 2. The warm process itself is killed.
        os.kill(_next_runtime(log, seen, worker, 2), signal.SIGKILL)
        # 3. The warm process stops answering (hang).
        hung = _next_runtime(log, seen, worker, 3)
        stopped = time.monotonic()
        os.kill(hung, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while "sent no pulse" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        detected = time.monotonic() - stopped
        flag.unlink()
        assert worker.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text()
    assert detected < 5 + 1 + 3, f"hang detected after {detected:.1f}s"
    assert not Path(f"/proc/{hung}").exists() or b"zombie" in Path(f"/proc/{hung}/status").read_bytes().lower()
    report = json.loads(shard_job("status", "--job-dir", str(job), "--json").stdout)
    assert report["complete"]
    # The warm runner claims the second shard ahead at once, so the three failures may fall on either shard.
    assert sum(shard["failures"] for shard in report["shards"]) == 3, report["shards"]
    errors = [a["error"] for a in sorted(_attempts(job), key=lambda a: a["finished_at"]) if a["status"] == "failed"]
    assert len(errors) == 3
    assert any("Ray" in e or "died" in e for e in errors[:1]), errors
    assert "died" in errors[1] and "sent no pulse" in errors[2], errors
    assert len(re.findall(r"starting warm runtime pid", text)) == 4
    out = tmp_path / "out.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(out))
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == list(range(8))
    assert _gone(str(ray_tmp)) and _gone(str(job / "cache"))
