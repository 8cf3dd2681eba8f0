"""`status --prometheus FILE`: the job's metrics in node-exporter's textfile format.

Point node-exporter's `--collector.textfile.directory` at FILE's directory (the name must end in
`.prom`). The file is replaced atomically, so the collector never reads half of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from elastic_sharding import fsops
from elastic_sharding.errors import UsageError
from elastic_sharding.observe.outputs import output_rows
from elastic_sharding.observe.status import Status
from elastic_sharding.vocabulary import SHARD_STATES

PREFIX = "elastic_shard"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in pairs.items()) + "}"


class _Metrics:
    def __init__(self, job: dict[str, str]):
        self.job = job
        self.lines: list[str] = []

    def family(self, name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float | int | None]]) -> None:
        present = [(labels, value) for labels, value in samples if value is not None]
        if not present:
            return
        self.lines += [f"# HELP {PREFIX}_{name} {help_text}", f"# TYPE {PREFIX}_{name} gauge"]
        for labels, value in present:
            number = float(value)  # type: ignore[arg-type]
            text = repr(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)
            self.lines.append(f"{PREFIX}_{name}{_labels({**self.job, **labels})} {text}")


def render(status: Status) -> str:
    m = status.metrics
    out = _Metrics({"job_id": status.manifest.job_id, "job_dir": str(status.layout.root)})
    out.family("shards", "Shards by state.", (({"state": state}, status.counts[state]) for state in SHARD_STATES))
    out.family("shards_total", "Shards of the job.", [({}, m.shards_total)])
    out.family("rows_done", "Input rows of done shards.", [({}, m.rows_done)])
    out.family("rows_total", "Input rows of the job.", [({}, m.rows_total)])
    out.family("bytes_done", "Normalized input bytes of done shards.", [({}, m.bytes_done)])
    out.family("bytes_total", "Normalized input bytes of the job.", [({}, m.bytes_total)])
    out.family(
        "output_rows",
        "Rows published by done shards.",
        [({}, output_rows(status.views))],
    )
    out.family(
        "merged_rows",
        "Rows of the merged output merge.json records (absent before a merge).",
        [({}, status.merged.rows if status.merged is not None else None)],
    )
    out.family("rows_per_second", "Recent input rows per second of the running workers.", [({}, m.rows_per_sec)])
    out.family("active_workers", "Workers running an attempt now.", [({}, m.active_workers)])
    out.family("elapsed_seconds", "Seconds since the first attempt started.", [({}, m.elapsed_secs)])
    out.family("eta_seconds", "Estimated seconds to completion (absent when unknown).", [({}, m.eta.secs)])
    out.family("complete", "1 once the whole recipe is done (every segment and stage).", [({}, int(status.complete))])
    out.family(
        "stragglers",
        "Running shards past the backup trigger (--backup-after, --backup-min-secs of the job).",
        [({}, len(m.stragglers))],
    )
    out.family(
        "backups_enabled",
        "1 when the job starts backup attempts (--backup-after above 0).",
        [({}, int(m.straggler_rule.backs_up))],
    )
    out.family("backups_started", "Backup attempts of straggling shards started.", [({}, m.backup_counts.started)])
    out.family("backups_running", "Backup attempts running now.", [({}, m.backup_counts.running)])
    out.family("backups_won", "Backup attempts that published their shard before the original.", [({}, m.backup_counts.won)])
    out.family(
        "backups_nondeterministic",
        "Shards whose backup and original both finished with different outputs (the recipe is not deterministic).",
        [({}, sum(backup.nondeterministic for backup in m.backups))],
    )
    out.family(
        "refused_nodes",
        "Nodes whose worker refused to claim (missing packages, version mismatch, node-local failures).",
        [({}, len(status.refusals))],
    )
    out.family(
        "host_refused",
        "1 for a node whose worker refused to claim, by reason.",
        (({"host": r.host, "reason": r.reason}, 1) for r in status.refusals),
    )
    out.family("host_rows_per_second", "Input rows per second of a node.", (({"host": n.host}, n.rows_per_sec) for n in m.nodes))
    out.family("host_shards_done", "Shards a node completed.", (({"host": n.host}, n.shards_done) for n in m.nodes))
    out.family(
        "host_active_workers",
        "Workers of a node running an attempt now.",
        (({"host": n.host}, n.active_workers) for n in m.nodes),
    )
    out.family(
        "host_failed_attempts",
        "Failed or superseded attempts of a node (since the last retry).",
        (({"host": n.host}, n.failures) for n in m.nodes),
    )
    warm = [(n.host, op) for n in m.nodes for op in n.warm_operators]
    out.family(
        "host_warm_operator_loads",
        "Instances of an actor-mode operator a node's warm runtimes built (model loads, replacements included).",
        (({"host": host, "op": op.op}, op.loads) for host, op in warm),
    )
    out.family(
        "host_warm_operator_all_busy_ratio",
        "Share of an actor-mode operator's processing time in which all its instances on a node were busy.",
        (({"host": host, "op": op.op}, op.all_busy_fraction) for host, op in warm),
    )
    out.family(
        "failed_attempts",
        "Failed or superseded attempts per shard that has any (since the last retry).",
        (({"shard": v.shard_id}, v.failures) for v in status.views if v.failures),
    )
    out.family("status_timestamp_seconds", "When this file was written.", [({}, status.at)])
    return "\n".join(out.lines) + "\n"


def check_target(path: Path) -> Path:
    """Refuse a target whose directory is missing before any status is read."""
    path = Path(os.path.abspath(path))
    if not path.parent.is_dir():
        raise UsageError(f"--prometheus {path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"--prometheus {path}: is a directory")
    return path


def write(status: Status, path: Path) -> None:
    fsops.replace_atomic(path, render(status).encode())
