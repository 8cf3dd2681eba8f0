"""Exact sums of float64 values as Python integers, so that shards merge by integer addition and
every mean, standard deviation and correlation is the same whatever the cut into shards.

Every finite double is an integer multiple of 2**-1074: Σx·2**1074 (`SCALE`) is an integer, and
so are Σx²·2**2148 and Σxy·2**2148. numpy computes them without a Python step per value:
`np.frexp` gives each value as m·2**e with an integer |m| < 2**53, m is cut into three 18-bit
limbs (the top one signed), and the limbs, or for a product their products summed by level
(below 3·2**36), are added per exponent by `np.bincount`, whose float64 sums stay exact while a
bin gathers at most 2**14 of them; those sums are added up as int64 and folded into one Python
int by shifts. The work is done `_STEP` values at a time, so it needs memory bounded by that.

(A matrix product of 18-bit slices would be faster, but OpenBLAS's threads stall it ~50-fold on
a busy node, and numpy offers no way to keep it to one thread.)

The floats made from these integers are rounded once, correctly: a mean by Python's int
division, a standard deviation or a correlation by `sqrt_ratio`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

SCALE = 1074  # x·2**SCALE is an integer for every finite double x
_BITS = 18
_MASK = (1 << _BITS) - 1
_STEP = 1 << 19  # values (rows × columns or pairs) handled at once: 5 levels of them are 20 MB
_ROWS = 1 << 14  # rows per bincount: 2**14 level sums below 3·2**36 stay below 2**53
_FLUSH = 1 << 8  # steps whose int64 partial sums may add up before folding: 2**8·3·2**50, five levels < 2**62


def _extent(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column: the `np.frexp` exponents of its least and greatest nonzero magnitude (0 where
    it has none) and whether it holds a zero; raises on a value that is not finite, which has no
    exact sum."""
    width = matrix.shape[1]
    top, bottom, zero = np.zeros(width), np.full(width, np.inf), np.zeros(width, dtype=bool)
    rows = max(1, _STEP // width)
    for start in range(0, matrix.shape[0], rows):
        magnitude = np.abs(matrix[start : start + rows])
        top = np.maximum(top, magnitude.max(axis=0))
        bottom = np.minimum(bottom, np.where(magnitude > 0, magnitude, np.inf).min(axis=0))
        zero |= (magnitude == 0).any(axis=0)
    if not np.isfinite(top).all():
        raise ValueError("an exact sum needs finite values")
    bottom[top == 0] = 0.0
    return np.frexp(bottom)[1].astype(np.int64), np.frexp(top)[1].astype(np.int64), zero


def _shifted(total: int, exponent: int) -> int:
    """total·2**exponent, known to be an integer."""
    return total << exponent if exponent >= 0 else total >> -exponent


# -- limbs ---------------------------------------------------------------------------------------


def _split(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`block` (columns × rows) as limbs (3 × columns × rows, float64) and exponents:
    x = (l0 + l1·2**18 + l2·2**36)·2**e, l0 and l1 in [0, 2**18), |l2| <= 2**17."""
    fraction, exponent = np.frexp(block)
    mantissa = np.ldexp(fraction, 53).astype(np.int64)
    limbs = np.stack([mantissa & _MASK, (mantissa >> _BITS) & _MASK, mantissa >> (2 * _BITS)]).astype(np.float64)
    return limbs, exponent.astype(np.int64) - 53


def _fold_levels(levels: np.ndarray, low: int, scale: int) -> int:
    """Σ levels[k, i]·2**(low + i + 18k + scale), exactly."""
    width = levels.shape[1]
    combined = np.zeros(width + _BITS * (levels.shape[0] - 1), dtype=np.int64)
    for k, level in enumerate(levels):
        combined[_BITS * k : _BITS * k + width] += level
    total = 0
    for i in np.flatnonzero(combined).tolist():
        total += int(combined[i]) << i
    return _shifted(total, low + scale)


def _by_exponent(
    matrix: np.ndarray,
    rows: int,
    levels: int,
    lows: np.ndarray,
    highs: np.ndarray,
    weigh: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    scale: int,
) -> list[int]:
    """The limbs' loop: `weigh(limbs, exponents)` gives a step's exact (levels × outputs × rows)
    float64 weights and (outputs × rows) exponents, within [lows, highs] per output."""
    sizes = highs - lows + 1
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    starts = (offsets - lows)[:, None]
    length = int(sizes.sum())
    totals = [0] * lows.size
    acc = np.zeros((levels, length), dtype=np.int64)

    def fold() -> None:
        for o, (offset, size, low) in enumerate(zip(offsets.tolist(), sizes.tolist(), lows.tolist(), strict=True)):
            totals[o] += _fold_levels(acc[:, offset : offset + size], low, scale)
        acc[:] = 0

    for step, start in enumerate(range(0, matrix.shape[0], rows), 1):
        weights, exponents = weigh(*_split(np.ascontiguousarray(matrix[start : start + rows].T)))
        index = (exponents + starts).ravel()
        for level in range(levels):
            acc[level] += np.bincount(index, weights[level].ravel(), minlength=length).astype(np.int64)
        if step % _FLUSH == 0:
            fold()
    fold()
    return totals


def _limb_bounds(bottom: np.ndarray, top: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least and greatest exponent `_split` gives each column (zero's is -53)."""
    low, high = bottom - 53, top - 53
    return np.where(zero, np.minimum(low, -53), low), np.where(zero, np.maximum(high, -53), high)


def _limb_sums(matrix: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> list[int]:
    rows = max(1, min(_ROWS, _STEP // matrix.shape[1]))
    return _by_exponent(matrix, rows, 3, lows, highs, lambda limbs, exponents: (limbs, exponents), SCALE)


def _limb_products(matrix: np.ndarray, pairs: Sequence[tuple[int, int]], lows: np.ndarray, highs: np.ndarray) -> list[int]:
    """Pairs grouped by their first column, whose limbs are broadcast against the second columns'
    (a view where those are consecutive), each product level written in place."""
    order = sorted(range(len(pairs)), key=lambda o: pairs[o])
    groups: dict[int, list[int]] = {}
    for o in order:
        groups.setdefault(pairs[o][0], []).append(pairs[o][1])
    plan, begin = [], 0
    for i, js in groups.items():
        run = js == list(range(js[0], js[0] + len(js)))
        plan.append((i, slice(js[0], js[0] + len(js)) if run else np.array(js, dtype=np.intp), begin, begin + len(js)))
        begin += len(js)
    first = np.array([pairs[o][0] for o in order], dtype=np.intp)
    second = np.array([pairs[o][1] for o in order], dtype=np.intp)
    rows = max(1, min(_ROWS, _STEP // len(pairs)))
    weights = np.empty((5, len(pairs), rows))
    exponents = np.empty((len(pairs), rows), dtype=np.int64)
    terms = [[(k, level - k) for k in range(3) if 0 <= level - k < 3] for level in range(5)]

    def weigh(limbs: np.ndarray, split: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        width = limbs.shape[2]
        for i, js, start, stop in plan:
            a, b = limbs[:, i, None, :], limbs[:, js]
            for level, products in enumerate(terms):
                out = weights[level, start:stop, :width]
                np.multiply(a[products[0][0]], b[products[0][1]], out=out)
                for k, m in products[1:]:
                    out += a[k] * b[m]
            np.add(split[i, None, :], split[js], out=exponents[start:stop, :width])
        return weights[:, :, :width], exponents[:, :width]

    totals = _by_exponent(matrix, rows, 5, lows[first] + lows[second], highs[first] + highs[second], weigh, 2 * SCALE)
    result = [0] * len(pairs)
    for o, total in zip(order, totals, strict=True):
        result[o] = total
    return result


# -- the sums ------------------------------------------------------------------------------------


def moments(matrix: np.ndarray, pairs: Sequence[tuple[int, int]] = ()) -> tuple[list[int], list[int]]:
    """Σ of each column of `matrix` (rows × columns, finite values) times 2**SCALE, and
    Σ matrix[:, i]·matrix[:, j] for each (i, j) of `pairs` (i == j: a sum of squares) times
    2**(2·SCALE), all exact."""
    matrix = np.asarray(matrix, dtype=np.float64)
    width = matrix.shape[1]
    if not matrix.shape[0] or not width:
        return [0] * width, [0] * len(pairs)
    lows, highs = _limb_bounds(*_extent(matrix))
    sums = _limb_sums(matrix, lows, highs)
    products = _limb_products(matrix, pairs, lows, highs) if pairs else []
    return sums, products


def sum_int(values: np.ndarray) -> int:
    """Σx·2**SCALE, exactly."""
    return moments(np.asarray(values, dtype=np.float64).reshape(-1, 1))[0][0]


def square_sum_int(values: np.ndarray) -> int:
    """Σx²·2**(2·SCALE), exactly."""
    return moments(np.asarray(values, dtype=np.float64).reshape(-1, 1), [(0, 0)])[1][0]


def product_sum_int(x: np.ndarray, y: np.ndarray) -> int:
    """Σxy·2**(2·SCALE), exactly."""
    return moments(np.column_stack([np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)]), [(0, 1)])[1][0]


# -- rounded once --------------------------------------------------------------------------------


def _divide(numerator: int, denominator: int) -> float:
    """numerator / denominator correctly rounded (Python's int division), infinite beyond floats."""
    try:
        return numerator / denominator
    except OverflowError:
        return math.inf if (numerator < 0) == (denominator < 0) else -math.inf


def sqrt_ratio(numerator: int, denominator: int) -> float:
    """sqrt(numerator / denominator) correctly rounded (numerator >= 0, denominator > 0): the
    integer square root to at least 60 bits, and a sticky half unit when it is not exact, which
    Python's correctly rounded int division then rounds as the exact root would be."""
    if numerator == 0:
        return 0.0
    shift = max(0, (denominator.bit_length() - numerator.bit_length()) // 2 + 62)
    quotient, remainder = divmod(numerator << (2 * shift), denominator)
    root = math.isqrt(quotient)
    if remainder == 0 and root * root == quotient:
        return _divide(root, 1 << shift)
    return _divide(2 * root + 1, 1 << (shift + 1))


def mean(s1: int, count: int) -> float:
    """Σx / n from the exact Σx·2**SCALE, rounded once; NaN for no value."""
    return s1 / (count << SCALE) if count else math.nan


def m2(s1: int, s2: int, count: int) -> float:
    """Σ(x - mean)² = (n·Σx² - (Σx)²) / n, rounded once; NaN for no value."""
    return _divide(count * s2 - s1 * s1, count << (2 * SCALE)) if count else math.nan


def std(s1: int, s2: int, count: int, ddof: int = 1) -> float:
    """The standard deviation (pandas' default ddof=1: NaN for fewer than two values), rounded once."""
    if count <= ddof:
        return math.nan
    return sqrt_ratio(count * s2 - s1 * s1, (count * (count - ddof)) << (2 * SCALE))


def comoment(sx: int, sy: int, sxy: int, count: int) -> float:
    """Σ(x - mean_x)(y - mean_y) = (n·Σxy - Σx·Σy) / n, rounded once; NaN for no value."""
    return _divide(count * sxy - sx * sy, count << (2 * SCALE)) if count else math.nan


def correlation(count: int, sx: int, sy: int, sxx: int, syy: int, sxy: int) -> float:
    """Pearson's r over `count` rows, rounded once; NaN, as pandas gives it, for no row or for a
    constant side (a zero divisor)."""
    mx, my = count * sxx - sx * sx, count * syy - sy * sy
    if count < 1 or mx == 0 or my == 0:
        return math.nan
    c = count * sxy - sx * sy
    r = sqrt_ratio(c * c, mx * my)
    return -r if c < 0 else r


def encode(value: int) -> str:
    """An exact sum as JSON-safe text: hex digits, then "p" and a power of two ("-1fp3" = -31·2**3)."""
    if not value:
        return "0"
    shift = (value & -value).bit_length() - 1
    return f"{value >> shift:x}p{shift}"


def decode(text: str) -> int:
    digits, _, shift = text.partition("p")
    return int(digits, 16) << int(shift or 0)
