"""Prepare in parallel: by byte-range units over several cores, and by several cooperating
processes through the job directory's parent. Whoever does which unit, the prepared job is the
one a single process writes (fast: no Data-Juicer, no Ray)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import zstandard
from support.fake_worker import worker_command
from support.jobs import cli, fast_settings

from elastic_sharding.errors import InputError
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.cooperate import JOIN_ENV
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.prepare.plan import UNIT_BYTES_ENV
from elastic_sharding.prepare.prepare_dir import PrepareDir

RECIPE = "dataset_path: {dataset}\nprocess:\n  - whitespace_normalization_mapper:\n"
INDEXED = (
    "dataset_path: {dataset}\nimage_key: images\nprocess:\n  - text_length_filter:\n      min_len: 1\n      index_key: idx\n"
)


def _rows(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        row: dict = {"id": i, "text": "word " * rng.randint(1, 60)}
        if i % 3 == 0:
            row["meta"] = {"score": rng.random() if i % 2 else rng.randint(0, 9), "tags": ["a"] * rng.randint(0, 3)}
        if i % 5 == 0:
            row["images"] = [f"img/{i}.png"]
        if i % 7 == 0:
            row["idx"] = None
        if i > n // 2 and i % 11 == 0:
            row["late"] = {"x": i}
        rows.append(row)
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _job_bytes(job: Path) -> dict:
    manifest = JobLayout(job).load_manifest()
    shards = {p.name: p.read_bytes() for p in sorted((job / "shards").iterdir())}
    return {
        "shards": shards,
        "specs": [(s.shard_id, s.first_row, s.rows, s.bytes, s.sha256) for s in manifest.shards],
        "normalized": manifest.normalized_sha256,
        "rows": manifest.total_rows,
        "warnings": manifest.warnings,
        "inputs": [(f.relpath, f.rows, f.size) for f in manifest.inputs],
    }


def _prepare(tmp_path: Path, dataset: Path, name: str, shards: int, procs: int, body: str = RECIPE, **kw):
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(body.format(dataset=dataset))
    return prepare(PrepareRequest(recipe, None, tmp_path / name, shards, fast_settings(), procs=procs), quiet=True, **kw)


@pytest.fixture
def small_units(monkeypatch):
    monkeypatch.setenv(UNIT_BYTES_ENV, "4096")


@pytest.mark.parametrize("body", [RECIPE, INDEXED], ids=["plain", "index-and-media"])
def test_prepared_job_is_byte_identical_for_1_2_and_4_cores(tmp_path, monkeypatch, body):
    data = tmp_path / "data"
    _write(data / "a.jsonl", _rows(700))
    _write(data / "b" / "c.jsonl", _rows(90, seed=3))
    _write(data / "d.jsonl", _rows(5, seed=4))
    reference = _prepare(tmp_path, data, "ref", 7, 1, body)  # one unit per file group, one process
    assert len(reference.manifest.prepared_by) == 1
    expected = _job_bytes(tmp_path / "ref")
    monkeypatch.setenv(UNIT_BYTES_ENV, "4096")
    for procs in (1, 2, 4):
        result = _prepare(tmp_path, data, f"p{procs}", 7, procs, body)
        assert _job_bytes(tmp_path / f"p{procs}") == expected, procs
        # Who did a unit is timing: on a loaded box a late helper finds none left (the bytes are the point).
        assert 1 <= len(result.manifest.prepared_by) <= procs
        big = next(f for f in result.manifest.inputs if f.relpath == "a.jsonl")
        assert big.chunk_bytes == 4096 and len(big.chunks) == -(-big.size // 4096)
        assert big.sha256 == hashlib.sha256(b"".join(bytes.fromhex(c) for c in big.chunks)).hexdigest()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_repeating_a_chunked_prepare_is_a_no_op_and_a_changed_chunk_is_found(tmp_path, small_units):
    data = _write(tmp_path / "d.jsonl", _rows(400))
    first = _prepare(tmp_path, data, "job", 4, 2)
    again = _prepare(tmp_path, data, "job", 4, 2)
    assert first.created and not again.created
    raw = bytearray(data.read_bytes())
    stat = data.stat()
    at = raw.index(b"word", 9000)
    raw[at : at + 4] = b"WORD"
    data.write_bytes(bytes(raw))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(Exception, match="content changed since the job was prepared"):
        _prepare(tmp_path, data, "job", 4, 2)


@pytest.mark.parametrize(
    "bad, pattern",
    [
        (b'{"id": 1, "text": oops}', r"d.jsonl:{line}: malformed JSON"),
        (b'{"id": "x", "text": "type changes"}', r"d.jsonl:{line}: field id is a string here but a number at .*d.jsonl:1;"),
        (b'{"id": 5, "id": 6, "text": "t"}', r"d.jsonl:{line}: duplicate key 'id'"),
    ],
    ids=["malformed", "type-conflict-across-units", "duplicate-key"],
)
def test_an_error_deep_in_a_later_unit_is_the_one_pass_error(tmp_path, monkeypatch, bad, pattern):
    rows = [orjson.dumps(r) for r in _rows(600)]
    line = 517
    rows[line - 1] = bad
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(InputError) as one_pass:
        _prepare(tmp_path, data, "one", 3, 1)
    monkeypatch.setenv(UNIT_BYTES_ENV, "4096")
    with pytest.raises(InputError) as parallel:
        _prepare(tmp_path, data, "many", 3, 2)
    assert str(parallel.value) == str(one_pass.value)
    import re

    assert re.search(pattern.format(line=line), str(parallel.value)), str(parallel.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "many.yaml", "one.yaml"]


def _cli_prepare(tmp_path: Path, dataset: Path, job: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    recipe = tmp_path / "r.yaml"
    if not recipe.exists():
        recipe.write_text(RECIPE.format(dataset=dataset))
    args = [sys.executable, "-m", "elastic_sharding", "prepare", "--config", str(recipe), "--job-dir", str(job)]
    args += ["--num-shards", "5", "--lock-timeout-secs", "2", "--heartbeat-interval-secs", "0.2", "--poll-interval-secs", "0.05"]
    full = {**os.environ, UNIT_BYTES_ENV: "4096", **(env or {})}
    return subprocess.Popen([*args, *extra], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _reference(tmp_path: Path, dataset: Path) -> dict:
    recipe = tmp_path / "ref.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    prepare(PrepareRequest(recipe, None, tmp_path / "ref", 5, fast_settings(), procs=1), quiet=True)
    return _job_bytes(tmp_path / "ref")


@pytest.mark.parametrize("participants", [2, 3])
def test_cooperating_participants_prepare_the_same_job(tmp_path, participants):
    dataset = _write(tmp_path / "d.jsonl", _rows(900))
    expected = _reference(tmp_path, dataset)
    job = tmp_path / "job"
    procs = [_cli_prepare(tmp_path, dataset, job, "--prepare-procs", "1") for _ in range(participants)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * participants, outs
    assert _job_bytes(job) == expected
    assert 1 <= len(JobLayout(job).load_manifest().prepared_by) <= participants
    assert not (tmp_path / ".job.preparing").exists()


@pytest.mark.parametrize(
    "point", ["prepare-recipe", "prepare-scan@3", "prepare-cut", "prepare-write@1", "prepare-final", "prepare-staged"]
)
def test_a_participant_killed_in_any_phase_costs_one_unit(tmp_path, point):
    """One of two participants dies at `point`; the other takes its unit over (same host, dead
    pid: at once) and finishes; the job is the single-process one. The victim starts the
    prepare and takes the recipe unit first; where the point is among the many scan units the
    other joins once that is done; elsewhere, once the victim is dead (else the other might take
    every unit of the phase first: a write point's five units went to the other in CI)."""
    dataset = _write(tmp_path / "d.jsonl", _rows(900))
    expected = _reference(tmp_path, dataset)
    job = tmp_path / "job"
    victim = _cli_prepare(tmp_path, dataset, job, "--prepare-procs", "1", env={"ELASTIC_SHARD_CRASH_AT": point})
    after_death = not point.startswith("prepare-scan")
    deadline = time.monotonic() + 60
    while victim.poll() is None and (after_death or not (tmp_path / ".job.preparing" / "units" / "recipe.json").exists()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    survivor = _cli_prepare(tmp_path, dataset, job, "--prepare-procs", "1")
    out, err = survivor.communicate(timeout=120)
    victim.communicate(timeout=60)
    assert victim.returncode == -9
    assert survivor.returncode == 0, err
    assert _job_bytes(job) == expected


def test_a_worker_started_before_the_prepare_helps_it_then_works(tmp_path):
    """What `mpi` does: its workers start with the prepare (JOIN_ENV) and share its units while
    the launcher's prepare judges the recipe; then they process the job as usual."""
    dataset = _write(tmp_path / "d.jsonl", _rows(900))
    expected = _reference(tmp_path, dataset)
    job = tmp_path / "job"
    env = {**os.environ, JOIN_ENV: "1", UNIT_BYTES_ENV: "4096"}
    worker = subprocess.Popen(
        worker_command(job),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        prepare_proc = _cli_prepare(tmp_path, dataset, job, "--prepare-procs", "1")
        out, err = prepare_proc.communicate(timeout=120)
        assert prepare_proc.returncode == 0, err
        _, worker_err = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, worker_err
    assert _job_bytes(job) == expected
    assert f"{socket.gethostname()}:{worker.pid}" in JobLayout(job).load_manifest().prepared_by
    assert len(list((job / "state" / "done").glob("*.json"))) == 5


def test_a_killed_prepare_is_resumed_by_the_next_one(tmp_path):
    dataset = _write(tmp_path / "d.jsonl", _rows(900))
    expected = _reference(tmp_path, dataset)
    job = tmp_path / "job"
    victim = _cli_prepare(tmp_path, dataset, job, "--prepare-procs", "1", env={"ELASTIC_SHARD_CRASH_AT": "prepare-write@3"})
    victim.communicate(timeout=60)
    assert victim.returncode == -9 and (tmp_path / ".job.preparing" / "units" / "cut.json").exists()
    rerun = _cli_prepare(tmp_path, dataset, job, "--prepare-procs", "1")
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert "joining the prepare already under way" in err
    assert _job_bytes(job) == expected
    assert not (tmp_path / ".job.preparing").exists()


def _leftovers(tmp_path: Path, job: str) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".{job}.preparing"))


def _as_a_caching_node_sees_it(tmp_path: Path, job: str) -> None:
    """What another node may show of a prepare that was just published and removed: the
    staging directory still there (a cached entry, for up to the entry timeout), and an earlier
    removal's leftover (a straggler's lock written into the directory while it was removed)."""
    (tmp_path / f".{job}.preparing" / "stage").mkdir(parents=True)
    straggler = tmp_path / f".{job}.preparing.removed-0123abcd" / "units"
    straggler.mkdir(parents=True)
    (straggler / "write-00001.lock").write_text("{}")


def test_a_participant_that_finds_the_job_published_exits_with_it_and_sweeps(tmp_path):
    """The job is published: a participant (a helper here) exits 0 with it, whatever else it
    still sees of the prepare, and leaves nothing beside the job."""
    dataset = _write(tmp_path / "d.jsonl", _rows(300))
    _reference(tmp_path, dataset)
    _as_a_caching_node_sees_it(tmp_path, "ref")
    helper = subprocess.run(
        [sys.executable, "-m", "elastic_sharding.prepare.cooperate", str(tmp_path / "ref")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert helper.returncode == 0, helper.stderr
    assert _leftovers(tmp_path, "ref") == []


def test_a_repeated_prepare_sweeps_what_the_last_one_left(tmp_path):
    dataset = _write(tmp_path / "d.jsonl", _rows(300))
    _reference(tmp_path, dataset)
    _as_a_caching_node_sees_it(tmp_path, "ref")
    recipe = tmp_path / "ref.yaml"
    result = prepare(PrepareRequest(recipe, None, tmp_path / "ref", 5, fast_settings(), procs=1), quiet=True)
    assert not result.created
    assert _leftovers(tmp_path, "ref") == []


def test_removing_the_prepare_directory_outlasts_a_writer_still_in_it(tmp_path):
    """A straggler on another node writes into the directory through its cached entry while it is
    removed (here: through a descriptor opened before): the removal goes on until it is gone."""
    job = tmp_path / "job"
    pdir = PrepareDir.of(job)
    units = pdir.root / "units"
    units.mkdir(parents=True)
    for i in range(200):
        (units / f"scan-{i:05d}.json").write_text("{}")
    fd = os.open(units, os.O_RDONLY | os.O_DIRECTORY)
    stop = threading.Event()

    def straggle() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            with contextlib.suppress(OSError):
                os.close(os.open(f".tmp-{n}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))

    writer = threading.Thread(target=straggle)
    writer.start()
    threading.Timer(0.5, stop.set).start()
    try:
        pdir.remove()
    finally:
        stop.set()
        writer.join()
        os.close(fd)
    assert _leftovers(tmp_path, "job") == []


# ---- compressed input ------------------------------------------------------------------------


def _zst(data: bytes, frames: int = 1) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    size = -(-len(data) // frames)
    return b"".join(compressor.compress(data[i : i + size]) for i in range(0, len(data), size))


def test_compressed_inputs_are_read_like_their_plain_text(tmp_path, small_units):
    rows = [{k: v for k, v in r.items() if k != "images"} for r in _rows(600)]  # media paths name their root
    plain = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    third = plain.index(b"\n", len(plain) // 3) + 1
    two = plain.index(b"\n", 2 * len(plain) // 3) + 1
    reference_dir = tmp_path / "plain"
    for name, part in (("a.jsonl", plain[:third]), ("b.jsonl", plain[third:two]), ("c.jsonl", plain[two:])):
        (reference_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (reference_dir / name).write_bytes(part)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.jsonl.gz").write_bytes(gzip.compress(plain[:third]))
    (mixed / "b.jsonl").write_bytes(plain[third:two])
    (mixed / "c.jsonl.zst").write_bytes(_zst(plain[two:], frames=3))
    ref = _prepare(tmp_path, reference_dir, "ref", 6, 1)
    got = _prepare(tmp_path, mixed, "got", 6, 2)
    assert [p.read_bytes() for p in sorted((tmp_path / "got" / "shards").iterdir())] == [
        p.read_bytes() for p in sorted((tmp_path / "ref" / "shards").iterdir())
    ]
    assert got.manifest.normalized_sha256 == ref.manifest.normalized_sha256
    gz = got.manifest.inputs[0]
    assert gz.relpath == "a.jsonl.gz" and gz.sha256 == hashlib.sha256((mixed / "a.jsonl.gz").read_bytes()).hexdigest()
    assert [f.rows for f in got.manifest.inputs] == [f.rows for f in ref.manifest.inputs]
    assert not _prepare(tmp_path, mixed, "got", 6, 2).created  # re-hashes the compressed bytes as stored


@pytest.mark.parametrize("kind", ["gz", "zst"])
@pytest.mark.parametrize("damage", ["truncated", "corrupt", "bad-line"])
def test_damaged_compressed_input_is_refused_naming_file_and_line(tmp_path, run_cli, kind, damage):
    rows = [orjson.dumps(r) for r in _rows(3000)]
    if damage == "bad-line":
        rows[2345] = b'{"id": 1, "text": broken}'
    plain = b"\n".join(rows) + b"\n"
    packed = gzip.compress(plain) if kind == "gz" else _zst(plain)
    if damage == "truncated":
        packed = packed[: len(packed) * 2 // 3]
    elif damage == "corrupt":
        packed = bytearray(packed)
        for at in range(len(packed) // 2, len(packed) // 2 + 64):
            packed[at] ^= 0x5A
        packed = bytes(packed)
    path = tmp_path / "data" / f"d.jsonl.{kind}"
    path.parent.mkdir()
    path.write_bytes(packed)
    (tmp_path / "r.yaml").write_text(RECIPE.format(dataset=path))
    proc = run_cli("prepare", "--config", str(tmp_path / "r.yaml"), "--job-dir", str(tmp_path / "job"), "--num-shards", "2")
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "Traceback" not in proc.stderr
    stream = "gzip" if kind == "gz" else "zstd"
    if damage == "bad-line":
        assert f"d.jsonl.{kind}:2346: malformed JSON" in error[0]
    elif damage == "truncated":
        assert f"the {stream} stream is truncated" in error[0] and f"d.jsonl.{kind}:" in error[0]
    else:
        assert f"the {stream} stream is" in error[0] and f"d.jsonl.{kind}:" in error[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "r.yaml"]


def test_prepare_procs_must_be_positive(tmp_path):
    dataset = _write(tmp_path / "d.jsonl", _rows(10))
    (tmp_path / "r.yaml").write_text(RECIPE.format(dataset=dataset))
    proc = cli("prepare", "--config", str(tmp_path / "r.yaml"), "--job-dir", str(tmp_path / "job"), "--prepare-procs", "0")
    assert proc.returncode == 2 and "--prepare-procs: must be at least 1" in proc.stderr
