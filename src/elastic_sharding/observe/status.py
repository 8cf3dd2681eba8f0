"""status: what a job's shards and deduplication stages are doing, as text for people or JSON
for machines.

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
from elastic_sharding.observe.durations import format_duration
from elastic_sharding.observe.metrics import (
    Backup,
    BackupState,
    Eta,
    Node,
    Running,
    WarmOperator,
    job_metrics,
)
from elastic_sharding.observe.outputs import merged_json, merged_record, output_lines, output_rows
from elastic_sharding.observe.snapshot import (
    AttemptView,
    ShardView,
    attempt_history,
    backup_records,
    counts,
    job_snapshot,
    node_refusals,
)
from elastic_sharding.observe.stages import (
    COMPONENTS,
    DONE,
    FAILED,
    PHASES,
    WAITING,
    StageView,
    UnitView,
    read_stage,
    recipe_operators,
)
from elastic_sharding.observe.stragglers import rule_json, straggler_lines
from elastic_sharding.records import Manifest, NodeRefusal
from elastic_sharding.segments import job_segments, segment_manifest
from elastic_sharding.vocabulary import ShardState

JSON_SCHEMA_VERSION = 3
SEGMENT_OPS_SHOWN = 3  # operators named in the text's segment line
BACKUP_LINES = 10  # backups the text lists (the non-deterministic ones first), the rest counted


def _age(seconds: float | None) -> str:
    return format_duration(seconds, "status")


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


def _backup_text(backup: Backup) -> str:
    """One backup attempt and how its race with the original went, as `status` shows it."""
    text = f"{backup.shard_id}: backup on {backup.host}"
    original = f"the original on {backup.of_host or '(unreadable)'}"
    ran = ""
    if backup.original_secs is not None:
        factor = f" ({backup.original_factor:.1f}x the median)" if backup.original_factor is not None else ""
        ran = f"{_age(backup.original_secs)}{factor}"
    if backup.state == BackupState.WON:
        text += f" won after {_age(backup.backup_secs)}"
        if backup.promoted:
            text += f" ({original} had ended: the claim was handed to the backup)"
        elif ran:
            text += f"; {original} had run {ran}"
        if backup.behind_secs is not None:
            text += f", {_age(backup.behind_secs)} behind"
        if backup.saved_secs is not None:
            text += f"; saved {_age(backup.saved_secs)} (the original finished too)"
    elif backup.state == BackupState.LOST:
        text += f" lost after {_age(backup.backup_secs)}: {original} published first" + (f", after {ran}" if ran else "")
    elif backup.state == BackupState.RUNNING:
        text += f" running for {_age(backup.backup_secs)}" + (f"; {original} has run {ran}" if ran else "")
    else:
        text += f" {backup.state} after {_age(backup.backup_secs)}"
        if backup.state == BackupState.FAILED and not backup.promoted:
            text += " (not counted against the shard's retries)"
    if backup.nondeterministic:
        text += "; NOT DETERMINISTIC: both attempts finished with different outputs (the published one is used)"
    return text


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


def warm_text(op: WarmOperator) -> str:
    """One line of a node's warm operator, as `status` and the HTML report show it."""
    fraction = op.all_busy_fraction
    busy = "-" if fraction is None else f"{100 * fraction:.0f}%"
    deaths = f", {op.deaths} replaced" if op.deaths else ""
    return f"{op.op}: {op.instances} instance(s), {op.loads} load(s){deaths}, all instances busy {busy}"


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


def _phase_text(stage: StageView, phase: str) -> str:
    units = stage.units[phase]
    text = f"{phase} {units.done}/{'?' if units.total is None else units.total}"
    if phase == COMPONENTS and stage.rounds:
        text += f" (the last of {stage.rounds} rounds)"
    return text + (f" ({units.held} held)" if units.held else "")


def _units_text(stage: StageView, but: str | None = None) -> str:
    """The phases with units, in order (all but `but`)."""
    shown = [p for p in PHASES if p != but and (stage.units[p].done or stage.units[p].held)]
    return ", ".join(_phase_text(stage, phase) for phase in shown)


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
        self.complete = self._complete()
        self.failed = bool(self.counts[ShardState.FAILED]) or any(stage.state == FAILED for stage in self.stages)
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
            f"segment {self.segment.index} is done; deduplication stage {stage.stage} is {doing} "
            "(its own estimate is in `stages`)",
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

    def segment_text(self) -> str:
        """Which segment of the recipe the shard counts are of."""
        segment, last = self.segment, len(self.segments) - 1
        head = f"segment {segment.index} of 0-{last}"
        if not segment.has_ops:
            return f"{head}: no operators (its input is its output)"
        names = (self.operators or [])[segment.first_op : segment.end_op]
        shown = ", ".join(names[:SEGMENT_OPS_SHOWN]) + (
            f" +{len(names) - SEGMENT_OPS_SHOWN} more" if len(names) > SEGMENT_OPS_SHOWN else ""
        )
        ops = f" ({shown})" if shown else ""
        return f"{head}{ops}: the shards above are this segment's"

    def stage_text(self, stage: StageView) -> str:
        """One line per stage: its state, current phase, units per phase and ETA."""
        head = f"stage {stage.stage} {stage.operator or '(operator unknown)'}"
        if stage.state == FAILED:
            return f"{head}: failed" + (f" in phase {stage.phase}" if stage.phase else "") + f": {stage.error}"
        if stage.state == DONE:
            took = stage.finished_at - stage.started_at if stage.finished_at and stage.started_at else None
            return f"{head}: done" + (f" in {_age(took)}" if took is not None else "") + f"; {_units_text(stage)}"
        if stage.state == WAITING:
            ahead = _units_text(stage)
            return f"{head}: waiting for segment {stage.stage - 1}" + (f"; hashed ahead: {ahead}" if ahead else "")
        parts = [f"{head}: running"]
        if stage.phase is not None:
            units = stage.units[stage.phase]
            round_text = f" round {stage.round}" if stage.round is not None else ""
            total = "?" if units.total is None else units.total
            held = f" ({units.held} held)" if units.held else ""
            parts[0] += f", phase {stage.phase}{round_text} {units.done}/{total} units{held}"
        before = _units_text(stage, but=stage.phase)
        if before:
            parts.append(before)
        if stage.eta_secs is not None:
            parts.append(f"ETA {_age(stage.eta_secs)}")
        return "; ".join(parts)

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

    def _refusal_lines(self) -> list[str]:
        lines = []
        for refusal in self.refusals:
            first, *more = refusal.message.splitlines() or [""]
            also = f" (+{len(more)} more line(s): status --json)" if more else ""
            lines.append(
                f"refused node: {refusal.host} (pid {refusal.pid}, {_age(self.at - refusal.at)} ago) claims nothing: "
                f"{refusal.reason}: {first}{also}"
            )
        return lines

    def errors(self, failed_only: bool = False) -> list[str]:
        """`<shard> last error: <root cause> (log: <path>)` for failed (and retrying) shards, and
        what made each failed stage fail."""
        stages = [
            f"deduplication stage {stage.stage} failed in {stage.error}; fix the cause, then `retry --all-failed`"
            for stage in self.stages
            if stage.state == FAILED
        ]
        return self._shard_errors(failed_only) + stages

    def _shard_errors(self, failed_only: bool = False) -> list[str]:
        return [
            f"{item['shard_id']} last error: {item['error']}" + (f" (log: {item['log']})" if item["log"] else "")
            for item in self.failures()
            if item["state"] == ShardState.FAILED or not failed_only
        ]

    def summary_line(self) -> str:
        parts = ", ".join(f"{n} {state}" for state, n in self.counts.items())
        m = self.metrics
        segment = f" segment {self.segment.index} of 0-{len(self.segments) - 1}," if len(self.segments) > 1 else ""
        return (
            f"{self.layout.root}:{segment} {len(self.views)} shards: {parts}; "
            f"input rows done {m.rows_done}/{m.rows_total} ({m.percent:.1f}%)"
        )

    def progress_line(self) -> str:
        m = self.metrics
        parts = [f"{m.shards_done}/{m.shards_total} shards", f"{m.rows_done}/{m.rows_total} rows ({m.percent:.1f}%)"]
        parts.append(f"elapsed {_age(m.elapsed_secs)}")
        if m.rows_per_sec is not None:
            parts.append(f"{m.rows_per_sec:,.1f} rows/s now on {m.active_workers} worker(s)")
        if m.overall_rows_per_sec is not None:
            parts.append(f"{m.overall_rows_per_sec:,.1f} rows/s overall")
        if m.eta.secs is not None and m.eta.basis != "complete":
            at = time.strftime("%H:%M:%S", time.localtime(m.eta.at))
            parts.append(f"ETA {_age(m.eta.secs)} (about {at})")
        elif m.eta.basis != "complete":
            parts.append(f"ETA unknown: {m.eta.basis}")
        return "progress: " + "; ".join(parts)

    def _node_lines(self) -> list[str]:
        if not self.metrics.nodes:
            return []
        lines = [f"  {'node':<24} {'workers':>7} {'done':>5} {'rows':>10} {'rows/s':>9}  running"]
        for node in self.metrics.nodes:
            rate = "-" if node.rows_per_sec is None else f"{node.rows_per_sec:,.1f}"
            running = ", ".join(
                f"{r.shard_id} ({r.phase or 'running'}, {_age(r.age_secs)}"
                f"{', BACKUP' if r.backup_of else ''}{', STRAGGLER' if r.straggler else ''})"
                for r in node.running
            )
            lines.append(
                f"  {node.host[:24]:<24} {node.active_workers:>7} {node.shards_done:>5} {node.rows_done:>10} {rate:>9}  {running or '-'}"
            )
            lines.extend(f"  {'':<24}   warm op {warm_text(op)}" for op in node.warm_operators)
        return ["nodes:", *lines]

    def _backup_lines(self) -> list[str]:
        backups, counts = self.metrics.backups, self.metrics.backup_counts
        if not backups:
            return []
        shown = sorted(backups, key=lambda b: (not b.nondeterministic, b.started_at))[:BACKUP_LINES]
        lines = [
            f"backups ({counts.started} started: {counts.running} running, {counts.won} won, {counts.lost} lost, "
            f"{counts.failed} failed):",
            *(f"  {_backup_text(backup)}" for backup in shown),
        ]
        if len(backups) > len(shown):
            lines.append(f"  (+{len(backups) - len(shown)} more: status --json)")
        return lines

    def _shard_lines(self, show_all: bool) -> list[str]:
        interesting = self.views if show_all else [v for v in self.views if v.state not in (ShardState.PENDING, ShardState.DONE)]
        if not interesting:
            return []
        lines = [f"{'shard':<22} {'state':<8} {'rows':>9} {'host':<20} {'age/took':>8} {'fails':>5}  attempt"]
        for v in interesting:
            took = v.completion.finished_at - v.completion.started_at if v.completion else v.heartbeat_age
            lines.append(
                f"{v.shard_id:<22} {v.state:<8} {v.spec.rows:>9} {(v.owner or '-')[:20]:<20} "
                f"{_age(took):>8} {v.failures:>5}  {v.attempt_id or '-'}"
            )
        return lines

    def text(self, show_all: bool) -> str:
        lines = [self.summary_line(), self.progress_line()]
        if self.stages:
            lines += [self.segment_text(), *(self.stage_text(stage) for stage in self.stages)]
        lines += output_lines(self.merged, self.views, self.segment.index if len(self.segments) > 1 else None)
        lines += self._node_lines()
        lines += self._refusal_lines()
        lines += straggler_lines(self.metrics)
        lines += self._backup_lines()
        for item in self.stale_claims():
            lines.append(
                f"stale claim: {item['shard_id']} held by {item['host']} (pid {item['pid']}), "
                f"no heartbeat for {_age(item['heartbeat_age_secs'])}"
            )
        lines += self._shard_lines(show_all)
        lines += [f"  {line}" for line in self._shard_errors()]
        if any(stage.state == FAILED for stage in self.stages):
            lines.append("  a failed stage: fix the cause, then `retry --all-failed` and start workers again")
        if self.counts[ShardState.STALE]:
            lines.append(
                "  stale = no heartbeat for longer than the lock timeout by this machine's clock (an estimate); "
                "a worker takes such a claim over after watching it for one lease"
            )
        for run in self.runs:
            phases = ", ".join(
                f"{phase} {run[phase]['state']}" + (f" ({run[phase]['host']})" if "host" in run[phase] else "")
                for phase in ("prepare", "finalize")
            )
            abort = run["abort"]
            ending = (
                f"; ShardState.FAILED in {abort['phase']} on {abort['host']} (exit {abort['exit_code']}): {abort['reason']}"
                if abort
                else ""
            )
            lines.append(f"  dlc run {run['run_id']}: {phases}{ending}  [{run['dir']}]")
        if not show_all and any(v.state in (ShardState.PENDING, ShardState.DONE) for v in self.views):
            lines.append("  (--all lists every shard)")
        return "\n".join(lines)


__all__ = ["Status"]
