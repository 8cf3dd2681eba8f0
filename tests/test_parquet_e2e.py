"""Parquet input end to end: real Data-Juicer + Ray read the Parquet shards with their own reader,
and the merged output equals one `dj-process` Ray run over the same Parquet directory, through
`local` and through `dlc` on nodes with their own hostnames."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support.e2e_support import (
    DEMO_DATA,
    DEMO_RECIPE,
    DLC_JOB,
    baseline_rows,
    needs_unshare,
    run_script,
    shard_job,
    start_node,
    wait_all,
)

pytestmark = pytest.mark.e2e

QUICK = ("--poll-interval-secs", "0.5", "--lock-timeout-secs", "120", "--coordinator-lease-secs", "4", "--ray-num-cpus", "1")


def typed_demo_table() -> pa.Table:
    """The demo rows with what Hub corpora carry besides text: a nested struct with nulls, a
    timestamp, binary, a list that is sometimes null, a float that is sometimes null."""
    rows = [orjson.loads(line) for line in DEMO_DATA.read_bytes().splitlines()]
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    for row in rows:
        i = row["id"]
        row["meta"]["n"] = None if i % 2 else i
        row["when"] = start + datetime.timedelta(seconds=37 * i)
        row["raw"] = bytes([65 + i % 26, 66])
        row["tags"] = [f"t{i % 3}"] if i % 4 else None
        row["score"] = None if i % 5 == 0 else i / 3
    return pa.Table.from_pylist(rows)


@pytest.fixture(scope="module")
def parquet_demo(tmp_path_factory) -> tuple[Path, list[bytes]]:
    """Three Parquet files of several row groups each, and one `dj-process` Ray run over them."""
    root = tmp_path_factory.mktemp("parquet")
    data = root / "data"
    data.mkdir()
    table = typed_demo_table()
    third = -(-table.num_rows // 3)
    for k in range(3):
        pq.write_table(table.slice(k * third, third), data / f"part-{k}.parquet", row_group_size=25)
    return data, baseline_rows(DEMO_RECIPE, data, root)


def test_local_parquet_job_equals_dj_process(tmp_path, parquet_demo):
    """Also `local`'s own contract with two worker processes (CI's only real run of it): both
    take shards, --output's directories are created, and a rerun finds the verified merge."""
    data, baseline = parquet_demo
    job, out = tmp_path / "job", tmp_path / "out" / "new" / "merged.jsonl"
    args = (
        "local", "--config", str(DEMO_RECIPE), "--dataset-path", str(data), "--job-dir", str(job),
        "--num-shards", "4", "--workers", "2", "--output", str(out),
    )  # fmt: skip
    proc = shard_job(*args)
    assert "PASS: 4 shards were completed by 1 node(s)" in proc.stderr
    workers = {line.split("elastic-shard[")[1].split("]")[0] for line in proc.stderr.splitlines() if "] INFO done part-" in line}
    assert len(workers) == 2
    assert out.read_bytes().splitlines(keepends=True) == baseline
    assert "already this job's verified merge" in shard_job(*args).stderr
    manifest = json.loads((job / "manifest.json").read_bytes())
    assert manifest["input_format"] == "parquet"
    assert [s["path"].endswith(".parquet") for s in manifest["shards"]] == [True] * 4
    first = orjson.loads(baseline[0])
    assert isinstance(first["when"], int) and first["raw"] == "AB"  # what Data-Juicer's export makes of them
    check_every_output_format(job, tmp_path, out)


def check_every_output_format(job: Path, tmp_path: Path, jsonl: Path) -> None:
    """The finished job merged again as zstd JSONL and as Parquet, one file and a directory of
    parts: the same rows, and each passes `verify` (which checks the latest merge)."""
    zst = tmp_path / "formats" / "merged.jsonl.zst"
    shard_job("merge", "--job-dir", str(job), "--output", str(zst))
    assert zstandard.ZstdDecompressor().stream_reader(zst.open("rb")).read() == jsonl.read_bytes()
    shard_job("verify", "--job-dir", str(job), "--output", str(zst))
    single = tmp_path / "formats" / "merged.parquet"
    shard_job("merge", "--job-dir", str(job), "--output", str(single))
    table = pq.read_table(single)
    assert table.to_pylist() == [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    shard_job("verify", "--job-dir", str(job), "--output", str(single))
    parts = tmp_path / "formats" / "parts"
    shard_job("merge", "--job-dir", str(job), "--output", f"{parts}/", "--output-format", "parquet")
    files = sorted(parts.glob("*.parquet"))
    assert len(files) == 4 and pa.concat_tables(pq.read_table(f) for f in files).equals(table)
    shard_job("verify", "--job-dir", str(job), "--output", str(parts))


@needs_unshare
def test_dlc_parquet_job_on_separate_hosts_equals_dj_process(tmp_path, parquet_demo):
    data, baseline = parquet_demo
    job = tmp_path / "job"
    args = (
        "--config", str(DEMO_RECIPE), "--dataset-path", str(data), "--job-dir", str(job),
        "--nodes", "2", "--num-shards", "6", "--run-id", "parquet-1", *QUICK,
    )  # fmt: skip
    nodes = {name: start_node(name, "dlc", *args, log=tmp_path / f"{name}.log", script=DLC_JOB) for name in ("pq-a", "pq-b")}
    codes = wait_all(nodes)
    assert codes == {"pq-a": 0, "pq-b": 0}, {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in nodes}
    assert (job / "merged.jsonl").read_bytes().splitlines(keepends=True) == baseline
    status = json.loads(run_script(DLC_JOB, "status", "--job-dir", str(job), "--json", check=False).stdout)
    assert {s["host"] for s in status["shards"]} <= {"pq-a", "pq-b"}
    prepared_by = json.loads((job / "manifest.json").read_bytes())["prepared_by"]
    assert prepared_by and all(who.split(":")[0] in {"pq-a", "pq-b"} for who in prepared_by)
