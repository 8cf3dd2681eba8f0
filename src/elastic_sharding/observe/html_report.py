"""report: one self-contained HTML page with a job's timeline, per-node throughput and shards.

The page must open from a shared filesystem on a machine with no network, and it shows text
that workers wrote (hostnames, errors, paths), so everything is inline, every such string is
escaped, and a Content-Security-Policy lets only this module's own scripts (by hash) run.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from elastic_sharding import fsops
from elastic_sharding.destination import check_target, prepare_destination
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.snapshot import AttemptView
from elastic_sharding.observe.status import Status
from elastic_sharding.vocabulary import OUTCOMES, SHARD_STATES, AttemptOutcome

LABEL_W, PLOT_W, RIGHT_PAD, AXIS_H = 180, 1000, 24, 30
ROW_H, ROW_GAP, LANE_PAD, MIN_BAR_W = 20, 4, 8, 3.0
CHAR_W = 6.6  # average advance of the 11px bar font, to decide whether a label fits
TICK_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TICKS = 10
LANE_LABEL_CHARS = 21
TITLE_ERROR_CHARS = 400
TAKEOVER, RETRY = "takeover", "retry"
STATE_ORDER = SHARD_STATES

CSS = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg2:#f6f8fa;--ok:#2da44e;--bad:#cf222e;--sup:#e8871e;
--run:#2f7de1;--int:#c6ccd4;--stale:#8c959f}
*{box-sizing:border-box}
body{margin:0;padding:20px 28px 40px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,
"Noto Sans","DejaVu Sans",sans-serif;color:var(--fg);background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
h3{font-size:14px;margin:16px 0 6px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
pre{white-space:pre-wrap;word-break:break-word;margin:0}
.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:10px 0}
.meta dt{color:var(--muted)}.meta dd{margin:0;word-break:break-all}
.chips{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}
.chip{border:1px solid var(--line);border-radius:12px;padding:1px 10px;background:var(--bg2);font-size:13px}
.chip b{font-variant-numeric:tabular-nums}
.st-done{border-color:var(--ok)}.st-failed{border-color:var(--bad);color:var(--bad)}.st-running{border-color:var(--run)}
.st-stale{border-color:var(--stale)}
svg.progress{vertical-align:-1px}.progress-bg{fill:#e6e9ed}.progress-fill{fill:var(--ok)}
.legend{display:flex;flex-wrap:wrap;gap:14px;font-size:13px;color:var(--muted);margin:4px 0 8px}
.legend span{display:inline-flex;align-items:center;gap:5px}
.swatch{display:inline-block;width:14px;height:10px;border-radius:2px}
.sw-succeeded{background:var(--ok)}.sw-failed{background:var(--bad)}.sw-superseded{background:var(--sup)}
.sw-interrupted{background:var(--int)}.sw-running{background:var(--run)}
.sw-stale{background:repeating-linear-gradient(135deg,#8c959f 0 2px,#e1e4e8 2px 5px)}
.sw-setup{background:repeating-linear-gradient(135deg,rgba(255,255,255,.75) 0 2px,var(--ok) 2px 5px)}
rect.setup{fill:url(#setup-hatch);pointer-events:none}
.sw-line{display:inline-block;width:22px;border-top:2px dashed #57606a}
.sw-line.takeover{border-top-color:var(--sup)}
.scroll{overflow-x:auto;border:1px solid var(--line);border-radius:6px}
svg.timeline{display:block;width:100%;min-width:900px;height:auto;font-size:11px}
.lane-bg{fill:#fff}.lane-bg.alt{fill:var(--bg2)}
.lane-label{fill:var(--fg);font-size:12px;font-weight:600}.lane-sub{fill:var(--muted);font-size:10.5px}
.grid{stroke:#e4e7eb;stroke-width:1}.tick{fill:var(--muted);font-size:10.5px}
.axis{stroke:var(--line)}.now{stroke:var(--run);stroke-dasharray:3 3}.now-label{fill:var(--run);font-size:10.5px}
rect.attempt{stroke:#fff;stroke-width:1;cursor:default;transition:opacity .1s}
.outcome-succeeded{fill:var(--ok)}.outcome-failed{fill:var(--bad)}.outcome-superseded{fill:var(--sup)}
.outcome-interrupted{fill:var(--int)}.outcome-running{fill:url(#running-stripes)}.outcome-stale{fill:url(#stale-hatch)}
.bar-text{fill:#fff;font-size:11px;pointer-events:none;font-variant-numeric:tabular-nums}
.bar-text.on-light,.bar-text.outside{fill:#24292f}
.handoff{fill:none;stroke:#57606a;stroke-width:1.3;stroke-dasharray:4 3;pointer-events:none}
.handoff.takeover{stroke:#bc4c00}
svg.focus rect.attempt:not(.hl){opacity:.25}
rect.attempt.hl{stroke:#24292f;stroke-width:2}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--bg2);position:sticky;top:0;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[aria-sort=ascending]::after{content:" \\25B2";font-size:9px}
table.sortable th[aria-sort=descending]::after{content:" \\25BC";font-size:9px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.nowrap{white-space:nowrap}
tr.hl td{background:#fff8c5}
.state-failed{color:var(--bad);font-weight:600}.state-done{color:#1a7f37}.state-running{color:var(--run)}
.state-stale{color:var(--muted);font-style:italic}
.flag{color:var(--bad);font-weight:600}
.none{color:var(--muted)}
.err{max-width:520px}
"""

ONERROR_JS = (
    "window.onerror=function(m,s,l,c){var d=document.documentElement.dataset;"
    "d.errors=(d.errors?d.errors+'\\n':'')+m+' (line '+l+')';};"
)

MAIN_JS = """(function(){
var root=document.documentElement;
var data=JSON.parse(document.getElementById('job-data').textContent);
function key(cell){var v=cell.getAttribute('data-sort');if(v===null)v=cell.textContent.trim();
if(v===''||v==='\\u2013')return [2,''];return /^-?\\d+(\\.\\d+)?(e[-+]?\\d+)?$/i.test(v)?[0,parseFloat(v)]:[1,v.toLowerCase()];}
function sortBy(th){var table=th.closest('table'),col=th.cellIndex,body=table.tBodies[0];
var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
table.querySelectorAll('th').forEach(function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',dir>0?'ascending':'descending');
Array.from(body.rows).map(function(r,i){return [key(r.cells[col]),i,r];}).sort(function(a,b){
var x=a[0],y=b[0];if(x[0]!==y[0])return x[0]-y[0];if(x[1]<y[1])return -dir;if(x[1]>y[1])return dir;return a[1]-b[1];
}).forEach(function(e){body.appendChild(e[2]);});}
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){sortBy(th);});});
var svg=document.querySelector('svg.timeline'),marked=document.querySelectorAll('[data-shard]');
function mark(shard){marked.forEach(function(el){el.classList.toggle('hl',shard!==null&&el.getAttribute('data-shard')===shard);});
if(svg)svg.classList.toggle('focus',shard!==null);}
marked.forEach(function(el){el.addEventListener('mouseenter',function(){mark(el.getAttribute('data-shard'));});
el.addEventListener('mouseleave',function(){mark(null);});});
var bars=document.querySelectorAll('rect.attempt').length;
if(bars!==data.attempts.length)throw new Error('timeline has '+bars+' bars for '+data.attempts.length+' attempts');
root.dataset.rendered='ok';
})();"""


def _sha256_source(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src {_sha256_source(ONERROR_JS)} {_sha256_source(MAIN_JS)}; base-uri 'none'; form-action 'none'"
)


# -- formatting ------------------------------------------------------------------------------


def _e(value: object) -> str:
    """Escaped text for element content and quoted attributes; None shows as nothing."""
    return "" if value is None else html.escape(str(value), quote=True)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _fmt_int(value: object) -> str:
    number = _num(value)
    return "–" if number is None else f"{int(number):,}"


def _fmt_bytes(value: object) -> str:
    number = _num(value)
    if number is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(number) < 1024 or unit == "TiB":
            return f"{number:.0f} {unit}" if unit == "B" else f"{number:.1f} {unit}"
        number /= 1024
    return "–"


def _fmt_rate(value: object, unit: str) -> str:
    number = _num(value)
    if number is None:
        return "–"
    return _fmt_bytes(number) + "/s" if unit == "bytes" else f"{number:,.1f} rows/s"


def _fmt_secs(value: object) -> str:
    secs = _num(value)
    if secs is None:
        return "–"
    if secs < 60:
        return f"{secs:.1f}s" if secs < 10 else f"{secs:.0f}s"
    secs = int(secs)
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def _fmt_elapsed(secs: float, fraction: bool = False) -> str:
    """m:ss (h:mm:ss past an hour) for axis ticks; tenths when ticks are closer than a second."""
    whole = int(secs)
    text = f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}" if whole >= 3600 else f"{whole // 60}:{whole % 60:02d}"
    return f"{text}.{int(round((secs - whole) * 10)) % 10}" if fraction else text


def _iso(epoch: object) -> str:
    number = _num(epoch)
    if number is None:
        return "–"
    return datetime.fromtimestamp(number, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _shard_number(shard_id: str) -> str:
    match = re.match(r"part-0*(\d+)", shard_id) or re.search(r"(\d+)", shard_id)
    return match.group(1) if match else shard_id[:8]


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


# -- timeline geometry -------------------------------------------------------------------------


@dataclass
class _Bar:
    view: AttemptView
    x0: float
    x1: float
    kind: str | None = None  # retry | takeover for attempts after a shard's first
    row: int = 0
    y: float = 0.0
    room_right: float = float("inf")

    @property
    def mid_y(self) -> float:
        return self.y + ROW_H / 2


@dataclass
class _Lane:
    host: str
    bars: list[_Bar]
    rows: int
    top: float
    height: float


@dataclass
class _Timeline:
    start: float
    end: float
    lanes: list[_Lane]
    height: float

    def x(self, at: float) -> float:
        return LABEL_W + (at - self.start) / max(self.end - self.start, 1e-9) * PLOT_W


def _attempt_end(view: AttemptView, now: float) -> float:
    return view.ended_at if view.ended_at is not None else max(now, view.started_at)


def _handoff_kinds(attempts: list[AttemptView]) -> dict[int, str]:
    """For each attempt after its shard's first (by index): how it followed the previous one."""
    previous: dict[str, AttemptView] = {}
    kinds: dict[int, str] = {}
    for index, view in sorted(enumerate(attempts), key=lambda item: (item[1].started_at, item[1].attempt_id)):
        before = previous.get(view.shard_id)
        if before is not None:
            kinds[index] = TAKEOVER if before.outcome in (AttemptOutcome.SUPERSEDED, AttemptOutcome.STALE) else RETRY
        previous[view.shard_id] = view
    return kinds


def _pack(bars: list[_Bar]) -> int:
    """Greedy interval packing: each bar goes to the first sub-row free at its start."""
    row_ends: list[float] = []
    for bar in sorted(bars, key=lambda b: (b.x0, b.x1, b.view.shard_id, b.view.attempt_id)):
        bar.row = next((row for row, end in enumerate(row_ends) if bar.x0 >= end - 0.5), len(row_ends))
        if bar.row == len(row_ends):
            row_ends.append(bar.x1)
        row_ends[bar.row] = bar.x1
    return max(1, len(row_ends))


def _layout(attempts: list[AttemptView], now: float) -> tuple[_Timeline, dict[int, _Bar]]:
    start = min(view.started_at for view in attempts)
    end = max(_attempt_end(view, now) for view in attempts)
    timeline = _Timeline(start, max(end, start + 1e-3), [], 0.0)
    kinds = _handoff_kinds(attempts)
    by_index: dict[int, _Bar] = {}
    by_host: dict[str, list[_Bar]] = {}
    for index, view in enumerate(attempts):
        x0 = timeline.x(view.started_at)
        bar = _Bar(view, x0, max(timeline.x(_attempt_end(view, now)), x0 + MIN_BAR_W), kinds.get(index))
        by_index[index] = bar
        by_host.setdefault(view.host, []).append(bar)
    top = float(AXIS_H)
    for host in sorted(by_host):
        bars = by_host[host]
        rows = _pack(bars)
        height = 2 * LANE_PAD + rows * ROW_H + (rows - 1) * ROW_GAP
        for bar in bars:
            bar.y = top + LANE_PAD + bar.row * (ROW_H + ROW_GAP)
        _set_room(bars)
        timeline.lanes.append(_Lane(host, bars, rows, top, height))
        top += height
    timeline.height = top + 6
    return timeline, by_index


def _set_room(bars: list[_Bar]) -> None:
    """Free space to the right of each bar in its sub-row, where a label that does not fit may go."""
    rows: dict[int, list[_Bar]] = {}
    for bar in bars:
        rows.setdefault(bar.row, []).append(bar)
    for row in rows.values():
        row.sort(key=lambda b: b.x0)
        for bar, following in zip(row, row[1:]):
            bar.room_right = following.x0 - bar.x1
        row[-1].room_right = LABEL_W + PLOT_W + RIGHT_PAD - row[-1].x1


def _tick_step(span: float) -> float:
    for step in TICK_STEPS:
        if span / step <= MAX_TICKS:
            return step
    return span / MAX_TICKS


# -- timeline SVG ----------------------------------------------------------------------------


def _bar_title(bar: _Bar, start: float, now: float) -> str:
    view = bar.view
    took = view.secs if view.secs is not None else max(0.0, now - view.started_at)
    lines = [
        f"{view.shard_id} · attempt {view.attempt_id}",
        f"host {view.host} · pid {view.pid} · runner {view.runner}",
        f"outcome: {view.outcome}" + (f" ({bar.kind} of an earlier attempt)" if bar.kind else ""),
        f"started +{_fmt_secs(view.started_at - start)} ({_iso(view.started_at)}), "
        + (f"took {_fmt_secs(took)}" if view.ended_at is not None else f"running for {_fmt_secs(took)}"),
        f"rows {_fmt_int(view.input_rows)} in → {_fmt_int(view.output_rows)} out · {_fmt_bytes(view.input_bytes)}",
    ]
    if view.setup_secs:
        lines.append(f"runtime start-up: {_fmt_secs(view.setup_secs)} of it")
    if view.phase:
        lines.append(f"phase: {view.phase}" + (f" (expected ~{_fmt_secs(view.expected_secs)})" if view.expected_secs else ""))
    if view.error:
        error = view.error if len(view.error) <= TITLE_ERROR_CHARS else view.error[:TITLE_ERROR_CHARS] + "…"
        lines.append(f"error: {error}")
    if view.archive:
        lines.append(f"archived by retry {view.archive}")
    lines.append(f"log: {view.log}")
    return "\n".join(lines)


def _bar_label(bar: _Bar) -> str:
    """The shard number (and retry/takeover) inside the bar, else beside it, else nothing."""
    number = _shard_number(bar.view.shard_id)
    light = " on-light" if bar.view.outcome in (AttemptOutcome.INTERRUPTED, AttemptOutcome.STALE) else ""
    y = bar.mid_y + 4
    width = bar.x1 - bar.x0
    for text in [f"{number} {bar.kind}", number] if bar.kind else [number]:
        if len(text) * CHAR_W + 8 <= width:
            return f'<text class="bar-text{light}" x="{bar.x0 + 4:.1f}" y="{y:.1f}">{_e(text)}</text>'
    if bar.kind and len(bar.kind) * CHAR_W + 6 <= bar.room_right:
        return f'<text class="bar-text outside" x="{bar.x1 + 3:.1f}" y="{y:.1f}">{_e(bar.kind)}</text>'
    return ""


def _bar_svg(bar: _Bar, start: float, now: float) -> str:
    view = bar.view
    outcome = view.outcome if view.outcome in OUTCOMES else AttemptOutcome.FAILED
    kind = f' data-kind="{bar.kind}"' if bar.kind else ""
    return (
        f'<rect class="attempt outcome-{outcome}" x="{bar.x0:.1f}" y="{bar.y:.1f}" width="{bar.x1 - bar.x0:.1f}" '
        f'height="{ROW_H}" rx="3" data-shard="{_e(view.shard_id)}" data-attempt="{_e(view.attempt_id)}" '
        f'data-host="{_e(view.host)}" data-outcome="{_e(outcome)}"{kind}>'
        f"<title>{_e(_bar_title(bar, start, now))}</title></rect>{_setup_svg(bar)}{_bar_label(bar)}"
    )


def _setup_svg(bar: _Bar) -> str:
    """The part of an attempt spent starting its node's runtime, hatched over the bar's start."""
    view = bar.view
    took = view.secs
    if not view.setup_secs or not took:
        return ""
    width = (bar.x1 - bar.x0) * min(1.0, view.setup_secs / took)
    if width < 1.0:
        return ""
    return f'<rect class="setup" x="{bar.x0:.1f}" y="{bar.y:.1f}" width="{width:.1f}" height="{ROW_H}" rx="3"/>'


def _handoff_svg(before: _Bar, after: _Bar) -> str:
    x1, y1, x2, y2 = before.x1, before.mid_y, after.x0, after.mid_y
    bend = max(18.0, abs(x2 - x1) / 2)
    return (
        f'<path class="handoff {after.kind}" data-shard="{_e(after.view.shard_id)}" '
        f'd="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}" '
        f'marker-end="url(#arrow-{after.kind})"/>'
    )


def _axis_svg(timeline: _Timeline, now: float, running: bool) -> list[str]:
    span = timeline.end - timeline.start
    step = _tick_step(span)
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


def _lane_svg(lane: _Lane, index: int) -> list[str]:
    alt = " alt" if index % 2 else ""
    width = LABEL_W + PLOT_W + RIGHT_PAD
    host = lane.host if len(lane.host) <= LANE_LABEL_CHARS else lane.host[: LANE_LABEL_CHARS - 1] + "…"
    mid = lane.top + lane.height / 2
    count = len(lane.bars)
    sub = f"{count} attempt{'s' if count != 1 else ''}" + (f" · {lane.rows} overlapping" if lane.rows > 1 else "")
    return [
        f'<rect class="lane-bg{alt}" x="0" y="{lane.top:.1f}" width="{width}" height="{lane.height:.1f}"/>',
        f'<text class="lane-label" x="10" y="{mid - 2:.1f}">{_e(host)}<title>{_e(lane.host)}</title></text>',
        f'<text class="lane-sub" x="10" y="{mid + 12:.1f}">{_e(sub)}</text>',
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
<marker id="arrow-retry" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0 L8,4 L0,8 z" fill="#57606a"/></marker>
<marker id="arrow-takeover" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto">
<path d="M0,0 L8,4 L0,8 z" fill="#bc4c00"/></marker>
</defs>"""


def _timeline_svg(attempts: list[AttemptView], now: float) -> str:
    if not attempts:
        return '<p class="none">No attempt has started yet.</p>'
    timeline, bars = _layout(attempts, now)
    running = any(view.ended_at is None for view in attempts)
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
    previous: dict[str, _Bar] = {}
    for index in sorted(bars, key=lambda i: (attempts[i].started_at, attempts[i].attempt_id)):
        bar = bars[index]
        if bar.kind and bar.view.shard_id in previous:
            parts.append(_handoff_svg(previous[bar.view.shard_id], bar))
        previous[bar.view.shard_id] = bar
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(attempts: list[AttemptView]) -> str:
    counts = {outcome: 0 for outcome in OUTCOMES}
    for view in attempts:
        counts[view.outcome] = counts.get(view.outcome, 0) + 1
    items = [f'<span><i class="swatch sw-{o}"></i>{o} ({counts[o]})</span>' for o in OUTCOMES]
    if any(view.setup_secs for view in attempts):
        items.append('<span><i class="swatch sw-setup"></i>starting the node runtime</span>')
    items.append('<span><i class="sw-line"></i>retry (after a failure or hand-back)</span>')
    items.append('<span><i class="sw-line takeover"></i>takeover of a superseded/stale claim</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


# -- tables ----------------------------------------------------------------------------------


def _cell(text: str, sort: object = None, cls: str = "") -> str:
    sort_attr = f' data-sort="{_e(sort)}"' if sort is not None else ""
    cls_attr = f' class="{cls}"' if cls else ""
    return f"<td{cls_attr}{sort_attr}>{text}</td>"


def _num_cell(value: object, text: str) -> str:
    number = _num(value)
    return _cell(text, "" if number is None else repr(number), "num")


HEADER_TITLES = {
    "Attempts": "attempts counted by status",
    "Recorded": "attempt directories found, those archived by retry included (bars on the timeline)",
    "Took": "processing time of the attempt that completed the shard",
}


def _header_title(name: str) -> str:
    return f' title="{_e(HEADER_TITLES[name])}"' if name in HEADER_TITLES else ""


def _table(headers: Iterable[tuple[str, bool]], rows: list[str], sortable: bool = False) -> str:
    if not rows:
        return '<p class="none">None.</p>'
    head = "".join(f"<th{' class=num' if numeric else ''}{_header_title(name)}>{_e(name)}</th>" for name, numeric in headers)
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _running_text(item: dict[str, Any]) -> str:
    parts = [f"<code>{_e(item.get('shard_id'))}</code>"]
    detail = [str(item["phase"])] if item.get("phase") else []
    age, expected = _num(item.get("age_secs")), _num(item.get("expected_secs"))
    if age is not None:
        detail.append(f"{_fmt_secs(age)}" + (f" of ~{_fmt_secs(expected)}" if expected else ""))
    fraction = _num(item.get("est_fraction"))
    if fraction is not None:
        detail.append(f"~{fraction * 100:.0f}%")
    if detail:
        parts.append(f"({_e(', '.join(detail))})")
    if item.get("straggler"):
        parts.append('<span class="flag">straggler</span>')
    return " ".join(parts)


def _warm_text(item: dict[str, Any]) -> str:
    """A node's warm operator: instances, model loads, and the share of time all were busy."""
    fraction = _num(item.get("all_busy_fraction"))
    busy = "–" if fraction is None else f"{fraction * 100:.0f}%"
    deaths = f", {_fmt_int(item.get('deaths'))} replaced" if _num(item.get("deaths")) else ""
    return (
        f"<code>{_e(item.get('op'))}</code> {_fmt_int(item.get('instances'))} instance(s), "
        f"{_fmt_int(item.get('loads'))} load(s){_e(deaths)}, all busy {busy}"
    )


def _nodes_table(nodes: list[dict[str, Any]]) -> str:
    headers = [
        ("Host", False),
        ("Workers", True),
        ("Shards done", True),
        ("Rows done", True),
        ("Bytes done", True),
        ("Rows/s", True),
        ("Bytes/s", True),
        ("Failures", True),
        ("Running now", False),
        ("Warm operators", False),
    ]
    rows = []
    none = '<span class="none">–</span>'
    for node in sorted(nodes, key=lambda n: str(n.get("host"))):
        running = "<br>".join(_running_text(item) for item in _list(node.get("running"))) or none
        warm = "<br>".join(_warm_text(item) for item in _list(node.get("warm_operators"))) or none
        rows.append(
            "<tr>"
            + _cell(_e(node.get("host")), cls="mono nowrap")
            + _num_cell(node.get("active_workers"), _fmt_int(node.get("active_workers")))
            + _num_cell(node.get("shards_done"), _fmt_int(node.get("shards_done")))
            + _num_cell(node.get("rows_done"), _fmt_int(node.get("rows_done")))
            + _num_cell(node.get("bytes_done"), _fmt_bytes(node.get("bytes_done")))
            + _num_cell(node.get("rows_per_sec"), _fmt_rate(node.get("rows_per_sec"), "rows"))
            + _num_cell(node.get("bytes_per_sec"), _fmt_rate(node.get("bytes_per_sec"), "bytes"))
            + _num_cell(node.get("failures"), _fmt_int(node.get("failures")))
            + _cell(running)
            + _cell(warm)
            + "</tr>"
        )
    return _table(headers, rows, sortable=True)


def _shards_table(shards: list[dict[str, Any]], attempts: list[AttemptView]) -> str:
    recorded: dict[str, int] = {}
    for view in attempts:
        recorded[view.shard_id] = recorded.get(view.shard_id, 0) + 1
    headers = [
        ("Shard", False),
        ("State", False),
        ("Rows in", True),
        ("Bytes in", True),
        ("Rows out", True),
        ("Host", False),
        ("Attempt", False),
        ("Attempts", True),
        ("Recorded", True),
        ("Failures", True),
        ("Took", True),
        ("Last error", False),
    ]
    rows = []
    for index, shard in enumerate(shards):
        shard_id = str(shard.get("shard_id"))
        state = str(shard.get("state"))
        state_cls = f"state-{state}" if state in STATE_ORDER else ""
        sort_state = STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER)
        rows.append(
            f'<tr data-shard="{_e(shard_id)}">'
            + _cell(f"<code>{_e(shard_id)}</code>", index, "nowrap")
            + _cell(_e(state), sort_state, state_cls)
            + _num_cell(shard.get("input_rows"), _fmt_int(shard.get("input_rows")))
            + _num_cell(shard.get("input_bytes"), _fmt_bytes(shard.get("input_bytes")))
            + _num_cell(shard.get("output_rows"), _fmt_int(shard.get("output_rows")))
            + _cell(_e(shard.get("host")), cls="mono nowrap")
            + _cell(_e(shard.get("attempt_id")), cls="mono")
            + _num_cell(shard.get("attempts"), _fmt_int(shard.get("attempts")))
            + _num_cell(recorded.get(shard_id, 0), _fmt_int(recorded.get(shard_id, 0)))
            + _num_cell(shard.get("failures"), _fmt_int(shard.get("failures")))
            + _num_cell(shard.get("secs"), _fmt_secs(shard.get("secs")))
            + _cell(f"<pre>{_e(shard.get('last_error'))}</pre>" if shard.get("last_error") else "", cls="err")
            + "</tr>"
        )
    return _table(headers, rows, sortable=True)


def _failures_table(failures: list[dict[str, Any]]) -> str:
    headers = [("Shard", False), ("State", False), ("Failures", True), ("Last error", False), ("Log", False)]
    rows = [
        f'<tr data-shard="{_e(item.get("shard_id"))}">'
        + _cell(f"<code>{_e(item.get('shard_id'))}</code>", cls="nowrap")
        + _cell(_e(item.get("state")))
        + _num_cell(item.get("failures"), _fmt_int(item.get("failures")))
        + _cell(f"<pre>{_e(item.get('error'))}</pre>", cls="err")
        + _cell(f"<code>{_e(item.get('log'))}</code>")
        + "</tr>"
        for item in failures
    ]
    return _table(headers, rows)


def _stragglers_table(stragglers: list[dict[str, Any]]) -> str:
    headers = [("Shard", False), ("Host", False), ("Attempt", False), ("Running for", True), ("Expected", True), ("Factor", True)]
    rows = [
        f'<tr data-shard="{_e(item.get("shard_id"))}">'
        + _cell(f"<code>{_e(item.get('shard_id'))}</code>", cls="nowrap")
        + _cell(_e(item.get("host")), cls="mono nowrap")
        + _cell(_e(item.get("attempt_id")), cls="mono")
        + _num_cell(item.get("age_secs"), _fmt_secs(item.get("age_secs")))
        + _num_cell(item.get("expected_secs"), _fmt_secs(item.get("expected_secs")))
        + _num_cell(item.get("factor"), "–" if _num(item.get("factor")) is None else f"{_num(item.get('factor')):.1f}×")
        + "</tr>"
        for item in stragglers
    ]
    return _table(headers, rows)


def _stale_table(stale: list[dict[str, Any]]) -> str:
    headers = [("Shard", False), ("Host", False), ("PID", True), ("Attempt", False), ("No heartbeat for", True)]
    rows = [
        f'<tr data-shard="{_e(item.get("shard_id"))}">'
        + _cell(f"<code>{_e(item.get('shard_id'))}</code>", cls="nowrap")
        + _cell(_e(item.get("host")), cls="mono nowrap")
        + _num_cell(item.get("pid"), _e(item.get("pid")))
        + _cell(_e(item.get("attempt_id")), cls="mono")
        + _num_cell(item.get("heartbeat_age_secs"), _fmt_secs(item.get("heartbeat_age_secs")))
        + "</tr>"
        for item in stale
    ]
    return _table(headers, rows)


# -- header ----------------------------------------------------------------------------------


def _progress(status: dict[str, Any]) -> tuple[float | None, str]:
    progress = _dict(status.get("progress"))
    percent = _num(progress.get("percent"))
    rows_done = progress.get("rows_done", status.get("rows_done"))
    rows_total = progress.get("rows_total", status.get("rows_total"))
    if percent is None and _num(rows_total):
        percent = 100.0 * (_num(rows_done) or 0.0) / float(rows_total)
    shards = f"{_fmt_int(progress.get('shards_done', _dict(status.get('counts')).get('done')))}"
    shards += f"/{_fmt_int(progress.get('shards_total', status.get('shards_total')))} shards"
    detail = f"{shards}, {_fmt_int(rows_done)}/{_fmt_int(rows_total)} rows"
    if _num(progress.get("bytes_total")):
        detail += f", {_fmt_bytes(progress.get('bytes_done'))}/{_fmt_bytes(progress.get('bytes_total'))}"
    return percent, detail


def _progress_bar(percent: float) -> str:
    width = 320 * min(max(percent, 0.0), 100.0) / 100
    return (
        '<svg class="progress" width="320" height="12" role="img" aria-label="progress">'
        f'<rect class="progress-bg" width="320" height="12" rx="6"/><rect class="progress-fill" width="{width:.1f}" height="12" rx="6"/>'
        "</svg>"
    )


def _eta(status: dict[str, Any]) -> str:
    eta = _dict(status.get("eta"))
    if _num(eta.get("secs")) is None:
        return "–"
    text = f"{_fmt_secs(eta.get('secs'))} (at {_iso(eta.get('at'))})" if _num(eta.get("at")) else _fmt_secs(eta.get("secs"))
    return _e(text + (f", from {eta['basis']}" if eta.get("basis") else ""))


def _throughput(throughput: dict[str, Any]) -> str:
    now = [_fmt_rate(throughput.get(key), unit) for key, unit in (("rows_per_sec", "rows"), ("bytes_per_sec", "bytes"))]
    text = ", ".join(rate for rate in now if rate != "–") or "idle"
    if _num(throughput.get("active_workers")) is not None:
        text += f" ({_fmt_int(throughput.get('active_workers'))} active worker(s))"
    if _num(throughput.get("overall_rows_per_sec")) is not None:
        text += f"; overall {_fmt_rate(throughput.get('overall_rows_per_sec'), 'rows')}"
    return text


def _header(status: dict[str, Any], attempts: list[AttemptView], now: float) -> str:
    percent, detail = _progress(status)
    bar = f"{_progress_bar(percent)} <b>{percent:.1f}%</b> · " if percent is not None else ""
    rate = _throughput(_dict(status.get("throughput")))
    counts = _dict(status.get("counts"))
    chips = "".join(
        f'<span class="chip st-{_e(state)}">{_e(state)} <b>{_fmt_int(counts[state])}</b></span>'
        for state in sorted(counts, key=lambda s: (STATE_ORDER.index(s) if s in STATE_ORDER else 99, str(s)))
    )
    hosts = sorted({view.host for view in attempts})
    items = [
        ("Job directory", f"<code>{_e(status.get('job_dir'))}</code>"),
        ("Job id", f"<code>{_e(status.get('job_id'))}</code>"),
        ("Generated", f"{_e(_iso(now))} (status read {_e(_iso(status.get('generated_at')))})"),
        ("Progress", bar + _e(detail)),
        ("Elapsed", _e(_fmt_secs(status.get("elapsed_secs")))),
        ("Throughput", _e(rate)),
        ("ETA", _eta(status)),
        ("Attempts", f"{len(attempts)} on {len(hosts)} node(s)"),
    ]
    meta = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in items)
    return f'<header><h1>Job report</h1><dl class="meta">{meta}</dl><div class="chips">{chips}</div></header>'


# -- page ------------------------------------------------------------------------------------


def _json_for_script(status: dict[str, Any], attempts: list[AttemptView]) -> str:
    """The data as JSON that cannot end the <script> element it sits in (every `<` escaped)."""
    payload = {"status": status, "attempts": [dataclasses.asdict(view) for view in attempts]}
    text = orjson.dumps(payload, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    return text.replace("<", "\\u003c")


def render_report(status: dict[str, Any], attempts: list[AttemptView], now: float) -> str:
    """The whole report page; the same inputs always give the same bytes."""
    title = f"Job report {status.get('job_id') or ''}".strip()
    sections = [
        _header(status, attempts, now),
        "<section><h2>Timeline</h2>" + _legend(attempts),
        f'<div class="scroll">{_timeline_svg(attempts, now)}</div></section>',
        f"<section><h2>Nodes</h2>{_nodes_table(_list(status.get('nodes')))}</section>",
        f"<section><h2>Shards</h2>{_shards_table(_list(status.get('shards')), attempts)}</section>",
        "<section><h2>Problems</h2>",
        f"<h3>Failed shards</h3>{_failures_table(_list(status.get('failures')))}",
        f"<h3>Stragglers</h3>{_stragglers_table(_list(status.get('stragglers')))}",
        f"<h3>Stale claims</h3>{_stale_table(_list(status.get('stale_claims')))}</section>",
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)}</title>",
            f"<style>{CSS}</style>",
            f"<script>{ONERROR_JS}</script>",
            "</head><body>",
            *sections,
            f'<script type="application/json" id="job-data">{_json_for_script(status, attempts)}</script>',
            f"<script>{MAIN_JS}</script>",
            "</body></html>",
            "",
        ]
    )


def write_report(job_dir: Path, output: Path, lock_timeout: float | None = None) -> int:
    """Render the job's report to `output` (replaced atomically); returns the number of attempt bars."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    output = check_target(output, layout)
    status = Status(layout.root, lock_timeout)
    page = render_report(status.as_json(), status.attempts, status.at)
    destination = prepare_destination(output)
    try:
        with fsops.atomic_output(output) as out:
            out.write(page.encode())
            out.commit()
    except BaseException:
        destination.discard()
        raise
    return len(status.attempts)


__all__ = ["render_report", "write_report"]
