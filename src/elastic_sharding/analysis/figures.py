"""The analysis figures, drawn as Data-Juicer 1.6.1's `dj-analyze` draws them, from merged numbers.

Data-Juicer draws from the rows (pandas `Series.hist`, `Series.plot.box`, a word cloud of the
values); across shards the rows are never in one place, so each figure is drawn from what the
shards' merge computed: a histogram's edges and counts (`ax.hist` of one value per bin, weighted
by its count, gives the very bars `np.histogram` of the rows gives), `boxplot_stats` for
`Axes.bxp`, and value frequencies for a categorical histogram and the word cloud. A box plot's
outliers may be a sample: the figure then says how many it shows.

Sizes and styles are Data-Juicer's: 20x16 inches at 100 dpi (2000x1600 px PNGs), its font
(`ANALYZER_FONT`, default "Heiti SC"; matplotlib's default when missing) and ASCII minus signs.
Figures are drawn on matplotlib's default style with the Agg canvas (no pyplot figure, no GUI),
and PNGs are written without the "Software" text, so the same numbers give the same bytes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.style as mpl_style
import numpy as np
from matplotlib.artist import setp
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure

from elastic_sharding import fsops

FIGSIZE = (20, 16)  # Data-Juicer's `figsize=(20, 16)` at matplotlib's default 100 dpi: 2000x1600 px
DPI = 100
CORRELATION_FIGSIZE = (16, 14)
WORDCLOUD_SIZE = (400, 320)
PNG_METADATA: dict[str, str | None] = {"Software": None}
FONT_ENV = "ANALYZER_FONT"
DEFAULT_FONT = "Heiti SC"
CORRELATION_METHODS = ("pearson", "kendall", "spearman")
_GRID_WIDTH, _GRID_HEIGHT = 4, 6  # all-stats.png: inches per sub-figure, as Data-Juicer


def analyzer_font() -> str:
    return os.environ.get(FONT_ENV, DEFAULT_FONT)


def rec_bins(length: int) -> int:
    """Data-Juicer's number of bins for a column of `length` values (NaNs included)."""
    return max(int(math.sqrt(max(int(length), 0))), 10)


@contextlib.contextmanager
def dj_style() -> Iterator[None]:
    """Data-Juicer's matplotlib settings, scoped to one drawing: its font first, ASCII minus signs,
    and the font manager's warnings about a missing font silenced as Data-Juicer silences them."""
    logger = logging.getLogger("matplotlib.font_manager")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with mpl_style.context("default"), mpl.rc_context({"font.sans-serif": [analyzer_font()], "axes.unicode_minus": False}):
            yield
    finally:
        logger.setLevel(level)


def _figure(figsize: tuple[float, float], **kwargs: Any) -> Figure:
    figure = Figure(figsize=figsize, dpi=DPI, **kwargs)
    FigureCanvasAgg(figure)
    return figure


def _png(figure: Figure, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    with dj_style():
        figure.savefig(buffer, format="png", metadata=PNG_METADATA, **{"dpi": DPI, **kwargs})
    figure.clear()
    return buffer.getvalue()


def _write(path: Path, data: bytes) -> None:
    """Replace the file in one step, so that a reader (index.html) never sees half a PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fsops.replace_atomic(path, data, durable=False)


def _file_name(name: str, kind: str) -> str:
    """`<name>-<kind>.png`, Data-Juicer's name; a stat name that would leave the directory is refused."""
    if not name or "/" in name or "\0" in name or os.sep in name or name in (".", ".."):
        raise ValueError(f"stat name {name!r} cannot name a figure file")
    return f"{name}-{kind}.png"


# -- the numbers -----------------------------------------------------------------------------


def _float(value: object) -> float:
    return math.nan if value is None else float(value)  # type: ignore[arg-type]


def _box_stats(result: Mapping[str, Any], label: bool) -> dict[str, Any]:
    box = result.get("box") or {}
    stats: dict[str, Any] = {
        key: _float(box.get(key)) for key in ("med", "q1", "q3", "whislo", "whishi", "mean", "iqr", "cilo", "cihi")
    }
    stats["fliers"] = np.asarray(box.get("fliers") or [], dtype=float)
    if label:
        stats["label"] = str(result["name"])
    return stats


def flier_note(result: Mapping[str, Any]) -> str | None:
    """The note a box plot carries when its outliers are a sample of all of them."""
    box = result.get("box") or {}
    drawn, total = len(box.get("fliers") or []), int(box.get("flier_count") or 0)
    return f"{drawn:,} of {total:,} outliers drawn" if total > drawn else None


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _frequencies(result: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    """A categorical column's values (as text) and counts in first-appearance order; missing
    values are left out, as pandas' `dropna` leaves them out of the histogram."""
    merged: dict[str, float] = {}
    for value, count in result.get("frequencies") or []:
        if not _is_missing(value) and count:
            key = value if isinstance(value, str) else str(value)
            merged[key] = merged.get(key, 0.0) + float(count)
    return list(merged), list(merged.values())


# -- the axes --------------------------------------------------------------------------------


def _draw_hist(ax: Axes, result: Mapping[str, Any]) -> None:
    if result["plot"] == "numeric":
        hist = result["hist"]
        edges = np.asarray(hist["edges"], dtype=float)
        ax.hist(edges[:-1], bins=edges, weights=np.asarray(hist["counts"], dtype=float))
    else:
        values, counts = _frequencies(result)
        ax.hist(values, bins=rec_bins(result["length"]), weights=counts)
    ax.set_xlabel(str(result["name"]))
    ax.set_ylabel("Count")


def _draw_box(ax: Axes, result: Mapping[str, Any], pandas_look: bool) -> None:
    artists = ax.bxp([_box_stats(result, label=pandas_look)])
    if pandas_look:
        colors = [entry["color"] for entry in mpl.rcParams["axes.prop_cycle"]][:3]
        box, median = colors[0], colors[min(2, len(colors) - 1)]
        for part, color in (("boxes", box), ("whiskers", box), ("medians", median), ("caps", box)):
            setp(artists[part], color=color, alpha=1)
    ax.set_ylabel(str(result["name"]))
    note = flier_note(result)
    if note:
        ax.set_title(note)


def hist_figure(result: Mapping[str, Any]) -> Figure:
    """The `<name>-hist.png` figure, as pandas' `Series.hist(bins=..., figsize=(20, 16))` draws it."""
    with dj_style():
        figure = _figure(FIGSIZE)
        ax = figure.gca()
        _draw_hist(ax, result)
        ax.grid(True)
    return figure


def box_figure(result: Mapping[str, Any]) -> Figure:
    """The `<name>-box.png` figure, as pandas' `Series.plot.box(figsize=(20, 16))` draws it."""
    with dj_style():
        figure = _figure(FIGSIZE)
        _draw_box(figure.add_subplot(111), result, pandas_look=True)
    return figure


def _wordcloud(result: Mapping[str, Any]) -> Any:
    """The column's word cloud (None for a column with no value), seeded so that it is reproducible."""
    import matplotlib.font_manager as font_manager
    import wordcloud

    values, counts = _frequencies(result)
    if not values:
        return None
    with dj_style():
        font_path = font_manager.findfont(analyzer_font())
    width, height = WORDCLOUD_SIZE
    cloud = wordcloud.WordCloud(font_path=font_path, width=width, height=height, random_state=0)
    return cloud.generate_from_frequencies(dict(zip(values, counts, strict=True)))


def wordcloud_png(result: Mapping[str, Any]) -> bytes:
    """The `<name>-wordcloud.png` bytes (as `WordCloud.to_file` writes them); a column with no
    value, where Data-Juicer's word cloud fails, gets the cloud's empty black canvas."""
    from PIL import Image

    cloud = _wordcloud(result)
    image = Image.new("RGB", WORDCLOUD_SIZE, "black") if cloud is None else cloud.to_image()
    buffer = io.BytesIO()
    image.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


# -- the files -------------------------------------------------------------------------------


def draw_column(result: dict, directory: Path) -> list[str]:
    """Write the column's figures into `directory` as ColumnWiseAnalysis names them (one file per
    figure); returns their file names."""
    name = str(result["name"])
    if result["plot"] not in ("numeric", "categorical"):
        raise ValueError(f"stat {name!r}: unknown plot kind {result['plot']!r}")
    second = "box" if result["plot"] == "numeric" else "wordcloud"
    hist_name, second_name = _file_name(name, "hist"), _file_name(name, second)
    directory = Path(directory)
    _write(directory / hist_name, _png(hist_figure(result)))
    if second == "box":
        _write(directory / second_name, _png(box_figure(result)))
    else:
        _write(directory / second_name, wordcloud_png(result))
    return [hist_name, second_name]


def _subfigure(subfigures: Any, rows: int, cols: int, grid: tuple[int, int]) -> SubFigure:
    if rows == 1 and cols == 1:
        return subfigures
    if cols == 1:
        return subfigures[grid[0]]
    if rows == 1:
        return subfigures[grid[1]]
    return subfigures[grid]


def all_stats_figure(results: Sequence[Mapping[str, Any]]) -> Figure | None:
    """The `all-stats.png` figure: ColumnWiseAnalysis's grid, a grey sub-figure per column."""
    if not results:
        return None
    from data_juicer.analysis.column_wise_analysis import get_row_col

    rows, cols, grids = get_row_col(len(results), 2)
    with dj_style():
        figure = _figure((cols * 2 * _GRID_WIDTH, rows * _GRID_HEIGHT), layout="constrained")
        subfigures = figure.subfigures(rows, cols, wspace=0.01)
        for result, grid in zip(results, grids, strict=True):
            subfigure = _subfigure(subfigures, rows, cols, grid)
            subfigure.set_facecolor("0.85")
            hist_ax, other_ax = subfigure.subplots(1, 2)
            _draw_hist(hist_ax, result)
            hist_ax.tick_params(axis="x", rotation=25)
            if result["plot"] == "numeric":
                _draw_box(other_ax, result, pandas_look=False)
            else:
                cloud = _wordcloud(result)
                if cloud is not None:
                    other_ax.imshow(cloud, interpolation="bilinear")
                other_ax.axis("off")
            subfigure.suptitle(str(result["name"]), fontsize="x-large", fontweight="bold")
    return figure


def draw_all_stats(results: list[dict], path: Path) -> None:
    """Write Data-Juicer's `all-stats.png` (made only when a recipe sets `save_stats_in_one_file`);
    nothing for no column."""
    figure = all_stats_figure(results)
    if figure is not None:
        _write(path, _png(figure))


def draw_correlation(columns: list[str], matrix: Sequence[Sequence[float]], path: Path, method: str = "pearson") -> None:
    """Write Data-Juicer's `stats-corr-<method>.png` heatmap with its own drawing functions; nothing
    for no column, as Data-Juicer."""
    if method not in CORRELATION_METHODS:
        raise ValueError(f"unknown correlation method {method!r}")
    if not columns:
        return
    import pandas as pd
    from data_juicer.analysis.correlation_analysis import annotate_heatmap, draw_heatmap

    size = len(columns)
    corr = pd.DataFrame(np.asarray(matrix, dtype=float).reshape(size, size), index=list(columns), columns=list(columns))
    with dj_style(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Data-Juicer's annotations of a NaN coefficient warn, and show "--" as there
        figure = _figure(CORRELATION_FIGSIZE)
        ax = figure.subplots()
        im, _ = draw_heatmap(corr, corr.columns, corr.columns, ax=ax, cmap="YlGn", cbarlabel="correlation coefficient")
        annotate_heatmap(im, valfmt="{x:.2f}")
        data = _png(figure, bbox_inches="tight", dpi=figure.dpi, pad_inches=0)
    _write(path, data)


__all__ = [
    "DPI",
    "FIGSIZE",
    "all_stats_figure",
    "box_figure",
    "draw_all_stats",
    "draw_column",
    "draw_correlation",
    "flier_note",
    "hist_figure",
    "rec_bins",
    "wordcloud_png",
]
