"""A job directory holds each shard's output once: Ray's raw export is removed once collected.

Fast tests (the fake runner, in real worker processes where a crash is needed) cover the
leftovers of a worker killed between collecting and removing, a failed attempt, and a publisher
that died before its sweep; the e2e test measures a real Data-Juicer + Ray run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from support.fake_worker import worker_command
from support.fakes import FakeRunner
from support.jobs import REPO, cli, sample_rows
from support.outputs import output_lines, output_path

from elastic_sharding.claims.protocol import read_claim
from elastic_sharding.errors import AttemptFailed
from elastic_sharding.layout import PROCESSED_NAMES, JobLayout, attempt_files, processed_file
from elastic_sharding.settings import DEFAULT_OUTPUT_CODEC
from elastic_sharding.work.collect import remove_raw_output
from elastic_sharding.work.worker import Worker, WorkerOptions

sys.path.insert(0, str(REPO / "bench"))
from jobdir_measure import job_dir_breakdown, job_dir_bytes  # noqa: E402

SHARD = "part-00000-of-00001"
# What the job directory may hold per input byte, the merged file written elsewhere: the shards
# (about 1.07x: the row index each row carries), the collected outputs (about 1x stored plain, a
# fraction of that stored compressed, the default) and the records and logs; never Ray's raw copy
# (another 1.05x before it was removed once collected). A merged file inside the job directory
# adds its own size (about 1x) and nothing else.
JOB_DIR_TARGET = 2.2


def raw_outputs(job: Path) -> list[Path]:
    return sorted(job.glob("attempts/*/*/ray-output.jsonl"))


def merged_bytes(job: Path, out: Path) -> bytes:
    cli("merge", "--job-dir", str(job), "--output", str(out), "--overwrite", check=True)
    return out.read_bytes()


def crashed_worker(job: Path, point: str) -> subprocess.CompletedProcess:
    """A fake worker in its own process that SIGKILLs itself at crash point `point`."""
    env = {**os.environ, "ELASTIC_SHARD_CRASH_AT": point}
    return subprocess.run(worker_command(job), env=env, capture_output=True, text=True, timeout=120)


# -- fast ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", sorted(PROCESSED_NAMES))
def test_a_collected_attempt_keeps_processed_and_drops_the_raw_export(make_job, tmp_path, codec):
    """The output is kept once, as the job's codec stores it: on disk it takes the record's stored
    size (plain: the size of its lines)."""
    job = make_job(rows=20, shards=2, shard_output_codec=codec)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    layout = JobLayout(job)
    assert raw_outputs(job) == []
    for shard in ("part-00000-of-00002", "part-00001-of-00002"):
        done = json.loads(layout.done(shard).read_text())
        processed = output_path(job, done)
        assert done["output_codec"] == codec and processed.name == PROCESSED_NAMES[codec]
        stored = done["output_bytes"] if codec == "none" else done["stored_bytes"]
        assert processed.stat().st_size == stored and len(output_lines(processed)) == done["output_bytes"]
        if codec != "none":
            assert stored < done["output_bytes"], "stored compressed"
        assert sorted(p.name for p in processed.parent.iterdir()) == [
            "attempt.json",
            "heartbeat.json",
            PROCESSED_NAMES[codec],
            "recipe.yaml",
        ]
    assert [orjson.loads(line) for line in merged_bytes(job, tmp_path / "m.jsonl").splitlines()] == sample_rows(20)


@pytest.mark.parametrize("point", ["collecting", "publishing"])
def test_a_worker_killed_between_collecting_and_removing_leaves_nothing_behind(make_job, tmp_path, point):
    """Killed with the raw export and a partial (collecting) or whole (publishing) processed
    output in its attempt: the worker that takes over and completes the shard removes both."""
    job = make_job(rows=30, shards=1, lock_timeout_secs=1.0, heartbeat_interval_secs=0.1)
    layout = JobLayout(job)
    killed = crashed_worker(job, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (crashed,) = layout.attempts_dir(SHARD).iterdir()
    files = attempt_files(crashed)
    assert files["ray_output"].is_dir(), "the crash is after collecting began, before the removal"
    processed = processed_file(crashed, DEFAULT_OUTPUT_CODEC)
    left = [p.name for p in crashed.iterdir() if p.name.startswith(f".{processed.name}.tmp-")]
    assert processed.exists() == (point == "publishing") and bool(left) == (point == "collecting")

    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    assert raw_outputs(job) == []
    assert sorted(p.name for p in crashed.iterdir()) == ["attempt.json", "heartbeat.json", "recipe.yaml", "superseded.json"]
    done = json.loads(layout.done(SHARD).read_text())
    assert done["attempt_id"] != crashed.name
    assert done["output_codec"] == DEFAULT_OUTPUT_CODEC and output_path(job, done).exists()
    assert [orjson.loads(line) for line in merged_bytes(job, tmp_path / "m.jsonl").splitlines()] == sample_rows(30)


class ExportThenFail(FakeRunner):
    """Exports every row, writes a log, then fails: its first attempt only."""

    def run(self, ctx) -> None:
        super().run(ctx)
        if len(self.calls) == 1:
            ctx.log_path.write_text("ValueError: failed after exporting\n")
            raise AttemptFailed("failed after exporting")


def test_a_failed_attempt_keeps_its_log_and_drops_its_export(make_job, tmp_path):
    job = make_job(rows=20, shards=1, max_retries=1)
    layout = JobLayout(job)
    assert Worker(job, WorkerOptions(), runner=ExportThenFail()).run() == 0
    attempts = sorted(layout.attempts_dir(SHARD).iterdir(), key=lambda p: json.loads((p / "attempt.json").read_text())["status"])
    failed, succeeded = attempts
    assert json.loads(attempt_files(failed)["record"].read_text())["status"] == "failed"
    assert attempt_files(failed)["log"].read_text() == "ValueError: failed after exporting\n"
    assert raw_outputs(job) == []
    done = json.loads(layout.done(SHARD).read_text())
    assert done["attempt_id"] == succeeded.name and output_path(job, done).exists()
    assert [orjson.loads(line) for line in merged_bytes(job, tmp_path / "m.jsonl").splitlines()] == sample_rows(20)


def test_a_publisher_that_died_before_its_sweep_is_swept_by_the_repair(make_job, tmp_path):
    """P6: the owner published and died before sweeping or recording it in the claim; an older
    attempt's leftovers (killed after collecting) are removed by the worker that repairs it."""
    job = make_job(rows=10, shards=1, lock_timeout_secs=0.3, heartbeat_interval_secs=0.05)
    layout = JobLayout(job)
    old = layout.attempt_dir(SHARD, "20000101T000000Z-gone-0123abcd")
    (old / "ray-output.jsonl").mkdir(parents=True)
    (old / "ray-output.jsonl" / "a_000000.json").write_bytes(b'{"__elastic_row__":0,"id":0}\n')
    for name in PROCESSED_NAMES.values():  # an output stored either way, and one being collected
        (old / name).write_bytes(b'{"id":0}\n')
        (old / f".{name}.tmp-gone-1-0123abcd").write_bytes(b'{"id":0}\n')
    (old / "process.log").write_text("the old attempt's log\n")
    worker = Worker(job, WorkerOptions(max_shards=1), runner=FakeRunner())
    worker.claims.finish = lambda claim, status: False  # "dies" right after publishing ...
    worker._sweep_leftovers = lambda shard_id, published=None: None  # ... before its sweep
    assert worker.run() == 0
    assert read_claim(layout, SHARD).status == "running" and (old / "ray-output.jsonl").exists()
    repair = FakeRunner()
    assert Worker(job, WorkerOptions(), runner=repair).run() == 0
    assert repair.calls == [] and read_claim(layout, SHARD).status == "done"
    assert raw_outputs(job) == []
    assert sorted(p.name for p in old.iterdir()) == ["process.log"]
    done = json.loads(layout.done(SHARD).read_text())
    assert output_path(job, done).exists()
    assert [orjson.loads(line) for line in merged_bytes(job, tmp_path / "m.jsonl").splitlines()] == sample_rows(10)


def test_removing_a_raw_export_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.json").write_bytes(b"{}\n")
    attempt = tmp_path / "attempt"
    (attempt / "ray-output.jsonl").mkdir(parents=True)
    (attempt / "ray-output.jsonl" / "part").symlink_to(outside / "keep.json")
    (attempt / "ray-output.jsonl" / "dir").symlink_to(outside)
    assert remove_raw_output(attempt / "ray-output.jsonl")
    (attempt / "ray-output.jsonl").symlink_to(outside)
    assert remove_raw_output(attempt / "ray-output.jsonl")
    assert list(attempt.iterdir()) == [] and (outside / "keep.json").read_bytes() == b"{}\n"
    (attempt / "ray-output.jsonl").write_bytes(b"")  # everything filtered out: a 0-byte file
    assert remove_raw_output(attempt / "ray-output.jsonl") and remove_raw_output(attempt / "ray-output.jsonl")


def test_job_dir_bytes_counts_regular_files_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 10)
    (tmp_path / "sub" / "hard").hardlink_to(tmp_path / "a")
    (tmp_path / "sub" / "soft").symlink_to(tmp_path / "a")
    (tmp_path / "dirlink").symlink_to(tmp_path / "sub")
    assert job_dir_bytes(tmp_path) == 110


def test_the_breakdown_counts_a_linked_directory_output_once(tmp_path):
    job = tmp_path / "job"
    attempt = job / "attempts" / SHARD / "20000101T000000Z-host-0123abcd"
    (attempt / "ray-output.jsonl").mkdir(parents=True)
    (attempt / "ray-output.jsonl" / "p.json").write_bytes(b"r" * 7)
    (attempt / "processed.jsonl").write_bytes(b"p" * 50)
    packed = job / "attempts" / SHARD / "20000101T000000Z-host-4567cdef"  # an output stored compressed
    packed.mkdir()
    (packed / "processed.jsonl.zst").write_bytes(b"z" * 20)
    (packed / ".processed.jsonl.zst.tmp-host-1-0123abcd").write_bytes(b"t" * 5)  # being collected
    (packed / ".processed.jsonl.tmp-host-2-0123abcd").write_bytes(b"t" * 4)
    (job / "shards").mkdir()
    (job / "shards" / f"{SHARD}.jsonl").write_bytes(b"s" * 60)
    (job / "out").mkdir()
    (job / "out" / "part.jsonl").hardlink_to(attempt / "processed.jsonl")
    (job / "out" / "index.json").write_bytes(b"i" * 3)
    (job / "merge.json").write_text(json.dumps({"output": str(job / "out")}))
    sizes = job_dir_breakdown(job)
    other = (job / "merge.json").stat().st_size
    assert sizes == {"shards": 60, "processed": 79, "raw": 7, "merged": 3, "other": other, "total": 149 + other}
    assert sizes["total"] == job_dir_bytes(job)


# -- e2e: real Data-Juicer + Ray --------------------------------------------------------------------


def _demo_input(path: Path, copies: int) -> Path:
    """The bundled demo data, `copies` times over with fresh ids (the demo recipe's ops are row-wise)."""
    from support.e2e_support import DEMO_DATA

    rows = [orjson.loads(line) for line in DEMO_DATA.read_bytes().splitlines()]
    with open(path, "wb") as out:
        for n in range(copies * len(rows)):
            out.write(orjson.dumps({**rows[n % len(rows)], "id": n}) + b"\n")
    return path


@pytest.mark.e2e
def test_a_real_run_leaves_no_raw_export_and_the_job_dir_holds_the_data_about_twice(tmp_path):
    from support.e2e_support import DEMO_RECIPE, prepare_job, shard_job

    dataset = _demo_input(tmp_path / "input.jsonl", copies=60)  # ~4.6 MB: the logs are ~4 % of it
    input_bytes = dataset.stat().st_size
    job = tmp_path / "job"
    prepare_job(DEMO_RECIPE, job, "--dataset-path", str(dataset), "--num-shards", "3", "--poll-interval-secs", "0.5")
    shard_job("worker", "--job-dir", str(job))
    outside = tmp_path / "merged.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(outside))

    assert raw_outputs(job) == [], "Ray's raw export must be gone once collected"
    shard_job("verify", "--job-dir", str(job), "--output", str(outside))  # the merge equals the validated shard outputs

    sizes = job_dir_breakdown(job)
    assert sizes["raw"] == 0 and sizes["total"] == job_dir_bytes(job)
    ratio = sizes["total"] / input_bytes
    assert ratio <= JOB_DIR_TARGET, (ratio, sizes, input_bytes)

    # The merged file inside the job directory (where the launchers put it by default): it adds
    # itself, no more.
    inside = job / "merged.jsonl"
    shard_job("merge", "--job-dir", str(job), "--output", str(inside))
    assert inside.read_bytes() == outside.read_bytes()
    with_merged = job_dir_breakdown(job)
    assert with_merged["merged"] == inside.stat().st_size and with_merged["raw"] == 0
    assert with_merged["total"] - with_merged["merged"] <= sizes["total"] + 1024, (with_merged, sizes)
