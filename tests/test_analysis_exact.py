"""Exact sums (`analysis/exact.py`) and what they buy: the analysis is byte-identical whatever the
cut into shards.

The sums are checked against `fractions.Fraction` on values that break float sums (subnormals,
huge and tiny magnitudes together, negatives, cancellation), the floats made from them against
an exact rounding of the true value, and the whole analysis (overall.csv and .md, the figures'
numbers, the correlation matrix) of the same rows cut into 1, 2, 3, 7 and 30 shards, and at random
cut points, byte for byte.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_sharding.analysis import columns, correlation, exact, overall
from elastic_sharding.analysis.cooperate import FIGURE_DATA, _figure_data, dumps

STATS = columns.STATS_FIELD
TWO = 2 * exact.SCALE


def fraction_sum(values) -> Fraction:
    return sum((Fraction(float(v)) for v in values), Fraction(0))


def fraction_products(x, y) -> Fraction:
    return sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, y, strict=True)), Fraction(0))


def awkward(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    """Values whose float sums go wrong in the last bits, or worse."""
    if kind == 0:  # every binary order, signs mixed
        return rng.normal(0, 1, n) * 10.0 ** rng.integers(-320, 300, n)
    if kind == 1:  # cancellation
        return np.concatenate([rng.normal(1e6, 1e-3, n), -rng.normal(1e6, 1e-3, n)])
    if kind == 2:  # subnormals, extremes, zeros of both signs
        edges = [5e-324, -5e-324, 2.2250738585072014e-308, -1e-310, 1.7976931348623157e308, -1.7976931348623157e308, 0.0, -0.0]
        return np.array(edges * 3 + rng.normal(0, 1e-315, n).tolist())
    if kind == 3:  # huge and tiny together, which a float sum drops
        return np.array([1e300, 1.0, -1e300, 1e-300] * (n // 4 + 1))
    return rng.integers(-(10**15), 10**15, n).astype(np.float64)


@pytest.mark.parametrize("kind", range(5))
def test_sums_equal_fraction_sums(kind):
    rng = np.random.default_rng(kind)
    for n in (0, 1, 2, 37, 1500):
        x = awkward(rng, n, kind)
        y = rng.permutation(x)[::-1] * (1e-300 if kind == 2 else -0.5)
        assert Fraction(exact.sum_int(x), 2**exact.SCALE) == fraction_sum(x)
        assert Fraction(exact.square_sum_int(x), 2**TWO) == fraction_products(x, x)
        assert Fraction(exact.product_sum_int(x, y), 2**TWO) == fraction_products(x, y)


def test_moments_of_many_columns_and_of_many_steps(monkeypatch):
    """Every column and pair at once, with steps small enough that partial sums are folded many times."""
    monkeypatch.setattr(exact, "_STEP", 96)
    monkeypatch.setattr(exact, "_FLUSH", 3)
    rng = np.random.default_rng(9)
    matrix = np.column_stack([awkward(rng, 400, kind)[:400] for kind in (0, 1, 3, 4)] + [np.zeros(400)])
    pairs = [(i, j) for i in range(5) for j in range(5)] + [(3, 1), (0, 2), (2, 0)]
    sums, products = exact.moments(matrix, pairs)
    assert [Fraction(s, 2**exact.SCALE) for s in sums] == [fraction_sum(matrix[:, c]) for c in range(5)]
    assert [Fraction(p, 2**TWO) for p in products] == [fraction_products(matrix[:, i], matrix[:, j]) for i, j in pairs]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_values_that_are_not_finite_have_no_exact_sum(bad):
    with pytest.raises(ValueError, match="finite"):
        exact.sum_int(np.array([1.0, bad]))


def test_encoded_sums_survive_json():
    for value in (0, 1, -1, 3 << 2000, -(5 << 4000) - 1, exact.square_sum_int(np.array([1.7976931348623157e308] * 3))):
        text = exact.encode(value)
        assert exact.decode(orjson.loads(orjson.dumps(text))) == value


def correctly_rounded(value: float, exact_value: Fraction) -> bool:
    """Whether `value` is the double nearest to `exact_value` (ties either way)."""
    below, above = math.nextafter(value, -math.inf), math.nextafter(value, math.inf)
    return (Fraction(below) + Fraction(value)) / 2 <= exact_value <= (Fraction(value) + Fraction(above)) / 2


def sqrt_correctly_rounded(value: float, square: Fraction) -> bool:
    """Whether `value` is the double nearest to sqrt(square), comparing squares (value >= 0)."""
    below, above = math.nextafter(value, -math.inf), math.nextafter(value, math.inf)
    low, high = (Fraction(below) + Fraction(value)) / 2, (Fraction(value) + Fraction(above)) / 2
    return (low < 0 or low * low <= square) and square <= high * high


def test_sqrt_ratio_is_correctly_rounded():
    rng = random.Random(4)
    cases = [(1, 1), (2, 1), (1, 3), (10**40 + 1, 7), (1, 10**600), (2**2040, 3), (4, 9), (0, 5)]
    cases += [(rng.getrandbits(rng.randint(1, 300)), rng.getrandbits(rng.randint(1, 300)) | 1) for _ in range(300)]
    for numerator, denominator in cases:
        assert sqrt_correctly_rounded(exact.sqrt_ratio(numerator, denominator), Fraction(numerator, denominator))
    assert exact.sqrt_ratio(2**2100, 3) == math.inf  # beyond floats, as pandas' float arithmetic gives it


@pytest.mark.parametrize("seed", range(6))
def test_mean_std_and_correlation_are_correctly_rounded_under_cancellation(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    x = 1e6 + rng.normal(0, 1e-4, n)
    y = -3e8 + 0.5 * (x - 1e6) + rng.normal(0, 1e-5, n)
    (sx, sy), (sxx, syy, sxy) = exact.moments(np.column_stack([x, y]), [(0, 0), (1, 1), (0, 1)])
    fx, fy = [Fraction(float(v)) for v in x], [Fraction(float(v)) for v in y]
    mean_x = sum(fx, Fraction(0)) / n
    var_x = sum(((v - mean_x) ** 2 for v in fx), Fraction(0)) / (n - 1)
    mean_y = sum(fy, Fraction(0)) / n
    var_y = sum(((v - mean_y) ** 2 for v in fy), Fraction(0)) / (n - 1)
    cov = sum(((a - mean_x) * (b - mean_y) for a, b in zip(fx, fy, strict=True)), Fraction(0)) / (n - 1)
    assert exact.mean(sx, n) == float(mean_x)  # Fraction -> float rounds correctly
    assert sqrt_correctly_rounded(exact.std(sx, sxx, n), var_x)
    assert exact.m2(sx, sxx, n) == float(var_x * (n - 1))
    assert exact.comoment(sx, sy, sxy, n) == float(cov * (n - 1))
    r = exact.correlation(n, sx, sy, sxx, syy, sxy)
    assert r > 0 and sqrt_correctly_rounded(r, cov * cov / (var_x * var_y))


def test_degenerate_moments_are_nan_as_pandas_gives_them():
    assert math.isnan(exact.mean(0, 0)) and math.isnan(exact.std(0, 0, 0)) and math.isnan(exact.std(5 << 1074, 25 << 2148, 1))
    (s,), (q,) = exact.moments(np.array([[0.1]] * 3), [(0, 0)])  # a constant: no rounding leaves a spread
    assert exact.std(s, q, 3) == 0.0
    assert math.isnan(exact.correlation(3, s, s, q, q, q)) and math.isnan(exact.correlation(0, 0, 0, 0, 0, 0))


# -- the whole analysis, byte for byte, whatever the cut -------------------------------------


def corpus(count: int = 240, seed: int = 3) -> list[dict]:
    """Statistics of every kind the analysis merges: floats near 1e6 (cancellation), tiny and huge
    magnitudes, ints, numeric lists, strings, booleans, NaN and missing values."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        stats = {
            "near": 1e6 + rng.gauss(0, 1e-3),
            "wide": rng.gauss(0, 1) * 10.0 ** rng.randint(-30, 30),
            "count": rng.randint(0, 5000),
            "ratio": rng.random() if i % 7 else float("nan"),
            "nums": [rng.uniform(-1, 1) * 1e-3 for _ in range(rng.randint(0, 3))],
            "lang": rng.choice(["en", "zh", "fr"]),
            "flag": i % 3 == 0,
        }
        if i % 11 == 4:
            del stats["count"]
        if i % 13 == 5:
            stats["near"] = None
        rows.append({STATS: stats})
    return rows


def analyse(parts: list[list[dict]], directory: Path) -> dict[str, bytes]:
    """What the report unit writes from these shards, but the figures' images: overall.csv and
    .md, figures.json (histograms, box plots, frequencies), each column's describe and the
    correlation matrix (NaN as null)."""
    directory.mkdir()
    dirs, summaries = [], []
    for index, part in enumerate(parts):
        shard_dir = directory / f"shard-{index}"
        shard_dir.mkdir()
        dirs.append(shard_dir)
        summaries.append(orjson.loads(dumps(columns.summarize_shard(iter(part), shard_dir))))
    plan = orjson.loads(dumps({"columns": overall.plan_columns(summaries)}))["columns"]
    results = [orjson.loads(dumps(overall.column_result(column, dirs, [0.1, 0.9]))) for column in plan]
    report = directory / "report"
    report.mkdir()
    overall.write_overall(overall.overall_frame(results), report)
    names, matrix = correlation.merged_correlation(summaries)
    return {
        "overall.csv": (report / "overall.csv").read_bytes(),
        "overall.md": (report / "overall.md").read_bytes(),
        FIGURE_DATA: dumps({r["name"]: _figure_data(r) for r in results}),
        "describe": repr([r.get("describe") for r in results]).encode(),
        "correlation": dumps({"names": names, "matrix": matrix}),
    }


def cut(rows: list[dict], points: list[int]) -> list[list[dict]]:
    bounds = [0, *sorted(points), len(rows)]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[list[dict], dict[str, bytes]]:
    rows = corpus()
    return rows, analyse([rows], tmp_path_factory.mktemp("whole") / "one")


@pytest.mark.parametrize("shards", [2, 3, 7, 30])
def test_the_analysis_is_byte_identical_whatever_the_number_of_shards(whole, tmp_path, shards):
    rows, expected = whole
    points = sorted(random.Random(shards).choices(range(len(rows) + 1), k=shards - 1))
    got = analyse(cut(rows, points), tmp_path / "cut")
    assert got == expected
    matrix = orjson.loads(expected["correlation"])["matrix"]
    assert sum(v is not None and abs(v) < 1 for row in matrix for v in row) > 10, "the pairs correlate, not only NaN"


def test_a_float_merge_would_not_have_been(whole):
    """The corpus does tell merges apart: a float mean of its "near" column depends on the cut."""
    rows, _ = whole
    near = [r[STATS]["near"] for r in rows if r[STATS]["near"] is not None]
    means = {sum(part) / len(part) for part in (near, near[::-1], sorted(near))}
    assert len(means) > 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(points=st.lists(st.integers(0, 240), max_size=12))
def test_property_any_cut_gives_the_same_bytes(whole, tmp_path_factory, points):
    rows, expected = whole
    assert analyse(cut(rows, points), tmp_path_factory.mktemp("cut") / "cut") == expected


_float = st.one_of(
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False),
    st.floats(1e6 - 1, 1e6 + 1),
    st.sampled_from([0.1, 0.2, 0.3, -0.0, 5e-324, 1e-300]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    values=st.lists(st.tuples(_float, _float, st.integers(-(2**40), 2**40)), min_size=1, max_size=40),
    points=st.lists(st.integers(0, 40), max_size=6),
)
def test_property_random_rows_and_cuts(tmp_path_factory, values, points):
    rows = [{STATS: {"a": a, "b": b, "i": i, "l": [a, b]}} for a, b, i in values]
    points = [min(p, len(rows)) for p in points]
    directory = tmp_path_factory.mktemp("rows")
    assert analyse(cut(rows, points), directory / "cut") == analyse([rows], directory / "one")
