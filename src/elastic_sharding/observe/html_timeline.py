"""The report's timeline: one lane per node, one bar per attempt, arrows from each retry or takeover;
then one lane per deduplication stage, one bar per unit, coloured by its phase.

Bars that overlap on a node (claim-ahead, several workers) are stacked in sub-rows; each bar's
title holds the attempt's details, and the shard number (and retry/takeover/backup) is written
inside the bar where it fits. A backup attempt has a dashed outline and a dotted arrow from its
original at the moment it started: the two ran at once, so it is neither a retry nor a takeover.
A shard has attempts in each segment of a recipe with deduplicators: a retry, takeover or backup
is only ever of an attempt of the same shard in the same segment. A stage's participants each
have a sub-row of its lane (one unit at a time each); a unit's title names its host and pid.
"""

from __future__ import annotations

import re

from elastic_sharding.observe.html_format import esc, fmt_bytes, fmt_int, fmt_secs, iso
from elastic_sharding.observe.html_timeline_layout import (
    AXIS_H,
    BACKUP,
    LABEL_W,
    PLOT_W,
    RIGHT_PAD,
    ROW_H,
    Bar,
    Lane,
    Timeline,
    UnitBar,
    lay_out,
    tick_step,
)
from elastic_sharding.observe.snapshot import AttemptView
from elastic_sharding.observe.stages import PHASES, UnitView
from elastic_sharding.vocabulary import OUTCOMES, AttemptOutcome

CHAR_W = 6.6  # average advance of the 11px bar font, to decide whether a label fits
LANE_LABEL_CHARS = 21
TITLE_ERROR_CHARS = 400
# Unit bars: a done unit in its phase's colour, a held one striped, a stale one hatched like an attempt.
PHASE_COLOURS = {"keys": "#8250df", "buckets": "#bf3989", "components": "#1b7c83", "place": "#0969da", "keep": "#9a6700"}
UNIT_FILL = {"held": "url(#unit-held)", "stale": "url(#stale-hatch)", "failed": "#cf222e"}
PHASE_LETTER = {"keys": "k", "buckets": "b", "components": "c", "place": "p", "keep": "K"}


def _fmt_elapsed(secs: float, fraction: bool = False) -> str:
    """m:ss (h:mm:ss past an hour) for axis ticks; tenths when ticks are closer than a second."""
    whole = int(secs)
    text = f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}" if whole >= 3600 else f"{whole // 60}:{whole % 60:02d}"
    return f"{text}.{int(round((secs - whole) * 10)) % 10}" if fraction else text


def _shard_number(shard_id: str) -> str:
    match = re.match(r"part-0*(\d+)", shard_id) or re.search(r"(\d+)", shard_id)
    return match.group(1) if match else shard_id[:8]


# -- timeline SVG ----------------------------------------------------------------------------


def _bar_title(bar: Bar, start: float, now: float) -> str:
    view = bar.view
    took = view.secs if view.secs is not None else max(0.0, now - view.started_at)
    segment = f"segment {view.segment} · " if view.segment else ""
    lines = [
        f"{segment}{view.shard_id} · attempt {view.attempt_id}",
        f"host {view.host} · pid {view.pid} · runner {view.runner}",
        f"outcome: {view.outcome}" + _outcome_note(bar),
        f"started +{fmt_secs(view.started_at - start)} ({iso(view.started_at)}), "
        + (f"took {fmt_secs(took)}" if view.ended_at is not None else f"running for {fmt_secs(took)}"),
        f"rows {fmt_int(view.input_rows)} in → {fmt_int(view.output_rows)} out · {fmt_bytes(view.input_bytes)}",
    ]
    if view.setup_secs:
        lines.append(f"runtime start-up: {fmt_secs(view.setup_secs)} of it")
    if view.phase:
        lines.append(f"phase: {view.phase}" + (f" (expected ~{fmt_secs(view.expected_secs)})" if view.expected_secs else ""))
    if view.error:
        error = view.error if len(view.error) <= TITLE_ERROR_CHARS else view.error[:TITLE_ERROR_CHARS] + "…"
        lines.append(f"error: {error}")
    if view.archive:
        lines.append(f"archived by retry {view.archive}")
    lines.append(f"log: {view.log}")
    return "\n".join(lines)


def _outcome_note(bar: Bar) -> str:
    view = bar.view
    note = " (another attempt of the shard published first)" if view.outcome == AttemptOutcome.BEATEN else ""
    if bar.kind == BACKUP:
        handed = "; the claim was handed to it" if view.promoted else ""
        return f"{note} (backup of attempt {view.backup_of}{handed})"
    return note + (f" ({bar.kind} of an earlier attempt)" if bar.kind else "")


def _bar_label(bar: Bar) -> str:
    """The shard number (and retry/takeover/backup) inside the bar, else beside it, else nothing."""
    number = _shard_number(bar.view.shard_id)
    light = " on-light" if bar.view.outcome in (AttemptOutcome.INTERRUPTED, AttemptOutcome.STALE) else ""
    y = bar.mid_y + 4
    width = bar.x1 - bar.x0
    for text in [f"{number} {bar.kind}", number] if bar.kind else [number]:
        if len(text) * CHAR_W + 8 <= width:
            return f'<text class="bar-text{light}" x="{bar.x0 + 4:.1f}" y="{y:.1f}">{esc(text)}</text>'
    if bar.kind and len(bar.kind) * CHAR_W + 6 <= bar.room_right:
        return f'<text class="bar-text outside" x="{bar.x1 + 3:.1f}" y="{y:.1f}">{esc(bar.kind)}</text>'
    return ""


def _bar_svg(bar: Bar, start: float, now: float) -> str:
    view = bar.view
    outcome = view.outcome if view.outcome in OUTCOMES else AttemptOutcome.FAILED
    kind = f' data-kind="{bar.kind}"' if bar.kind else ""
    return (
        f'<rect class="attempt outcome-{outcome}" x="{bar.x0:.1f}" y="{bar.y:.1f}" width="{bar.x1 - bar.x0:.1f}" '
        f'height="{ROW_H}" rx="3" data-shard="{esc(view.shard_id)}" data-attempt="{esc(view.attempt_id)}" '
        f'data-host="{esc(view.host)}" data-outcome="{esc(outcome)}" data-segment="{view.segment}"{kind}>'
        f"<title>{esc(_bar_title(bar, start, now))}</title></rect>{_setup_svg(bar)}{_backup_svg(bar)}{_bar_label(bar)}"
    )


def _backup_svg(bar: Bar) -> str:
    """A backup attempt's dashed outline, over its bar."""
    if bar.kind != BACKUP:
        return ""
    return (
        f'<rect class="backup-mark" x="{bar.x0 + 0.75:.1f}" y="{bar.y + 0.75:.1f}" width="{max(bar.x1 - bar.x0 - 1.5, 0.5):.1f}" '
        f'height="{ROW_H - 1.5}" rx="3"/>'
    )


def _setup_svg(bar: Bar) -> str:
    """The part of an attempt spent starting its node's runtime, hatched over the bar's start."""
    view = bar.view
    took = view.secs
    if not view.setup_secs or not took:
        return ""
    width = (bar.x1 - bar.x0) * min(1.0, view.setup_secs / took)
    if width < 1.0:
        return ""
    return f'<rect class="setup" x="{bar.x0:.1f}" y="{bar.y:.1f}" width="{width:.1f}" height="{ROW_H}" rx="3"/>'


def _unit_title(bar: UnitBar, start: float, now: float) -> str:
    unit = bar.unit
    took = unit.secs if unit.secs is not None else max(0.0, now - (unit.started_at or now))
    lines = [
        f"stage {unit.stage} · unit {unit.unit}",
        f"phase {unit.phase}" + (f", round {unit.round}" if unit.round is not None else "") + f" · {unit.outcome}",
        f"host {unit.host} · pid {unit.pid}",
        f"started +{fmt_secs((unit.started_at or start) - start)} ({iso(unit.started_at)}), "
        + (f"took {fmt_secs(took)}" if unit.ended_at is not None else f"held for {fmt_secs(took)}"),
    ]
    if unit.count is not None:
        what = "rows kept" if unit.phase == "keep" else "messages sent" if unit.phase == "components" else "records written"
        lines.append(f"{what}: {fmt_int(unit.count)}")
    return "\n".join(lines)


def _unit_svg(bar: UnitBar, start: float, now: float) -> str:
    unit = bar.unit
    fill = UNIT_FILL.get(unit.outcome, PHASE_COLOURS.get(unit.phase, "#57606a"))
    label = f"{PHASE_LETTER.get(unit.phase, '?')}{unit.index}"
    text = ""
    if len(label) * CHAR_W + 8 <= bar.x1 - bar.x0:
        light = " on-light" if unit.outcome == "stale" else ""
        text = f'<text class="bar-text{light}" x="{bar.x0 + 4:.1f}" y="{bar.y + ROW_H / 2 + 4:.1f}">{esc(label)}</text>'
    return (
        f'<rect class="unit phase-{esc(unit.phase)}" x="{bar.x0:.1f}" y="{bar.y:.1f}" width="{bar.x1 - bar.x0:.1f}" '
        f'height="{ROW_H}" rx="3" fill="{fill}" stroke="#fff" data-stage="{unit.stage}" data-unit="{esc(unit.unit)}" '
        f'data-host="{esc(unit.host)}" data-outcome="{esc(unit.outcome)}">'
        f"<title>{esc(_unit_title(bar, start, now))}</title></rect>{text}"
    )


def _handoff_svg(before: Bar, after: Bar) -> str:
    if after.kind == BACKUP:
        # From the original at the moment the backup started: the two overlap in time.
        x, y1, y2 = min(after.x0, before.x1), before.mid_y, after.mid_y
        y2 += -ROW_H / 2 if y2 > y1 else ROW_H / 2
        return (
            f'<path class="handoff backup" data-shard="{esc(after.view.shard_id)}" d="M{x:.1f},{y1:.1f} L{x:.1f},{y2:.1f}" '
            'marker-end="url(#arrow-backup)"/>'
        )
    x1, y1, x2, y2 = before.x1, before.mid_y, after.x0, after.mid_y
    bend = max(18.0, abs(x2 - x1) / 2)
    return (
        f'<path class="handoff {after.kind}" data-shard="{esc(after.view.shard_id)}" '
        f'd="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}" '
        f'marker-end="url(#arrow-{after.kind})"/>'
    )


def _axis_svg(timeline: Timeline, now: float, running: bool) -> list[str]:
    span = timeline.end - timeline.start
    step = tick_step(span)
    parts = [f'<line class="axis" x1="{LABEL_W}" y1="{AXIS_H - 4}" x2="{LABEL_W + PLOT_W}" y2="{AXIS_H - 4}"/>']
    count = int(span / step + 1e-9)
    for i in range(count + 1):
        x = timeline.x(timeline.start + i * step)
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{AXIS_H - 8}" x2="{x:.1f}" y2="{timeline.height - 6:.1f}"/>')
        anchor = "start" if i == 0 else "middle"
        label = _fmt_elapsed(i * step, fraction=step < 1)
        parts.append(f'<text class="tick" x="{x:.1f}" y="{AXIS_H - 12}" text-anchor="{anchor}">{label}</text>')
    if running:
        x = timeline.x(min(now, timeline.end))
        parts.append(f'<line class="now" x1="{x:.1f}" y1="{AXIS_H - 8}" x2="{x:.1f}" y2="{timeline.height - 6:.1f}"/>')
        parts.append(f'<text class="now-label" x="{x - 3:.1f}" y="{AXIS_H - 12}" text-anchor="end">now</text>')
    return parts


def _lane_svg(lane: Lane, index: int) -> list[str]:
    alt = " alt" if index % 2 else ""
    width = LABEL_W + PLOT_W + RIGHT_PAD
    host = lane.host if len(lane.host) <= LANE_LABEL_CHARS else lane.host[: LANE_LABEL_CHARS - 1] + "…"
    mid = lane.top + lane.height / 2
    count = len(lane.bars)
    sub = lane.sub or f"{count} attempt{'s' if count != 1 else ''}" + (f" · {lane.rows} overlapping" if lane.rows > 1 else "")
    return [
        f'<rect class="lane-bg{alt}" x="0" y="{lane.top:.1f}" width="{width}" height="{lane.height:.1f}"/>',
        f'<text class="lane-label" x="10" y="{mid - 2:.1f}">{esc(host)}<title>{esc(lane.tooltip or lane.host)}</title></text>',
        f'<text class="lane-sub" x="10" y="{mid + 12:.1f}">{esc(sub)}</text>',
    ]


SVG_DEFS = """<defs>
<pattern id="stale-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#e1e4e8"/><rect width="2.5" height="6" fill="#8c959f"/></pattern>
<pattern id="running-stripes" width="12" height="12" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="12" height="12" fill="#2f7de1"/><rect width="5" height="12" fill="#5b9bea"/>
<animateTransform attributeName="patternTransform" type="translate" additive="sum" from="0 0" to="12 0"
 dur="1.2s" repeatCount="indefinite"/></pattern>
<pattern id="setup-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="2.5" height="6" fill="#ffffff" fill-opacity="0.7"/></pattern>
<pattern id="unit-held" width="12" height="12" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="12" height="12" fill="#8250df"/><rect width="5" height="12" fill="#a475f9"/>
<animateTransform attributeName="patternTransform" type="translate" additive="sum" from="0 0" to="12 0"
 dur="1.2s" repeatCount="indefinite"/></pattern>
<marker id="arrow-retry" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0 L8,4 L0,8 z" fill="#57606a"/></marker>
<marker id="arrow-takeover" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0 L8,4 L0,8 z" fill="#bc4c00"/></marker>
<marker id="arrow-backup" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0 L8,4 L0,8 z" fill="#8250df"/></marker>
</defs>"""


def timeline_svg(
    attempts: list[AttemptView], now: float, units: list[UnitView] | None = None, stage_names: dict[int, str] | None = None
) -> str:
    """The SVG of every attempt, and of every deduplication unit whose start is known (`units`;
    `stage_names` names each stage's operator)."""
    units = [unit for unit in units or () if unit.started_at is not None]
    if not attempts and not units:
        return '<p class="none">No attempt has started yet.</p>'
    timeline, bars, unit_bars = lay_out(attempts, units, now, stage_names or {})
    running = any(view.ended_at is None for view in attempts) or any(unit.ended_at is None for unit in units)
    width = LABEL_W + PLOT_W + RIGHT_PAD
    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {timeline.height:.0f}" '
        f'width="{width}" height="{timeline.height:.0f}" role="img" aria-label="attempts per node over time">',
        SVG_DEFS,
    ]
    for index, lane in enumerate(timeline.lanes):
        parts += _lane_svg(lane, index)
    parts += _axis_svg(timeline, now, running)
    for index in range(len(attempts)):
        parts.append(_bar_svg(bars[index], timeline.start, now))
    parts += [_unit_svg(bar, timeline.start, now) for bar in unit_bars]
    for index in sorted(bars, key=lambda i: (attempts[i].started_at, attempts[i].attempt_id)):
        bar = bars[index]
        if bar.kind and bar.after is not None:
            parts.append(_handoff_svg(bars[bar.after], bar))
    parts.append("</svg>")
    return "\n".join(parts)


def legend(attempts: list[AttemptView], units: list[UnitView] | None = None) -> str:
    counts = {outcome: 0 for outcome in OUTCOMES}
    for view in attempts:
        counts[view.outcome] = counts.get(view.outcome, 0) + 1
    items = [f"<span>{_swatch(o)}{o} ({counts[o]})</span>" for o in OUTCOMES]
    if any(view.setup_secs for view in attempts):
        items.append('<span><i class="swatch sw-setup"></i>starting the node runtime</span>')
    items.append('<span><i class="sw-line"></i>retry (after a failure or hand-back)</span>')
    items.append('<span><i class="sw-line takeover"></i>takeover of a superseded/stale claim</span>')
    backups = sum(view.backup_of is not None for view in attempts)
    if backups:
        items.append(
            f'<span><i class="swatch sw-backup"></i>backup attempt of a straggler ({backups})</span>'
            '<span><i class="sw-line backup"></i>backup started</span>'
        )
    if units:
        phases = [phase for phase in PHASES if any(unit.phase == phase for unit in units)]
        items += [
            f'<span><i class="swatch" style="background:{PHASE_COLOURS[phase]}"></i>stage unit: {phase} '
            f"({sum(unit.phase == phase for unit in units)})</span>"
            for phase in phases
        ]
        if any(unit.outcome == "held" for unit in units):
            items.append('<span><i class="swatch" style="background:#a475f9"></i>stage unit held now</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _swatch(outcome: str) -> str:
    return f'<i class="swatch sw-{outcome}"></i>'


__all__ = ["legend", "timeline_svg"]
