"""The analysis figures and index.html, drawn from merged numbers, against Data-Juicer's own drawing.

Each column's result is made here from raw rows the way the shards' merge makes it (np.histogram
counts and edges, matplotlib's boxplot_stats, first-appearance frequencies); the figures drawn from
it must be the ones pandas and Data-Juicer draw from the rows.
"""

from __future__ import annotations

import io
import logging
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cbook import boxplot_stats
from matplotlib.figure import Figure
from PIL import Image, ImageChops
from support.browser import ARTIFACTS, chromium, needs_chromium, open_report

from elastic_sharding.analysis import figures
from elastic_sharding.analysis.figures import (
    box_figure,
    dj_style,
    draw_all_stats,
    draw_column,
    draw_correlation,
    hist_figure,
    rec_bins,
)
from elastic_sharding.analysis.html_index import readable, write_index

HOSTILE = "<img src=x onerror=alert(1)> \"&' #%"
RNG = np.random.default_rng(7)
COLUMNS = {
    "alnum_ratio": [float(v) for v in np.round(RNG.beta(8, 2, 700), 10)] + [None, 0.01, 0.02],
    "is_good": [True, False, True, True, False, True] * 20,
    "lang": ["en", "zh", "en", "fr", None, "de", "en"] * 15,
    "tags": [["a", "b"], ["b"], [], ["c", "a", "d"], ["e"]] * 12,
    "word_lengths": [[1.0, 2.5], [3.0], [], [7.0, 1.0, 100.0]] * 10,
}


def column_result(name: str, rows: list, flier_limit: int = 1000) -> dict:
    """What the merge hands over for one column, computed here from all its rows at once."""
    data = pd.Series(rows, name=name).explode().infer_objects()
    if pd.api.types.is_bool_dtype(data):
        data = data.astype(int)
    result = {"name": name, "source": "stats", "length": len(data), "describe": {}}
    if pd.api.types.is_numeric_dtype(data):
        values = data.dropna().to_numpy(dtype=float)
        counts, edges = np.histogram(values, bins=rec_bins(len(data)))
        stats = boxplot_stats(values)[0]
        fliers = sorted(stats.pop("fliers").tolist())
        box = {key: float(value) for key, value in stats.items() if key != "label"}
        box |= {"fliers": fliers[:flier_limit], "flier_count": len(fliers)}
        return result | {"plot": "numeric", "hist": {"edges": edges.tolist(), "counts": counts.tolist()}, "box": box}
    frequencies: dict = {}
    for value in data.tolist():
        frequencies[value] = frequencies.get(value, 0) + 1
    return result | {"plot": "categorical", "frequencies": [[value, count] for value, count in frequencies.items()]}


def raw(name: str) -> pd.Series:
    data = pd.Series(COLUMNS[name], name=name).explode().infer_objects()
    return data.astype(int) if pd.api.types.is_bool_dtype(data) else data


def new_figure() -> Figure:
    figure = Figure(figsize=figures.FIGSIZE, dpi=figures.DPI)
    FigureCanvasAgg(figure)
    return figure


def png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    with dj_style():
        figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def same_pixels(a: bytes, b: bytes) -> bool:
    first, second = Image.open(io.BytesIO(a)).convert("RGB"), Image.open(io.BytesIO(b)).convert("RGB")
    return first.size == second.size and ImageChops.difference(first, second).getbbox() is None


def bars(figure: Figure) -> list[tuple[float, float, float]]:
    return [(patch.get_x(), patch.get_width(), patch.get_height()) for patch in figure.axes[0].patches]


@pytest.mark.parametrize("name", list(COLUMNS))
def test_the_histogram_drawn_from_counts_has_the_bars_of_the_rows(name):
    result = column_result(name, COLUMNS[name])
    reference = new_figure()
    with dj_style():
        raw(name).hist(bins=rec_bins(len(raw(name))), figsize=figures.FIGSIZE, figure=reference)
    ours = hist_figure(result)
    assert bars(ours) == pytest.approx(bars(reference), rel=1e-12, abs=1e-12)
    assert len(bars(ours)) == rec_bins(result["length"])
    ax = ours.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == (name, "Count")
    assert all(line.get_visible() for line in ax.get_xgridlines())
    reference.axes[0].set_xlabel(name)
    reference.axes[0].set_ylabel("Count")
    assert png(ours) == png(reference)


@pytest.mark.parametrize("name", ["alnum_ratio", "is_good", "word_lengths"])
def test_the_box_plot_drawn_from_stats_is_the_one_pandas_draws(name):
    reference = new_figure()
    with dj_style():
        ax = raw(name).plot.box(figsize=figures.FIGSIZE, ax=reference.add_subplot(111))
        ax.set_ylabel(name)
    assert png(box_figure(column_result(name, COLUMNS[name]))) == png(reference)


def test_each_column_gets_data_juicers_files_at_its_size(tmp_path):
    written = {name: draw_column(column_result(name, rows), tmp_path) for name, rows in COLUMNS.items()}
    assert written == {
        name: [f"{name}-hist.png", f"{name}-{'wordcloud' if name in ('lang', 'tags') else 'box'}.png"] for name in COLUMNS
    }
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(sum(written.values(), []))
    for path in tmp_path.iterdir():
        size = Image.open(path).size
        assert size == ((400, 320) if path.name.endswith("-wordcloud.png") else (2000, 1600)), path.name


def test_the_same_numbers_give_the_same_bytes(tmp_path):
    for attempt in ("one", "two"):
        (tmp_path / attempt).mkdir()
        for name, rows in COLUMNS.items():
            draw_column(column_result(name, rows), tmp_path / attempt)
        draw_all_stats([column_result(name, rows) for name, rows in COLUMNS.items()], tmp_path / attempt / "all-stats.png")
    first = {path.name: path.read_bytes() for path in (tmp_path / "one").iterdir()}
    second = {path.name: path.read_bytes() for path in (tmp_path / "two").iterdir()}
    assert first == second and len(first) == 2 * len(COLUMNS) + 1
    assert all(b"Matplotlib" not in data for data in first.values())


def test_a_box_plot_of_sampled_outliers_says_so():
    rows = list(RNG.normal(0, 1, 4000)) + list(RNG.normal(0, 1, 300) * 50)
    sampled = column_result("spread", rows, flier_limit=100)
    total = sampled["box"]["flier_count"]
    assert total > 100
    ax = box_figure(sampled).axes[0]
    assert ax.get_title() == f"100 of {total:,} outliers drawn"
    assert sum(len(line.get_xdata()) for line in ax.lines if line.get_marker() == "o") == 100
    assert box_figure(column_result("spread", rows)).axes[0].get_title() == ""


def test_data_juicers_own_column_analysis_draws_the_same_pixels(tmp_path):
    """ColumnWiseAnalysis on the rows, and draw_column on the merged numbers: the same pixels (its
    word clouds are unseeded, so only their size is compared). Its word cloud fails on a missing
    string (NaN reaches WordCloud), so the string columns here have none."""
    import matplotlib.pyplot as plt
    from data_juicer.analysis.column_wise_analysis import ColumnWiseAnalysis

    plt.switch_backend("Agg")
    columns = dict(COLUMNS) | {
        "lang": ["en", "zh", "en", "fr", "de"] * 8,
        "tags": [["a", "b"], ["b"], ["c", "a", "d"], ["e"]] * 10,
    }
    count = min(len(values) for values in columns.values())
    rows = [{name: values[index] for name, values in columns.items()} for index in range(count)]
    top = {name: ("x" if name in ("lang", "tags") else math.nan) for name in columns}
    overall = pd.DataFrame({name: {"count": count, "top": value} for name, value in top.items()})
    logger = logging.getLogger("matplotlib.font_manager")
    level = logger.level
    try:
        with dj_style():
            dataset = {"__dj__stats__": rows, "__dj__meta__": [{} for _ in rows]}
            ColumnWiseAnalysis(dataset, str(tmp_path / "dj"), overall_result=overall, save_stats_in_one_file=False).analyze()
    finally:
        plt.close("all")
        logger.setLevel(level)
    (tmp_path / "ours").mkdir()
    for name in columns:
        for file in draw_column(column_result(name, [row[name] for row in rows]), tmp_path / "ours"):
            theirs, ours = (tmp_path / "dj" / file).read_bytes(), (tmp_path / "ours" / file).read_bytes()
            if file.endswith("-wordcloud.png"):
                assert Image.open(io.BytesIO(theirs)).size == Image.open(io.BytesIO(ours)).size
            else:
                assert same_pixels(theirs, ours), file


def test_all_stats_and_the_correlation_heatmap(tmp_path):
    results = [column_result(name, rows) for name, rows in COLUMNS.items()]
    draw_all_stats(results[:4], tmp_path / "all-stats.png")
    assert Image.open(tmp_path / "all-stats.png").size == (1600, 1200)  # Data-Juicer's 2x2 grid of 16x6-inch rows
    draw_all_stats([], tmp_path / "none.png")
    draw_correlation([], [], tmp_path / "stats-corr-none.png")
    assert not (tmp_path / "none.png").exists() and not (tmp_path / "stats-corr-none.png").exists()
    draw_correlation(["a", "b"], [[1.0, -0.25], [-0.25, 1.0]], tmp_path / "stats-corr-pearson.png")
    draw_correlation(["a", "b"], [[1.0, math.nan], [math.nan, 1.0]], tmp_path / "stats-corr-nan.png")
    assert Image.open(tmp_path / "stats-corr-pearson.png").size[0] > 1000
    with pytest.raises(ValueError, match="method"):
        draw_correlation(["a"], [[1.0]], tmp_path / "x.png", method="cosine")


def test_a_stat_name_that_leaves_the_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot name a figure file"):
        draw_column(column_result("../escape", [1.0, 2.0]), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_numbers_in_the_table_are_readable():
    assert [readable(text) for text in ("1019.0", "0.7942583732", "35.60000000000002", "123456.7", "2.5e-07", "en")] == [
        "1,019",
        "0.7943",
        "35.6",
        "123,457",
        "2.5e-07",
        "en",
    ]


# -- index.html ------------------------------------------------------------------------------


def analysis_dir(tmp_path: Path, columns: dict[str, list]) -> tuple[Path, list[str], list[str]]:
    """An analysis directory: each column's figures, overall.csv (one column per stat), the heatmap."""
    directory = tmp_path / "analysis"
    directory.mkdir()
    drawn = []
    for name, rows in columns.items():
        drawn += draw_column(column_result(name, rows), directory)
    frame = pd.concat([pd.Series(rows, name=name).explode().describe() for name, rows in columns.items()], axis=1)
    frame.to_csv(directory / "overall.csv")
    numeric = [name for name in columns if column_result(name, columns[name])["plot"] == "numeric"]
    corr = pd.DataFrame({name: pd.Series(columns[name]).explode().astype(float) for name in numeric[:2]}).corr()
    draw_correlation(list(corr.columns), corr.to_numpy().tolist(), directory / "stats-corr-pearson.png")
    return directory, drawn, list(columns)


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_a_hostile_stat_name_or_value_stays_text(tmp_path):
    columns = {HOSTILE: [1.0, 2.0, 3.0], "lang": ["<script>alert(2)</script>", "x", "<script>alert(2)</script>"]}
    directory, drawn, _ = analysis_dir(tmp_path, columns)
    page = write_index(directory, directory / "overall.csv", drawn, f"Analysis {HOSTILE}", [f"note {HOSTILE}"]).read_text()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    parser = _Elements()
    parser.feed(page)
    assert [attrs for tag, attrs in parser.tags if tag == "script"] == [{}, {}]
    assert not any(name.startswith("on") for _, attrs in parser.tags for name in attrs)
    sources = [attrs["src"] for tag, attrs in parser.tags if tag == "img"]
    assert "%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E%20%22%26%27%20%23%25-hist.png" in sources
    assert not any(re.search(r"https?:|//", source) for source in sources)
    assert not list(directory.glob(".index.html.tmp*"))


@needs_chromium
def test_chromium_shows_every_figure_and_one_column_per_stat(tmp_path):
    columns = dict(COLUMNS) | {HOSTILE: [1.0, 5.0, 2.0, 8.0]}
    directory, drawn, stats = analysis_dir(tmp_path, columns)
    draw_all_stats([column_result(name, rows) for name, rows in columns.items()], directory / "all-stats.png")
    notes = ["4 shards, 120 rows analysed", "skipped: document_deduplicator (not a stats operator)"]
    page = write_index(directory, directory / "overall.csv", drawn, "Analysis of the test recipe", notes)
    dom = open_report(page, tmp_path / "profile", "analysis-index")
    widths = re.findall(r'<img [^>]*data-natural-width="(\d+)"', dom)
    assert len(widths) == len(re.findall(r"<img ", dom)) == len(drawn) + 2  # + the heatmap and all-stats
    assert all(int(width) > 0 for width in widths)
    assert f'data-images="{len(drawn) + 2}"' in dom
    header = re.search(r'<table class="overall"><thead><tr>(.*?)</tr>', dom).group(1)  # type: ignore[union-attr]
    assert len(re.findall(r"<th[ >]", header)) == 1 + len(stats)
    assert (ARTIFACTS / "analysis-index.png").stat().st_size > 10_000


@needs_chromium
def test_chromium_flags_a_figure_that_is_missing(tmp_path):
    directory, drawn, _ = analysis_dir(tmp_path, {"alnum_ratio": COLUMNS["alnum_ratio"]})
    (directory / drawn[0]).unlink()
    page = write_index(directory, directory / "overall.csv", drawn, "Missing figure", [])
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0
    html_tag = re.search(r"<html[^>]*>", dom.stdout).group(0)  # type: ignore[union-attr]
    assert "data-errors" in html_tag and "alnum_ratio-hist.png" in html_tag and "data-rendered" not in html_tag
    assert 'data-natural-width="0"' in dom.stdout


def test_the_figures_module_imports_neither_pyplot_nor_data_juicer_at_import():
    source = Path(figures.__file__).read_text()
    top_level = [line for line in source.splitlines() if re.match(r"(from|import) ", line)]
    assert not [line for line in top_level if "pyplot" in line or "data_juicer" in line]
