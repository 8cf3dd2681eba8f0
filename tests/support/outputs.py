"""The finished job of the merge and verify tests (the `job` fixture: four shards, the third with
no rows left) and what those tests read of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import zstandard

from elastic_sharding.layout import JobLayout, processed_file
from elastic_sharding.work.output_codec import compressor

EMPTY = set()  # the rows of the job's third shard: filtered out, so that shard has no rows left


def keep(row: dict) -> bool:
    return row["id"] not in EMPTY


def records(job: Path) -> list[dict]:
    layout = JobLayout(job)
    return [orjson.loads(layout.done(spec.shard_id).read_bytes()) for spec in layout.load_manifest().shards]


def hidden_leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def output_path(job: Path, record: dict) -> Path:
    """The collected output a completion record names, stored as its codec says."""
    attempt_dir = JobLayout(job).attempt_dir(record["shard_id"], record["attempt_id"])
    return processed_file(attempt_dir, record.get("output_codec", "none"))


def output_lines(path: Path) -> bytes:
    """A collected output's JSONL lines, decompressed if it is stored compressed."""
    data = path.read_bytes()
    return zstandard.ZstdDecompressor().decompressobj().decompress(data) if path.name.endswith(".zst") else data


def rewrite_output(path: Path, change: Callable[[bytes], bytes]) -> None:
    """Edit a collected output's lines in place, stored again as it was (a manual edit of the job
    directory, which merge and verify must catch)."""
    data = change(output_lines(path))
    path.write_bytes(compressor().compress(data) if path.name.endswith(".zst") else data)
