"""Watching a real job: three nodes (own hostnames) run the demo with real Data-Juicer + Ray;
status mid-run shows per-node throughput and an ETA, the report opens in headless Chromium with
one bar per attempt, and the merged output is the single-run output."""

from __future__ import annotations

import json
import time

import pytest
from jsonschema import Draft202012Validator
from support.browser import needs_chromium, open_report
from support.e2e_support import SHARD_JOB, needs_unshare, prepare_demo, shard_job, start_node, wait_all
from support.jobs import STATUS_SCHEMA

from elastic_sharding.observe.html_report import write_report
from elastic_sharding.observe.status import Status

pytestmark = pytest.mark.e2e

NODES = ("node-a", "node-b", "node-c")


@needs_unshare
@needs_chromium
def test_three_nodes_status_mid_run_and_the_report_in_a_browser(tmp_path, demo_baseline):
    job = tmp_path / "job"
    prepare_demo(job, "--num-shards", "12", "--lock-timeout-secs", "600", "--heartbeat-interval-secs", "1", "--ray-num-cpus", "1")
    nodes = {
        name: start_node(name, "worker", "--job-dir", str(job), log=tmp_path / f"{name}.log", script=SHARD_JOB) for name in NODES
    }
    validator = Draft202012Validator(STATUS_SCHEMA)
    mid = None
    deadline = time.monotonic() + 600
    while any(proc.poll() is None for proc in nodes.values()) and time.monotonic() < deadline:
        report = Status(job).as_json()
        assert not list(validator.iter_errors(report))
        if mid is None and report["eta"]["secs"] and report["counts"]["done"] >= 2 and report["counts"]["running"]:
            mid = report
            mid_text = shard_job("status", "--job-dir", str(job), check=False).stdout
        time.sleep(0.3)
    codes = wait_all(nodes, timeout=60)
    logs = {name: (tmp_path / f"{name}.log").read_text()[-3000:] for name in NODES}
    assert codes == dict.fromkeys(NODES, 0), logs

    assert mid is not None, "never saw the job mid-run with an ETA"
    assert mid["throughput"]["rows_per_sec"] > 0 and 0 < mid["progress"]["percent"] < 100
    assert mid["eta"]["secs"] > 0 and ("throughput" in mid["eta"]["basis"] or "tail" in mid["eta"]["basis"])
    rated = [node for node in mid["nodes"] if node["rows_per_sec"]]
    assert rated and all(node["host"] in NODES for node in mid["nodes"])
    running = [item for node in mid["nodes"] for item in node["running"]]
    assert running and all(item["phase"] for item in running)
    assert "nodes:" in mid_text and "rows/s" in mid_text and "ETA" in mid_text

    final = json.loads(shard_job("status", "--job-dir", str(job), "--json").stdout)
    assert final["complete"] and final["eta"]["basis"] == "complete"
    assert sum(node["shards_done"] for node in final["nodes"]) == 12
    assert {node["host"] for node in final["nodes"]} <= set(NODES)

    page = tmp_path / "report.html"
    assert shard_job("report", "--job-dir", str(job), "--output", str(page)).returncode == 0
    attempts = len(list(job.glob("attempts/*/*/attempt.json")))
    dom = open_report(page, tmp_path / "profile", "three-nodes-report")
    assert dom.count('class="attempt ') == attempts >= 12
    records = [json.loads(path.read_text()) for path in job.glob("attempts/*/*/attempt.json")]
    started = [r for r in records if r.get("setup_secs")]
    if all(r["runner"] == "warm" for r in records):  # the process runner starts Ray inside every attempt
        assert {r["host"] for r in started} == set(NODES), "each node's first shard started its warm runtime"
    assert dom.count('class="setup"') == len(started)
    assert write_report(job, tmp_path / "again.html") == attempts

    out = tmp_path / "merged.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(out))
    assert out.read_bytes().splitlines(keepends=True) == demo_baseline
