"""Exact order statistics over several sorted float64 arrays, without ever concatenating them.

Each shard leaves one column's values sorted in a file; the global step memory-maps those files
and asks here for ranks, numpy-exact quantiles, histogram counts and box-plot statistics of their
union. Selection is a weighted median-of-medians search: every round costs two binary searches per
array and discards at least a quarter of what is left, so a rank takes O(log N) rounds and touches
O(log N) pages of each file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_FLIERS = 1000
_SMALL = 2048  # once this few candidates are left, sorting them beats another round


def _arrays(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Plain ndarray views (a memmap's subclass machinery costs on every call), empty ones dropped."""
    return [view for view in (np.asarray(a, dtype=np.float64) for a in arrays) if view.size]


def count_below(arrays: Sequence[np.ndarray], value: float, side: str = "left") -> int:
    """How many values are < `value` (side "left") or <= `value` (side "right")."""
    return int(sum(int(np.searchsorted(a, value, side=side)) for a in _arrays(arrays)))


def _kth(arrays: list[np.ndarray], k: int) -> float:
    sizes = np.array([a.size for a in arrays], dtype=np.int64)
    if not 0 <= k < int(sizes.sum()):
        raise IndexError(f"rank {k} outside 0..{int(sizes.sum()) - 1}")
    lo = np.zeros(len(arrays), dtype=np.int64)
    hi = sizes.copy()
    while True:
        width = hi - lo
        rest = int(width.sum())
        if rest <= _SMALL:
            pool = np.concatenate([a[int(low) : int(high)] for a, low, high in zip(arrays, lo, hi, strict=True)])
            pool.sort()
            return float(pool[k - int(lo.sum())])
        active = np.flatnonzero(width)
        mids = (lo[active] + hi[active]) // 2
        medians = np.array([arrays[i][m] for i, m in zip(active.tolist(), mids.tolist(), strict=True)])
        order = np.argsort(medians, kind="stable")
        cumulative = np.cumsum(width[active][order])
        pivot = float(medians[order[int(np.searchsorted(2 * cumulative, rest, side="left"))]])
        below, upto = lo.copy(), lo.copy()
        for i in active.tolist():
            segment = arrays[i][int(lo[i]) : int(hi[i])]
            below[i] += np.searchsorted(segment, pivot, side="left")
            upto[i] += np.searchsorted(segment, pivot, side="right")
        if k < int(below.sum()):
            hi = below
        elif k >= int(upto.sum()):
            lo = upto
        else:
            return pivot


def kth(arrays: Sequence[np.ndarray], k: int) -> float:
    """The k-th smallest (0-based) value of the arrays' union."""
    return _kth(_arrays(arrays), k)


def kth_pair(arrays: Sequence[np.ndarray], k: int) -> tuple[float, float]:
    """The k-th and (k+1)-th smallest values: one selection plus one round of binary searches."""
    views = _arrays(arrays)
    first = _kth(views, k)
    ends = [int(np.searchsorted(a, first, side="right")) for a in views]
    if sum(ends) > k + 1:
        return first, first
    following = [float(a[end]) for a, end in zip(views, ends, strict=True) if end < a.size]
    if not following:
        raise IndexError(f"rank {k + 1} outside the arrays")
    return first, min(following)


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's `_lerp`, operation for operation, so results are bit-identical to `np.quantile`."""
    diff = b - a
    if t >= 0.5:
        return b - diff * (1 - t)
    return a + diff * t


def quantile(arrays: Sequence[np.ndarray], total: int, q: float) -> float:
    """`np.quantile(union, q)` with method "linear" (what pandas' `Series.quantile` calls); NaN when empty."""
    if total == 0:
        return math.nan
    views = _arrays(arrays)
    virtual = float(np.float64(total - 1) * np.float64(q))
    if virtual >= total - 1:
        return _kth(views, total - 1)
    if virtual < 0:
        return _kth(views, 0)
    previous = math.floor(virtual)
    a, b = kth_pair(views, previous)
    return _lerp(a, b, virtual - previous)


def histogram(arrays: Sequence[np.ndarray], edges: Sequence[float]) -> list[int]:
    """`np.histogram(union, bins=edges)[0]`: bins closed on the left, the last one on both sides."""
    edges = np.asarray(edges, dtype=np.float64)
    below = np.zeros(edges.size, dtype=np.int64)
    last = 0
    for a in _arrays(arrays):
        below += np.searchsorted(a, edges, side="left")
        last += int(np.searchsorted(a, edges[-1], side="right"))
    counts = np.diff(below)
    counts[-1] = last - below[-2]
    return [int(c) for c in counts]


def _flier_ranges(views: list[np.ndarray], low: float, high: float) -> list[tuple[np.ndarray, int, int]]:
    ranges = [(a, 0, int(np.searchsorted(a, low, side="left"))) for a in views]
    ranges += [(a, int(np.searchsorted(a, high, side="right")), a.size) for a in views]
    return [(a, start, stop) for a, start, stop in ranges if stop > start]


def fliers(arrays: Sequence[np.ndarray], low: float, high: float, limit: int = MAX_FLIERS) -> tuple[int, list[float]]:
    """The number of values < `low` or > `high`, and at most `limit` of them, sorted: all when they
    fit, else evenly spaced over the whole run of outliers (so each array's share is proportional)."""
    ranges = _flier_ranges(_arrays(arrays), low, high)
    lengths = np.array([stop - start for _, start, stop in ranges], dtype=np.int64)
    count = int(lengths.sum())
    if count <= limit:
        picked = [a[start:stop] for a, start, stop in ranges]
    else:
        positions = np.arange(limit, dtype=np.int64) * count // limit
        ends = np.cumsum(lengths)
        owner = np.searchsorted(ends, positions, side="right")
        offsets = positions - (ends - lengths)[owner]
        picked = [a[start + offsets[owner == i]] for i, (a, start, _) in enumerate(ranges)]
    sample = np.sort(np.concatenate(picked)) if picked else np.empty(0)
    return count, [float(v) for v in sample]


def box_stats(arrays: Sequence[np.ndarray], total: int, mean: float, limit: int = MAX_FLIERS) -> dict:
    """matplotlib's `cbook.boxplot_stats` (whis=1.5, no bootstrap) of the union: the same quartiles,
    notch and whisker rules; `fliers` is a sample of at most `limit`, `flier_count` counts them all."""
    nan = math.nan
    if total == 0:
        keys = ("mean", "med", "q1", "q3", "iqr", "cilo", "cihi", "whislo", "whishi")
        return {**dict.fromkeys(keys, nan), "fliers": [], "flier_count": 0}
    views = _arrays(arrays)
    q1, med, q3 = (quantile(views, total, q) for q in (0.25, 0.5, 0.75))
    iqr = q3 - q1
    notch = 1.57 * iqr / math.sqrt(total)
    loval, hival = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    upto = count_below(views, hival, side="right")
    highest = _kth(views, upto - 1) if upto else q3
    whishi = q3 if highest < q3 else highest
    below = count_below(views, loval, side="left")
    lowest = _kth(views, below) if below < total else q1
    whislo = q1 if lowest > q1 else lowest
    flier_count, sample = fliers(views, whislo, whishi, limit)
    return {
        "mean": mean,
        "med": med,
        "q1": q1,
        "q3": q3,
        "iqr": iqr,
        "cilo": med - notch,
        "cihi": med + notch,
        "whislo": whislo,
        "whishi": whishi,
        "fliers": sample,
        "flier_count": flier_count,
    }
