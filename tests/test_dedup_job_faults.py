"""A job whose recipe has a deduplicator, its workers killed (kill -9) or its stage failing: nothing
lost or duplicated, the result unchanged, the failure seen and retried.

The segments' shards run on the fast fake processor (tests/support/fakes.py: it copies rows and
drops those whose id is 3 modulo 7); the stage runs Data-Juicer's own `document_deduplicator`.
Each worker is a real process; a crash point kills it with SIGKILL where the code says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import orjson
import pytest
from support.dedup_corpus import prose_rows
from support.fake_worker import worker_command
from support.jobs import DEDUP_RECIPE, REPO, write_jsonl

SHARDS = 4
STAGE_POINTS = [f"dedup-{phase}{end}" for phase in ("keys", "buckets", "keep") for end in ("", "-done")]
# The segment after the stage: the victim's 5th and 6th claim or publication is one of its shards.
SEGMENT_POINTS = ["claimed@5", "published@6"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}", **extra}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "elastic_sharding", *args], env=_env(), capture_output=True, text=True, timeout=300
    )


def _worker(job, *options: str, **env: str) -> subprocess.CompletedProcess:
    argv = worker_command(job, "--keep-fake-recipe", *options)
    return subprocess.run(argv, env=_env(**env), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A prepared job and the merged output of one clean fake worker over a copy of it."""
    root = tmp_path_factory.mktemp("dedup-job")
    data = write_jsonl(root / "input.jsonl", prose_rows(600, seed=9))
    recipe = root / "recipe.yaml"
    recipe.write_text(DEDUP_RECIPE.format(dataset=data))
    job = root / "job"
    proc = _cli("prepare", "--config", str(recipe), "--job-dir", str(job), "--num-shards", str(SHARDS),
                "--lock-timeout-secs", "3", "--heartbeat-interval-secs", "0.3", "--poll-interval-secs", "0.2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    clean = root / "clean"
    subprocess.run(["cp", "-a", str(job), str(clean)], check=True)
    assert _worker(clean).returncode == 0
    out = root / "clean.jsonl"
    assert _cli("merge", "--job-dir", str(clean), "--output", str(out)).returncode == 0
    return job, out.read_bytes()


def _copy(prepared, tmp_path):
    job = tmp_path / "job"
    subprocess.run(["cp", "-a", str(prepared[0]), str(job)], check=True)
    return job


def _merged(job, tmp_path) -> bytes:
    out = tmp_path / "merged.jsonl"
    proc = _cli("merge", "--job-dir", str(job), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert _cli("verify", "--job-dir", str(job), "--output", str(out)).returncode == 0
    return out.read_bytes()


def test_the_clean_run_drops_duplicates_across_shards(prepared):
    ids = [orjson.loads(line)["id"] for line in prepared[1].splitlines()]
    assert ids == sorted(set(ids))
    assert 420 < len(ids) < 600 * 6 / 7 - 20, "the stage must have dropped planted duplicates"


@pytest.mark.parametrize("point", STAGE_POINTS + SEGMENT_POINTS)
def test_a_worker_killed_at_each_crash_point_loses_nothing(prepared, tmp_path, point):
    job = _copy(prepared, tmp_path)
    victim = _worker(job, ELASTIC_SHARD_CRASH_AT=point)
    assert victim.returncode == -9, f"the victim did not reach {point}: {victim.stderr[-2000:]}"
    survivor = _worker(job)  # on the same host: the dead pid's claim is taken over at once
    assert survivor.returncode == 0, survivor.stderr[-3000:]
    assert _merged(job, tmp_path) == prepared[1]


def test_a_failed_stage_ends_every_worker_and_retry_resumes_it(prepared, tmp_path):
    job = _copy(prepared, tmp_path)
    # A keep unit that cannot write its output fails the stage for everyone, naming the unit.
    blocker = job / "stages" / "1" / "shards"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory")
    failed = _worker(job)
    assert failed.returncode != 0
    assert "keep-00000" in failed.stderr, failed.stderr[-2000:]
    status = json.loads(_cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["exit_code"] == 2 and status["stages"][0]["state"] == "failed"
    assert _worker(job).returncode != 0, "a failed stage stays failed until `retry`"
    blocker.unlink()
    retried = _cli("retry", "--job-dir", str(job), "--all-failed")
    assert retried.returncode == 0, retried.stderr
    assert _worker(job).returncode == 0
    assert _merged(job, tmp_path) == prepared[1]
