"""The analysis of a job shared by any number of processes: its units, in order, claimed through
`claims.units.SharedStage` (claims, heartbeats, takeover, fencing, create-once results, the
first failure ends everyone).

A `columns` unit's result is its shard's summary; `plan`'s the analysed columns; a `stats`
unit's one column's numbers (its figures are written beside them first); `report`'s the files
of the finished directory. Every result is a function of the published shard outputs only, so a
unit done twice (a takeover, a fenced straggler) writes the same bytes and the late copy loses
the create-once race. The stage's end is `stage.json`, published by whoever first sees `report`
done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from elastic_sharding import fsops
from elastic_sharding.analysis import columns, correlation, figures, html_index, overall
from elastic_sharding.claims.units import SharedStage
from elastic_sharding.errors import JobStateError
from elastic_sharding.layout import AnalysisLayout
from elastic_sharding.records import AnalysisSpec

log = logging.getLogger(__name__)

COLUMNS, PLAN, STATS, REPORT = "columns", "plan", "stats", "report"
PHASES = (COLUMNS, PLAN, STATS, REPORT)
OVERALL_FILES = ("overall.csv", "overall.md")
FIGURE_DATA = "figures.json"  # the numbers every figure was drawn from: bin edges and counts, box statistics

unit_name = AnalysisLayout.unit_name


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def read_done(paths: AnalysisLayout) -> dict[str, Any] | None:
    return fsops.read_record(paths.done, orjson.loads)


class AnalysisParticipant:
    """One process's share of the analysis; `rows_of(shard_index)` gives a shard's output rows
    (its statistics and meta fields) in input order."""

    def __init__(
        self,
        paths: AnalysisLayout,
        spec: AnalysisSpec,
        num_shards: int,
        rows_of: Callable[[int], Iterable[dict]],
        lease_secs: float,
        heartbeat_secs: float,
        poll_secs: float,
        stop: Callable[[], bool] = lambda: False,
        notes: Callable[[], list[str]] = list,
    ):
        self.paths = paths
        self.spec = spec
        self.num_shards = num_shards
        self.rows_of = rows_of
        self.notes = notes
        self.shared = SharedStage(paths, "analysis", lease_secs, heartbeat_secs, poll_secs, stop)

    def run(self) -> dict[str, Any]:
        """Take part until the analysis is complete; raises the error a participant published, or
        `Interrupted` when asked to stop."""
        done = read_done(self.paths)
        if done is not None:
            return done
        self.shared.run_phase(self._names(COLUMNS, self.num_shards), self._columns, f"analysis-{COLUMNS}")
        self.shared.run_phase([unit_name(PLAN, 0)], self._plan, f"analysis-{PLAN}")
        planned = self._result(unit_name(PLAN, 0))["columns"]
        self.shared.run_phase(self._names(STATS, len(planned)), self._stats, f"analysis-{STATS}")
        self.shared.run_phase([unit_name(REPORT, 0)], self._report, f"analysis-{REPORT}")
        fsops.publish_once(self.paths.done, self.paths.result(unit_name(REPORT, 0)).read_bytes())
        return read_done(self.paths) or self._result(unit_name(REPORT, 0))

    def help(self, ready: Callable[[int], bool]) -> bool:
        """Summarize one finished shard nobody holds while others still process; False if none."""
        if read_done(self.paths) is not None:
            return False
        names = self._names(COLUMNS, self.num_shards)
        return self.shared.help_once(names, lambda name: ready(_index(name)), self._columns, f"analysis-{COLUMNS}")

    # -- units ----------------------------------------------------------------------------------

    def _columns(self, name: str) -> bytes:
        shard_index = _index(name)
        directory = self.paths.shard_dir(shard_index)
        fsops.make_dirs(directory)
        return dumps(columns.summarize_shard(self.rows_of(shard_index), directory))

    def _summaries(self) -> list[dict[str, Any]]:
        return [self._result(name) for name in self._names(COLUMNS, self.num_shards)]

    def _plan(self, name: str) -> bytes:
        return dumps({"columns": overall.plan_columns(self._summaries())})

    def _stats(self, name: str) -> bytes:
        column = self._result(unit_name(PLAN, 0))["columns"][_index(name)]
        shard_dirs = [self.paths.shard_dir(i) for i in range(self.num_shards)]
        result = overall.column_result(column, shard_dirs, list(self.spec.percentiles))
        fsops.make_dirs(self.paths.report)
        result["files"] = [] if self.spec.save_stats_in_one_file else figures.draw_column(result, self.paths.report)
        return dumps(result)

    def _report(self, name: str) -> bytes:
        planned = self._result(unit_name(PLAN, 0))["columns"]
        results = [self._result(n) for n in self._names(STATS, len(planned))]
        report = self.paths.report
        fsops.make_dirs(report)
        frame = overall.overall_frame(results)
        overall.write_overall(frame, report)
        files = [*OVERALL_FILES, *(f for r in results for f in r["files"])]
        if self.spec.save_stats_in_one_file and results:
            figures.draw_all_stats(results, report / "all-stats.png")
            files.append("all-stats.png")
        names, matrix = correlation.merged_correlation(self._summaries())
        if names:
            figures.draw_correlation(names, matrix, report / "stats-corr-pearson.png")
            files.append("stats-corr-pearson.png")
        fsops.replace_atomic(report / FIGURE_DATA, dumps({r["name"]: _figure_data(r) for r in results}))
        files.append(FIGURE_DATA)
        html_index.write_index(report, report / "overall.csv", files, "Analysis", self.notes())
        files.append("index.html")
        rows = sum(s.get("rows", 0) for s in self._summaries())
        return dumps({"files": files, "columns": [r["name"] for r in results], "rows": rows, "shards": self.num_shards})

    # -- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _names(phase: str, count: int) -> list[str]:
        return [unit_name(phase, i) for i in range(count)]

    def _result(self, name: str) -> dict[str, Any]:
        path = self.paths.result(name)
        record = fsops.read_record(path, orjson.loads)
        if record is None:
            raise JobStateError(f"{path}: missing; the analysis is incomplete: remove {self.paths.root} and run the job again")
        return record


def _figure_data(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result[key] for key in ("plot", "length", "hist", "box", "frequencies") if key in result}


def _index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])
