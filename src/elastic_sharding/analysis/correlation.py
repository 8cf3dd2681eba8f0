"""Pearson correlation of the stats columns across shards, as Data-Juicer's CorrelationAnalysis
computes it on the whole frame, from per-shard exact integer sums (`exact.py`: n, Σx, Σy, Σx²,
Σy², Σxy of each pair) that merge by addition, so the matrix is the same whatever the cut.

CorrelationAnalysis keeps the stats columns of a numeric dtype (bool included), replaces a
numeric-list column (`is_numeric_list_series`) by each row's list mean, 0 for an empty list and
for a missing value, and drops the rest; `DataFrame.corr()` then correlates every pair over the
rows where both are finite (pairwise-complete, `min_periods=1`): NaN when fewer than one such row
or when either side is constant there (zero divisor), the result clipped to [-1, 1].

Whether a column is numeric, a numeric list or dropped depends on all shards, and a shard holding
nothing but missing values for a column cannot tell whether they are NaN (a numeric column) or 0 (a
numeric-list one): each shard keeps the sums of its own candidates, and the merge fills in those
of a numeric-list column's all-missing shards, a constant 0 over the shard's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic_sharding.analysis import exact
from elastic_sharding.analysis.columns import NULL_KINDS, NUMBER_KINDS, frame_dtype
from elastic_sharding.errors import AnalysisError


def shard_moments(matrix: np.ndarray) -> dict[str, list]:
    """The exact sums of a shard's candidate columns (`matrix`: rows x columns, NaN where not
    finite), each `exact.encode`d but the counts.

    `single[i]` = [n, Σx, Σx²] of column i over its finite rows; `pairs` holds, for every i < j in
    row-major order, [n, Σx_i, Σx_j, Σx_i², Σx_j², Σx_i·x_j] over the rows where both are finite.
    Columns that are finite on the same rows are summed together, in one pass."""
    width = matrix.shape[1]
    finite = np.isfinite(matrix)
    groups: dict[bytes, list[int]] = {}
    for j in range(width):
        groups.setdefault(np.packbits(finite[:, j]).tobytes(), []).append(j)
    single: list[list | None] = [None] * width
    pair_of: dict[tuple[int, int], list] = {}
    members = list(groups.values())
    for position, first in enumerate(members):
        for second in members[position:]:
            keep = finite[:, first[0]] & finite[:, second[0]]
            n = int(keep.sum())
            columns = first if first is second else [*first, *second]
            squares = [(x, x) for x in range(len(columns))]
            crosses = [(x, y) for x in range(len(first)) for y in range(x + 1 if first is second else len(first), len(columns))]
            sums, products = exact.moments(matrix[keep][:, columns], squares + crosses)
            total = [exact.encode(v) for v in sums]
            square = [exact.encode(v) for v in products[: len(columns)]]
            if first is second:
                for x, i in enumerate(first):
                    single[i] = [n, total[x], square[x]]
            for (x, y), product in zip(crosses, products[len(columns) :], strict=True):
                if columns[y] < columns[x]:
                    x, y = y, x
                pair_of[columns[x], columns[y]] = [n, total[x], total[y], square[x], square[y], exact.encode(product)]
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


def _sums(size: int) -> tuple[np.ndarray, ...]:
    return tuple(np.zeros((size, size), dtype=object) for _ in range(4))


def _local(moments: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """A shard's own matrices over its candidate columns: n[a, b] rows where a and b are both
    finite, and over those rows s[a, b] = Σa, q[a, b] = Σa², p[a, b] = Σab (exact integers)."""
    width = len(moments["single"])
    n, s, q, p = _sums(width)
    pairs = iter(moments["pairs"])
    for i in range(width):
        count, total, square = moments["single"][i]
        n[i, i], s[i, i], q[i, i] = count, exact.decode(total), exact.decode(square)
        p[i, i] = q[i, i]
        for j in range(i + 1, width):
            count, s_i, s_j, q_i, q_j, product = next(pairs)
            n[i, j] = n[j, i] = count
            s[i, j], s[j, i], q[i, j], q[j, i] = (exact.decode(v) for v in (s_i, s_j, q_i, q_j))
            p[i, j] = p[j, i] = exact.decode(product)
    return n, s, q, p


def _shard_arrays(summary: dict[str, Any], names: list[str], kinds: dict[str, str | None]) -> tuple[np.ndarray, ...]:
    """The shard's (n, s, q, p) matrices over the global columns (see `_local`). A numeric-list
    column the shard has no list of is 0 on every row of it: finite wherever the other side is."""
    size = len(names)
    merged = _sums(size)
    moments = summary["correlation"]
    index = {name: i for i, name in enumerate(moments["columns"])}
    here = [a for a, name in enumerate(names) if name in index]
    local = [index[names[a]] for a in here]
    zero = [a for a, name in enumerate(names) if name not in index and kinds[name] == "list"]
    own = _local(moments)
    block, local_block = np.ix_(here, here), np.ix_(local, local)
    for target, part in zip(merged, own, strict=True):
        target[block] = part[local_block]
    n, s, q, _ = merged
    n[np.ix_(zero, zero)] = summary["rows"]
    if zero and here:
        counts = own[0][local, local]
        n[np.ix_(zero, here)], n[np.ix_(here, zero)] = counts[None, :], counts[:, None]
        s[np.ix_(here, zero)] = own[1][local, local][:, None]
        q[np.ix_(here, zero)] = own[2][local, local][:, None]
    return merged


def merged_correlation(summaries: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[float]]]:
    """What `CorrelationAnalysis(dataset).analyze()` computes (`DataFrame.corr("pearson")`) on the
    whole stats frame: its columns and matrix, NaN where undefined; ([], []) for no column, where
    Data-Juicer returns None and draws nothing."""
    kinds = _merged_kinds(summaries)
    names = [name for name, kind in kinds.items() if kind is not None]
    size = len(names)
    n, s, q, p = _sums(size)
    for summary in summaries:
        shard = _shard_arrays(summary, names, kinds)
        n, s, q, p = n + shard[0], s + shard[1], q + shard[2], p + shard[3]
    matrix = np.array(
        [
            [exact.correlation(int(n[a, b]), s[a, b], s[b, a], q[a, b], q[b, a], p[a, b]) for b in range(size)]
            for a in range(size)
        ],
        dtype=np.float64,
    ).reshape(size, size)
    matrix = np.clip(matrix, -1.0, 1.0)
    return names, [[float(v) for v in row] for row in matrix]
