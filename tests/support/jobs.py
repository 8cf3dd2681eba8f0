"""Jobs for tests: the repository's paths, sample datasets and recipes, fast settings, running a
worker (fake runner) in this process and the CLI as a separate one, and checks on what a command
refused or left behind."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from elastic_sharding.records import Settings
from elastic_sharding.work.worker import Worker, WorkerOptions
from support.fakes import FakeRunner

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
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


# A recipe with a deduplicator between two segments, for the fake processor (it ignores the
# mapper and the filter) and Data-Juicer's own document_deduplicator in the stage.
DEDUP_RECIPE = """\
executor_type: ray
ray_address: local
dataset_path: {dataset}
process:
  - whitespace_normalization_mapper:
  - document_deduplicator:
      lowercase: true
      ignore_non_character: true
  - text_length_filter:
      min_len: 5
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


def run(job: Path, runner: FakeRunner | None = None, **options) -> int:
    """A worker over `job` in this process, with the fake runner: its exit code."""
    return Worker(job, WorkerOptions(**options), runner=runner or FakeRunner()).run()


def merged_rows(job: Path, output: Path, *extra: str) -> list[dict]:
    """`merge` to `output` (it must succeed): the merged rows."""
    cli("merge", "--job-dir", str(job), "--output", str(output), *extra, check=True)
    return [orjson.loads(line) for line in output.read_bytes().splitlines()]


def wait_until_ready(ready: Path | Iterable[Path], *procs: subprocess.Popen, timeout: float = 30.0) -> None:
    """A test's barrier for the processes it started: wait until each has created its `ready` file
    (a racer about to race, a fake worker whose shard is processing: `--ready-file`), failing at
    once if one of `procs` exits first and after `timeout` seconds at most."""
    paths = [ready] if isinstance(ready, Path) else list(ready)
    deadline = time.monotonic() + timeout
    while missing := [path for path in paths if not path.exists()]:
        for proc in procs:
            assert proc.poll() is None, f"{proc.args} exited {proc.returncode} before it was ready"
        assert time.monotonic() < deadline, f"not ready after {timeout} s: {[str(p) for p in missing]}"
        time.sleep(0.01)


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


def edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Change bytes without changing the size or the modification time (`rsync --inplace --times`)."""
    st = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
