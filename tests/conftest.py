from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.records import Settings

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
STATUS_SCHEMA = orjson.loads((REPO / "docs" / "status.schema.json").read_bytes())

SIMPLE_RECIPE = """\
project_name: test
dataset_path: {dataset}
export_path: /tmp/ignored-by-workers.jsonl
executor_type: ray
ray_address: local
process:
  - whitespace_normalization_mapper:
  - text_length_filter:
      min_len: 5
      max_len: 100000
"""


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def sample_rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": i, "text": f"sample number {i} " + "x" * (i % 37)} for i in range(start, start + n)]


def fast_settings(**overrides) -> Settings:
    values = dict(lock_timeout_secs=2.0, max_retries=1, poll_interval_secs=0.05, heartbeat_interval_secs=0.2, ray_address="local")
    values.update(overrides)
    return Settings(**values)


def cli(
    *args: str, cwd: Path | None = None, check: bool = False, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `elastic-shard` as a separate process, as a user would."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_sharding", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"elastic-shard {' '.join(args)} exited {proc.returncode}\n{proc.stderr}")
    return proc


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
    from fakes import FakeRunner

    from elastic_sharding.work.worker import Worker, WorkerOptions

    job = make_job(rows=20, shards=2)
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
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


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under `root` with its content and mtime: proves nothing was written (through a link or at all)."""
    result = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        result[str(path.relative_to(root))] = (path.read_bytes() if stat.S_ISREG(st.st_mode) else None, st.st_mtime_ns)
    return result


def refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2 with exactly one `error:` line (no traceback) that contains every fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run the CLI in this process (fast: Data-Juicer is imported once) and capture its output."""
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
    from e2e_support import DEMO_DATA, DEMO_RECIPE, baseline_rows

    return baseline_rows(DEMO_RECIPE, DEMO_DATA, tmp_path_factory.mktemp("baseline"))


@pytest.fixture
def gluster():
    """`gluster(nodes=2, mode="strict")` -> a started GlusterFS test cluster (tests/cluster.py), torn down at test end.

    Skips where the cluster cannot be built (not root, no glusterfs, ...), fails there with ELASTIC_SHARD_REQUIRE_CLUSTER=1.
    """
    from cluster import cluster_factory

    with cluster_factory() as make:
        yield make


def _rclone_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "an rclone FUSE mount needs root here"
    missing = [name for name in ("rclone", "fusermount3") if shutil.which(name) is None]
    if missing:
        return f"missing {', '.join(missing)} (scripts/system-packages installs rclone and fuse3)"
    return None if Path("/dev/fuse").exists() else "no /dev/fuse"


def _mounted(point: Path) -> bool:
    escaped = str(point).replace("\\", "\\134").replace(" ", "\\040")
    return any(line.split()[4] == escaped for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture
def rclone_mount(tmp_path: Path):
    """A FUSE filesystem without hard links: `rclone mount` of a local directory with a write
    cache, the way clusters mount object storage (OSS, S3) on every node; unmounted at the end.
    Yields the mount point (the directory behind it is `bucket` next to it). Skips where rclone,
    fuse3 or root are missing, and fails there with ELASTIC_SHARD_REQUIRE_CLUSTER=1 (CI)."""
    reason = _rclone_unavailable()
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
        while not _mounted(point):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"rclone mount did not come up: {(tmp_path / 'rclone.log').read_text()[-2000:]}")
            time.sleep(0.05)
        yield point
    finally:
        if _mounted(point):
            subprocess.run(["fusermount3", "-u", "-z", str(point)], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
