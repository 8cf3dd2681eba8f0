"""The finished job of the merge and verify tests (the `job` fixture: four shards, the third with
no rows left) and what those tests read of it."""

from __future__ import annotations

from pathlib import Path

import orjson

from elastic_sharding.layout import JobLayout

EMPTY = set()  # the rows of the job's third shard: filtered out, so that shard has no rows left


def keep(row: dict) -> bool:
    return row["id"] not in EMPTY


def records(job: Path) -> list[dict]:
    layout = JobLayout(job)
    return [orjson.loads(layout.done(spec.shard_id).read_bytes()) for spec in layout.load_manifest().shards]


def hidden_leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))
