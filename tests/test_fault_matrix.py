"""The bounded CI subset of `scripts/faults`: every kind of fault once, on a GlusterFS volume in its
default caching mode (the harder one: it behaves like a NAS with attribute caching).

The full randomized run (`scripts/faults --trials 200`) is documented in the README with its
summary line; this subset keeps every kind exercised on every CI run. The tests after it check
the matrix's Parquet inputs and the fake processor's reading of Parquet shards, without a cluster.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.exhaustive import EXHAUSTIVE
from support.fakes import FakeRunner, fake_recipe_keep, parquet_lines
from support.fault_matrix import (
    KINDS,
    PARQUET_GROUPS,
    PARQUET_ROWS,
    PREPARE_PARQUET_GROUPS,
    PREPARE_ROWS,
    PREPARE_SHARDS,
    PREPARE_UNIT_BYTES,
    parquet_rows,
    run,
    write_parquet_input,
)
from support.jobs import SIMPLE_RECIPE, fast_settings

from elastic_sharding.finish.merge import merge
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.prepare.plan import plan_units, write_units
from elastic_sharding.records import ROW_KEY
from elastic_sharding.work.worker import Worker, WorkerOptions

# CI leaves out the `actor` kind (real Data-Juicer + Ray on two nodes, about a minute):
# test_warm_ops.py kills and freezes a warm instance mid-shard with real operators; and the scale
# kinds (jobs of hundreds of shards, about 20 s each at 3 nodes, more to build their clean runs):
# test_cluster_scale.py runs a job on 16 nodes.
CI_KINDS = list(KINDS) if EXHAUSTIVE else [kind for kind in KINDS if kind != "actor" and not kind.startswith("scale-")]


@pytest.mark.cluster
def test_every_kind_of_fault_loses_nothing_and_merges_identically(gluster, capsys):
    cluster = gluster(nodes=3, mode="cached")
    summary = run(trials=len(CI_KINDS), seed=int(os.environ.get("FAULTS_SEED", "20261130")), cluster=cluster, kinds=CI_KINDS)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.failed == [], "\n".join(summary.failed) + "\n" + line
    assert summary.trials == len(CI_KINDS) and set(summary.kinds) == set(CI_KINDS), line
    assert summary.rows_lost == 0 and summary.rows_duplicated == 0, line
    assert summary.identical == summary.merges > 0, line
    assert summary.clean_failures == summary.expected_failures > 0, line


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _parquet_job(tmp_path: Path, shards: int) -> Path:
    data = write_parquet_input(tmp_path / "data", parquet_rows(PARQUET_ROWS), PARQUET_GROUPS)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SIMPLE_RECIPE.format(dataset=data))
    job = tmp_path / "job"
    prepare(PrepareRequest(recipe, None, job, shards, fast_settings()), quiet=True)
    return job


def test_the_prepare_kill_parquet_input_has_work_for_every_phase(tmp_path):
    """Several files of several row groups, nested, null and timestamp fields; at every unit size
    of the prepare-kill kind several scan units and several write units, and at its largest shard
    count fewer row groups than shards (the cut splits row groups into row ranges)."""
    root = write_parquet_input(tmp_path / "in", parquet_rows(PREPARE_ROWS), PREPARE_PARQUET_GROUPS)
    files = sorted(root.iterdir())
    assert len(files) == len(PREPARE_PARQUET_GROUPS) > 1
    groups = [pq.ParquetFile(f).metadata.num_row_groups for f in files]
    assert all(g > 1 for g in groups) and min(PREPARE_SHARDS) <= sum(groups) < max(PREPARE_SHARDS)
    table = pa.concat_tables(pq.read_table(f) for f in files)
    assert table.column("id").to_pylist() == list(range(PREPARE_ROWS))
    assert pa.types.is_struct(table.schema.field("meta").type)
    assert table.schema.field("when").type == pa.timestamp("us", tz="UTC")
    assert table.column("meta").null_count and table.column("note").null_count
    sizes = [f.stat().st_size for f in files]
    for unit_bytes in PREPARE_UNIT_BYTES:
        assert len(plan_units(files, sizes, unit_bytes)) >= len(files)
        for shards in PREPARE_SHARDS:
            assert write_units(sum(sizes), shards, unit_bytes) > 1


def test_the_fake_exports_a_parquet_shard_as_data_juicer_does(tmp_path):
    """The fake processor reads a Parquet shard and writes the lines of Data-Juicer's Ray export
    (pandas' JSON: floats to 10 decimal places, timestamps in epoch milliseconds), the kept ones as is."""
    job = _parquet_job(tmp_path, 12)  # more shards than row groups: shards of row ranges
    manifest = JobLayout(job).load_manifest()
    assert manifest.input_format == "parquet" and all(s.path.endswith(".parquet") for s in manifest.shards)
    shard = job / manifest.shards[0].path
    lines = parquet_lines(shard)
    assert len(lines) == manifest.shards[0].rows
    assert all(line.startswith(b'{"' + ROW_KEY.encode() + b'":') for line in lines)  # collect's fast path
    assert Worker(job, WorkerOptions(), runner=FakeRunner(keep=fake_recipe_keep)).run() == 0
    out = tmp_path / "merged.jsonl"
    merge(job, out)
    merged = out.read_bytes().splitlines()
    rows = [orjson.loads(line) for line in merged]
    inputs = parquet_rows(PARQUET_ROWS)
    assert [r["id"] for r in rows] == [r["id"] for r in inputs if fake_recipe_keep(r)]
    for row in rows:
        source = inputs[row["id"]]
        assert list(row) == ["id", "text", "meta", "when", "note"]
        assert row["when"] == (source["when"] - EPOCH) // datetime.timedelta(milliseconds=1)
        assert row["note"] == source["note"] and row["text"] == source["text"]
        if source["meta"] is None:
            assert row["meta"] is None
        else:
            assert row["meta"]["tags"] == source["meta"]["tags"]
            assert abs(row["meta"]["score"] - source["meta"]["score"]) <= 1e-10  # 10 decimal places
    # The merge holds the export's lines byte for byte (less the ordering field).
    exported = [line for spec in manifest.shards for line in parquet_lines(job / spec.path)]
    prefix = len(b'{"' + ROW_KEY.encode() + b'":')
    kept = {orjson.loads(line)["id"]: b"{" + line[line.index(b",", prefix) + 1 :] for line in exported}
    assert merged == [kept[r["id"]] for r in rows]


RAY_EXPORT = r"""
import sys, ray
ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[3], object_store_memory=100 << 20)
ray.data.read_parquet(sys.argv[1]).write_json(sys.argv[2], force_ascii=False)
"""


@pytest.mark.e2e
def test_the_fake_parquet_export_is_rays(tmp_path):
    """What `parquet_lines` gives is what Ray writes for Data-Juicer (`RayDataset.read` is
    `ray.data.read_parquet`, `RayExporter.write_json` is `write_json(path, force_ascii=False)`)."""
    job = _parquet_job(tmp_path, 3)
    shard = job / JobLayout(job).load_manifest().shards[0].path
    out = tmp_path / "ray-out"
    ray_tmp = tempfile.mkdtemp(prefix="esfm", dir="/tmp")
    subprocess.run([sys.executable, "-c", RAY_EXPORT, str(shard), str(out), ray_tmp], check=True, timeout=300)
    written = [line for part in sorted(out.iterdir()) for line in part.read_bytes().splitlines()]
    assert sorted(written, key=lambda line: orjson.loads(line)[ROW_KEY]) == parquet_lines(shard)
