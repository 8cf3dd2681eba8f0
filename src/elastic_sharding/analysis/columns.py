"""One shard's contribution to the analysis: per column, what pandas needs to type it and what the
global step needs to describe, plot and correlate it, plus the column's values sorted in a file.

Data-Juicer builds `pd.DataFrame(stats)` and `pd.DataFrame(meta)` over the whole dataset; what it
then does to a column depends on the dtype pandas infers, which depends on every value of it. So a
shard does not decide anything: it tallies the types it saw (`types`, and `elements` for the items
of its lists) and the first valid one, and keeps what merges exactly whatever the cut (counts,
exact integer sums from `exact.py`, extremes, value counts, the sorted values);
`overall.plan_columns` decides once all shards are in. `frame_dtype` is pandas' inference rule, written out from
`lib.maybe_convert_objects` as measured on pandas 3.1.1 (the same rule for the frame constructor and
for `infer_objects` after `explode`).
"""

from __future__ import annotations

import math
import numbers
import os
from array import array
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from elastic_sharding.analysis import exact
from elastic_sharding.errors import AnalysisError

STATS_FIELD = "__dj__stats__"  # Data-Juicer's Fields.stats
META_FIELD = "__dj__meta__"  # Data-Juicer's Fields.meta
DEFAULT_PREFIX = "__dj__"  # OverallAnalysis keeps only the meta columns named with it
SUMMARY_VERSION = 2  # 2: exact integer sums instead of float sums, means and M2

KINDS = ("none", "nan", "bool", "int", "float", "bigint", "str", "list", "other")
NULL_KINDS = frozenset({"none", "nan"})
NUMBER_KINDS = frozenset({"bool", "int", "float", "bigint"})  # `numbers.Number`, as is_numeric_list_series asks
_INT64 = (-(2**63), 2**63)


def value_kind(value: Any) -> str:
    """The category pandas' inference distinguishes: None and float NaN are both missing but type
    a column differently; ints beyond int64 make it uint64 or object."""
    kind = _EXACT.get(type(value))
    if kind is None:
        if value is None:
            return "none"
        if isinstance(value, (bool, np.bool_)):
            return "bool"
        kind = "int" if isinstance(value, numbers.Integral) else "float" if isinstance(value, numbers.Real) else "other"
    if kind == "int":
        return "int" if _INT64[0] <= value < _INT64[1] else "bigint"
    if kind == "float":
        return "nan" if value != value else "float"
    return kind


_EXACT = {float: "float", int: "int", str: "str", list: "list", bool: "bool", dict: "other"}


def frame_dtype(tally: Mapping[str, int]) -> str:
    """The dtype pandas 3.1.1 gives a column holding these kinds ("nan" counting missing keys too):
    "int64", "float64", "bool", "str" or "object"."""
    present = {kind for kind in KINDS if tally.get(kind) and kind not in NULL_KINDS}
    nulls = tally.get("none", 0) + tally.get("nan", 0)
    if "bigint" in present:
        raise AnalysisError("holds an integer outside int64, which pandas stores as uint64 or as objects")
    if not present:
        return "float64" if tally.get("nan") else "object"
    if present == {"bool"}:
        return "object" if nulls else "bool"
    if present == {"int"}:
        return "float64" if nulls else "int64"
    if present <= {"int", "float"}:
        return "float64"
    if present == {"str"}:
        return "str"
    return "object"


def finite_or_none(value: float) -> float | None:
    """A float that survives JSON (orjson writes NaN and infinities as null)."""
    value = float(value)
    return value if math.isfinite(value) else None


class _Column:
    __slots__ = ("source", "name", "present", "empty_lists", "types", "elements", "first", "length", "count", "numbers", "counts",
                 "scalar_rows", "scalar_values", "list_rows", "list_means", "list_numeric")  # fmt: skip

    def __init__(self, source: str, name: str):
        self.source, self.name = source, name
        self.present = self.length = self.count = self.empty_lists = 0
        self.types = dict.fromkeys(KINDS, 0)
        self.elements = dict.fromkeys(KINDS, 0)
        self.first: str | None = None
        self.numbers = array("d")
        self.counts: dict[Any, int] = {}
        self.scalar_rows = array("q")
        self.scalar_values = array("d")
        self.list_rows = array("q")
        self.list_means = array("d")
        self.list_numeric = True

    def _item(self, kind: str, value: Any) -> None:
        """One value as `explode` leaves it."""
        if kind in NULL_KINDS:
            return
        self.count += 1
        if kind in NUMBER_KINDS:
            self.numbers.append(float(value))
        if kind in ("str", "bool"):
            key = bool(value) if kind == "bool" else value
            self.counts[key] = self.counts.get(key, 0) + 1

    def add(self, row: int, value: Any) -> None:
        self.present += 1
        kind = value_kind(value)
        self.types[kind] += 1
        if self.first is None and kind not in NULL_KINDS:
            self.first = kind
        if kind != "list":
            self.length += 1
            self._item(kind, value)
            if kind in NUMBER_KINDS and self.source == "stats":
                self.scalar_rows.append(row)
                self.scalar_values.append(float(value))
            return
        self.length += max(len(value), 1)
        self.empty_lists += not value
        numeric = True
        for element in value:
            element_kind = value_kind(element)
            self.elements[element_kind] += 1
            self._item(element_kind, element)
            numeric = numeric and element_kind in NUMBER_KINDS | {"nan"}
        if self.source == "stats":
            if numeric:
                self.list_rows.append(row)
                self.list_means.append(sum(float(v) for v in value) / len(value) if value else 0.0)
            else:
                self.list_numeric = False

    def correlation_kind(self) -> str | None:
        """How CorrelationAnalysis could read this column, as far as this shard can tell: "scalar"
        (a numeric dtype), "list" (numeric lists, replaced by their means), "null" (nothing but
        missing values here: either), None (dropped whatever the other shards hold)."""
        present = {kind for kind, n in self.types.items() if n and kind not in NULL_KINDS}
        if not present:
            return "null"
        if present <= NUMBER_KINDS:
            return "scalar"
        if present == {"list"} and self.list_numeric:
            return "list"
        return None

    def correlation_vector(self, rows: int, kind: str) -> np.ndarray:
        fill, where, values = (
            (np.nan, self.scalar_rows, self.scalar_values) if kind == "scalar" else (0.0, self.list_rows, self.list_means)
        )
        vector = np.full(rows, fill, dtype=np.float64)
        vector[np.frombuffer(where, dtype=np.int64)] = np.frombuffer(values, dtype=np.float64)
        vector[~np.isfinite(vector)] = np.nan
        return vector


def _write_sorted(values: np.ndarray, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        values.astype("<f8", copy=False).tofile(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _numeric(ordered: np.ndarray, file: str) -> dict[str, Any]:
    """count, extremes and the exact Σx and Σx² (`exact.encode`d) of the shard's sorted finite
    numbers: integers that add up to the same totals however the rows are cut."""
    finite = ordered[np.searchsorted(ordered, -np.inf, side="right") : np.searchsorted(ordered, np.inf, side="left")]
    (s1,), (s2,) = exact.moments(finite.reshape(-1, 1), [(0, 0)])
    return {
        "count": int(ordered.size),
        "nonfinite": int(ordered.size - finite.size),
        "s1": exact.encode(s1),
        "s2": exact.encode(s2),
        "min": finite_or_none(ordered[0]),
        "max": finite_or_none(ordered[-1]),
        "file": file,
    }


def _record(row: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    record = row.get(field)
    if record is None:
        return {}
    if not isinstance(record, Mapping):
        raise AnalysisError(f"a row's {field} is a {type(record).__name__}, not an object")
    return record


def summarize_shard(rows: Iterable[Mapping[str, Any]], directory: Path) -> dict[str, Any]:
    """Read one shard's rows once (in input order); write each numeric column's sorted values into
    `directory` and return the JSON-serialisable summary the global step merges.

    Summary: `version`, `rows`, `columns` (stats columns in order of first appearance, then meta
    columns named with `__dj__`), and `correlation` (`columns` and `kinds` of the stats columns
    it correlates here, and their exact sums, see `correlation.shard_moments`). Per column: `source`,
    `name`, `present` (rows holding the key; the others are missing, NaN to pandas), `types` and
    `elements` (tallies of `KINDS` over the values and over their lists' items), `empty_lists`,
    `first` (kind of the first non-missing value), `length` (values after `explode`, missing rows
    included), `count` (non-missing values after `explode`), `numeric` (None, or count, nonfinite,
    s1 and s2: the exact Σx and Σx² of its finite values, `exact.encode`d, min, max and `file`:
    the sorted float64 values' file name), `values` ([value, count] of its strings and booleans
    in order of first appearance)."""
    from elastic_sharding.analysis.correlation import shard_moments  # correlation imports this module

    tables: dict[str, dict[str, _Column]] = {"stats": {}, "meta": {}}
    count = 0
    for index, row in enumerate(rows):
        count = index + 1
        for source, field in (("stats", STATS_FIELD), ("meta", META_FIELD)):
            table = tables[source]
            for name, value in _record(row, field).items():
                if source == "meta" and not str(name).startswith(DEFAULT_PREFIX):
                    continue
                column = table.get(name)
                if column is None:
                    column = table[name] = _Column(source, str(name))
                column.add(index, value)
    columns = [*tables["stats"].values(), *tables["meta"].values()]
    summaries = []
    for position, column in enumerate(columns):
        numeric = None
        if column.numbers and not column.counts.keys() - {True, False}:
            file = f"c{position:04d}.f8"
            ordered = np.sort(np.frombuffer(column.numbers, dtype=np.float64))
            _write_sorted(ordered, directory / file)
            numeric = _numeric(ordered, file)
        summaries.append(
            {
                "source": column.source,
                "name": column.name,
                "present": column.present,
                "types": {k: v for k, v in column.types.items() if v},
                "elements": {k: v for k, v in column.elements.items() if v},
                "empty_lists": column.empty_lists,
                "first": column.first,
                "length": column.length + count - column.present,
                "count": column.count,
                "numeric": numeric,
                "values": [[value, n] for value, n in column.counts.items()],
            }
        )
    kinds = {c.name: c.correlation_kind() for c in tables["stats"].values()}
    used = [c for c in tables["stats"].values() if kinds[c.name] in ("scalar", "list")]
    matrix = np.column_stack([c.correlation_vector(count, kinds[c.name]) for c in used]) if used else np.empty((count, 0))
    return {
        "version": SUMMARY_VERSION,
        "rows": count,
        "columns": summaries,
        "correlation": {"columns": [c.name for c in used], "kinds": [kinds[c.name] for c in used], **shard_moments(matrix)},
    }
