"""What the analysis of a `--analyze` job is doing, read from its files without writing to them.

Its units (`analysis/cooperate.py`) leave in `analysis-stage/units/` a claim and, once done, a
result, as a deduplication stage's do. The analysis is `waiting` until every shard is done (its
`columns` units may already summarize the finished ones), `running` after, `done` once
`stage.json` exists, `failed` while `failed.json` exists (`retry --all-failed` archives it).
Per phase: units done, held, and the total: one `columns` unit per shard, one `plan`, one `stats`
unit per statistic (known once `plan` is done) and one `report`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from elastic_sharding import confined
from elastic_sharding.layout import AnalysisLayout, JobLayout
from elastic_sharding.observe.snapshot import read_leniently
from elastic_sharding.observe.stages import DONE, FAILED, RUNNING, WAITING, PhaseUnits, unit_names
from elastic_sharding.records import StageFailure

# `analysis/cooperate.py`'s PHASES, in order (not imported: that module needs numpy, status does not).
COLUMNS, PLAN, STATS, REPORT = "columns", "plan", "stats", "report"
PHASES = (COLUMNS, PLAN, STATS, REPORT)
_UNIT_RE = re.compile(r"^(?P<phase>columns|plan|stats|report)-(?P<index>[0-9]{5,})$")


@dataclass
class AnalysisView:
    state: str
    phase: str | None
    units: dict[str, PhaseUnits]
    failure: StageFailure | None

    @property
    def error(self) -> str | None:
        f = self.failure
        return None if f is None else f"unit {f.unit} on host={f.host} pid={f.pid}: {f.error}: {f.message}"

    def as_json(self) -> dict:
        return {
            "state": self.state,
            "phase": self.phase,
            "units": {phase: {"done": u.done, "held": u.held, "total": u.total} for phase, u in self.units.items()},
            "error": self.error,
        }

    def line(self) -> str:
        counts = ", ".join(f"{phase} {u.done}/{'?' if u.total is None else u.total}" for phase, u in self.units.items())
        return f"analysis: {self.state} ({counts})" + (f": {self.error}" if self.error else "")


def _statistics(files: AnalysisLayout) -> int | None:
    """How many statistics the plan chose (None before it is published)."""
    try:
        plan = orjson.loads(confined.read_bytes_nofollow(files.result(f"{PLAN}-00000")))
        return len(plan["columns"])
    except (OSError, ValueError, KeyError, TypeError, confined.LinkRefused):
        return None


def read_analysis(layout: JobLayout, num_shards: int, input_done: bool) -> AnalysisView:
    """The job's analysis; `input_done` says whether every shard is done."""
    files = AnalysisLayout(layout.analysis_stage)
    failure = read_leniently(files.failed, StageFailure)
    claimed, published = unit_names(files, _UNIT_RE)
    totals = {COLUMNS: num_shards, PLAN: 1, STATS: _statistics(files), REPORT: 1}
    units = {phase: PhaseUnits(total=totals[phase]) for phase in PHASES}
    for name in claimed | published:
        phase = name.rsplit("-", 1)[0]
        if name in published:
            units[phase].done += 1
        else:
            units[phase].held += 1
    if failure is not None:
        state, phase = FAILED, failure.unit.rsplit("-", 1)[0]
    elif confined.lexists(files.done):
        state, phase = DONE, None
    else:
        state = RUNNING if input_done else WAITING
        started = [p for p in PHASES if units[p].done or units[p].held]
        phase = next((p for p in PHASES if units[p].total is None or units[p].done < units[p].total), None) if started else None
    return AnalysisView(state, phase, units, failure)
