"""Where every bar of the report's timeline goes: the time scale, a lane per node and per
deduplication stage, sub-rows for bars that overlap, and which earlier attempt each retry,
takeover or backup follows.

Its own module because placing is arithmetic on attempts and units, done once before any SVG is
written: `html_timeline` only draws what this decided (a bar's box, its lane and sub-row, the
room beside it for a label that does not fit inside).
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_sharding.observe.snapshot import AttemptView
from elastic_sharding.observe.stages import UnitView
from elastic_sharding.vocabulary import AttemptOutcome

LABEL_W, PLOT_W, RIGHT_PAD, AXIS_H = 180, 1000, 24, 30
ROW_H, ROW_GAP, LANE_PAD, MIN_BAR_W = 20, 4, 8, 3.0
TICK_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TICKS = 10
TAKEOVER, RETRY, BACKUP = "takeover", "retry", "backup"


@dataclass
class Bar:
    """An attempt's box on its node's lane."""

    view: AttemptView
    x0: float
    x1: float
    kind: str | None = None  # retry | takeover | backup for attempts after a shard's first
    after: int | None = None  # the index of the attempt it follows (a backup: its original)
    row: int = 0
    y: float = 0.0
    room_right: float = float("inf")

    @property
    def mid_y(self) -> float:
        return self.y + ROW_H / 2

    @property
    def order(self) -> tuple:
        return (self.x0, self.x1, self.view.segment, self.view.shard_id, self.view.attempt_id)


@dataclass
class UnitBar:
    """A deduplication unit's box on its stage's lane."""

    unit: UnitView
    x0: float
    x1: float
    row: int = 0
    y: float = 0.0
    room_right: float = float("inf")

    @property
    def order(self) -> tuple:
        return (self.x0, self.x1, self.unit.unit)


@dataclass
class Lane:
    """A node's or a stage's band of the timeline, with its sub-rows."""

    host: str  # the lane's label: a host, or "stage k"
    bars: list[Bar] | list[UnitBar]
    rows: int
    top: float
    height: float
    sub: str = ""
    tooltip: str = ""  # the label's title, when not the label itself


@dataclass
class Timeline:
    """The time scale (`x`) and the lanes, top to bottom."""

    start: float
    end: float
    lanes: list[Lane]
    height: float

    def x(self, at: float) -> float:
        return LABEL_W + (at - self.start) / max(self.end - self.start, 1e-9) * PLOT_W


def _attempt_end(view: AttemptView, now: float) -> float:
    return view.ended_at if view.ended_at is not None else max(now, view.started_at)


def _handoffs(attempts: list[AttemptView]) -> dict[int, tuple[str, int | None]]:
    """For each attempt after its shard's first in its segment (by index): how it followed which one.

    A backup follows its original, and the claim's next attempt follows the original too, unless
    the claim was handed to the backup (`promoted`)."""
    previous: dict[tuple[int, str], int] = {}
    originals = {(view.segment, view.shard_id, view.attempt_id): index for index, view in enumerate(attempts)}
    handoffs: dict[int, tuple[str, int | None]] = {}
    for index, view in sorted(enumerate(attempts), key=lambda item: (item[1].started_at, item[1].attempt_id)):
        key = (view.segment, view.shard_id)
        if view.backup_of is not None:
            handoffs[index] = (BACKUP, originals.get((*key, view.backup_of)))
            if not view.promoted:
                continue
        elif key in previous:
            before = attempts[previous[key]]
            kind = TAKEOVER if before.outcome in (AttemptOutcome.SUPERSEDED, AttemptOutcome.STALE) else RETRY
            handoffs[index] = (kind, previous[key])
        previous[key] = index
    return handoffs


def _unit_span(unit: UnitView, now: float) -> tuple[float, float] | None:
    """A unit's start and end (now while it is held); None when its times are unknown."""
    if unit.started_at is None:
        return None
    return unit.started_at, unit.ended_at if unit.ended_at is not None else max(now, unit.started_at)


def _pack(bars: list[Bar] | list[UnitBar]) -> int:
    """Greedy interval packing: each bar goes to the first sub-row free at its start."""
    row_ends: list[float] = []
    for bar in sorted(bars, key=lambda b: b.order):
        bar.row = next((row for row, end in enumerate(row_ends) if bar.x0 >= end - 0.5), len(row_ends))
        if bar.row == len(row_ends):
            row_ends.append(bar.x1)
        row_ends[bar.row] = bar.x1
    return max(1, len(row_ends))


def lay_out(
    attempts: list[AttemptView], units: list[UnitView], now: float, stage_names: dict[int, str]
) -> tuple[Timeline, dict[int, Bar], list[UnitBar]]:
    """The timeline of `attempts` and `units`: its lanes, each attempt's bar by its index, and the units' bars."""
    spans = [span for span in (_unit_span(unit, now) for unit in units) if span is not None]
    start = min([view.started_at for view in attempts] + [s for s, _ in spans])
    end = max([_attempt_end(view, now) for view in attempts] + [e for _, e in spans])
    timeline = Timeline(start, max(end, start + 1e-3), [], 0.0)
    handoffs = _handoffs(attempts)
    by_index: dict[int, Bar] = {}
    by_host: dict[str, list[Bar]] = {}
    for index, view in enumerate(attempts):
        x0 = timeline.x(view.started_at)
        kind, after = handoffs.get(index, (None, None))
        bar = Bar(view, x0, max(timeline.x(_attempt_end(view, now)), x0 + MIN_BAR_W), kind, after)
        by_index[index] = bar
        by_host.setdefault(view.host, []).append(bar)
    by_stage: dict[int, list[UnitBar]] = {}
    for unit in units:
        span = _unit_span(unit, now)
        if span is not None:
            x0 = timeline.x(span[0])
            by_stage.setdefault(unit.stage, []).append(UnitBar(unit, x0, max(timeline.x(span[1]), x0 + MIN_BAR_W)))
    lanes: list[tuple[str, list[Bar] | list[UnitBar], str, str]] = [(host, by_host[host], "", "") for host in sorted(by_host)]
    for stage in sorted(by_stage):
        count = len(by_stage[stage])
        name = f"stage {stage}" + (f": {stage_names[stage]}" if stage_names.get(stage) else "")
        lanes.append((f"stage {stage}", by_stage[stage], f"{count} unit{'s' if count != 1 else ''}", name))
    top = float(AXIS_H)
    for label, bars, sub, tooltip in lanes:
        if sub:
            rows = _participant_rows(bars)  # type: ignore[arg-type]
            sub += f" · {rows} participant{'s' if rows != 1 else ''}"
        else:
            rows = _pack(bars)
        height = 2 * LANE_PAD + rows * ROW_H + (rows - 1) * ROW_GAP
        for bar in bars:
            bar.y = top + LANE_PAD + bar.row * (ROW_H + ROW_GAP)
        _set_room(bars)
        timeline.lanes.append(Lane(label, bars, rows, top, height, sub, tooltip))
        top += height
    timeline.height = top + 6
    return timeline, by_index, [bar for _, bars, _, _ in lanes for bar in bars if isinstance(bar, UnitBar)]


def _participant_rows(bars: list[UnitBar]) -> int:
    """A stage's units get one sub-row per participant (host and pid), which does one unit at a
    time: however many tiny units a stage has, its lane is as tall as it has participants."""
    participants = sorted({(bar.unit.host or "", bar.unit.pid or 0) for bar in bars})
    row_of = {participant: row for row, participant in enumerate(participants)}
    for bar in bars:
        bar.row = row_of[(bar.unit.host or "", bar.unit.pid or 0)]
    return max(1, len(participants))


def _set_room(bars: list[Bar] | list[UnitBar]) -> None:
    """Free space to the right of each bar in its sub-row, where a label that does not fit may go."""
    rows: dict[int, list[Bar | UnitBar]] = {}
    for bar in bars:
        rows.setdefault(bar.row, []).append(bar)
    for row in rows.values():
        row.sort(key=lambda b: b.x0)
        for bar, following in zip(row, row[1:]):
            bar.room_right = following.x0 - bar.x1
        row[-1].room_right = LABEL_W + PLOT_W + RIGHT_PAD - row[-1].x1


def tick_step(span: float) -> float:
    """The axis' tick spacing in seconds: the first of `TICK_STEPS` that gives at most `MAX_TICKS` ticks."""
    for step in TICK_STEPS:
        if span / step <= MAX_TICKS:
            return step
    return span / MAX_TICKS


__all__ = [
    "AXIS_H",
    "BACKUP",
    "LABEL_W",
    "PLOT_W",
    "RETRY",
    "RIGHT_PAD",
    "ROW_H",
    "TAKEOVER",
    "Bar",
    "Lane",
    "Timeline",
    "UnitBar",
    "lay_out",
    "tick_step",
]
