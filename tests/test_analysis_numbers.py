"""The analysis' numbers, merged across shards, against Data-Juicer's own analysis of all rows.

Ground truth is Data-Juicer 1.6.1 itself: OverallAnalysis (its `overall.csv`), CorrelationAnalysis
(its correlation frame), and what ColumnWiseAnalysis plots, i.e. numpy's histogram and matplotlib's
`boxplot_stats` of `explode().infer_objects()` of each column. Rows are split into 1, 3 and 7
shards, empty shards included, and every split must give the same answer.
"""

from __future__ import annotations

import csv
import math
import random
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib import cbook

from elastic_sharding import errors
from elastic_sharding.analysis import columns, correlation, overall, select

OverallAnalysis = pytest.importorskip("data_juicer.analysis.overall_analysis").OverallAnalysis
CorrelationAnalysis = pytest.importorskip("data_juicer.analysis.correlation_analysis").CorrelationAnalysis

STATS, META = columns.STATS_FIELD, columns.META_FIELD
ERROR = getattr(errors, "AnalysisError", errors.JobStateError)
SPLITS = (1, 3, 7)


def split(rows: list[dict], shards: int, seed: int = 0) -> list[list[dict]]:
    """`shards` consecutive parts of the rows; from 3 shards on, the middle one is empty."""
    if shards == 1:
        return [rows]
    cuts = sorted(random.Random(seed).choices(range(len(rows) + 1), k=shards - 2))
    bounds = [0, *cuts, len(rows)]
    parts = [rows[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return [*parts[: shards // 2], [], *parts[shards // 2 :]]


def ours(rows: list[dict], shards: int, directory: Path, percentiles=(), seed: int = 0):
    """Our analysis of the rows split into `shards`: (summaries, column results, overall frame)."""
    dirs, summaries = [], []
    for index, part in enumerate(split(rows, shards, seed)):
        shard_dir = directory / f"{shards}-{seed}-{index}"
        shard_dir.mkdir()
        dirs.append(shard_dir)
        summaries.append(columns.summarize_shard(iter(part), shard_dir))
    plan = overall.plan_columns(summaries)
    results = [overall.column_result(column, dirs, list(percentiles)) for column in plan]
    return summaries, results, overall.overall_frame(results)


def dataset(rows: list[dict]) -> dict:
    return {STATS: [row.get(STATS) or {} for row in rows], META: [row.get(META) or {} for row in rows]}


def dj_overall(rows: list[dict], directory: Path, percentiles=()) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OverallAnalysis(dataset(rows), str(directory)).analyze(percentiles=list(percentiles))


def dj_corr(rows: list[dict], directory: Path, draw: bool = True) -> pd.DataFrame | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = CorrelationAnalysis(dataset(rows), str(directory))
        if not draw:  # what analyze() correlates, without its heatmap
            return analysis.stats.corr("pearson") if len(analysis.stats.columns) else None
        import matplotlib.pyplot as plt

        try:
            return analysis.analyze(skip_export=True)
        finally:
            plt.close("all")


def close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-9 or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _cell(text: str) -> float | str:
    try:
        return float(text) if text else math.nan
    except ValueError:
        return text


def assert_same_csv(mine: Path, theirs: Path) -> None:
    with mine.open(newline="") as a, theirs.open(newline="") as b:
        left, right = list(csv.reader(a)), list(csv.reader(b))
    assert [row[0] for row in left] == [row[0] for row in right]
    assert left[0] == right[0]
    for row_a, row_b in zip(left[1:], right[1:], strict=True):
        for x, y in zip(row_a, row_b, strict=True):
            x, y = _cell(x), _cell(y)
            assert type(x) is type(y), (row_a, row_b)
            assert (x == y) if isinstance(x, str) else close(x, y), (row_a, row_b)


def _md_cells(source: Path | str) -> list[list[str]]:
    """The markdown table's labels (first column and header); its widths follow the floats' digits."""
    text = source.read_text() if isinstance(source, Path) else source
    lines = [[cell.strip() for cell in line.split("|")] for line in text.splitlines()]
    return [lines[:1], [line[1] for line in lines[2:]]]


def plotted(rows: list[dict], name: str) -> tuple[int, np.ndarray]:
    """What ColumnWiseAnalysis plots: the exploded column's length and its non-missing values."""
    ds = dataset(rows)
    stats, meta = pd.DataFrame(ds[STATS]), pd.DataFrame(ds[META])
    meta = meta[[c for c in meta.columns if c.startswith(columns.DEFAULT_PREFIX)]]
    data = pd.concat([stats, meta], axis=1)[name].explode().infer_objects()
    if pd.api.types.is_bool_dtype(data):
        data = data.astype(int)
    return len(data), np.asarray(data.dropna()._values)


def check_against_dj(rows: list[dict], tmp_path: Path, percentiles=(), splits=SPLITS, draw=True, seed=0) -> list[list[dict]]:
    """Our overall.csv, figures' numbers and correlation for each split equal Data-Juicer's."""
    dj_dir = tmp_path / "dj"
    theirs = dj_overall(rows, dj_dir, percentiles)
    dj_dir.mkdir(exist_ok=True)
    theirs.to_csv(dj_dir / "overall.csv")
    corr = dj_corr(rows, tmp_path / "dj-corr", draw=draw)
    every = []
    for shards in splits:
        summaries, results, frame = ours(rows, shards, tmp_path, percentiles, seed)
        every.append(results)
        mine = tmp_path / f"ours-{shards}"
        mine.mkdir()
        overall.write_overall(frame, mine)
        assert_same_csv(mine / "overall.csv", dj_dir / "overall.csv")
        assert _md_cells(mine / "overall.md") == _md_cells(theirs.to_markdown())
        for result in results:
            check_plot(rows, result)
        names, matrix = correlation.merged_correlation(summaries)
        if corr is None:
            assert names == []
            continue
        assert names == list(corr.columns)
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                assert close(value, float(corr.iloc[i, j])), (names[i], names[j], value, corr.iloc[i, j])
    return every


def check_plot(rows: list[dict], result: dict) -> None:
    length, values = plotted(rows, result["name"])
    assert result["length"] == length
    if result["plot"] == "categorical":
        assert result["frequencies"] == [[k, int(v)] for k, v in pd.Series(values).value_counts(sort=False).items()]
        return
    counts, edges = np.histogram(values, bins=max(int(math.sqrt(length)), 10))
    assert result["hist"]["edges"] == edges.tolist()
    assert result["hist"]["counts"] == counts.tolist()
    expected = cbook.boxplot_stats(values)[0]
    box = result["box"]
    for key in ("med", "q1", "q3", "iqr", "cilo", "cihi", "whislo", "whishi"):
        assert box[key] == expected[key] or (math.isnan(box[key]) and math.isnan(expected[key])), key
    assert close(box["mean"], float(expected["mean"]))
    assert box["flier_count"] == len(expected["fliers"])
    assert set(box["fliers"]) <= set(expected["fliers"].tolist())
    assert len(box["fliers"]) == min(len(expected["fliers"]), select.MAX_FLIERS)


def rows_of(stats: list[dict], meta: list[dict] | None = None) -> list[dict]:
    meta = meta or [{} for _ in stats]
    return [{STATS: s, META: m} for s, m in zip(stats, meta, strict=True)]


# -- edge cases --------------------------------------------------------------------------------


def test_one_row(tmp_path):
    check_against_dj(rows_of([{"a": 3, "b": 0.5, "s": "x", "l": [1, 2]}]), tmp_path, [0.01, 0.999])


@pytest.mark.parametrize("count", [1, 2, 9, 10])
def test_all_values_equal(tmp_path, count):
    check_against_dj(rows_of([{"a": 0.1, "b": 7, "c": 1.1, "s": "same", "l": [0.3, 0.3]} for _ in range(count)]), tmp_path)


@pytest.mark.parametrize("count", [11, 12])  # an odd and an even number of rows
def test_ints_only(tmp_path, count):
    rng = random.Random(count)
    check_against_dj(rows_of([{"a": rng.randint(-50, 50), "b": i * i} for i in range(count)]), tmp_path, [0.01, 0.999])


def test_missing_and_nan_values(tmp_path):
    stats = []
    for i in range(40):
        row = {"a": None if i % 5 == 0 else i / 7, "b": float("nan") if i % 3 == 0 else i % 4, "c": i}
        if i % 6 == 0:
            del row["c"]
        if i % 4 == 0:
            row["late"] = i * 1.5
        stats.append(row)
    check_against_dj(rows_of(stats), tmp_path, [0.01, 0.999])


def test_list_valued_stats(tmp_path):
    rng = random.Random(3)
    stats = []
    for i in range(60):
        numbers = [rng.choice([1, 2.5, -3, 10, 0.25]) for _ in range(rng.randint(0, 4))]
        words = [rng.choice("abc") for _ in range(rng.randint(0, 3))]
        stats.append({"nums": None if i % 7 == 3 else numbers, "words": None if i % 9 == 4 else words, "x": i % 5})
    check_against_dj(rows_of(stats), tmp_path, [0.1, 0.9, 0.999])


def test_columns_absent_from_whole_shards(tmp_path):
    """A numeric-list column is 0 where it is missing (correlation), a numeric one NaN: shards that
    never saw a column must count it as such."""
    stats = [{"x": i % 7, "y": (i * 5) % 11} for i in range(30)]
    for i in range(6):
        stats[i]["nums"] = [i, 2 * i + 1] if i % 4 else []
        stats[i]["early"] = i * 0.5
    for i in range(24, 30):
        stats[i]["late"] = [i % 3]
    for i in range(12, 14):
        stats[i]["middle"] = None
    check_against_dj(rows_of(stats), tmp_path, splits=(1, 3, 7, 30))


def test_tied_top_strings(tmp_path):
    values = ["b", "a", "c", "a", "b", "c", None, "d"] * 3
    check_against_dj(rows_of([{"s": v, "t": ["q", "p"] if i % 2 else ["p", "q"]} for i, v in enumerate(values)]), tmp_path)


def test_bool_stat(tmp_path):
    check_against_dj(rows_of([{"flag": i % 3 == 1, "other": i % 4 == 0, "v": i} for i in range(25)]), tmp_path)


def test_all_null_columns(tmp_path):
    """Every row None: object dtype, skipped; None mixed with missing keys: float64, all NaN, described."""
    stats = [{"none": None, "v": i, **({"gaps": None} if i % 2 else {})} for i in range(9)]
    every = check_against_dj(rows_of(stats), tmp_path)
    assert [r["name"] for r in every[0]] == ["v", "gaps"]
    assert every[0][1]["describe"]["count"] == 0.0


def test_skipped_like_data_juicer(tmp_path):
    """Booleans with missing values, and an int before a string, are objects Data-Juicer skips."""
    stats = [{"flag": True if i % 2 else None, "mix": 1 if i == 0 else "x", "v": i} for i in range(6)]
    every = check_against_dj(rows_of(stats), tmp_path)
    assert [r["name"] for r in every[0]] == ["v"]


def test_meta_columns(tmp_path):
    meta = [{"__dj__tag": "t" + str(i % 3), "plain": i, "__dj__n": i * 2} for i in range(10)]
    stats = [{"a": i} for i in range(10)]
    rows = rows_of(stats, meta)
    del rows[3][STATS], rows[4][META]
    rows[5][STATS] = None
    every = check_against_dj(rows, tmp_path)
    assert [(r["source"], r["name"]) for r in every[0]] == [("stats", "a"), ("meta", "__dj__tag"), ("meta", "__dj__n")]


def test_no_rows_and_no_columns(tmp_path):
    check_against_dj(rows_of([{}, {}]), tmp_path)
    (tmp_path / "none").mkdir()
    _, results, frame = ours([], 3, tmp_path / "none")
    assert results == [] and frame.equals(pd.DataFrame([]).T)


def test_many_rows_and_fliers(tmp_path):
    rng = np.random.default_rng(5)
    values = np.round(rng.standard_cauchy(10_000), 4)
    stats = [{"c": float(v), "k": int(rng.integers(0, 3))} for v in values]
    every = check_against_dj(rows_of(stats), tmp_path, [0.01, 0.999], splits=(1, 7), draw=False)
    assert every[0][0]["box"]["flier_count"] > select.MAX_FLIERS == len(every[0][0]["box"]["fliers"])


@pytest.mark.parametrize(
    "stats",
    [
        [{"m": "a"}, {"m": 1}],  # a string first, then a number: pandas describes the mixture
        [{"m": [True]}, {"m": [False, True]}],  # lists of booleans
        [{"m": [1]}, {"m": ["a"]}],  # lists of numbers and of strings
        [{"m": 2**70}],
    ],
)
def test_unreproducible_columns_raise(tmp_path, stats):
    with pytest.raises(ERROR, match="'m'"):
        ours(rows_of(stats), 3, tmp_path)


def test_infinite_value_raises(tmp_path):
    with pytest.raises(ERROR, match="infinite"):
        ours(rows_of([{"m": 1.0}, {"m": float("inf")}]), 1, tmp_path)


def test_summary_survives_json(tmp_path):
    orjson = pytest.importorskip("orjson")
    rows = rows_of([{"a": float("nan"), "l": [float("nan"), 1]}, {"a": 2, "l": []}])
    summary = columns.summarize_shard(rows, tmp_path)
    assert orjson.loads(orjson.dumps(summary)) == summary


@pytest.mark.parametrize(
    "stats",
    [
        [{"m": [True], "x": 1}, {"m": [False, True], "x": 2}, {"m": [], "x": 5}, {"x": 3, "m": [True, False, False]}],
        [{"m": [1.5, float("nan")], "x": 1}, {"m": [2], "x": 2}, {"m": [4, 1], "x": 0}, {"m": None, "x": 7}],
        [{"m": 1, "x": 1}, {"m": True, "x": 2}, {"x": 4, "m": 3}],  # ints and booleans: objects, dropped
        [{"m": 1.0, "x": 1}, {"m": float("inf"), "x": 2}, {"x": 4, "m": 3.0}, {"x": 5, "m": 2.0}],  # inf: not finite, left out
        [{"m": 1.0, "x": 1}],
    ],
)
def test_correlation_of_columns_the_overall_refuses(tmp_path, stats):
    """Columns the overall analysis cannot take still correlate as CorrelationAnalysis correlates them."""
    rows = rows_of(stats)
    expected = dj_corr(rows, tmp_path / "dj")
    for shards in (1, 3):
        summaries = []
        for index, part in enumerate(split(rows, shards)):
            (tmp_path / f"{shards}-{index}").mkdir()
            summaries.append(columns.summarize_shard(part, tmp_path / f"{shards}-{index}"))
        names, matrix = correlation.merged_correlation(summaries)
        assert names == list(expected.columns)
        assert all(close(matrix[i][j], float(expected.iloc[i, j])) for i in range(len(names)) for j in range(len(names)))


# -- a property ------------------------------------------------------------------------------

_number = st.one_of(st.integers(-20, 20), st.sampled_from([0.5, -1.25, 3.75, 100.0, 1e-3, 1e6 + 0.1, -2.5e-7]))
_VALUES = {
    "int": st.integers(-30, 30),
    "float": st.one_of(_number, st.just(float("nan"))),
    "list": st.lists(_number, max_size=3),
    "strlist": st.lists(st.sampled_from(["x", "y", "z"]), max_size=3),
    "str": st.sampled_from(["x", "y", "z", "w"]),
}


@st.composite
def _rows(draw):
    """Rows of up to five stats, each of one kind, with None and missing keys (bools have neither:
    with them, Data-Juicer skips the column, covered above)."""
    kinds = draw(st.lists(st.sampled_from([*_VALUES, "bool"]), min_size=1, max_size=5))
    stats = []
    for _ in range(draw(st.integers(1, 30))):
        row = {}
        for i, kind in enumerate(kinds):
            name = f"{kind}{i}"
            if kind == "bool":
                row[name] = draw(st.booleans())
            elif draw(st.integers(0, 5)) == 0:
                if draw(st.booleans()):
                    row[name] = None
            else:
                row[name] = draw(_VALUES[kind])
        stats.append(row)
    return rows_of(stats)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    rows=_rows(),
    percentiles=st.lists(st.sampled_from([0.01, 0.1, 0.5, 0.9, 0.999]), max_size=3, unique=True),
    seed=st.integers(0, 10_000),
)
def test_property_matches_data_juicer(tmp_path_factory, rows, percentiles, seed):
    check_against_dj(rows, tmp_path_factory.mktemp("p"), percentiles, draw=False, seed=seed)


# -- selection over large memory-mapped arrays ----------------------------------------------


def test_selection_on_large_memmaps(tmp_path):
    rng = np.random.default_rng(11)
    arrays = []
    for i in range(6):
        size = [0, 1, 150_000, 300_000, 7, 250_000][i]
        values = np.round(rng.normal(i, 3, size), 1) if i % 2 else rng.exponential(2.0, size)
        values.sort()
        values.astype("<f8").tofile(tmp_path / f"a{i}.f8")
        arrays.append(np.memmap(tmp_path / f"a{i}.f8", dtype="<f8", mode="r") if size else np.empty(0))
    union = np.concatenate(arrays)
    ordered = np.sort(union)
    for k in [0, 1, len(union) // 2, len(union) - 1, *rng.integers(0, len(union), 20).tolist()]:
        assert select.kth(arrays, k) == ordered[k]
    for q in [0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.999, 1.0, 1 / 3]:
        assert select.quantile(arrays, len(union), q) == np.quantile(union, q)
    edges = np.histogram_bin_edges(union, bins=int(math.sqrt(len(union))))
    assert select.histogram(arrays, edges) == np.histogram(union, bins=edges)[0].tolist()
    for value in (-1.0, 0.0, 2.5, 100.0):
        assert select.count_below(arrays, value) == int((union < value).sum())
        assert select.count_below(arrays, value, side="right") == int((union <= value).sum())
    box = select.box_stats(arrays, len(union), float(union.mean()))
    expected = cbook.boxplot_stats(union)[0]
    assert all(box[key] == expected[key] for key in ("med", "q1", "q3", "iqr", "cilo", "cihi", "whislo", "whishi"))
    assert box["flier_count"] == len(expected["fliers"]) and len(box["fliers"]) == select.MAX_FLIERS
    assert set(box["fliers"]) <= set(expected["fliers"].tolist())
