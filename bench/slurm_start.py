#!/usr/bin/env python3
"""Start to first shard on a real Slurm: an elastic array job vs an N-node allocation, side by side.

On the test Slurm of tests/support/slurm.py (slurmctld and one slurmd per GlusterFS node, each its
own hostname; root, docs/testing/slurm.md), the bundled demo recipe with real Data-Juicer + Ray is
submitted with `elastic-shard slurm` in both shapes, twice: on an idle cluster, and on a busy one
where another job holds all nodes but one for `--busy-secs`. Printed per case: seconds from
`sbatch` to the first completed shard and to the finished job, and the array's time as a ratio of
the allocation's. The allocation waits for all N nodes at once (gang scheduling); the array starts
on the first free node and grows.

    .venv/bin/python bench/slurm_start.py [--nodes 3] [--busy-secs 45] [--shards 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.cluster import Cluster  # noqa: E402
from support.slurm import SlurmCluster, slurm_available  # noqa: E402

PY = sys.executable
QUICK = ("--poll-interval-secs", "0.5", "--lock-timeout-secs", "60", "--coordinator-lease-secs", "4")


def _done_shards(slurm: SlurmCluster, job: Path) -> int:
    proc = slurm.run([PY, "-m", "elastic_sharding", "status", "--job-dir", str(job), "--json"], cwd=REPO, timeout=60)
    if not proc.stdout.strip():
        return 0
    return sum(s["state"] == "done" for s in json.loads(proc.stdout).get("shards", []))


def run_case(slurm: SlurmCluster, shape: str, busy_secs: float, shards: int, logs: Path) -> dict:
    nodes = len(slurm.node_names)
    if busy_secs:
        blocker = slurm.submit(
            f"#!/bin/bash\nsleep {busy_secs}\n", f"--nodes={nodes - 1}", "--job-name=other-user", "--exclusive"
        )
        slurm.wait_for(lambda: slurm.job(blocker)["JobState"] == "RUNNING", 30, what="the other job running")
    job = slurm.mount / f"{shape}-{'busy' if busy_secs else 'idle'}"
    flags = ("--nodes", str(nodes)) if shape == "allocation" else ("--array", str(nodes))
    started = time.monotonic()
    submitted = slurm.run(
        [PY, "-m", "elastic_sharding", "slurm", "--job-dir", str(job), "--num-shards", str(shards), *flags,
         "--log-dir", str(logs), *QUICK],
        cwd=REPO,
        timeout=120,
    )  # fmt: skip
    if submitted.returncode != 0:
        raise SystemExit(f"elastic-shard slurm failed: {submitted.stderr[-2000:]}")
    job_id = submitted.stdout.strip()
    slurm.wait_for(lambda: _done_shards(slurm, job) > 0, 900, 0.5, "a first completed shard")
    first = time.monotonic() - started
    slurm.wait_done(job_id, timeout=900)
    finished = time.monotonic() - started
    states = sorted({r["JobState"] for r in slurm.job_records(job_id)})
    if states != ["COMPLETED"]:
        raise SystemExit(f"{shape}: the job ended {states}; logs in {logs}\n{slurm.logs(10)}")
    if busy_secs:
        slurm.wait_done(blocker, timeout=busy_secs + 60)
    return {"first_shard_secs": round(first, 1), "job_secs": round(finished, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs each test node declares")
    parser.add_argument("--busy-secs", type=float, default=45, help="how long the other job holds all nodes but one")
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reason = slurm_available()
    if reason:
        raise SystemExit(f"cannot build the test Slurm here: {reason}")
    logs = Path(tempfile.mkdtemp(prefix="es-slurm-bench-"))
    results: dict[str, dict] = {}
    with Cluster(args.nodes, "strict") as cluster, SlurmCluster(cluster, cpus=args.cpus) as slurm:
        for busy in (0.0, args.busy_secs):
            for shape in ("allocation", "array"):
                case = f"{shape}, {'busy' if busy else 'idle'}"
                results[case] = run_case(slurm, shape, busy, args.shards, logs)
                print(f"{case}: {results[case]}", file=sys.stderr, flush=True)
    print(f"{'case':<22}{'first shard':>13}{'whole job':>11}")
    for case, row in results.items():
        print(f"{case:<22}{row['first_shard_secs']:>12.1f}s{row['job_secs']:>10.1f}s")
    for cluster_state in ("idle", "busy"):
        a, b = results[f"array, {cluster_state}"], results[f"allocation, {cluster_state}"]
        print(
            f"{cluster_state}: array / allocation = {a['first_shard_secs'] / b['first_shard_secs']:.2f}x to the first shard, "
            f"{a['job_secs'] / b['job_secs']:.2f}x to the end"
        )
    if args.json:
        args.json.write_text(json.dumps({"nodes": args.nodes, "busy_secs": args.busy_secs, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
