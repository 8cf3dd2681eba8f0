"""Backup attempts with real Data-Juicer + Ray warm runners on two nodes with their own hostnames:
whichever node holds the job's last shard is throttled to a few percent of a core mid-shard
(alive: it keeps heartbeating, so its claim never goes stale); the other node, idle, backs the
straggler up and wins. The slow attempt stops in its warm runtime (which is not restarted),
publishes nothing, and the merged output equals one plain `dj-process` run."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from support.e2e_support import (
    DEMO_DATA,
    DEMO_RECIPE,
    REPO,
    SHARD_JOB,
    needs_unshare,
    prepare_job,
    shard_job,
    start_node,
    wait_all,
)
from support.throttle import CpuThrottle, cgroup_throttle_available

from elastic_sharding.layout import PROCESSED_NAMES

pytestmark = [
    needs_unshare,
    pytest.mark.skipif(not cgroup_throttle_available(), reason="needs root and the cgroup v1 cpu controller"),
]

NODES = ("node-a", "node-b")
BENCH_OPS = REPO / "bench" / "ops" / "bench_ops"
SHARDS = 8
LAST = f"part-{SHARDS - 1:05d}-of-{SHARDS:05d}"


def _await(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _spinning_demo(path):
    """The demo recipe plus an operator that burns 40 ms of CPU per row and changes nothing (so
    the output is the demo's): a shard takes long enough to be throttled mid-shard."""
    config = yaml.safe_load(DEMO_RECIPE.read_text())
    config["dataset_path"] = str(DEMO_DATA)
    config["custom_operator_paths"] = [str(BENCH_OPS)]
    config["process"].append({"bench_spin_mapper": {"ms_per_row": 40}})
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_throttled_node_is_backed_up_and_the_backup_wins(tmp_path, demo_baseline):
    job = tmp_path / "job"
    prepare_job(
        _spinning_demo(tmp_path / "recipe.yaml"), job, "--num-shards", str(SHARDS), "--lock-timeout-secs", "600", "--heartbeat-interval-secs", "1",
        "--poll-interval-secs", "0.5", "--ray-num-cpus", "1", "--backup-after", "1.5", "--backup-min-secs", "3",
    )  # fmt: skip
    nodes = {
        name: start_node(name, "worker", "--job-dir", str(job), log=tmp_path / f"{name}.log", script=SHARD_JOB) for name in NODES
    }
    logs = lambda: {name: (tmp_path / f"{name}.log").read_text()[-4000:] for name in NODES}  # noqa: E731
    lock = job / "state" / "locks" / f"{LAST}.json"
    try:
        _await(lock.exists, 600, "a node to claim the last shard")
        holder = json.loads(lock.read_text())
        with CpuThrottle(holder["pid"], share=0.05):
            done = lambda: all((job / "state" / "done" / f"part-{i:05d}-of-{SHARDS:05d}.json").exists() for i in range(SHARDS))  # noqa: E731
            _await(done, 600, "every shard to be published while the holder is throttled")
        codes = wait_all(nodes, timeout=300)
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                proc.kill()
    assert codes == dict.fromkeys(NODES, 0), logs()

    slow = holder["host"]
    records = [json.loads(p.read_text()) for p in job.glob("attempts/*/*/attempt.json")]
    backups = [r for r in records if r["backup_of"]]
    won = [r for r in backups if r["status"] == "succeeded"]
    assert won, f"no backup won: {backups}\n{logs()}"
    assert all(r["host"] != slow for r in backups), "only the idle node backs up"
    for backup in won:
        done_record = json.loads((job / "state" / "done" / f"{backup['shard_id']}.json").read_text())
        assert done_record["attempt_id"] == backup["attempt_id"]
        original = next(r for r in records if r["attempt_id"] == backup["backup_of"])
        assert original["host"] == slow and original["status"] == "beaten", original
        attempt_dir = job / "attempts" / original["shard_id"] / original["attempt_id"]
        assert not any((attempt_dir / name).exists() for name in (*PROCESSED_NAMES.values(), "ray-output.jsonl"))
        claim = json.loads((job / "state" / "locks" / f"{backup['shard_id']}.json").read_text())
        assert claim["status"] == "done"
    assert not [r for r in records if r["status"] in ("failed", "fenced")], records
    # The slow attempt was cancelled inside its warm runtime: that runtime was never replaced.
    assert len(list((job / "logs").glob(f"warm-{slow}-*.log"))) == 1, sorted(p.name for p in (job / "logs").iterdir())

    status = json.loads(shard_job("status", "--job-dir", str(job), "--json").stdout)
    assert status["complete"]
    shown = status["backups"]
    assert {b["attempt_id"] for b in shown} == {b["attempt_id"] for b in backups}
    assert any(b["state"] == "won" for b in shown)

    out = tmp_path / "merged.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(out))
    shard_job("verify", "--job-dir", str(job), "--output", str(out))
    assert out.read_bytes().splitlines(keepends=True) == demo_baseline
