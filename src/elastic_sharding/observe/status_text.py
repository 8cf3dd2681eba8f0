"""status's text for people: one `Status` read, worded line by line.

Its own module because `Status` (status.py) is the read of a job and its JSON for machines;
everything here only words what that read holds: the summary and progress lines, a segment's and
each stage's line, the nodes, backups and shards, and what to do about a failure. `--watch`
prints `progress_line` between full views.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from elastic_sharding.observe.backup_races import Backup, BackupState
from elastic_sharding.observe.durations import format_duration
from elastic_sharding.observe.metrics import WarmOperator
from elastic_sharding.observe.outputs import output_lines
from elastic_sharding.observe.stages import COMPONENTS, DONE, FAILED, PHASES, WAITING, StageView
from elastic_sharding.observe.stragglers import straggler_lines
from elastic_sharding.vocabulary import ShardState

if TYPE_CHECKING:
    from elastic_sharding.observe.status import Status

SEGMENT_OPS_SHOWN = 3  # operators named in the text's segment line
BACKUP_LINES = 10  # backups the text lists (the non-deterministic ones first), the rest counted


def _age(seconds: float | None) -> str:
    return format_duration(seconds, "status")


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


def warm_text(op: WarmOperator) -> str:
    """One line of a node's warm operator, as `status` and the HTML report show it."""
    fraction = op.all_busy_fraction
    busy = "-" if fraction is None else f"{100 * fraction:.0f}%"
    deaths = f", {op.deaths} replaced" if op.deaths else ""
    return f"{op.op}: {op.instances} instance(s), {op.loads} load(s){deaths}, all instances busy {busy}"


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


def segment_text(status: Status) -> str:
    """Which segment of the recipe the shard counts are of."""
    segment, last = status.segment, len(status.segments) - 1
    head = f"segment {segment.index} of 0-{last}"
    if not segment.has_ops:
        return f"{head}: no operators (its input is its output)"
    names = (status.operators or [])[segment.first_op : segment.end_op]
    shown = ", ".join(names[:SEGMENT_OPS_SHOWN]) + (
        f" +{len(names) - SEGMENT_OPS_SHOWN} more" if len(names) > SEGMENT_OPS_SHOWN else ""
    )
    ops = f" ({shown})" if shown else ""
    return f"{head}{ops}: the shards above are this segment's"


def stage_text(stage: StageView) -> str:
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


def _refusal_lines(status: Status) -> list[str]:
    lines = []
    for refusal in status.refusals:
        first, *more = refusal.message.splitlines() or [""]
        also = f" (+{len(more)} more line(s): status --json)" if more else ""
        lines.append(
            f"refused node: {refusal.host} (pid {refusal.pid}, {_age(status.at - refusal.at)} ago) claims nothing: "
            f"{refusal.reason}: {first}{also}"
        )
    return lines


def progress_line(status: Status) -> str:
    """Shards, rows, elapsed time, rates and the ETA in one line (`--watch` prints it between views)."""
    m = status.metrics
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


def _node_lines(status: Status) -> list[str]:
    if not status.metrics.nodes:
        return []
    lines = [f"  {'node':<24} {'workers':>7} {'done':>5} {'rows':>10} {'rows/s':>9}  running"]
    for node in status.metrics.nodes:
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


def _backup_lines(status: Status) -> list[str]:
    backups, counts = status.metrics.backups, status.metrics.backup_counts
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


def _shard_lines(status: Status, show_all: bool) -> list[str]:
    interesting = status.views if show_all else [v for v in status.views if v.state not in (ShardState.PENDING, ShardState.DONE)]
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


def status_text(status: Status, show_all: bool) -> str:
    """The whole text of `status`; `show_all` lists every shard, not only the unfinished ones."""
    lines = [status.summary_line(), progress_line(status)]
    if status.stages:
        lines += [segment_text(status), *(stage_text(stage) for stage in status.stages)]
    if status.analysis is not None:
        lines.append(status.analysis.line())
    lines += output_lines(status.merged, status.views, status.segment.index if len(status.segments) > 1 else None)
    lines += _node_lines(status)
    lines += _refusal_lines(status)
    lines += straggler_lines(status.metrics)
    lines += _backup_lines(status)
    for item in status.stale_claims():
        lines.append(
            f"stale claim: {item['shard_id']} held by {item['host']} (pid {item['pid']}), "
            f"no heartbeat for {_age(item['heartbeat_age_secs'])}"
        )
    lines += _shard_lines(status, show_all)
    lines += [f"  {line}" for line in status.shard_errors()]
    if any(stage.state == FAILED for stage in status.stages) or (status.analysis and status.analysis.state == FAILED):
        lines.append("  a failed stage: fix the cause, then `retry --all-failed` and start workers again")
    if status.counts[ShardState.STALE]:
        lines.append(
            "  stale = no heartbeat for longer than the lock timeout by this machine's clock (an estimate); "
            "a worker takes such a claim over after watching it for one lease"
        )
    for run in status.runs:
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
    if not show_all and any(v.state in (ShardState.PENDING, ShardState.DONE) for v in status.views):
        lines.append("  (--all lists every shard)")
    return "\n".join(lines)


__all__ = ["progress_line", "segment_text", "stage_text", "status_text", "warm_text"]
