"""verify: a job is complete, its outputs match their records, and enough nodes took part."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import fsops
from .errors import IntegrityError, JobStateError
from .layout import JobLayout
from .merge import completed_outputs
from .output import file_stats
from .records import MergeRecord, load


@dataclass
class VerifyResult:
    shards: int
    hosts: list[str]
    output_checked: Path | None


def verify_shards(layout: JobLayout, expect_nodes: int = 1) -> tuple[int, list[str]]:
    """Every shard is done, its output matches its completion record, and enough hosts took part."""
    shards = completed_outputs(layout)
    for record, path in shards:
        try:
            stats = file_stats(path)
        except (OSError, ValueError) as exc:
            raise IntegrityError(f"{record.shard_id}: {exc}") from None
        if (stats.rows, stats.bytes, stats.sha256) != (record.output_rows, record.output_bytes, record.output_sha256):
            raise IntegrityError(f"{record.shard_id}: output {path} does not match its completion record")
    hosts = sorted({record.host for record, _ in shards})
    if len(hosts) < expect_nodes:
        raise JobStateError(
            f"{len(shards)} shards were completed by {len(hosts)} node(s) ({', '.join(hosts)}), expected at least {expect_nodes}"
        )
    return len(shards), hosts


def verify_merged(layout: JobLayout, target: Path) -> MergeRecord:
    """`target` is the merge that `merge.json` describes, byte for byte."""
    if not fsops.lexists(layout.merge_record):
        raise JobStateError(f"{target}: no merge.json in the job directory; run merge first")
    merged = load(MergeRecord, layout.merge_record)
    if os.path.abspath(merged.output) != str(target):
        raise JobStateError(f"merge.json describes {merged.output}, not {target}")
    try:
        stats = file_stats(target)
    except FileNotFoundError:
        raise JobStateError(f"{target}: merged output does not exist; run merge") from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{target}: {exc}") from None
    if (stats.rows, stats.bytes, stats.sha256) != (merged.rows, merged.bytes, merged.sha256):
        raise IntegrityError(f"{target}: merged output does not match merge.json")
    return merged


def verify(job_dir: Path, expect_nodes: int = 1, output: Path | None = None) -> VerifyResult:
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    count, hosts = verify_shards(layout, expect_nodes)
    target = Path(os.path.abspath(output)) if output is not None else layout.default_output
    checked = None
    if output is not None or fsops.lexists(target):
        verify_merged(layout, target)
        checked = target
    return VerifyResult(count, hosts, checked)
