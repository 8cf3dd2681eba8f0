"""status: what a job's shards and deduplication stages are doing, read once (`Status`) and
given as JSON for machines; `status_text.py` words the same read for people.

A recipe with deduplicators runs in segments (`segments.py`). The shard views (counts, progress,
nodes, ETA) are of the *current* segment: the last one whose shards are known (segment k's once
stage k has kept every shard) among those with operators; when no known segment has any, segment
0, whose shards are then done (a segment without operators runs nothing: its input is its
output). The job is complete when the last segment is: its shards all done, or, when it has no
operators, known. Each stage is read by `observe/stages.py`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from elastic_sharding.claims.backups import StragglerRule
from elastic_sharding.claims.submission import generations
from elastic_sharding.errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.analysis_stage import read_analysis
from elastic_sharding.observe.backup_races import Backup
from elastic_sharding.observe.metrics import Eta, Node, Running, WarmOperator, job_metrics
from elastic_sharding.observe.outputs import merged_json, merged_record, output_rows
from elastic_sharding.observe.snapshot import (
    AttemptView,
    ShardView,
    attempt_history,
    backup_records,
    counts,
    job_snapshot,
    node_refusals,
)
from elastic_sharding.observe.stages import DONE, FAILED, PHASES, StageView, UnitView, read_stage, recipe_operators
from elastic_sharding.observe.stragglers import rule_json
from elastic_sharding.records import Manifest, NodeRefusal
from elastic_sharding.segments import job_segments, segment_manifest
from elastic_sharding.vocabulary import ShardState

JSON_SCHEMA_VERSION = 3


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _shard_json(view: ShardView, attempts: int) -> dict[str, Any]:
    took = view.completion.finished_at - view.completion.started_at if view.completion else None
    return {
        "shard_id": view.shard_id,
        "state": view.state,
        "input_rows": view.spec.rows,
        "input_bytes": view.spec.bytes,
        "host": view.owner,
        "attempt_id": view.attempt_id,
        "attempts": attempts,
        "phase": view.heartbeat.phase if view.heartbeat is not None and view.state == ShardState.RUNNING else None,
        "heartbeat_age_secs": _round(view.heartbeat_age),
        "secs": _round(took),
        "failures": view.failures,
        "last_error": view.last_error,
        "output_rows": view.completion.output_rows if view.completion else None,
    }


def _running_json(item: Running) -> dict[str, Any]:
    return {
        "shard_id": item.shard_id,
        "attempt_id": item.attempt_id,
        "host": item.host,
        "pid": item.pid,
        "phase": item.phase,
        "age_secs": _round(item.age_secs, 1),
        "expected_secs": _round(item.expected_secs, 1),
        "est_fraction": _round(item.est_fraction),
        "straggler": item.straggler,
        "factor": _round(item.factor, 2),
        "straggler_reason": item.straggling.reason() if item.straggling is not None else None,
        "backup_of": item.backup_of,
    }


def _backup_json(backup: Backup) -> dict[str, Any]:
    return {
        "shard_id": backup.shard_id,
        "attempt_id": backup.attempt_id,
        "host": backup.host,
        "pid": backup.pid,
        "of_attempt_id": backup.of_attempt_id,
        "of_host": backup.of_host,
        "started_at": backup.started_at,
        "reason": backup.reason,
        "state": backup.state,
        "promoted": backup.promoted,
        "backup_secs": _round(backup.backup_secs, 1),
        "original_secs": _round(backup.original_secs, 1),
        "original_factor": _round(backup.original_factor, 2),
        "behind_secs": _round(backup.behind_secs, 1),
        "saved_secs": _round(backup.saved_secs, 1),
        "nondeterministic": backup.nondeterministic,
    }


def _node_json(node: Node) -> dict[str, Any]:
    return {
        "host": node.host,
        "active_workers": node.active_workers,
        "shards_done": node.shards_done,
        "rows_done": node.rows_done,
        "bytes_done": node.bytes_done,
        "rows_per_sec": _round(node.rows_per_sec, 2),
        "bytes_per_sec": _round(node.bytes_per_sec, 1),
        "failures": node.failures,
        "running": [_running_json(item) for item in node.running],
        "warm_operators": [_warm_json(op) for op in node.warm_operators],
    }


def _warm_json(op: WarmOperator) -> dict[str, Any]:
    return {
        "op": op.op,
        "instances": op.instances,
        "loads": op.loads,
        "deaths": op.deaths,
        "rows": op.rows,
        "window_secs": _round(op.window_secs, 2),
        "all_busy_fraction": _round(op.all_busy_fraction, 4),
        "busy_fraction": _round(op.busy_fraction, 4),
    }


def terminal_failures(views: list[ShardView]) -> str | None:
    """The terminally failed shards in one line (at most three named), for a launcher's error;
    `Status.errors` is the per-shard form, with each one's log."""
    failed = [
        f"{v.shard_id} failed {v.failure.failures} time(s), last on host={v.failure.host}: {v.failure.last_error}"
        for v in views
        if v.failure is not None
    ]
    if not failed:
        return None
    return f"{len(failed)} shard(s) failed terminally: " + "; ".join(failed[:3]) + (" ..." if len(failed) > 3 else "")


def _done_views(manifest: Manifest) -> list[ShardView]:
    """The shards of a segment without operators: done as soon as they are known."""
    return [ShardView(spec, ShardState.DONE, None, None, None, None, 0, None, None) for spec in manifest.shards]


def _stage_json(stage: StageView) -> dict[str, Any]:
    return {
        "stage": stage.stage,
        "operator": stage.operator,
        "state": stage.state,
        "phase": stage.phase,
        "round": stage.round,
        "units": {phase: dataclasses.asdict(stage.units[phase]) for phase in PHASES},
        "error": stage.error,
        "started_at": stage.started_at,
        "finished_at": stage.finished_at,
        "eta_secs": _round(stage.eta_secs, 1),
    }


class Status:
    """One read of a job directory: the current segment's shard states, attempts and the metrics
    derived from them, and every deduplication stage."""

    def __init__(self, job_dir: Path, lock_timeout: float | None = None):
        self.job_layout = JobLayout(Path(os.path.abspath(job_dir)))
        self.job_manifest = self.job_layout.load_manifest()
        settings = self.job_manifest.request.settings
        self.lock_timeout = lock_timeout if lock_timeout is not None else settings.lock_timeout_secs
        self.at = time.time()
        self.segments = job_segments(self.job_manifest)
        self.known = self._known_segments()
        current = max((i for i in self.known if self.segments[i].has_ops), default=0)
        self.segment = self.segments[current]
        # `layout` and `manifest` are the current segment's (the job directory and id are the job's).
        self.layout = self.job_layout.segment(current)
        self.manifest = self.known[current]
        if self.segment.has_ops:
            self.views, self.attempts = job_snapshot(self.layout, self.manifest, self.lock_timeout, self.at)
            backups = backup_records(self.layout)
        else:
            self.views, self.attempts, backups = _done_views(self.manifest), [], {}
        self.metrics = job_metrics(self.views, self.attempts, self.at, backups, StragglerRule.of(settings))
        self.merged = merged_record(self.job_layout)
        self.counts = counts(self.views)
        self.runs = generations(self.job_layout.root)
        self.refusals = node_refusals(self.job_layout)
        self.operators = recipe_operators(self.job_layout) if len(self.segments) > 1 else None
        self.stages = [self._stage(segment.index) for segment in self.segments[1:]]
        shards_complete = self._complete()
        self.analysis = (
            read_analysis(self.job_layout, len(self.job_manifest.shards), shards_complete)
            if self.job_manifest.analysis is not None
            else None
        )
        self.complete = shards_complete and (self.analysis is None or self.analysis.state == DONE)
        self.failed = (
            bool(self.counts[ShardState.FAILED])
            or any(stage.state == FAILED for stage in self.stages)
            or (self.analysis is not None and self.analysis.state == FAILED)
        )
        if not self.complete and self.stages and all(v.state == ShardState.DONE for v in self.views):
            self.metrics.eta = self._between_segments_eta()

    def _known_segments(self) -> dict[int, Manifest]:
        """Each segment whose shards are known, in order (segment 0's always are)."""
        known: dict[int, Manifest] = {}
        for segment in self.segments:
            try:
                manifest = segment_manifest(self.job_layout, self.job_manifest, segment.index)
            except ValueError:  # a keep record planted as a link or damaged: not kept as far as status sees
                manifest = None
            if manifest is None:
                break
            known[segment.index] = manifest
        return known

    def _segment_done(self, index: int) -> bool:
        """Every shard of segment `index` done: a known segment before the current one is (a later
        segment is known only once the stages between kept every shard), and one after it has no
        operators."""
        if index not in self.known:
            return False
        return index != self.segment.index or all(v.state == ShardState.DONE for v in self.views)

    def _stage(self, index: int) -> StageView:
        names = self.operators or []
        dedup_op = self.segments[index].dedup_op
        operator = names[dedup_op] if dedup_op is not None and 0 <= dedup_op < len(names) else None
        return read_stage(
            self.job_layout,
            index,
            len(self.job_manifest.shards),
            operator,
            self._segment_done(index - 1),
            self.lock_timeout,
            self.at,
        )

    def _complete(self) -> bool:
        last = self.segments[-1]
        if last.index not in self.known:
            return False
        return not last.has_ops or all(v.state == ShardState.DONE for v in self.views)

    def _between_segments_eta(self) -> Eta:
        """The current segment is done and the job is not: a stage is what runs now."""
        stage = next((s for s in self.stages if s.state != DONE), None)
        if stage is None:
            return Eta(None, None, f"segment {self.segment.index} is done; the next segment's shards are not known yet")
        doing = f"failed: {stage.error}" if stage.state == FAILED else stage.state
        if stage.phase is not None and stage.state != FAILED:
            doing += f", phase {stage.phase}"
        return Eta(
            None,
            None,
            f"segment {self.segment.index} is done; stage {stage.stage} is {doing} (its own estimate is in `stages`)",
        )

    @property
    def exit_code(self) -> int:
        if self.failed:
            return EXIT_ERROR
        if self.complete:
            return EXIT_OK
        return EXIT_INCOMPLETE

    def history(self) -> list[AttemptView]:
        """Every attempt of every known segment with operators, oldest first (what `report` draws)."""
        attempts = list(self.attempts)
        for index, manifest in self.known.items():
            if index != self.segment.index and self.segments[index].has_ops:
                attempts += attempt_history(self.job_layout.segment(index), manifest, self.lock_timeout, self.at)
        attempts.sort(key=lambda view: (view.started_at, view.segment, view.shard_id, view.attempt_id))
        return attempts

    def stage_units(self) -> list[UnitView]:
        return [unit for stage in self.stages for unit in stage.unit_views]

    def _log_of(self, view: ShardView) -> str | None:
        attempt_id = view.failure.last_attempt_id if view.failure is not None else None
        if attempt_id is None:
            failed = [a for a in self.attempts if a.shard_id == view.shard_id and a.archive is None and a.counts_as_failure]
            attempt_id = failed[-1].attempt_id if failed else None
        return None if attempt_id is None else str(attempt_files(self.layout.attempt_dir(view.shard_id, attempt_id))["log"])

    def failures(self) -> list[dict[str, Any]]:
        """Failed shards, and unfinished ones with a failed attempt, with the root cause and log."""
        return [
            {"shard_id": v.shard_id, "state": v.state, "failures": v.failures, "error": v.last_error, "log": self._log_of(v)}
            for v in self.views
            if v.state == ShardState.FAILED or (v.last_error and v.state != ShardState.DONE)
        ]

    def stale_claims(self) -> list[dict[str, Any]]:
        return [
            {
                "shard_id": v.shard_id,
                "host": v.owner,
                "pid": v.claim.pid if v.claim else None,
                "attempt_id": v.attempt_id,
                "heartbeat_age_secs": _round(v.heartbeat_age, 1),
            }
            for v in self.views
            if v.state == ShardState.STALE
        ]

    def as_json(self) -> dict[str, Any]:
        m = self.metrics
        per_shard = Counter(a.shard_id for a in self.attempts if a.archive is None)
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "job_dir": str(self.layout.root),
            "job_id": self.manifest.job_id,
            "generated_at": self.at,
            "lock_timeout_secs": self.lock_timeout,
            "stale_is_estimate": True,
            "complete": self.complete,
            "failed": self.failed,
            "exit_code": self.exit_code,
            "segment": self.segment.index,
            "segments_total": len(self.segments),
            "stages": [_stage_json(stage) for stage in self.stages],
            "analysis": self.analysis.as_json() if self.analysis is not None else None,
            "shards_total": len(self.views),
            "counts": self.counts,
            "rows_total": m.rows_total,
            "rows_done": m.rows_done,
            "output_rows": output_rows(self.views),
            "merged": merged_json(self.merged),
            "hosts": sorted({v.completion.host for v in self.views if v.completion}),
            "progress": {
                "shards_done": m.shards_done,
                "shards_total": m.shards_total,
                "rows_done": m.rows_done,
                "rows_total": m.rows_total,
                "bytes_done": m.bytes_done,
                "bytes_total": m.bytes_total,
                "percent": round(m.percent, 2),
                "percent_bytes": round(m.percent_bytes, 2),
            },
            "started_at": m.started_at,
            "elapsed_secs": round(m.elapsed_secs, 1),
            "throughput": {
                "rows_per_sec": _round(m.rows_per_sec, 2),
                "bytes_per_sec": _round(m.bytes_per_sec, 1),
                "overall_rows_per_sec": _round(m.overall_rows_per_sec, 2),
                "active_workers": m.active_workers,
            },
            "eta": {"secs": _round(m.eta.secs, 1), "at": _round(m.eta.at, 1), "basis": m.eta.basis},
            "nodes": [_node_json(node) for node in m.nodes],
            "stragglers": [_running_json(item) for item in m.stragglers],
            "straggler_rule": rule_json(m.straggler_rule, m.median_secs_per_byte),
            "backups": [_backup_json(backup) for backup in m.backups],
            "backup_counts": dataclasses.asdict(m.backup_counts),
            "refused_nodes": [self._refusal_json(r) for r in self.refusals],
            "stale_claims": self.stale_claims(),
            "failures": self.failures(),
            "shards": [_shard_json(v, per_shard[v.shard_id]) for v in self.views],
            "launcher_runs": self.runs,
        }

    def _refusal_json(self, refusal: NodeRefusal) -> dict[str, Any]:
        return {
            "host": refusal.host,
            "pid": refusal.pid,
            "at": refusal.at,
            "age_secs": _round(max(0.0, self.at - refusal.at), 1),
            "reason": refusal.reason,
            "message": refusal.message,
        }

    def errors(self, failed_only: bool = False) -> list[str]:
        """`<shard> last error: <root cause> (log: <path>)` for failed (and retrying) shards, and
        what made each failed stage fail."""
        stages = [
            f"stage {stage.stage} failed in {stage.error}; fix the cause, then `retry --all-failed`"
            for stage in self.stages
            if stage.state == FAILED
        ]
        if self.analysis is not None and self.analysis.state == FAILED:
            stages.append(f"the analysis failed in {self.analysis.error}; fix the cause, then `retry --all-failed`")
        return self.shard_errors(failed_only) + stages

    def shard_errors(self, failed_only: bool = False) -> list[str]:
        """`errors` without the stages' (the text adds its own advice for a failed stage)."""
        return [
            f"{item['shard_id']} last error: {item['error']}" + (f" (log: {item['log']})" if item["log"] else "")
            for item in self.failures()
            if item["state"] == ShardState.FAILED or not failed_only
        ]

    def summary_line(self) -> str:
        """The text's first line: also what a launcher's error quotes."""
        parts = ", ".join(f"{n} {state}" for state, n in self.counts.items())
        m = self.metrics
        segment = f" segment {self.segment.index} of 0-{len(self.segments) - 1}," if len(self.segments) > 1 else ""
        return (
            f"{self.layout.root}:{segment} {len(self.views)} shards: {parts}; "
            f"input rows done {m.rows_done}/{m.rows_total} ({m.percent:.1f}%)"
        )


__all__ = ["Status"]
