"""The global step of the analysis: from every shard's summary, Data-Juicer's `overall.csv` and
each column's figures' numbers, exactly as `dj-analyze` computes them on the whole dataset.

OverallAnalysis runs `describe(include="all")` on each column of `pd.concat([stats, meta], axis=1)`
after `refine_single_column`; ColumnWiseAnalysis plots `explode().infer_objects()` of each column
it described. `plan_columns` replays pandas' typing and Data-Juicer's choices from the merged
tallies; `column_result` computes one column's describe, histogram and box statistics from the
memory-mapped sorted values; `overall_frame` rebuilds the very frame Data-Juicer writes.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from elastic_sharding import fsops
from elastic_sharding.analysis import exact, select
from elastic_sharding.analysis.columns import SUMMARY_VERSION, frame_dtype
from elastic_sharding.errors import AnalysisError, JobStateError

log = logging.getLogger(__name__)

DEFAULT_PERCENTILES = (0.25, 0.5, 0.75)  # OverallAnalysis.default_percentiles
CATEGORICAL_LABELS = ("count", "unique", "top", "freq")
_SOURCES = ("stats", "meta")


def _merge_tally(target: dict[str, int], tally: dict[str, int]) -> None:
    for kind, n in tally.items():
        target[kind] = target.get(kind, 0) + n


def _merged(summaries: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Each column's shard summaries merged, stats columns then meta columns, each in order of first
    appearance over the whole input (the frame constructor's column order)."""
    columns: dict[tuple[str, str], dict[str, Any]] = {}
    for shard, summary in enumerate(summaries):
        if summary.get("version") != SUMMARY_VERSION:
            raise JobStateError(
                f"shard {shard}'s analysis summary is of format {summary.get('version')}, not {SUMMARY_VERSION}: "
                "an older version began this analysis; remove its analysis-stage directory and run again"
            )
        for column in summary["columns"]:
            merged = columns.setdefault(
                (column["source"], column["name"]),
                {"source": column["source"], "name": column["name"], "present": 0, "types": {}, "elements": {},
                 "first": None, "length": 0, "count": 0, "empty_lists": 0, "numeric": [], "values": {}, "shards": set()},
            )  # fmt: skip
            merged["present"] += column["present"]
            merged["length"] += column["length"]
            merged["count"] += column["count"]
            merged["empty_lists"] += column["empty_lists"]
            merged["shards"].add(shard)
            _merge_tally(merged["types"], column["types"])
            _merge_tally(merged["elements"], column["elements"])
            merged["first"] = merged["first"] or column["first"]
            if column["numeric"] is not None:
                merged["numeric"].append((shard, column["numeric"]))
            for value, n in column["values"]:
                merged["values"][value] = merged["values"].get(value, 0) + n
    rows = [summary["rows"] for summary in summaries]
    for merged in columns.values():
        merged["length"] += sum(n for shard, n in enumerate(rows) if shard not in merged["shards"])
    ordered = [c for source in _SOURCES for (s, _), c in columns.items() if s == source]
    names = [c["name"] for c in ordered]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise AnalysisError(f"stats and meta both hold a column named {twice[0]!r}; Data-Juicer's analysis fails on it")
    return ordered, sum(rows)


def _exploded_tally(column: dict[str, Any], missing: int) -> dict[str, int]:
    """The kinds `explode()` leaves: the lists' items, the other values as they are, NaN for each
    empty list and each missing row."""
    tally = dict(column["elements"])
    for kind, n in column["types"].items():
        if kind != "list":
            tally[kind] = tally.get(kind, 0) + n
    tally["nan"] = tally.get("nan", 0) + column["empty_lists"] + missing
    return tally


def _kind(column: dict[str, Any], missing: int) -> str | None:
    """The column's kind ("numeric", "categorical", "bool"), or None where Data-Juicer skips it;
    raises where pandas would do something this merge cannot reproduce."""
    name = column["name"]
    full = {**column["types"], "nan": column["types"].get("nan", 0) + missing}
    try:
        dtype = frame_dtype(full)
        if dtype in ("int64", "float64"):
            return "numeric"
        if dtype == "bool":
            return "bool"
        if dtype == "str":
            return "categorical"
        first = column["first"]
        if first is None:
            log.warning("There is a column of stats without any valid value, which is skipped for now.")
            return None
        if first not in ("str", "list"):
            log.warning("There is a column of stats with type [%s], which is not supported to be analyzed for now.", first)
            return None
        if first == "str":
            raise AnalysisError("mixes strings with other values, which pandas describes as objects")
        exploded = frame_dtype(_exploded_tally(column, missing))
        if exploded in ("int64", "float64"):
            return "numeric"
        if exploded == "str":
            return "categorical"
        what = "booleans" if exploded == "bool" else "values of mixed or unsupported types"
        raise AnalysisError(f"holds lists of {what}, which pandas describes as objects")
    except AnalysisError as exc:
        raise AnalysisError(f"cannot analyse {column['source']} column {name!r}: it {exc}") from None


def plan_columns(summaries: list[dict]) -> list[dict]:
    """The columns Data-Juicer analyses, in its order, each with everything `column_result` needs:
    source, name, kind ("numeric", "categorical" or "bool": described as categorical, plotted as
    0/1), length (values after `explode`, NaN included: the histogram's bin count), count (values
    described), mean, std (None for fewer than two values), min, max, files ([shard index, file
    name] of the sorted values) and values ([value, count] in first-appearance order, categorical
    and bool columns)."""
    ordered, total_rows = _merged(summaries)
    planned = []
    for column in ordered:
        missing = total_rows - column["present"]
        kind = _kind(column, missing)
        if kind is None:
            continue
        parts = [part for _, part in column["numeric"] if part["count"]]
        if kind != "categorical" and any(part["nonfinite"] for part in parts):
            raise AnalysisError(
                f"cannot analyse {column['source']} column {column['name']!r}: it holds an infinite value, "
                "and Data-Juicer's histogram of it fails"
            )
        entry: dict[str, Any] = {"source": column["source"], "name": column["name"], "kind": kind, "length": column["length"]}
        if kind == "categorical":
            values = [[value, n] for value, n in column["values"].items()]
            entry.update(count=sum(n for _, n in values), values=values, files=[])
        else:
            entry.update(_numeric_merge(parts))
            entry["files"] = [[shard, part["file"]] for shard, part in column["numeric"] if part["count"]]
            if kind == "bool":
                entry["values"] = [[bool(value), n] for value, n in column["values"].items()]
        planned.append(entry)
    return planned


def _numeric_merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts, extremes and the exact sums add up; the mean and the standard deviation (ddof=1,
    as pandas) are computed once from the totals and rounded once, the same whatever the cut."""
    count = sum(part["count"] for part in parts)
    if not count:
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
    s1 = sum(exact.decode(part["s1"]) for part in parts)
    s2 = sum(exact.decode(part["s2"]) for part in parts)
    return {
        "count": count,
        "mean": exact.mean(s1, count),
        "std": exact.std(s1, s2, count) if count >= 2 else None,
        "min": min(part["min"] for part in parts),
        "max": max(part["max"] for part in parts),
    }


@functools.lru_cache(maxsize=64)
def percentile_labels(percentiles: tuple[float, ...]) -> tuple[str, ...]:
    """pandas' own labels for these percentiles (`format_percentiles`, through `describe`)."""
    index = pd.Series([0.0]).describe(percentiles=list(percentiles)).index
    return tuple(index[4:-1])


def describe_percentiles(percentiles: Sequence[float]) -> list[float]:
    """OverallAnalysis merges the user's percentiles with its defaults; describe sorts them."""
    return sorted({float(p) for p in [*percentiles, *DEFAULT_PERCENTILES]})


def _memmaps(column: dict[str, Any], shard_dirs: Sequence[Path]) -> list[np.ndarray]:
    return [np.memmap(Path(shard_dirs[shard]) / file, dtype="<f8", mode="r") for shard, file in column["files"]]


def _top(values: list[list[Any]]) -> tuple[Any, int]:
    """value_counts' first entry: pandas sorts the counts (in first-appearance order) with a stable
    descending sort, done here by pandas itself on the merged counts."""
    counts = pd.Series([n for _, n in values], index=pd.RangeIndex(len(values)), dtype="int64")
    first = int(counts.sort_values(ascending=False, kind="stable").index[0])
    return values[first][0], values[first][1]


def column_result(column: dict, shard_dirs: list[Path], percentiles: list[float]) -> dict:
    """One planned column's numbers: `describe` (label -> value, pandas' labels in its order),
    `plot` ("numeric" or "categorical"), `length`, and for a numeric plot `hist` ({"edges",
    "counts"}: np.histogram's over max(int(sqrt(length)), 10) bins) and `box` (boxplot_stats' keys,
    `fliers` a sample, `flier_count` all of them); `frequencies` ([value, count]) for categorical
    and bool columns. Memory does not grow with rows: the values stay in their memory-mapped files."""
    result: dict[str, Any] = {
        "source": column["source"],
        "name": column["name"],
        "kind": column["kind"],
        "length": column["length"],
    }
    if column["kind"] != "numeric":
        top, freq = _top(column["values"])
        result["describe"] = {"count": column["count"], "unique": len(column["values"]), "top": top, "freq": freq}
        result["frequencies"] = [list(pair) for pair in column["values"]]
    if column["kind"] == "categorical":
        result["plot"] = "categorical"
        return result
    arrays = _memmaps(column, shard_dirs)
    count = column["count"]
    mean = math.nan if not count else column["mean"]
    if column["kind"] == "numeric":
        ps = describe_percentiles(percentiles)
        std = _or_nan(column["std"])
        described = {"count": float(count), "mean": mean, "std": std, "min": _or_nan(column["min"])}
        for label, p in zip(percentile_labels(tuple(ps)), ps, strict=True):
            described[label] = select.quantile(arrays, count, p)
        described["max"] = _or_nan(column["max"])
        result["describe"] = described
    bins = max(int(math.sqrt(column["length"])), 10)
    bounds = np.array([column["min"], column["max"]], dtype=np.float64) if count else np.empty(0)
    edges = np.histogram_bin_edges(bounds, bins=bins)
    result.update(
        plot="numeric",
        hist={"edges": [float(e) for e in edges], "counts": select.histogram(arrays, edges) if count else [0] * bins},
        box=select.box_stats(arrays, count, mean),
    )
    return result


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _series(result: dict[str, Any]) -> pd.Series:
    described = result["describe"]
    if result["kind"] == "numeric":
        values = [_or_nan(v) for v in described.values()]
        return pd.Series(values, index=list(described), name=result["name"], dtype="float64")
    top = np.bool_(described["top"]) if result["kind"] == "bool" else described["top"]
    values = [np.int64(described["count"]), int(described["unique"]), top, np.int64(described["freq"])]
    return pd.Series(values, index=list(CATEGORICAL_LABELS), name=result["name"], dtype=None)


def overall_frame(results: list[dict]) -> pd.DataFrame:
    """`pd.DataFrame(result_cols).T` as OverallAnalysis builds it, from Series of the dtypes and
    scalar types `describe` returns (float64 for numeric columns; numpy ints, a Python int and the
    top value for categorical ones)."""
    return pd.DataFrame([_series(result) for result in results]).T


def write_overall(frame: pd.DataFrame, directory: Path) -> None:
    """`overall.csv` and `overall.md`, written by pandas as OverallAnalysis writes them."""
    fsops.replace_atomic(Path(directory) / "overall.csv", frame.to_csv().encode("utf-8"), durable=False)
    fsops.replace_atomic(Path(directory) / "overall.md", frame.to_markdown().encode("utf-8"), durable=False)
