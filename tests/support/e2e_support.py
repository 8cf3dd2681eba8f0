"""Helpers of the end-to-end tests: real Data-Juicer + Ray, "nodes" with their own hostnames."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml

from support.jobs import REPO

SCRIPTS = REPO / "demos" / "elastic_sharding"
SHARD_JOB = SCRIPTS / "shard_job.py"
DLC_JOB = SCRIPTS / "dlc_job.py"
TWO_NODE = SCRIPTS / "two_node_test.py"
DEMO_RECIPE = SCRIPTS / "configs" / "demo.yaml"
DEMO_DATA = REPO / "demos" / "data" / "demo-dataset.jsonl"


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="needs root and `unshare --uts` to give each node its own hostname")


def run_script(script: Path, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(script), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script.name} {' '.join(args)} exited {proc.returncode}\n{proc.stderr[-4000:]}")
    return proc


def shard_job(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_script(SHARD_JOB, *args, check=check)


def prepare_job(recipe: Path, job: Path, *options: str) -> None:
    shard_job("prepare", "--config", str(recipe), "--job-dir", str(job), *options)


def prepare_demo(job: Path, *options: str) -> None:
    prepare_job(DEMO_RECIPE, job, *options)


def start_node(
    hostname: str, *args: str, log: Path, script: Path = SHARD_JOB, python: str | Path = sys.executable
) -> subprocess.Popen:
    """`script` in its own UTS namespace, so gethostname() differs per simulated node, run by
    `python` (the node's environment)."""
    command = " ".join(["hostname", hostname, "&&", "exec", str(python), str(script), *args])
    return subprocess.Popen(["unshare", "--uts", "sh", "-c", command], cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def wait_all(nodes: dict[str, subprocess.Popen], timeout: float = 900) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    return {name: proc.wait(timeout=max(1.0, deadline - time.monotonic())) for name, proc in nodes.items()}


def read_log(logs: Path, name: str) -> str:
    return (logs / f"{name}.log").read_text()


def baseline_rows(recipe: Path, dataset: Path, workdir: Path) -> list[bytes]:
    """A plain single-process dj-process Ray run over the whole input, in input (id) order."""
    config = yaml.safe_load(recipe.read_text())
    config.update(
        dataset_path=str(dataset), export_path=str(workdir / "baseline.jsonl"), work_dir=str(workdir), skip_op_error=False
    )
    path = workdir / "baseline.yaml"
    path.write_text(yaml.safe_dump(config))
    entry = "import sys; from data_juicer.tools.process_data import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", entry, "--config", str(path)], cwd=workdir, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = workdir / "baseline.jsonl"
    parts = sorted(out.iterdir()) if out.is_dir() else [out]
    lines = [line for part in parts for line in part.read_bytes().splitlines(keepends=True)]
    return sorted(lines, key=lambda line: orjson.loads(line)["id"])


def processes_with(marker: str) -> list[int]:
    """Processes whose command line or environment mentions `marker` (a job directory is in the
    environment of every process a runner starts, Ray's included, via XDG_CACHE_HOME)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text:
            found.append(int(entry.name))
    return found


def run_on_nodes(
    tmp_path: Path, recipe: Path, dataset: Path, shards: int, workers: int, name: str = "node"
) -> tuple[list[dict], dict]:
    """prepare `recipe` over `dataset`, `workers` worker processes with their own hostnames
    (`<name>-<n>`), merge and verify: the merged rows, parsed, and `status --json`."""
    job, merged = tmp_path / "job", tmp_path / "merged.jsonl"
    shard_job(
        "prepare", "--config", str(recipe), "--dataset-path", str(dataset), "--job-dir", str(job),
        "--num-shards", str(shards), "--poll-interval-secs", "0.5", "--heartbeat-interval-secs", "1",
        "--ray-num-cpus", "1",
    )  # fmt: skip
    logs = [tmp_path / f"{name}-{n}.log" for n in range(workers)]
    nodes = {f"{name}-{n}": start_node(f"{name}-{n}", "worker", "--job-dir", str(job), log=logs[n]) for n in range(workers)}
    codes = wait_all(nodes)
    assert set(codes.values()) == {0}, {log.name: log.read_text()[-3000:] for log in logs}
    shard_job("merge", "--job-dir", str(job), "--output", str(merged))
    shard_job("verify", "--job-dir", str(job), "--output", str(merged))
    status = json.loads(shard_job("status", "--job-dir", str(job), "--json", check=False).stdout)
    return [orjson.loads(line) for line in merged.read_bytes().splitlines()], status
