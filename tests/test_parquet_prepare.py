"""Parquet input in `prepare`: the cut on row-group boundaries, the shards as Parquet files of the
input's own types, and every refusal naming the file (and row group)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.jobs import fast_settings

from elastic_sharding.errors import InputError, RecipeError, UsageError
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.prepare.parquet import Segment, cut_row_groups
from elastic_sharding.records import ROW_KEY

DEDUP_FIRST = """\
project_name: test
dataset_path: {dataset}
executor_type: ray
process:
  - document_deduplicator:
  - whitespace_normalization_mapper:
"""


def typed_rows(count: int, start: int = 0) -> list[dict]:
    """Rows with nested, null, timestamp and binary fields (what corpora on the Hub hold)."""
    rows = []
    for i in range(start, start + count):
        rows.append(
            {
                "text": f"document {i} " + "word " * (i % 13),
                "meta": {"source": f"s{i % 3}", "score": i / 7, "tags": [f"t{i % 2}"] if i % 4 else None},
                "when": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=i),
                "raw": bytes([65 + i % 26, 0, 66]),
                "note": None if i % 3 else f"n{i}",
            }
        )
    return rows


def write_parquet(path: Path, rows: list[dict], group_rows: int, schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, row_group_size=group_rows)
    return path


def make_parquet_dir(root: Path, files: int = 3, rows: int = 40, group_rows: int = 7) -> Path:
    schema = pa.Table.from_pylist(typed_rows(4)).schema
    for f in range(files):
        write_parquet(root / f"part-{f}.parquet", typed_rows(rows, f * rows), group_rows, schema)
    return root


def run_prepare(recipe_file, dataset: Path, job: Path, shards: int, body: str | None = None) -> Path:
    recipe = recipe_file(dataset) if body is None else recipe_file(dataset, body)
    prepare(PrepareRequest(recipe, None, job, shards, fast_settings()), quiet=True)
    return job


def shard_tables(job: Path) -> list[pa.Table]:
    manifest = JobLayout(job).load_manifest()
    return [pq.read_table(job / spec.path) for spec in manifest.shards]


def test_shards_hold_the_input_rows_and_types_in_order(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data")
    job = run_prepare(recipe_file, data, tmp_path / "job", 5)
    manifest = JobLayout(job).load_manifest()
    assert manifest.input_format == "parquet"
    assert [s.path for s in manifest.shards] == [f"shards/{s.shard_id}.parquet" for s in manifest.shards]
    tables = shard_tables(job)
    whole = pa.concat_tables(tables)
    assert whole.column(ROW_KEY).to_pylist() == list(range(120))
    expected = pa.concat_tables(pq.read_table(p) for p in sorted(data.iterdir()))
    assert whole.drop_columns([ROW_KEY]).equals(expected)
    assert whole.schema.field("when").type == pa.timestamp("us", tz="UTC")
    assert whole.schema.field("raw").type == pa.binary()
    for spec, table in zip(manifest.shards, tables):
        assert spec.rows == table.num_rows > 0
        assert spec.first_row == table.column(ROW_KEY)[0].as_py()
        assert spec.bytes == os.path.getsize(job / spec.path)
    assert manifest.total_rows == 120 and [f.rows for f in manifest.inputs] == [40, 40, 40]


def test_cut_follows_row_group_boundaries_and_is_deterministic(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data", files=2, rows=50, group_rows=10)
    a = JobLayout(run_prepare(recipe_file, data, tmp_path / "a", 4)).load_manifest()
    b = JobLayout(run_prepare(recipe_file, data, tmp_path / "b", 4)).load_manifest()
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
    assert a.normalized_sha256 == b.normalized_sha256
    assert all(s.rows % 10 == 0 for s in a.shards)
    for spec in a.shards:
        groups = pq.ParquetFile(tmp_path / "a" / spec.path).metadata.num_row_groups
        assert groups == spec.rows // 10


def test_cut_rule():
    # (file, group, rows, bytes): whole row groups while there are at least as many as shards.
    groups = [(0, g, 10, 100) for g in range(6)]
    shards = cut_row_groups(groups, 3)
    assert [[s.group for s in shard] for shard in shards] == [[0, 1], [2, 3], [4, 5]]
    # Balanced by bytes, not rows: one heavy group takes a shard of its own.
    heavy = [(0, 0, 10, 1000), (0, 1, 10, 10), (0, 2, 10, 10), (0, 3, 10, 10)]
    assert [[s.group for s in shard] for shard in cut_row_groups(heavy, 2)] == [[0], [1, 2, 3]]
    # Every later shard still gets a group.
    front = [(0, 0, 10, 1000)] + [(0, g, 10, 1) for g in range(1, 4)]
    assert [len(shard) for shard in cut_row_groups(front, 4)] == [1, 1, 1, 1]
    # Empty row groups are skipped.
    with_empty = [(0, 0, 0, 5), (0, 1, 10, 100), (1, 0, 0, 5), (1, 1, 10, 100)]
    assert [[(s.file, s.group) for s in shard] for shard in cut_row_groups(with_empty, 2)] == [[(0, 1)], [(1, 1)]]


def test_more_shards_than_row_groups_split_groups_by_rows():
    groups = [(0, 0, 10, 300), (0, 1, 10, 100)]
    shards = cut_row_groups(groups, 5)
    assert len(shards) == 5 and all(len(s) == 1 for s in shards)
    assert [s[0] for s in shards] == [
        Segment(0, 0, 0, 3),
        Segment(0, 0, 3, 3),
        Segment(0, 0, 6, 2),
        Segment(0, 0, 8, 2),
        Segment(0, 1, 0, 10),
    ]
    # A group never gets more shards than rows.
    tiny = [(0, 0, 2, 10_000), (0, 1, 5, 1)]
    assert [s[0].rows for s in cut_row_groups(tiny, 7)] == [1, 1, 1, 1, 1, 1, 1]
    with pytest.raises(UsageError, match="exceeds the number of input rows"):
        cut_row_groups(tiny, 8)


def test_more_shards_than_row_groups_end_to_end(tmp_path, recipe_file):
    data = write_parquet(tmp_path / "one.parquet", typed_rows(30), group_rows=30)
    job = run_prepare(recipe_file, data, tmp_path / "job", 4)
    tables = shard_tables(job)
    assert [t.num_rows for t in tables] == [8, 8, 7, 7]
    assert pa.concat_tables(tables).column(ROW_KEY).to_pylist() == list(range(30))


def test_empty_files_are_skipped(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data", files=2, rows=20, group_rows=5)
    schema = pq.read_schema(data / "part-0.parquet")
    pq.write_table(schema.empty_table(), data / "part-00-empty.parquet")
    job = run_prepare(recipe_file, data, tmp_path / "job", 3)
    assert sum(t.num_rows for t in shard_tables(job)) == 40
    manifest = JobLayout(job).load_manifest()
    assert [f.rows for f in manifest.inputs] == [20, 0, 20]


def test_truncated_file_is_refused_by_name(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data", files=2)
    bad = data / "part-1.parquet"
    content = bad.read_bytes()
    bad.write_bytes(content[: len(content) // 2])
    with pytest.raises(InputError, match=r"part-1\.parquet: not a readable Parquet file"):
        run_prepare(recipe_file, data, tmp_path / "job", 3)
    assert not (tmp_path / "job").exists()


def test_corrupt_row_group_is_refused_by_name_and_group(tmp_path, recipe_file):
    rows = [{"text": f"{i:04d} " + "x" * 200} for i in range(40)]
    bad = write_parquet(tmp_path / "data" / "a.parquet", rows, group_rows=10)
    meta = pq.read_metadata(bad)
    chunk = meta.row_group(2).column(0)
    content = bytearray(bad.read_bytes())
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    for k in range(start, start + chunk.total_compressed_size):
        content[k] = 0xFF
    bad.write_bytes(bytes(content))
    with pytest.raises(InputError, match=r"a\.parquet: row group 2 does not decode"):
        run_prepare(recipe_file, tmp_path / "data", tmp_path / "job", 2)
    assert not (tmp_path / "job").exists()


def test_schema_mismatch_is_refused_by_name(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data", files=2)
    write_parquet(data / "part-2.parquet", [{"text": "x", "meta": 1}], group_rows=1)
    with pytest.raises(InputError, match=r"part-2\.parquet: its schema differs from .*part-0\.parquet's: it has no column"):
        run_prepare(recipe_file, data, tmp_path / "job", 3)
    assert not (tmp_path / "job").exists()


def test_mixed_tree_is_refused(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data", files=1)
    (data / "more.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(InputError, match="mixes Parquet files .* and JSONL files"):
        run_prepare(recipe_file, data, tmp_path / "job", 1)


def test_reserved_column_is_refused(tmp_path, recipe_file):
    data = write_parquet(tmp_path / "x.parquet", [{"text": "a", ROW_KEY: 1}], group_rows=1)
    with pytest.raises(InputError, match="reserved by elastic-sharding"):
        run_prepare(recipe_file, data, tmp_path / "job", 1)


def test_media_paths_are_made_absolute(tmp_path, recipe_file):
    rows = [{"text": f"t{i}", "images": [f"img/{i}.png", "/abs/x.png", "http://h/y.png"]} for i in range(6)]
    write_parquet(tmp_path / "data" / "a.parquet", rows, group_rows=3)
    job = run_prepare(recipe_file, tmp_path / "data", tmp_path / "job", 2)
    images = pa.concat_tables(shard_tables(job)).column("images").to_pylist()
    assert images[4] == [str(tmp_path / "data" / "img" / "4.png"), "/abs/x.png", "http://h/y.png"]


def test_a_recipe_that_begins_with_a_deduplicator_is_refused_on_parquet(tmp_path, recipe_file):
    data = make_parquet_dir(tmp_path / "data", files=1)
    with pytest.raises(RecipeError, match="process\\[0\\] document_deduplicator runs as a stage across all shards"):
        run_prepare(recipe_file, data, tmp_path / "job", 2, body=DEDUP_FIRST)


def test_cooperative_prepare_writes_the_same_bytes(tmp_path, recipe_file, monkeypatch):
    """Files hashed in ranges by several units and processes (footers read once), the same job."""
    from elastic_sharding.prepare.plan import UNIT_BYTES_ENV

    data = make_parquet_dir(tmp_path / "data", files=3, rows=300, group_rows=40)
    reference = JobLayout(run_prepare(recipe_file, data, tmp_path / "ref", 6)).load_manifest()
    monkeypatch.setenv(UNIT_BYTES_ENV, "4096")
    recipe = recipe_file(data)
    for procs in (1, 3):
        job = tmp_path / f"p{procs}"
        result = prepare(PrepareRequest(recipe, None, job, 6, fast_settings(), procs=procs), quiet=True)
        manifest = result.manifest
        assert [s.sha256 for s in manifest.shards] == [s.sha256 for s in reference.shards]
        assert [f.sha256 for f in manifest.inputs] != [f.sha256 for f in reference.inputs]  # chunked fingerprints
        assert all(f.chunks for f in manifest.inputs)
    assert 1 <= len(result.manifest.prepared_by) <= 3


def test_binary_that_is_not_utf8_is_refused_by_file_group_row_and_column(tmp_path, recipe_file):
    rows = [{"text": f"t{i}", "raw": b"ok" if i != 7 else b"\xff\xfe"} for i in range(10)]
    write_parquet(tmp_path / "data" / "a.parquet", rows, group_rows=5)
    with pytest.raises(InputError, match=r"a\.parquet: row group 1, row 2: binary column 'raw' holds bytes that are not UTF-8"):
        run_prepare(recipe_file, tmp_path / "data", tmp_path / "job", 2)
    assert not (tmp_path / "job").exists()
