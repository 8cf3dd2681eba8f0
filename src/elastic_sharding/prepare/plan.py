"""Planning a prepare: the input cut into scan units, and the plan every participant works from.

A large plain file is scanned in ranges of its own so that processes can share it; a compressed
file cannot be entered in the middle and is scanned whole. The plan's key names the request, the
input files' sizes and times, the unit size and the resolved recipe: a participant joins only a
plan with its own key, and a plan of anything else is removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import socket
from pathlib import Path

import orjson

from elastic_sharding import confined, fsops
from elastic_sharding.engine import engine_identity, python_identity
from elastic_sharding.errors import JobStateError
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.prepare_dir import PrepareDir
from elastic_sharding.prepare.recipe import Recipe, dump_config
from elastic_sharding.prepare.sources import compression_of
from elastic_sharding.records import FORMAT_VERSION, AnalysisSpec, PreparePlan, Request, encode

log = logging.getLogger(__name__)

UNIT_BYTES = 64 << 20
# A write unit covers shards of about this many input bytes in all (at least one shard): where
# shards are tiny, the unit's own cost (claim, heartbeat, result, fsyncs) stays small beside them.
WRITE_UNIT_BYTES = 4 << 20
MAX_SHARDS_PER_WRITE = 256  # and few enough per unit that every participant still gets units
UNIT_BYTES_ENV = "ELASTIC_SHARD_PREPARE_UNIT_BYTES"


def configured_unit_bytes() -> int:
    value = os.environ.get(UNIT_BYTES_ENV)
    return int(value) if value else UNIT_BYTES


def plan_units(paths: list[Path], sizes: list[int], unit_bytes: int) -> list[list[list[int | None]]]:
    """Scan units: a large plain file in `unit_bytes` ranges of its own, smaller files (and every
    compressed one, which cannot be entered in the middle) whole, grouped up to `unit_bytes`."""
    units: list[list[list[int | None]]] = []
    group: list[list[int | None]] = []
    group_bytes = 0
    for i, (path, size) in enumerate(zip(paths, sizes)):
        compressed = compression_of(path) is not None
        if compressed or size <= unit_bytes:
            if group and group_bytes + size > unit_bytes:
                units.append(group)
                group, group_bytes = [], 0
            group.append([i, 0, None if compressed else size])
            group_bytes += size
            continue
        if group:
            units.append(group)
            group, group_bytes = [], 0
        for start in range(0, size, unit_bytes):
            units.append([[i, start, min(size, start + unit_bytes)]])
    if group:
        units.append(group)
    return units


def make_plan(
    request: Request,
    recipe: Recipe,
    kind: str,
    root: Path,
    files: list[Path],
    stats: list[os.stat_result],
    units: list[list[list[int | None]]],
    recipe_base: Path,
    input_format: str = "jsonl",
    analysis: AnalysisSpec | None = None,
) -> PreparePlan:
    sizes = [st.st_size for st in stats]
    mtimes = [st.st_mtime_ns for st in stats]
    unit_bytes = configured_unit_bytes()
    config = dict(recipe.config)
    config["dataset_path"] = str(Path(request.dataset_path))
    recipe_bytes = dump_config(config)
    identity = engine_identity()
    manifest = {
        "format_version": FORMAT_VERSION,
        "job_id": secrets.token_hex(8),
        "created_on": socket.gethostname(),
        "request": dataclasses.asdict(request),
        "recipe_sha256": hashlib.sha256(recipe_bytes).hexdigest(),
        "recipe_file": "recipe.yaml",
        "data_juicer_version": identity.data_juicer_version,
        "data_juicer_commit": identity.data_juicer_commit,
        "ray_version": identity.ray_version,
        "python_version": python_identity(),
        "dataset_kind": kind,
        "dataset_root": str(root if kind == "dir" else files[0]),
        "index_key": recipe.index_key,
        "media_keys": list(recipe.media_keys),
        "warnings": list(recipe.warnings),
        "segments": [dataclasses.asdict(segment) for segment in recipe.segments],
        "input_format": input_format,
        "analysis": dataclasses.asdict(analysis) if analysis is not None else None,
    }
    settings = request.settings
    key_source = orjson.dumps(
        [FORMAT_VERSION, dataclasses.asdict(request), [str(f) for f in files], sizes, mtimes, unit_bytes, recipe_bytes.decode()]
    )
    return PreparePlan(
        key=hashlib.sha256(key_source).hexdigest(),
        files=[str(f) for f in files],
        sizes=sizes,
        mtimes=mtimes,
        units=units,
        unit_bytes=unit_bytes,
        base=str(root),
        media_keys=list(recipe.media_keys),
        index_key=recipe.index_key,
        max_line=recipe.max_line_bytes,
        num_shards=request.num_shards,
        lease_secs=settings.lock_timeout_secs,
        heartbeat_secs=settings.heartbeat_interval_secs,
        poll_secs=min(settings.poll_interval_secs, 0.2),
        manifest=manifest,
        recipe_text=recipe_bytes.decode(),
        recipe_base=str(recipe_base),
        shards_per_write=shards_per_write(sum(sizes), request.num_shards, unit_bytes),
        input_format=input_format,
    )


def write_units(input_bytes: int, num_shards: int, unit_bytes: int) -> int:
    """How many write units a plan of these sizes has."""
    return -(-num_shards // shards_per_write(input_bytes, num_shards, unit_bytes))


def shards_per_write(input_bytes: int, num_shards: int, unit_bytes: int) -> int:
    """How many shards one write unit writes: shards of about `WRITE_UNIT_BYTES` of input in
    all (or of one scan unit where scan units are smaller), and at least one."""
    per_shard = max(1, input_bytes // max(1, num_shards))
    return max(1, min(num_shards, MAX_SHARDS_PER_WRITE, min(unit_bytes, WRITE_UNIT_BYTES) // per_shard))


def open_plan(pdir: PrepareDir, plan: PreparePlan) -> PreparePlan:
    """Start the prepare of `plan`, or join the same one already under way (or left by a killed
    prepare: its finished units are kept). A plan of another request or of input files that
    changed since, or one that failed, is removed first."""
    for _ in range(5):
        if pdir.root.is_dir():
            try:
                existing = pdir.read_plan()
            except ValueError:
                existing = None
            if existing is not None:
                if existing.key == plan.key and not confined.lexists(pdir.failed):
                    log.info("joining the prepare already under way in %s", pdir.root)
                    return existing
                log.warning("removing %s: it holds an earlier prepare of another request or input", pdir.root)
                pdir.remove()
                continue
        fsops.ensure_dir(pdir.root)
        for sub in (pdir.units, pdir.stage, JobLayout(pdir.stage).shards_dir):
            fsops.ensure_dir(sub)
        if fsops.publish_once(pdir.plan, encode(plan)):
            return plan
    raise JobStateError(
        f"could not start the prepare in {pdir.root}: other prepares keep replacing it; run one prepare at a time"
    )
