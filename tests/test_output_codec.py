"""Shard outputs stored compressed in the job directory (`--shard-output-codec`, work/output_codec.py):
the same merged bytes in every format as outputs stored plain, per-worker choices mixed in one job,
verify without decompressing, and a changed compressed output refused by shard (fake runner, fast)."""

from __future__ import annotations

import hashlib

import orjson
import pytest
import zstandard
from support.fakes import FakeRunner
from support.jobs import cli, run, write_jsonl
from support.outputs import output_lines, output_path, records, rewrite_output

from elastic_sharding.errors import IntegrityError
from elastic_sharding.finish.merge import merge
from elastic_sharding.finish.verify import verify
from elastic_sharding.layout import JobLayout
from elastic_sharding.output_formats import FORMATS, suffix
from elastic_sharding.work.collect import collect

pytestmark = pytest.mark.usefixtures("own_log_handlers")


def published(job, out_dir, fmt: str, directory: bool) -> bytes:
    """What a merge of `job` publishes in `fmt`: the file, or the parts concatenated."""
    target = out_dir / (f"parts-{fmt}" if directory else f"merged{suffix(fmt)}")
    merge(job, target, quiet=True, output_format=fmt, directory=directory)
    verify(job, output=target)
    if not directory:
        return target.read_bytes()
    return b"".join(p.read_bytes() for p in sorted(target.iterdir()) if not p.name.startswith("."))


def test_collect_stores_the_same_lines_compressed_and_records_both_digests(tmp_path):
    raw = tmp_path / "ray-output.jsonl"
    raw.mkdir()
    rows = [orjson.dumps({"__elastic_row__": 10 + i, "text": f"line {i} " * 20}) for i in range(500)]
    write = lambda name, lines: (raw / name).write_bytes(b"\n".join(lines) + b"\n")  # noqa: E731
    write("b.json", rows[1::2])
    write("a.json", rows[::2])
    plain = collect(raw, tmp_path / "processed.jsonl", 10, 500)
    packed = collect(raw, tmp_path / "processed.jsonl.zst", 10, 500, "zstd")
    stored = (tmp_path / "processed.jsonl.zst").read_bytes()
    assert zstandard.ZstdDecompressor().decompressobj().decompress(stored) == (tmp_path / "processed.jsonl").read_bytes()
    assert (
        (packed.rows, packed.bytes, packed.sha256) == (plain.rows, plain.bytes, plain.sha256) == (500, plain.bytes, plain.sha256)
    )
    assert packed.stored_bytes == len(stored) < plain.bytes / 3
    assert packed.stored_sha256 == hashlib.sha256(stored).hexdigest()
    assert plain.stored_bytes is None and plain.stored_sha256 is None


@pytest.fixture
def two_jobs(make_job):
    """The same finished job twice: outputs stored zstd (the default) and plain; the first shard
    has no rows left."""
    data = [{"id": i, "text": f"row {i} " + "word " * (i % 50)} for i in range(120)]
    jobs = {}
    for codec in ("zstd", "none"):
        job = make_job(shards=5, name=f"job-{codec}", data=data, shard_output_codec=codec)
        first = JobLayout(job).load_manifest().shards[0].rows
        assert run(job, FakeRunner(keep=lambda row: row["id"] >= first and row["id"] % 7 != 3)) == 0  # noqa: B023
        jobs[codec] = job
    return jobs


def test_outputs_stored_compressed_publish_the_same_bytes_in_every_format_and_form(two_jobs, tmp_path):
    zstd_job, plain_job = two_jobs["zstd"], two_jobs["none"]
    for record in records(zstd_job):
        assert record["output_codec"] == "zstd" and output_path(zstd_job, record).name == "processed.jsonl.zst"
        assert output_path(zstd_job, record).stat().st_size == record["stored_bytes"]
        assert record["stored_bytes"] < record["output_bytes"] or record["output_rows"] == 0
    assert [r["output_rows"] == 0 for r in records(zstd_job)] == [True, False, False, False, False]
    for record in records(plain_job):
        assert record["output_codec"] == "none" and output_path(plain_job, record).name == "processed.jsonl"
    for fmt in FORMATS:
        for directory in (False, True):
            a = published(zstd_job, tmp_path / "a", fmt, directory)
            b = published(plain_job, tmp_path / "b", fmt, directory)
            assert a == b and a, (fmt, directory)


@pytest.mark.parametrize(("fmt", "stored_as"), [("jsonl", "none"), ("jsonl.zst", "zstd")])
def test_a_directory_output_links_the_outputs_already_stored_in_its_format(two_jobs, tmp_path, fmt, stored_as):
    for codec, job in two_jobs.items():
        target = tmp_path / f"{codec}-{fmt}"
        merge(job, target, quiet=True, output_format=fmt, directory=True)
        stored = {output_path(job, r).stat().st_ino for r in records(job) if r["output_rows"]}
        parts = {p.stat().st_ino for p in target.iterdir() if p.name.endswith(suffix(fmt))}
        assert len(parts) == 4
        if codec == stored_as:
            assert parts == stored, "every part is its shard output, hard-linked"
        else:
            assert not parts & stored, "outputs stored the other way are converted, never linked"
        verify(job, output=target)


def test_workers_of_one_job_may_store_outputs_differently(make_job, tmp_path):
    data = [{"id": i, "text": "t" * i} for i in range(60)]
    job = make_job(shards=6, data=data)
    assert run(job, FakeRunner(), max_shards=2, shard_output_codec="none") == 0
    assert run(job, FakeRunner()) == 0
    codecs = sorted(r["output_codec"] for r in records(job))
    assert codecs == ["none", "none", "zstd", "zstd", "zstd", "zstd"]
    merged = tmp_path / "merged.jsonl"
    merge(job, merged, quiet=True)
    assert merged.read_bytes() == b"".join(orjson.dumps(row) + b"\n" for row in data)


@pytest.mark.parametrize(
    ("field", "change"),
    [("output_rows", lambda v: v + 1), ("output_sha256", lambda v: v[::-1]), ("output_bytes", lambda v: v + 1)],
)
def test_a_completion_record_that_no_longer_describes_its_compressed_output_is_refused(two_jobs, tmp_path, field, change):
    """Found in review: the stored file's own digest does not prove the record's lines; merge and
    verify decompress and check rows, bytes and sha256 (a wrong byte count once left a hole)."""
    job = two_jobs["zstd"]
    done = JobLayout(job).done(records(job)[2]["shard_id"])
    record = orjson.loads(done.read_bytes())
    record[field] = change(record[field])
    done.write_bytes(orjson.dumps(record))
    for fmt in FORMATS:
        for directory in (False, True):
            out = tmp_path / f"{fmt}-{directory}"
            with pytest.raises(
                IntegrityError, match=rf"{record['shard_id']}: output .* does not match its completion record \(rows"
            ):
                merge(job, out, quiet=True, output_format=fmt, directory=directory)
            assert not out.exists()
    proc = cli("verify", "--job-dir", str(job))
    assert proc.returncode == 2 and record["shard_id"] in proc.stderr and "does not match its completion record" in proc.stderr


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: rewrite_output(p, lambda lines: lines.replace(b"row", b"ROW", 1)), id="lines-changed"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:-9]), id="truncated"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:40] + b"\0" + p.read_bytes()[41:]), id="byte-flipped"),
    ],
)
def test_a_changed_compressed_output_is_refused_by_shard_and_nothing_is_published(two_jobs, tmp_path, damage):
    job = two_jobs["zstd"]
    record = records(job)[1]
    damage(output_path(job, record))
    for fmt in FORMATS:
        out = tmp_path / f"merged{suffix(fmt)}"
        with pytest.raises(IntegrityError, match=record["shard_id"]):
            merge(job, out, quiet=True, output_format=fmt)
        assert not out.exists()
    proc = cli("verify", "--job-dir", str(job))
    assert proc.returncode == 2 and record["shard_id"] in proc.stderr and "restore the file" in proc.stderr


def test_an_unknown_codec_is_refused_before_any_work(tmp_path, recipe_file):
    dataset = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    job = tmp_path / "job"
    proc = cli(
        "prepare",
        "--config",
        str(recipe_file(dataset)),
        "--job-dir",
        str(job),
        "--num-shards",
        "1",
        "--shard-output-codec",
        "gzip",
    )
    assert proc.returncode == 2 and "--shard-output-codec must be one of none, zstd" in proc.stderr
    assert not job.exists()


def test_lines_of_a_compressed_output_read_back(two_jobs):
    job = two_jobs["zstd"]
    record = records(job)[1]
    lines = output_lines(output_path(job, record))
    assert len(lines) == record["output_bytes"] and hashlib.sha256(lines).hexdigest() == record["output_sha256"]
