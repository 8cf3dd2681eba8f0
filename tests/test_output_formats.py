"""Output formats chosen at merge (fake runner, no Ray): jsonl, jsonl.zst and parquet, each as one
file and as a directory of one part per shard. A jsonl.zst file decompresses to the JSONL merge; a
Parquet file reads back as its rows under the union schema of every shard, and the Parquet parts as
the same table; both are the same bytes for any shard count. merge.json records the format, verify
re-hashes either form (and reads a Parquet footer's row count), a flag the output name contradicts
and a field Parquet cannot hold are refused with nothing published."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support.fakes import FakeRunner
from support.jobs import refused, sample_rows, snapshot
from support.launchers import launcher_args
from support.outputs import hidden_leftovers, output_lines, output_path, records, rewrite_output

from elastic_sharding.cli.parser import build_parser, dlc_arguments
from elastic_sharding.destination import INDEX_NAME, refuse_foreign_output
from elastic_sharding.errors import IntegrityError, UsageError
from elastic_sharding.finish import parquet_output
from elastic_sharding.finish.merge import merge
from elastic_sharding.finish.verify import verify
from elastic_sharding.launch.steps import JobRequest
from elastic_sharding.launch.two_node import with_two_node_defaults
from elastic_sharding.layout import JobLayout
from elastic_sharding.output_formats import choose_format
from elastic_sharding.records import ROW_KEY
from elastic_sharding.work import output_codec
from elastic_sharding.work.worker import Worker, WorkerOptions

pytestmark = pytest.mark.usefixtures("own_log_handlers")

SUFFIX = {"jsonl": ".jsonl", "jsonl.zst": ".jsonl.zst", "parquet": ".parquet"}


class MappingRunner(FakeRunner):
    """The fake processor, then `mapper` applied to every row it wrote: the operators of a recipe
    that add fields whose types differ from shard to shard (the row key stays first)."""

    def __init__(self, mapper):
        super().__init__()
        self.mapper = mapper

    def run(self, ctx) -> None:
        super().run(ctx)
        for part in ctx.ray_output.iterdir():
            rows = [orjson.loads(line) for line in part.read_bytes().splitlines()]
            part.write_bytes(b"".join(orjson.dumps(self.mapper(row)) + b"\n" for row in rows))


LATE = 25  # rows from here on are in the last of three shards (of 30 rows), and in none of the first two


def varied(row: dict) -> dict:
    """Fields whose type changes at row LATE, so the shards before it disagree with the last one:
    `note` null there and a string later, `score` an int then a float, `meta` objects whose fields
    come and go (a list empty in one shard, of strings in another), `day` an ISO date."""
    i = row["id"]
    extra = {
        "note": None if i < LATE else f"note {i}",
        "score": i if i < LATE else i + 0.5,
        "meta": {"tags": []} if i < LATE else {"tags": [f"t{i}"], "source": {"name": "web", "rank": i}},
        "day": f"2024-01-{1 + i % 28:02d}",
    }
    if i % 7 == 3:
        del extra["note"]  # missing here, null or a string elsewhere
    return {**row, **extra}


@pytest.fixture
def varied_job(make_job):
    """make_varied_job(shards, name, mapper=varied) -> a finished 30-row job whose rows `mapper` made."""

    def make(shards: int = 3, name: str = "varied", mapper=varied) -> Path:
        job = make_job(data=sample_rows(30), shards=shards, name=name)
        assert Worker(job, WorkerOptions(), runner=MappingRunner(mapper)).run() == 0
        return job

    return make


def published_rows(jsonl: bytes) -> list[dict]:
    return [orjson.loads(line) for line in jsonl.splitlines()]


def position(job: Path, row_id: int) -> tuple[str, int]:
    """The shard output, and the line in it, that holds the row `row_id`."""
    for done in records(job):
        for number, line in enumerate(output_lines(output_path(job, done)).splitlines(), 1):
            if orjson.loads(line)["id"] == row_id:
                return done["shard_id"], number
    raise AssertionError(f"no row {row_id}")


def shaped(rows: list[dict], schema: pa.Schema) -> list[dict]:
    """The rows as Parquet gives them back: every field of the union (a missing one null)."""

    def shape(value, kind: pa.DataType):
        if value is None:
            return None
        if pa.types.is_struct(kind):
            return {f.name: shape(value.get(f.name), f.type) for f in kind}
        if pa.types.is_list(kind):
            return [shape(v, kind.value_type) for v in value]
        return float(value) if pa.types.is_floating(kind) else value

    return [shape(row, pa.struct(list(schema))) for row in rows]


def record_of(job: Path) -> dict:
    return orjson.loads(JobLayout(job).merge_record.read_bytes())


# -- choosing the format -----------------------------------------------------------------------------


def test_the_format_follows_the_output_name_and_a_contradicting_flag_is_refused(tmp_path):
    assert choose_format("x/out.parquet", None, False) == "parquet"
    assert choose_format("out.jsonl.zst", None, False) == "jsonl.zst"
    assert choose_format("out.json.zst", None, False) == choose_format("out.zst", None, False) == "jsonl.zst"
    assert choose_format("out.jsonl", None, False) == choose_format("out.data", None, False) == "jsonl"
    assert choose_format("out.data", "parquet", False) == "parquet", "a name that says nothing takes the flag"
    assert choose_format("out.parquet", None, True) == "jsonl", "a directory output is jsonl unless the flag says"
    assert choose_format("out/", "jsonl.zst", True) == "jsonl.zst"
    with pytest.raises(
        UsageError, match=r"--output x.jsonl names a jsonl file but --output-format is parquet; name the output x.parquet"
    ):
        choose_format("x.jsonl", "parquet", False)
    with pytest.raises(UsageError, match=r"name the output y.jsonl.zst, or leave --output-format out to publish parquet"):
        choose_format("y.parquet", "jsonl.zst", False)
    with pytest.raises(UsageError, match=r"name the output z.parquet, or leave --output-format out to publish jsonl.zst"):
        choose_format("z.json.zst", "parquet", False)

    job = tmp_path / "job"
    assert JobRequest(job, None, None, 2, None).output_path == job / "merged.jsonl"  # type: ignore[arg-type]
    assert JobRequest(job, None, None, 2, None, output_format="parquet").output_path == job / "merged.parquet"  # type: ignore[arg-type]
    request = JobRequest(job, None, None, 2, None, output_format="jsonl.zst")  # type: ignore[arg-type]
    assert request.output_path == job / "merged.jsonl.zst"


def test_merge_and_the_launchers_refuse_a_flag_the_name_contradicts_before_any_work(job, tmp_path, run_cli):
    out = tmp_path / "x.jsonl"
    refused(
        run_cli("merge", "--job-dir", str(job), "--output", str(out), "--output-format", "parquet"),
        "name the output",
        "x.parquet",
    )
    assert not out.exists() and not (tmp_path / "x.parquet").exists() and not JobLayout(job).merge_record.exists()
    fresh = tmp_path / "fresh-job"
    result = run_cli("local", "--job-dir", str(fresh), "--output", str(tmp_path / "y.parquet"), "--output-format", "jsonl")
    refused(result, "--output-format is jsonl", "y.jsonl")
    assert not fresh.exists(), "refused before prepare"


def test_every_launcher_that_merges_takes_the_flag_and_slurm_passes_it_on(tmp_path):
    parser = build_parser()
    for command in ("dlc", "slurm", "mpi", "local"):
        args = parser.parse_args([command, "--job-dir", str(tmp_path), "--output-format", "parquet"])
        assert args.output_format == "parquet", command
    args = parser.parse_args(["slurm", "--job-dir", str(tmp_path), "--nodes", "2", "--output-format", "jsonl.zst"])
    rebuilt = dlc_arguments(args)
    assert rebuilt[rebuilt.index("--output-format") + 1] == "jsonl.zst"
    assert parser.parse_args(["dlc", *rebuilt]).output_format == "jsonl.zst"
    with pytest.raises(SystemExit):
        parser.parse_args(["merge", "--job-dir", "j", "--output", "o", "--output-format", "csv"])
    two_node = with_two_node_defaults(["dlc", "--job-dir", "/j", "--output-format", "parquet"])
    assert two_node[two_node.index("--output") + 1] == "/j/two-node-merged.parquet"
    assert "--output" not in with_two_node_defaults(["dlc", "--job-dir", "/j", "--output", "/o.jsonl"])[5:]


# -- each format, both forms ---------------------------------------------------------------------------


def test_jsonl_zst_is_the_jsonl_merge_compressed_in_both_forms(job, tmp_path):
    merge(job, tmp_path / "merged.jsonl", quiet=True)
    jsonl = (tmp_path / "merged.jsonl").read_bytes()
    assert record_of(job)["output_format"] == "jsonl"

    record = merge(job, tmp_path / "merged.jsonl.zst", quiet=True)
    data = (tmp_path / "merged.jsonl.zst").read_bytes()
    assert zstandard.ZstdDecompressor().decompress(data) == jsonl
    assert zstandard.get_frame_parameters(data).content_size == len(jsonl) and data[:4] == b"\x28\xb5\x2f\xfd"
    assert (record.output_format, record.form, record.rows, record.bytes) == (
        "jsonl.zst",
        "file",
        len(jsonl.splitlines()),
        len(data),
    )
    assert record_of(job)["output_format"] == "jsonl.zst"
    assert verify(job, output=tmp_path / "merged.jsonl.zst").output_format == "jsonl.zst"

    out = tmp_path / "parts"
    record = merge(job, f"{out}/", quiet=True, output_format="jsonl.zst")
    names = sorted(os.listdir(out))
    assert names == [INDEX_NAME, *(f"part-0000{i}-of-00004.jsonl.zst" for i in (0, 1, 3))], "a shard without rows: no part"
    frames = [(out / n).read_bytes() for n in names[1:]]
    assert {zstandard.get_frame_parameters(f).content_size for f in frames} == {zstandard.CONTENTSIZE_UNKNOWN}, (
        "a part is a frame as a worker stores a shard output: no content size"
    )
    parts = b"".join(zstandard.ZstdDecompressor().decompressobj().decompress(f) for f in frames)
    assert parts == jsonl, "the parts, decompressed in name order, are the JSONL merge"
    index = orjson.loads((out / INDEX_NAME).read_bytes())
    assert index["output_format"] == "jsonl.zst" and record.output_format == "jsonl.zst"
    assert [e["bytes"] for e in index["entries"] if e["name"]] == [(out / n).stat().st_size for n in names[1:]]
    assert index["bytes"] == record.bytes == sum((out / n).stat().st_size for n in names[1:])
    assert verify(job, output=out).form == "directory"
    assert hidden_leftovers(tmp_path) == []


def test_parquet_is_the_rows_of_the_jsonl_merge_in_both_forms(job, tmp_path):
    merge(job, tmp_path / "merged.jsonl", quiet=True)
    rows = published_rows((tmp_path / "merged.jsonl").read_bytes())
    record = merge(job, tmp_path / "merged.parquet", quiet=True)
    table = pq.read_table(tmp_path / "merged.parquet")
    assert table.to_pylist() == rows and table.schema.names == ["id", "text"]
    assert (record.output_format, record.rows, record.bytes) == (
        "parquet",
        len(rows),
        (tmp_path / "merged.parquet").stat().st_size,
    )
    assert pq.ParquetFile(tmp_path / "merged.parquet").metadata.metadata.keys() == {b"ARROW:schema"}, "no pandas metadata"

    out = tmp_path / "parts"
    merge(job, f"{out}/", quiet=True, output_format="parquet")
    assert sorted(os.listdir(out))[1:] == [f"part-0000{i}-of-00004.parquet" for i in (0, 1, 3)]
    assert pq.read_table(out).equals(table), "the parts read back as the single file's table"
    assert verify(job, output=f"{out}/").output_format == "parquet"
    assert hidden_leftovers(tmp_path) == []


def test_parquet_takes_the_union_schema_of_every_shard(varied_job, tmp_path):
    job = varied_job()
    assert position(job, LATE)[0] == "part-00002-of-00003", "the first two shards hold only the earlier types"
    merge(job, tmp_path / "merged.jsonl", quiet=True)
    rows = published_rows((tmp_path / "merged.jsonl").read_bytes())
    assert "note" not in rows[3] and rows[0]["note"] is None, "the JSONL merge keeps each row as it is"
    merge(job, tmp_path / "merged.parquet", quiet=True)
    table = pq.read_table(tmp_path / "merged.parquet")
    schema = table.schema
    assert schema.names == ["id", "text", "note", "score", "meta", "day"], "fields in order of first appearance"
    assert schema.field("note").type == pa.string(), "null in one shard, a string in another"
    assert schema.field("score").type == pa.float64(), "an int in one shard, a float in another"
    assert schema.field("day").type == pa.string(), "an ISO date stays a string"
    meta = schema.field("meta").type
    assert [f.name for f in meta] == ["tags", "source"] and meta.field("source").type == pa.struct(
        [("name", pa.string()), ("rank", pa.int64())]
    )
    assert pa.types.is_list(meta.field("tags").type) and meta.field("tags").type.value_type == pa.string()
    assert table.to_pylist() == shaped(rows, schema)

    out = tmp_path / "parts"
    merge(job, f"{out}/", quiet=True, output_format="parquet")
    first = pq.read_table(out / "part-00000-of-00003.parquet")
    assert first.schema == schema, "a part whose own rows are narrower still has the whole output's schema"
    assert pq.read_table(out).equals(table)
    assert pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("*.parquet"))).equals(table)


@pytest.mark.parametrize(
    ("fmt", "group_rows", "group_bytes"), [("jsonl.zst", 0, 0), ("parquet", 4, 1 << 20), ("parquet", 1000, 700)]
)
def test_the_same_rows_give_the_same_bytes_whatever_the_shard_count(
    varied_job, tmp_path, monkeypatch, fmt, group_rows, group_bytes
):
    """Parquet's row groups straddle shard boundaries: cut every 4 rows, or once they hold 700 bytes of JSON."""
    monkeypatch.setattr(parquet_output, "ROW_GROUP_ROWS", group_rows)
    monkeypatch.setattr(parquet_output, "ROW_GROUP_BYTES", group_bytes)
    published = []
    for shards in (1, 3, 7):
        job = varied_job(shards, f"cut{shards}")
        out = tmp_path / f"cut{shards}{SUFFIX[fmt]}"
        merge(job, out, quiet=True)
        published.append(out.read_bytes())
    assert published[0] == published[1] == published[2]
    if fmt == "parquet":
        metadata = pq.ParquetFile(io.BytesIO(published[0])).metadata
        groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        assert sum(groups) == 30 and (groups == [4] * 7 + [2] if group_rows == 4 else 2 < len(groups) < 30)


def test_zstd_output_does_not_depend_on_the_worker_count_nor_on_how_it_is_fed():
    data = b"".join(orjson.dumps({"id": i, "text": f"row {i} " + "abc" * (i % 50)}) + b"\n" for i in range(40000))
    assert len(data) > 4 << 20

    def compressed(workers: int, step: int) -> bytes:
        sink = io.BytesIO()
        writer = output_codec.compressor(workers).stream_writer(sink, size=len(data), closefd=False)
        for start in range(0, len(data), step):
            writer.write(data[start : start + step])
        writer.close()
        return sink.getvalue()

    one = compressed(1, 1 << 16)
    assert compressed(4, 1 << 16) == compressed(4, 1_000_003) == compressed(2, 7 << 20) == one
    assert zstandard.ZstdDecompressor().decompress(one) == data


# -- verify ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl.zst", "parquet"])
def test_verify_finds_a_flipped_byte_or_a_truncated_file_in_either_form(job, tmp_path, run_cli, fmt):
    single = tmp_path / f"merged{SUFFIX[fmt]}"
    merge(job, single, quiet=True)
    result = run_cli("verify", "--job-dir", str(job), "--output", str(single), "--json")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["output_format"] == fmt and f"({fmt}) matches merge.json" in result.stderr
    original = single.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    single.write_bytes(bytes(flipped))
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(single)), str(single), "(sha256", "merge --overwrite")
    single.write_bytes(original[:-8])
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(single)), str(single), "(bytes")
    single.write_bytes(original)
    assert run_cli("verify", "--job-dir", str(job), "--output", str(single)).returncode == 0

    out = tmp_path / "parts"
    merge(job, f"{out}/", quiet=True, output_format=fmt)
    part = out / f"part-00001-of-00004{SUFFIX[fmt]}"
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(out)), str(part), f"does not match {INDEX_NAME} (sha256")
    part.write_bytes(data[: len(data) // 2])
    refused(run_cli("verify", "--job-dir", str(job), "--output", str(out)), str(part), "(bytes")
    part.write_bytes(data)
    assert run_cli("verify", "--job-dir", str(job), "--output", str(out)).returncode == 0


def test_verify_reads_a_parquet_footer_and_finds_the_default_output(job):
    default = job / "merged.parquet"
    merge(job, default, quiet=True)
    result = verify(job)
    assert (result.output_checked, result.output_format) == (default, "parquet"), "the launchers' default, named in merge.json"
    saved = record_of(job)
    JobLayout(job).merge_record.write_bytes(orjson.dumps({**saved, "rows": saved["rows"] + 1}))  # the bytes still match
    with pytest.raises(IntegrityError, match=f"its Parquet footer says {saved['rows']} rows, merge.json {saved['rows'] + 1}"):
        verify(job)


# -- refusals -------------------------------------------------------------------------------------


def conflicting(row: dict) -> dict:
    i = row["id"]
    return {**row, "extra": {"deep": f"text {i}" if i < LATE else {"k": i}}}


def test_a_field_parquet_cannot_hold_is_refused_naming_shard_line_and_field(varied_job, tmp_path, run_cli):
    job = varied_job(mapper=conflicting)
    shard, line = position(job, LATE)
    for output, flags in ((tmp_path / "merged.parquet", ()), (tmp_path / "parts", ("--output-format", "parquet"))):
        result = run_cli("merge", "--job-dir", str(job), "--output", str(output), *flags)
        refused(
            result,
            f"cannot publish Parquet: field extra.deep is an object in {shard} line {line} (",
            "but a string in part-00000-of-00003 line 1 (",
            "--output-format",
        )
        assert not output.exists() and hidden_leftovers(tmp_path) == [] and not JobLayout(job).merge_record.exists()
    assert run_cli("merge", "--job-dir", str(job), "--output", str(tmp_path / "merged.jsonl.zst")).returncode == 0


def test_a_boolean_beside_a_number_is_refused_not_turned_into_one(varied_job, tmp_path):
    """Arrow would make True a 1.0 in a column of floats (and only when they share a chunk)."""
    job = varied_job(mapper=lambda row: {**row, "flag": True if row["id"] == LATE else row["id"] + 0.5})
    shard, line = position(job, LATE)
    with pytest.raises(
        UsageError, match=rf"field flag is a boolean in {shard} line {line} .* but a number in part-00000-of-00003 line 1 "
    ):
        merge(job, tmp_path / "merged.parquet", quiet=True)


def test_an_object_that_never_has_a_field_rows_without_fields_or_a_number_past_64_bits_are_refused(varied_job, tmp_path):
    job = varied_job(mapper=lambda row: {**row, "meta": {}})
    with pytest.raises(UsageError, match=r"field meta is an empty object in every row .* publish jsonl or jsonl.zst"):
        merge(job, tmp_path / "merged.parquet", quiet=True)
    job = varied_job(name="bare", mapper=lambda row: {ROW_KEY: row[ROW_KEY]})
    with pytest.raises(
        UsageError, match=r"every row of the job's 3 shard output\(s\) is \{\}, and Parquet keeps no rows without a column"
    ):
        merge(job, tmp_path / "merged.parquet", quiet=True)
    job = varied_job(name="huge", mapper=lambda row: {**row, "big": 1 << 63 if row["id"] == LATE else 1})
    shard, line = position(job, LATE)
    with pytest.raises(UsageError, match=rf"field big is 9223372036854775808 in {shard} line {line} .* 64-bit"):
        merge(job, tmp_path / "merged.parquet", quiet=True)
    assert hidden_leftovers(tmp_path) == [] and not (tmp_path / "merged.parquet").exists()


def test_a_changed_shard_output_is_refused_before_a_conversion_publishes(job, tmp_path):
    layout = JobLayout(job)
    done = orjson.loads(layout.done("part-00001-of-00004").read_bytes())
    processed = output_path(job, done)
    st = processed.stat()
    rewrite_output(processed, lambda lines: lines.replace(b"sample", b"SAMPLE", 1))
    os.utime(processed, ns=(st.st_atime_ns, st.st_mtime_ns))
    for output in (tmp_path / "merged.parquet", tmp_path / "merged.jsonl.zst", tmp_path / "parts/"):
        with pytest.raises(IntegrityError, match="part-00001-of-00004: output .* does not match its completion record"):
            merge(job, output, quiet=True, output_format="parquet" if str(output).endswith("/") else None)
    assert sorted(os.listdir(tmp_path)) == ["job", "job-input.jsonl", "recipe.yaml"]


def test_overwrite_replaces_a_directory_output_of_another_format(job, tmp_path):
    out = tmp_path / "parts"
    merge(job, f"{out}/", quiet=True, output_format="parquet")
    merge(job, f"{out}/", overwrite=True, quiet=True, output_format="jsonl.zst")
    assert sorted(os.listdir(out))[1].endswith(".jsonl.zst") and verify(job, output=out).output_format == "jsonl.zst"


# -- the launchers -----------------------------------------------------------------------------------


def test_a_launcher_publishes_the_format_asked_for_and_keeps_it_on_a_rerun(tmp_path, launch, run_cli):
    job = tmp_path / "job"
    extra = launcher_args("local", tmp_path)
    assert launch("local", "--job-dir", str(job), "--output-format", "parquet", *extra) == [0], (
        tmp_path / "local-0.log"
    ).read_text()
    default = job / "merged.parquet"
    assert [row["id"] for row in pq.read_table(default).to_pylist()] == list(range(12))
    assert record_of(job)["output_format"] == "parquet"
    before = snapshot(job)
    assert launch("local", "--job-dir", str(job), "--output-format", "parquet", *extra) == [0]
    assert "is already this job's verified merge" in (tmp_path / "local-0.log").read_text()
    assert snapshot(job)["merged.parquet"] == before["merged.parquet"], "a rerun keeps its own output"
    result = run_cli("verify", "--job-dir", str(job), "--json")
    assert result.returncode == 0 and orjson.loads(result.stdout)["output"] == str(default), "verify finds the default output"


def test_a_launcher_refuses_up_front_a_directory_output_of_another_format(job, tmp_path):
    out = tmp_path / "parts"
    merge(job, f"{out}/", quiet=True, output_format="jsonl.zst")
    layout = JobLayout(job)
    refuse_foreign_output(out, layout, directory=True, output_format="jsonl.zst")  # its own: kept
    with pytest.raises(UsageError, match="is not this job's merge \\(this job's merge there is jsonl.zst, not parquet\\)"):
        refuse_foreign_output(out, layout, directory=True, output_format="parquet")


def test_records_written_before_formats_existed_read_as_jsonl(job, tmp_path):
    out = tmp_path / "parts"
    merge(job, f"{out}/", quiet=True)
    layout = JobLayout(job)
    record = record_of(job)
    assert record["output_format"] == "jsonl"
    index = orjson.loads((out / INDEX_NAME).read_bytes())
    del index["output_format"]
    data = orjson.dumps(index, option=orjson.OPT_INDENT_2) + b"\n"
    (out / INDEX_NAME).write_bytes(data)
    del record["output_format"]
    layout.merge_record.write_bytes(orjson.dumps({**record, "sha256": hashlib.sha256(data).hexdigest()}))
    assert verify(job, output=out).output_format == "jsonl"


@pytest.mark.parametrize("fmt", ["jsonl.zst", "parquet"])
def test_a_job_without_rows_publishes_an_empty_output(make_job, tmp_path, fmt):
    job = make_job(rows=6, shards=2, name="empty")
    assert Worker(job, WorkerOptions(), runner=FakeRunner(keep=lambda row: False)).run() == 0
    record = merge(job, tmp_path / f"merged{SUFFIX[fmt]}", quiet=True)
    data = (tmp_path / f"merged{SUFFIX[fmt]}").read_bytes()
    if fmt == "jsonl.zst":
        assert zstandard.ZstdDecompressor().decompress(data) == b""
    else:
        assert pq.read_table(io.BytesIO(data)).num_rows == 0
    assert record.rows == 0 and verify(job, output=tmp_path / f"merged{SUFFIX[fmt]}").output_format == fmt
    merge(job, f"{tmp_path / 'parts'}/", quiet=True, output_format=fmt)
    assert os.listdir(tmp_path / "parts") == [INDEX_NAME] and verify(job, output=tmp_path / "parts").form == "directory"
