"""End to end with the real Data-Juicer Ray executor and real node-local Ray runtimes.

Two "nodes" are separate worker processes, each in its own UTS namespace with its own hostname,
sharing one job directory. The merged output must equal, row for row and in order, a plain
single-process `dj-process` Ray run of the same recipe over the whole input.
"""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
import pytest
from support.e2e_support import SHARD_JOB, needs_unshare, prepare_demo, prepare_job, processes_with, shard_job, start_node
from support.jobs import REPO, TESTS, write_jsonl

pytestmark = pytest.mark.e2e


@needs_unshare
def test_killed_node_is_taken_over_and_the_result_is_unchanged(tmp_path, demo_baseline):
    import signal
    import time

    job = tmp_path / "job"
    prepare_demo(job, "--num-shards", "2", "--lock-timeout-secs", "6", "--poll-interval-secs", "1")
    node_a = start_node("node-a", "worker", "--job-dir", str(job), log=tmp_path / "node-a.log")
    deadline = time.monotonic() + 120
    while not list(job.glob("attempts/*/*/recipe.yaml")) or not processes_with(str(job / "cache")):  # mid-shard
        assert time.monotonic() < deadline and node_a.poll() is None, (tmp_path / "node-a.log").read_text()[-3000:]
        time.sleep(0.2)
    node_a.send_signal(signal.SIGKILL)
    node_a.wait()
    node_b = start_node("node-b", "worker", "--job-dir", str(job), log=tmp_path / "node-b.log")
    assert node_b.wait(timeout=600) == 0, (tmp_path / "node-b.log").read_text()[-4000:]
    log_b = (tmp_path / "node-b.log").read_text()
    assert "took over stale claim of part-00000-of-00002 from host=node-a" in log_b

    report = json.loads(shard_job("status", "--job-dir", str(job), "--json").stdout)
    assert [s["host"] for s in report["shards"]] == ["node-b", "node-b"]
    assert report["shards"][0]["failures"] == 1
    superseded = list((job / "attempts" / "part-00000-of-00002").glob("*-node-a-*/superseded.json"))
    assert len(superseded) == 1
    merged = tmp_path / "merged.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(merged))
    assert merged.read_bytes().splitlines(keepends=True) == demo_baseline


def test_operator_error_fails_the_attempt_then_retry_completes_the_job(tmp_path):
    rows = [{"id": i, "text": f"a perfectly normal row {i}"} for i in range(12)]
    rows[7]["text"] = "this row will EXPLODE in the operator"
    dataset = write_jsonl(tmp_path / "d.jsonl", rows)
    fixed = tmp_path / "fixed"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"dataset_path: {dataset}\n"
        f"custom_operator_paths: [{TESTS / 'data' / 'explode_op'}]\n"
        "process:\n  - whitespace_normalization_mapper:\n"
        f"  - explode_on_marker_mapper:\n      fixed_flag: {fixed}\n"
    )
    job = tmp_path / "job"
    prepare_job(recipe, job, "--num-shards", "2", "--max-retries", "0", "--poll-interval-secs", "1")
    worker = shard_job("worker", "--job-dir", str(job), check=False)
    assert worker.returncode == 2, worker.stderr[-3000:]
    status = shard_job("status", "--job-dir", str(job), "--json", check=False)
    assert status.returncode == 2
    report = json.loads(status.stdout)
    states = {s["shard_id"]: s["state"] for s in report["shards"]}
    assert states == {"part-00000-of-00002": "done", "part-00001-of-00002": "failed"}, states
    failed = next(s for s in report["shards"] if s["state"] == "failed")
    assert failed["last_error"].endswith("ValueError: row contains the marker EXPLODE"), failed["last_error"]
    assert not (job / "state" / "done" / "part-00001-of-00002.json").exists()

    fixed.touch()
    shard_job("retry", "--job-dir", str(job), "--shard-id", "part-00001-of-00002")
    shard_job("worker", "--job-dir", str(job))
    out = tmp_path / "out.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(out))
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == list(range(12))
    assert len(list((job / "state" / "history").glob("*/part-00001-of-00002/attempts/*"))) == 1


CONTRACT_EXAMPLE_RECIPE = """\
project_name: my-elastic-job
dataset_path: {dataset}
export_path: /mnt/shared/output/ignored-by-shard-worker.jsonl
executor_type: ray
ray_address: local

text_key: text
image_key: images
audio_key: audios
video_key: videos

process:
  - whitespace_normalization_mapper:
      text_key: text
  - text_length_filter:
      text_key: text
      min_len: 10
      max_len: 10000
"""


def test_contract_example_recipe_runs_as_written(tmp_path):
    """The user's README shows a recipe with a top-level `text_key`, which Data-Juicer 1.6.1's
    parser rejects; prepare maps it to `text_keys` so the example works as written."""
    rows = [
        {"id": i, "text": ("  short " if i % 3 == 0 else f"row {i} has\tenough   text to keep"), "images": []} for i in range(9)
    ]
    dataset = write_jsonl(tmp_path / "in.jsonl", rows)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(CONTRACT_EXAMPLE_RECIPE.format(dataset=dataset))
    job = tmp_path / "job"
    prepare_job(recipe, job, "--num-shards", "1")
    shard_job("worker", "--job-dir", str(job))
    out = tmp_path / "out.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(out))
    got = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["id"] for r in got] == [i for i in range(9) if i % 3]
    assert got[0]["text"] == "row 1 has enough   text to keep", got[0]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_stopping_a_real_worker_stops_its_data_juicer_process(tmp_path, sig):
    import signal
    import time

    job = tmp_path / "job"
    prepare_demo(job, "--num-shards", "1", "--lock-timeout-secs", "600")
    worker = subprocess.Popen(
        [sys.executable, str(SHARD_JOB), "worker", "--job-dir", str(job)], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list(job.glob("attempts/*/*/recipe.yaml")) or not processes_with(str(job / "cache")):
        assert time.monotonic() < deadline and worker.poll() is None, "dj-process never started"
        time.sleep(0.2)
    worker.send_signal(getattr(signal, sig))
    _, err = worker.communicate(timeout=120)
    deadline = time.monotonic() + 60
    while processes_with(str(job / "cache")):
        assert time.monotonic() < deadline, "Data-Juicer or Ray outlived its worker"
        time.sleep(0.2)
    lock = job / "state" / "locks" / "part-00000-of-00001.json"
    if sig == "SIGTERM":
        assert worker.returncode == 2 and "handed back" in err, err[-2000:]
        assert not lock.exists(), "a drained worker hands its shard back at once"
    else:
        assert lock.exists(), "a killed worker's claim stays until another worker sees it go stale"
    assert not (job / "state" / "done" / "part-00000-of-00001.json").exists()
