"""`merge` (fake runner): it refuses an incomplete job, an existing output without --overwrite and
a usage error before any work; a corrupted shard output or a completion record whose row count
alone was changed is refused and leaves no output (nor an earlier one) changed. The output forms
(the merged file's copy path, the directory output) are in test_merge_output.py."""

from __future__ import annotations

import json

import orjson
import pytest
from support.jobs import cli, merged_rows, run
from support.outputs import hidden_leftovers, output_path, records, rewrite_output

from elastic_sharding.errors import IntegrityError, UsageError
from elastic_sharding.finish.merge import merge
from elastic_sharding.finish.verify import verify
from elastic_sharding.layout import JobLayout

pytestmark = pytest.mark.usefixtures("own_log_handlers")


def test_merge_refuses_existing_output_and_detects_corruption(make_job, tmp_path):
    job = make_job(rows=30, shards=3)
    out = tmp_path / "out.jsonl"
    proc = cli("merge", "--job-dir", str(job), "--output", str(out))
    assert proc.returncode == 2 and "not complete" in proc.stderr and not out.exists()
    assert run(job) == 0
    merged_rows(job, out)
    original = out.read_bytes()
    proc = cli("merge", "--job-dir", str(job), "--output", str(out))
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    layout = JobLayout(job)
    done = json.loads(layout.done("part-00001-of-00003").read_text())
    rewrite_output(output_path(job, done), lambda lines: lines.replace(b"sample", b"SAMPLE", 1))
    proc = cli("merge", "--job-dir", str(job), "--output", str(out), "--overwrite")
    assert proc.returncode == 2 and "does not match its completion record" in proc.stderr
    assert out.read_bytes() == original, "a failed merge must leave the previous output untouched"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []
    assert cli("verify", "--job-dir", str(job)).returncode == 2


@pytest.mark.parametrize("form", ["file", "directory"])
def test_a_completion_record_whose_row_count_was_changed_is_refused(job, tmp_path, form):
    """The record's sha256 still matches its output: only the row count read with it tells
    (found by the fault matrix's corrupt kind, seed 26)."""
    layout = JobLayout(job)
    done = records(job)[1]
    path = layout.done(done["shard_id"])
    path.write_bytes(orjson.dumps({**done, "output_rows": done["output_rows"] + 1}))
    out = tmp_path / ("out/" if form == "directory" else "merged.jsonl")
    rows = f"rows {done['output_rows']} vs {done['output_rows'] + 1}"
    with pytest.raises(IntegrityError, match=f"{done['shard_id']}: output .* does not match its completion record \\({rows}"):
        merge(job, str(out), quiet=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / "merged.jsonl").exists()
    assert hidden_leftovers(tmp_path) == []
    with pytest.raises(IntegrityError, match=done["shard_id"]):
        verify(job)


def test_merge_refuses_with_a_usage_error_before_any_work(job, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("x")
    with pytest.raises(UsageError, match="already exists and is not empty"):
        merge(job, out, quiet=True)
