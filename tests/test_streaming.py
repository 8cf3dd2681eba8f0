"""Streaming prepare/merge: output identical to the reference implementation, and progress that is
silent unless stderr is a terminal and not quiet."""

from __future__ import annotations

import hashlib
import io
import logging
import random
from pathlib import Path

import orjson
import pytest
from support.fakes import FakeRunner
from support.jobs import fast_settings, write_jsonl

import elastic_sharding.finish.merge as merge_mod
import elastic_sharding.prepare.cut as cut_mod
from elastic_sharding import progress
from elastic_sharding.errors import InputError, IntegrityError
from elastic_sharding.finish.merge import merge
from elastic_sharding.layout import JobLayout, processed_file
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.prepare.jsonl import HashingLineReader, Offload
from elastic_sharding.prepare.normalize import SchemaNode
from elastic_sharding.prepare.shard_writer import ShardWriter
from elastic_sharding.work.worker import Worker, WorkerOptions

RECIPE = "dataset_path: {dataset}\nprocess:\n  - text_length_filter:\n      min_len: 1\n"


def golden_input() -> bytes:
    """Mixed shapes, escapes, spacing, CRLF, ints widened to floats, no final newline."""
    rng = random.Random(42)
    out = []
    for i in range(400):
        row: dict = {"text": f"row {i} " + 'é中🚀 "q"\n'[i % 6] * rng.randrange(40)}
        if i % 3 == 0:
            row["meta"] = {"a": i, "b": {"c": [1, 2.5] if i % 6 == 0 else []}}
        if i % 3 == 1:
            row["meta"] = {"z": "q", "a": None}
        if i % 4 == 0:
            row["score"] = i if i % 8 else i + 0.5
        if i % 5 == 0:
            row["images"] = [f"/data/img/{i}.jpg", "http://x/y.png"]
        if i % 7 == 0:
            row["lst"] = [{"k": i}, {"k": 1.5, "m": "x"}, None]
        line = orjson.dumps(row)
        if i % 2:
            line = line.replace(b":", b": ", 1)
        out.append(line + (b"\r\n" if i % 10 == 0 else b"\n"))
    return b"".join(out)[:-1]


# Written by the row-at-a-time implementation this streaming one replaced.
GOLDEN = {
    1: ["51dedc0ca89c"],
    3: ["43a5121820ee", "ea80d124ded2", "947862f73214"],
    7: ["c8acb46ab211", "090e23c7ae2b", "32479cbad19a", "2ed49a93e545", "5d5ad7ab77dc", "597157dee8aa", "959c5217f0f8"],
}
GOLDEN_ROWS = {1: [400], 3: [136, 133, 131], 7: [61, 57, 55, 57, 58, 56, 56]}


def prepare_golden(tmp_path: Path, shards: int, name: str = "job", **settings) -> Path:
    dataset = tmp_path / "in.jsonl"
    if not dataset.exists():
        dataset.write_bytes(golden_input())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    job = tmp_path / name
    prepare(PrepareRequest(recipe, None, job, shards, fast_settings(**settings)), quiet=True)
    return job


@pytest.mark.parametrize("max_marks", [cut_mod.MAX_MARKS, 2, 5])
@pytest.mark.parametrize("shards", sorted(GOLDEN))
def test_prepare_output_is_byte_identical_to_the_reference(tmp_path, monkeypatch, shards, max_marks):
    monkeypatch.setattr(cut_mod, "MAX_MARKS", max_marks)
    monkeypatch.setattr(ShardWriter, "FLUSH_BYTES", 1000)
    manifest = JobLayout(prepare_golden(tmp_path, shards)).load_manifest()
    assert manifest.normalized_sha256.startswith("51dedc0ca89c2bee") and manifest.total_bytes == 65037
    assert [s.sha256[:12] for s in manifest.shards] == GOLDEN[shards]
    assert [s.rows for s in manifest.shards] == GOLDEN_ROWS[shards]
    assert manifest.inputs[0].sha256 == hashlib.sha256(golden_input()).hexdigest()
    assert manifest.inputs[0].rows == 400


def test_reader_blocks_do_not_change_lines_or_hash(tmp_path):
    data = golden_input() + b"\n\xef\xbb\xbf{}\n" + b"x" * 50
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    expected = [(i, line) for i, line in enumerate(data.split(b"\n"), 1)]
    for block_size in (1, 3, 64, 1 << 20):
        with Offload(backlog=2) as offload:
            reader = HashingLineReader(path, offload, block_size=block_size)
            got = [(first + k, line) for first, lines in reader.blocks() for k, line in enumerate(lines)]
            offload.drain()
        assert got == expected
        assert (reader.size, reader.lines) == (len(data), len(expected))
        assert reader.sha256.hexdigest() == hashlib.sha256(data).hexdigest()


def test_reader_rejects_bom_split_across_blocks(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf{}\n")
    with pytest.raises(InputError, match="d.jsonl:1: starts with a UTF-8 byte-order mark"):
        list(HashingLineReader(path, block_size=2).blocks())


def test_fast_schema_paths_match_the_reference_ones():
    lines = [line for line in golden_input().split(b"\n")]
    rows = [orjson.loads(line) for line in lines]
    slow, fast = SchemaNode(), SchemaNode()
    for i, row in enumerate(rows, 1):
        slow.add(row, "", f"f:{i}")
        fast.add_row(row, ("f", i))
    assert fast == slow
    shaper = fast.shaper()
    for line in lines:
        assert orjson.dumps(shaper(orjson.loads(line))) == orjson.dumps(slow.shape(orjson.loads(line)))


def test_fast_schema_conflict_names_the_same_field_and_origin():
    schema = SchemaNode()
    schema.add_row({"l": [{"k": 1}]}, ("f", 1))
    with pytest.raises(InputError, match=r"field l\[1\].k is a string here but a number at f:1"):
        schema.add_row({"l": [{"k": 2}, {"k": "x"}]}, ("f", 2))


def run_job(job: Path) -> None:
    assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0


# A truncated plain output is explained by its line; a compressed one is compared as stored (a
# truncated zstd frame decompresses to whatever it still holds: validate._explain_stored).
TRUNCATED = {
    "none": r"processed\.jsonl:\d+: truncated",
    "zstd": r"processed\.jsonl\.zst does not match its completion record \(stored zstd: bytes",
}


@pytest.mark.parametrize("codec", sorted(TRUNCATED))
def test_merge_in_small_blocks_is_identical_and_detects_truncation(tmp_path, monkeypatch, codec):
    job = prepare_golden(tmp_path, 3, shard_output_codec=codec)
    run_job(job)
    whole = tmp_path / "whole.jsonl"
    merge(job, whole, quiet=True)
    monkeypatch.setattr(merge_mod, "BLOCK_SIZE", 7)
    pieces = tmp_path / "pieces.jsonl"
    record = merge(job, pieces, quiet=True)
    assert pieces.read_bytes() == whole.read_bytes()
    assert record.sha256 == hashlib.sha256(whole.read_bytes()).hexdigest() and record.bytes == len(whole.read_bytes())
    assert record.rows == 400 == whole.read_bytes().count(b"\n")
    layout = JobLayout(job)
    shard = layout.load_manifest().shards[1].shard_id
    done = orjson.loads(layout.done(shard).read_bytes())
    assert done["output_codec"] == codec
    processed = processed_file(layout.attempt_dir(shard, done["attempt_id"]), codec)
    processed.write_bytes(processed.read_bytes()[:-1])
    with pytest.raises(IntegrityError, match=rf"{shard}: .*{TRUNCATED[codec]}"):
        merge(job, tmp_path / "bad.jsonl", quiet=True)
    assert not (tmp_path / "bad.jsonl").exists()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def small_job(tmp_path):
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"text": f"row {i}"} for i in range(50)])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    return recipe


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_is_silent_when_stderr_is_not_a_terminal_or_quiet(tmp_path, monkeypatch, small_job, quiet):
    stderr = FakeTerminal() if quiet else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setattr(logging, "raiseExceptions", False)  # a handler left by another test may hold a closed stream
    job = tmp_path / "job"
    prepare(PrepareRequest(small_job, None, job, 2, fast_settings()), quiet=quiet)
    assert not prepare(PrepareRequest(small_job, None, job, 2, fast_settings()), quiet=quiet).created
    run_job(job)
    merge(job, tmp_path / "out.jsonl", quiet=quiet)
    assert not any(mark in stderr.getvalue() for mark in ("pass 1/2", "pass 2/2", "checking input", "merge", "\r"))


def test_progress_bar_on_a_terminal(tmp_path, monkeypatch, small_job):
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stderr", terminal)
    job = tmp_path / "job"
    prepare(PrepareRequest(small_job, None, job, 2, fast_settings()))
    shown = terminal.getvalue()
    assert "pass 1/2" in shown and "pass 2/2" in shown and "checking input" not in shown
    assert not prepare(PrepareRequest(small_job, None, job, 2, fast_settings())).created
    assert "checking input" in terminal.getvalue()[len(shown) :]
    shown = terminal.getvalue()
    run_job(job)
    merge(job, tmp_path / "out.jsonl")
    assert "merge" in terminal.getvalue()[len(shown) :]


def test_progress_is_silent_without_a_terminal_and_when_quiet(monkeypatch):
    plain = io.StringIO()
    monkeypatch.setattr("sys.stderr", plain)
    with progress.Progress("step", 100) as bar:
        bar.update(50, rows=5)
    terminal = FakeTerminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with progress.Progress("step", 100, quiet=True) as bar:
        bar.update(50, rows=5)
    with progress.Progress("shards", 4, unit="shard") as bar:
        bar.update(3)
    assert plain.getvalue() == ""
    assert "step" not in terminal.getvalue() and "shards:" in terminal.getvalue()
