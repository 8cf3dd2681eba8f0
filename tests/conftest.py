from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # `import support.…` (tests/support/) from every test module, whatever pytest's import mode
    sys.path.insert(0, _TESTS_DIR)

from support.fakes import FakeRunner  # noqa: E402
from support.jobs import SIMPLE_RECIPE, fast_settings, sample_rows, write_jsonl  # noqa: E402
from support.launchers import launcher_runner  # noqa: E402
from support.mounts import mounted, rclone_unavailable  # noqa: E402
from support.outputs import EMPTY, keep  # noqa: E402

from elastic_sharding.layout import JobLayout  # noqa: E402
from elastic_sharding.prepare.job import PrepareRequest, prepare  # noqa: E402
from elastic_sharding.work.worker import Worker, WorkerOptions  # noqa: E402


@pytest.fixture
def recipe_file(tmp_path: Path):
    def make(dataset: Path, body: str = SIMPLE_RECIPE) -> Path:
        path = tmp_path / "recipe.yaml"
        path.write_text(body.format(dataset=dataset))
        return path

    return make


@pytest.fixture
def make_job(tmp_path: Path, recipe_file):
    """Prepare a job in-process: make_job(rows=..., shards=..., **settings) -> job dir."""

    def make(rows: int = 40, shards: int = 8, name: str = "job", data: list[dict] | None = None, **settings) -> Path:
        dataset = write_jsonl(tmp_path / f"{name}-input.jsonl", data if data is not None else sample_rows(rows))
        job = tmp_path / name
        prepare(PrepareRequest(recipe_file(dataset), None, job, shards, fast_settings(**settings)))
        return job

    return make


@pytest.fixture
def done_job(make_job) -> Path:
    """A finished two-shard job (fake runner)."""
    job = make_job(rows=20, shards=2)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
    return job


@pytest.fixture
def job(make_job) -> Path:
    """A finished four-shard job whose third shard has no rows left (the merge and verify tests).
    Its outputs are stored plain, so a directory output hard-links them; test_output_codec.py
    runs merge and verify over outputs stored compressed."""
    job = make_job(rows=40, shards=4, shard_output_codec="none")
    spec = JobLayout(job).load_manifest().shards[2]
    EMPTY.clear()
    EMPTY.update(range(spec.first_row, spec.first_row + spec.rows))
    assert Worker(job, WorkerOptions(), runner=FakeRunner(keep=keep)).run() == 0
    return job


@pytest.fixture
def own_log_handlers():
    """run_cli points the package's log handler at the running test's captured stderr: start a
    test without a handler left pointing at an earlier test's (closed) capture."""
    logger = logging.getLogger("elastic_sharding")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers[:], logger.propagate = [], True
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture
def run_cli(capsys, monkeypatch, own_log_handlers):
    """Run the CLI in this process (fast: Data-Juicer is imported once) and capture its output;
    the package's log handler it points at this test's capture is gone after the test."""
    from elastic_sharding.cli import main

    def invoke(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse rejects parameters by exiting
            code = exc.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return invoke


@pytest.fixture(scope="session")
def demo_baseline(tmp_path_factory) -> list[bytes]:
    """The bundled demo recipe over the bundled data, as one plain `dj-process` Ray run."""
    from support.e2e_support import DEMO_DATA, DEMO_RECIPE, baseline_rows

    return baseline_rows(DEMO_RECIPE, DEMO_DATA, tmp_path_factory.mktemp("baseline"))


@pytest.fixture
def gluster():
    """`gluster(nodes=2, mode="strict")` -> a started GlusterFS test cluster (tests/support/cluster.py), torn down at test end.

    Skips where the cluster cannot be built (not root, no glusterfs, ...), fails there with ELASTIC_SHARD_REQUIRE_CLUSTER=1.
    """
    from support.cluster import cluster_factory

    with cluster_factory() as make:
        yield make


@pytest.fixture
def slurm():
    """`slurm(nodes=3, cpus=2, mode="strict")` -> a started Slurm (tests/support/slurm.py) on a new GlusterFS test
    cluster, both torn down at test end. Skips where unavailable, fails there with ELASTIC_SHARD_REQUIRE_CLUSTER=1."""
    from support.slurm import slurm_factory

    with slurm_factory() as make:
        yield make


@pytest.fixture
def rclone_mount(tmp_path: Path):
    """A FUSE filesystem without hard links: `rclone mount` of a local directory with a write
    cache, the way clusters mount object storage (OSS, S3) on every node; unmounted at the end.
    Yields the mount point (the directory behind it is `bucket` next to it). Skips where rclone,
    fuse3 or root are missing, and fails there with ELASTIC_SHARD_REQUIRE_CLUSTER=1 (CI)."""
    reason = rclone_unavailable()
    if reason is not None:
        if os.environ.get("ELASTIC_SHARD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"an rclone mount is required (ELASTIC_SHARD_REQUIRE_CLUSTER=1) but unavailable: {reason}")
        pytest.skip(reason)
    bucket, point, cache = tmp_path / "bucket", tmp_path / "rclone", tmp_path / "rclone-cache"
    for directory in (bucket, point, cache):
        directory.mkdir()
    log = open(tmp_path / "rclone.log", "wb")  # noqa: SIM115 - the mount keeps it while it runs
    proc = subprocess.Popen(
        ["rclone", "mount", str(bucket), str(point), "--vfs-cache-mode", "writes", "--cache-dir", str(cache),
         "--config", str(tmp_path / "rclone.conf")],
        stdout=log, stderr=log,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not mounted(point):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"rclone mount did not come up: {(tmp_path / 'rclone.log').read_text()[-2000:]}")
            time.sleep(0.05)
        yield point
    finally:
        if mounted(point):
            subprocess.run(["fusermount3", "-u", "-z", str(point)], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def launch(tmp_path: Path):
    return launcher_runner(tmp_path)
