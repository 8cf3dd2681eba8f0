"""`verify` (fake runner): --expect-nodes counts distinct hosts; a merged file or a directory
output passes, and a changed, missing or extra file, a changed index, a changed linked file or
the other form than merge.json describes is refused naming it."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from support.jobs import cli, merged_rows, refused, run

from elastic_sharding.destination import INDEX_NAME

pytestmark = pytest.mark.usefixtures("own_log_handlers")


def test_verify_counts_distinct_hosts(make_job, tmp_path):
    job = make_job(rows=10, shards=2)
    assert run(job) == 0
    assert cli("verify", "--job-dir", str(job)).returncode == 0
    proc = cli("verify", "--job-dir", str(job), "--expect-nodes", "2")
    assert proc.returncode == 2 and "completed by 1 node(s)" in proc.stderr
    out = tmp_path / "m.jsonl"
    merged_rows(job, out)
    assert cli("verify", "--job-dir", str(job), "--output", str(out)).returncode == 0
    out.write_bytes(out.read_bytes()[:-5])
    assert cli("verify", "--job-dir", str(job), "--output", str(out)).returncode == 2


@pytest.fixture
def published(job, tmp_path, run_cli) -> Path:
    out = tmp_path / "out"
    assert run_cli("merge", "--job-dir", str(job), "--output", f"{out}/").returncode == 0
    return out


def test_verify_passes_on_both_forms(job, tmp_path, run_cli, published):
    result = run_cli("verify", "--job-dir", str(job), "--output", f"{published}/", "--json")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["form"] == "directory" and "every file and the index" in result.stderr
    (published / ".DS_Store").write_bytes(b"\0")  # hidden and not JSON: no reader takes it as data
    assert run_cli("verify", "--job-dir", str(job), "--output", str(published)).returncode == 0
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(tmp_path / "m.jsonl")), "merge.json describes")
    assert run_cli("merge", "--job-dir", str(job), "--output", str(tmp_path / "m.jsonl")).returncode == 0
    result = run_cli("verify", "--job-dir", str(job), "--output", str(tmp_path / "m.jsonl"), "--json")
    assert result.returncode == 0 and orjson.loads(result.stdout)["form"] == "file"
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(published)), "merge.json describes", "not")


def test_verify_names_a_changed_missing_or_extra_file_of_a_directory_output(job, run_cli, published):
    def verify_fails(*fragments: str) -> None:
        refused(run_cli("verify", "--job-dir", str(job), "--output", str(published)), *fragments)

    first = published / "part-00000-of-00004.jsonl"
    original = first.read_bytes()
    changed = published / ".changed"
    changed.write_bytes(original.replace(b"sample", b"SAMPLE", 1))
    os.replace(changed, first)  # a new file in its place: the shard output itself is intact
    verify_fails(str(first), f"does not match {INDEX_NAME} (sha256")
    first.write_bytes(original[:-1])
    verify_fails(str(first), f"does not match {INDEX_NAME} (bytes")
    first.unlink()
    verify_fails(str(first), "missing (listed in", INDEX_NAME)
    first.write_bytes(original)
    assert run_cli("verify", "--job-dir", str(job), "--output", str(published)).returncode == 0
    for extra in ("part-00009-of-00004.jsonl", "notes.txt", ".hidden.jsonl"):
        (published / extra).write_text("{}\n")
        verify_fails(str(published / extra), "not in", "would take it as data")
        (published / extra).unlink()
    index = published / INDEX_NAME
    saved = index.read_bytes()
    index.write_bytes(saved.replace(b'"rows": ', b'"rows":  ', 1))
    verify_fails(str(index), "does not match merge.json")
    index.unlink()
    verify_fails(f"no {INDEX_NAME}")
    index.write_bytes(saved)
    assert run_cli("verify", "--job-dir", str(job), "--output", str(published)).returncode == 0


def test_a_changed_linked_file_is_a_changed_shard_output(job, run_cli, published):
    first = published / "part-00000-of-00004.jsonl"
    first.write_bytes(first.read_bytes().replace(b"sample", b"SAMPLE", 1))  # in place: the same inode as the shard output
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(published)), "part-00000-of-00004: output", "does not match")
