"""Pearson correlation of the stats columns across shards, as Data-Juicer's CorrelationAnalysis
computes it on the whole frame, from per-shard co-moments merged with Chan's formulas.

CorrelationAnalysis keeps the stats columns of a numeric dtype (bool included), replaces a
numeric-list column (`is_numeric_list_series`) by each row's list mean, 0 for an empty list and
for a missing value, and drops the rest; `DataFrame.corr()` then correlates every pair over the
rows where both are finite (pairwise-complete, `min_periods=1`): NaN when fewer than one such row
or when either side is constant there (zero divisor), the result clipped to [-1, 1].

Whether a column is numeric, a numeric list or dropped depends on all shards, and a shard holding
nothing but missing values for a column cannot tell whether they are NaN (a numeric column) or 0 (a
numeric-list one): each shard keeps the moments of its own candidates, and the merge fills in
those of a numeric-list column's all-missing shards, a constant 0 over the shard's rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic_sharding.analysis.columns import NULL_KINDS, NUMBER_KINDS, frame_dtype
from elastic_sharding.errors import AnalysisError


def _center(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and deviations of a block with no NaN; a constant column gets its own value as
    mean, so its deviations, M2 and co-moments are exactly 0 (pandas' Welford gives exactly 0 there)."""
    if block.shape[0] == 0:
        return np.zeros(block.shape[1]), block
    means = block.mean(axis=0)
    low, high = block.min(axis=0), block.max(axis=0)
    means = np.where(low == high, low, means)
    return means, block - means


def shard_moments(matrix: np.ndarray) -> dict[str, list]:
    """The moments of a shard's candidate columns (`matrix`: rows x columns, NaN where not finite).

    `single[i]` = [n, mean, m2] of column i over its finite rows; `pairs` holds, for every i < j in
    row-major order, [n, mean_i, mean_j, m2_i, m2_j, c_ij] over the rows where both are finite.
    Columns that are finite on the same rows are centred and multiplied together in one product."""
    rows, width = matrix.shape
    finite = np.isfinite(matrix)
    groups: dict[bytes, list[int]] = {}
    for j in range(width):
        groups.setdefault(np.packbits(finite[:, j]).tobytes(), []).append(j)
    single: list[list[float] | None] = [None] * width
    pair_of: dict[tuple[int, int], list[float]] = {}
    members = list(groups.values())
    for position, first in enumerate(members):
        for second in members[position:]:
            keep = finite[:, first[0]] & finite[:, second[0]]
            n = int(keep.sum())
            means_a, dev_a = _center(matrix[keep][:, first])
            means_b, dev_b = _center(matrix[keep][:, second])
            m2_a, m2_b = np.einsum("ij,ij->j", dev_a, dev_a), np.einsum("ij,ij->j", dev_b, dev_b)
            cross = dev_a.T @ dev_b
            if first is second:
                for x, i in enumerate(first):
                    single[i] = [n, float(means_a[x]), float(m2_a[x])]
            for x, i in enumerate(first):
                for y, j in enumerate(second):
                    if i == j:
                        continue
                    one, other = (means_a[x], m2_a[x]), (means_b[y], m2_b[y])
                    if j < i:
                        one, other = other, one
                    pair_of[min(i, j), max(i, j)] = [
                        n,
                        float(one[0]),
                        float(other[0]),
                        float(one[1]),
                        float(other[1]),
                        float(cross[x, y]),
                    ]
    pairs = [pair_of[i, j] for i in range(width) for j in range(i + 1, width)]
    return {"single": single, "pairs": pairs}


def _merged_kinds(summaries: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """Each stats column's global role: "scalar" (numeric dtype), "list" (numeric list) or None."""
    total_rows = sum(s["rows"] for s in summaries)
    types: dict[str, dict[str, int]] = {}
    elements: dict[str, dict[str, int]] = {}
    present: dict[str, int] = {}
    for summary in summaries:
        for column in summary["columns"]:
            if column["source"] != "stats":
                continue
            name = column["name"]
            present[name] = present.get(name, 0) + column["present"]
            for target, tally in ((types, column["types"]), (elements, column["elements"])):
                merged = target.setdefault(name, {})
                for kind, n in tally.items():
                    merged[kind] = merged.get(kind, 0) + n
    kinds: dict[str, str | None] = {}
    for name, tally in types.items():
        try:
            dtype = frame_dtype({**tally, "nan": tally.get("nan", 0) + total_rows - present[name]})
        except AnalysisError as exc:
            raise AnalysisError(f"cannot correlate stats column {name!r}: it {exc}") from None
        valid = {k for k, n in tally.items() if n and k not in NULL_KINDS}
        items = elements[name]
        if dtype in ("int64", "float64", "bool"):
            kinds[name] = "scalar"
        elif valid == {"list"} and sum(items.values()) and set(items) <= NUMBER_KINDS | {"nan"}:
            kinds[name] = "list"
        else:
            kinds[name] = None
    return kinds


def _floats(rows: Sequence[Sequence[float | None]], width: int) -> np.ndarray:
    return np.array([[0.0 if v is None else float(v) for v in row] for row in rows], dtype=np.float64).reshape(-1, width)


def _local(moments: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """A shard's own (n, mean, m2, co-moment) matrices over its candidate columns."""
    single = _floats(moments["single"], 3)
    pairs = _floats(moments["pairs"], 6)
    width = single.shape[0]
    n, mean, m2, co = (np.zeros((width, width)) for _ in range(4))
    upper = np.triu_indices(width, 1)
    lower = upper[::-1]
    for target, first, second in ((n, 0, 0), (mean, 1, 2), (m2, 3, 4), (co, 5, 5)):
        target[upper] = pairs[:, first]
        target[lower] = pairs[:, second]
    diagonal = np.arange(width)
    n[diagonal, diagonal], mean[diagonal, diagonal] = single[:, 0], single[:, 1]
    m2[diagonal, diagonal] = co[diagonal, diagonal] = single[:, 2]
    return n, mean, m2, co


def _shard_arrays(summary: dict[str, Any], names: list[str], kinds: dict[str, str | None]) -> tuple[np.ndarray, ...]:
    """The shard's (n, mean, m2, co-moment) matrices over the global columns: mean[a, b] and
    m2[a, b] are those of column a over the rows where a and b are both finite. A numeric-list
    column the shard has no list of is 0 on every row of it: finite wherever the other side is."""
    size = len(names)
    n, mean, m2, co = (np.zeros((size, size)) for _ in range(4))
    moments = summary["correlation"]
    index = {name: i for i, name in enumerate(moments["columns"])}
    here = [a for a, name in enumerate(names) if name in index]
    local = [index[names[a]] for a in here]
    zero = [a for a, name in enumerate(names) if name not in index and kinds[name] == "list"]
    local_n, local_mean, local_m2, local_co = _local(moments)
    block, local_block = np.ix_(here, here), np.ix_(local, local)
    for merged, own in zip((n, mean, m2, co), (local_n, local_mean, local_m2, local_co), strict=True):
        merged[block] = own[local_block]
    n[np.ix_(zero, zero)] = summary["rows"]
    if zero and here:
        counts = local_n[local, local]
        n[np.ix_(zero, here)], n[np.ix_(here, zero)] = counts[None, :], counts[:, None]
        mean[np.ix_(here, zero)] = local_mean[local, local][:, None]
        m2[np.ix_(here, zero)] = local_m2[local, local][:, None]
    return n, mean, m2, co


def _merge(left: tuple[np.ndarray, ...], right: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Chan et al.'s pairwise update of counts, means, M2 and co-moments, elementwise."""
    n1, mean1, m21, co1 = left
    n2, mean2, m22, co2 = right
    n = n1 + n2
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = mean2 - mean1
        weight = np.where(n > 0, n1 * n2 / np.where(n > 0, n, 1), 0.0)
        mean = np.where(n1 == 0, mean2, np.where(n2 == 0, mean1, mean1 + delta * (n2 / np.where(n > 0, n, 1))))
        m2 = np.where(n1 == 0, m22, np.where(n2 == 0, m21, m21 + m22 + delta * delta * weight))
        co = np.where(n1 == 0, co2, np.where(n2 == 0, co1, co1 + co2 + delta * delta.T * weight))
    return n, mean, m2, co


def merged_correlation(summaries: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[float]]]:
    """What `CorrelationAnalysis(dataset).analyze()` computes (`DataFrame.corr("pearson")`) on the
    whole stats frame: its columns and matrix, NaN where undefined; ([], []) for no column, where
    Data-Juicer returns None and draws nothing."""
    kinds = _merged_kinds(summaries)
    names = [name for name, kind in kinds.items() if kind is not None]
    size = len(names)
    merged: tuple[np.ndarray, ...] = tuple(np.zeros((size, size)) for _ in range(4))
    for summary in summaries:
        merged = _merge(merged, _shard_arrays(summary, names, kinds))
    n, _, m2, co = merged
    with np.errstate(invalid="ignore", divide="ignore"):
        divisor = np.sqrt(m2 * m2.T)
        matrix = np.where((n >= 1) & (divisor != 0), co / divisor, math.nan)
    matrix = np.clip(matrix, -1.0, 1.0)
    return names, [[float(v) for v in row] for row in matrix]
