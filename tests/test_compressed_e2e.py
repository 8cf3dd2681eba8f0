"""A `.jsonl.zst` / `.jsonl.gz` directory through the real Data-Juicer Ray executor: the merged
output equals a plain `dj-process` run over the decompressed data, row for row and in order."""

from __future__ import annotations

import gzip

import pytest
import zstandard
from support.e2e_support import DEMO_DATA, DEMO_RECIPE, shard_job
from support.exhaustive import exhaustive_only

pytestmark = pytest.mark.e2e


@exhaustive_only  # CI: test_prepare.py and test_bad_inputs.py read compressed inputs into the same plain shards; test_parquet_e2e.py runs a non-JSONL input end to end
def test_compressed_directory_input_merges_to_the_plain_run(tmp_path, demo_baseline):
    lines = DEMO_DATA.read_bytes().splitlines(keepends=True)
    third = len(lines) // 3
    data = tmp_path / "corpus"
    (data / "b").mkdir(parents=True)
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    (data / "a.jsonl.zst").write_bytes(compressor.compress(b"".join(lines[:third])))
    (data / "b" / "c.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[third : 2 * third])))
    (data / "b" / "d.jsonl.zst").write_bytes(compressor.compress(b"".join(lines[2 * third :])))
    job, out = tmp_path / "job", tmp_path / "merged.jsonl"
    shard_job(
        "local", "--config", str(DEMO_RECIPE), "--dataset-path", str(data), "--job-dir", str(job),
        "--num-shards", "3", "--workers", "1", "--output", str(out),
    )  # fmt: skip
    assert out.read_bytes().splitlines(keepends=True) == demo_baseline
    status = shard_job("verify", "--job-dir", str(job), "--output", str(out))
    assert status.returncode == 0
