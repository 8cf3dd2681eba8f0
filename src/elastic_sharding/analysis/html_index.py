"""index.html: one page that shows an analysis directory, `overall.csv` and every figure in it.

Data-Juicer's `dj-analyze` leaves a directory of PNGs and a CSV; the page puts them together. It
opens offline from a shared filesystem: its style and script are inline, the figures are the
directory's own files by relative name, and a Content-Security-Policy lets only the page's own
script (by hash) run and loads images only from where the page is. Stat names and string values
come from the data, so every one is escaped. The script marks each figure with the width it
loaded at (`data-natural-width`, 0 for one missing) and fails loudly (`data-errors`) when one is
missing; `data-rendered="ok"` says all loaded.

The look follows the job report's (`observe/assets/report.css`), restated here: this module is
below `observe/` in the package's layering and does not import it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import math
import re
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from elastic_sharding import fsops

INDEX_NAME = "index.html"
ALL_STATS = "all-stats.png"
NONE = "–"
_CORRELATION = re.compile(r"stats-corr-(pearson|kendall|spearman)\.png")
_SECOND_FIGURES = ("box", "wordcloud")
_LONG_TEXT = 80

_CSS = """\
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg2:#f6f8fa;--bad:#cf222e}
*{box-sizing:border-box}
body{margin:0;padding:20px 28px 40px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,
"Noto Sans","DejaVu Sans",sans-serif;color:var(--fg);background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
h3{font-size:14px;margin:18px 0 6px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
ul.notes{margin:8px 0;padding-left:20px;color:var(--muted)}
nav.files a{margin-right:14px}
.scroll{overflow-x:auto;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
thead th{background:var(--bg2);position:sticky;top:0;white-space:nowrap}
tbody th{font-weight:600;white-space:nowrap;background:var(--bg2)}
thead th.stat,td{text-align:right}
td.num{font-variant-numeric:tabular-nums;white-space:nowrap}
td.text{max-width:320px;word-break:break-word}
.none{color:var(--muted)}
.figs{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:12px;align-items:start}
.figs.one{grid-template-columns:minmax(0,1fr)}
figure{margin:0;border:1px solid var(--line);border-radius:6px;padding:6px;background:#fff}
figure img{display:block;max-width:100%;height:auto;margin:0 auto}
figcaption{color:var(--muted);font-size:12px;margin-top:4px;word-break:break-all}
img.broken{min-height:40px;outline:2px solid var(--bad)}"""

_ONERROR_JS = "window.onerror=function(m,s,l,c){var d=document.documentElement.dataset;d.errors=(d.errors?d.errors+'\\n':'')+m+' (line '+l+')';};"

_MAIN_JS = """\
window.addEventListener('load',function(){
var root=document.documentElement,missing=[];
Array.prototype.forEach.call(document.images,function(img){img.setAttribute('data-natural-width',String(img.naturalWidth));
if(!img.naturalWidth){img.classList.add('broken');missing.push(img.getAttribute('src'));}});
root.dataset.images=String(document.images.length);
if(missing.length)throw new Error('figures that did not load: '+missing.join(', '));
root.dataset.rendered='ok';
});"""


def _sha256_source(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


_CSP = (
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
    f"script-src {_sha256_source(_ONERROR_JS)} {_sha256_source(_MAIN_JS)}; base-uri 'none'; form-action 'none'"
)


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def readable(text: str) -> str:
    """A CSV cell as a reader wants it: integers with thousands separators, other numbers to four
    significant digits, anything else as it is."""
    try:
        value = float(text)
    except ValueError:
        return text if len(text) <= _LONG_TEXT else text[: _LONG_TEXT - 1] + "…"
    if not math.isfinite(value):
        return text
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 1e6 or magnitude < 1e-4:
        return f"{value:.4g}"
    decimals = max(0, 3 - math.floor(math.log10(magnitude)))
    shown = f"{value:,.{decimals}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_frame(frame_csv: Path) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """`overall.csv` as pandas writes it: the stats (its header after the first cell) and each row's
    label and cells; no stat and no row for a file that is missing or empty."""
    try:
        with open(frame_csv, newline="", encoding="utf-8") as file:
            rows = list(csv.reader(file))
    except FileNotFoundError:
        return [], []
    if not rows:
        return [], []
    stats = rows[0][1:]
    body = [(row[0] if row else "", (row[1:] + [""] * len(stats))[: len(stats)]) for row in rows[1:]]
    return stats, body


def _cell(text: str) -> str:
    if text == "":
        return f'<td class="num none">{NONE}</td>'
    cls = "num" if _is_number(text) else "text"
    return f'<td class="{cls}" title="{esc(text)}">{esc(readable(text))}</td>'


def _overall_table(stats: list[str], body: list[tuple[str, list[str]]], anchors: dict[str, str]) -> str:
    if not stats:
        return '<p class="none">No overall table.</p>'

    def head(stat: str) -> str:
        name = f"<code>{esc(stat)}</code>"
        return (
            f'<th class="stat"><a href="#{anchors[stat]}">{name}</a></th>' if stat in anchors else f'<th class="stat">{name}</th>'
        )

    header = "<th></th>" + "".join(head(stat) for stat in stats)
    rows = "".join(f"<tr><th>{esc(label)}</th>{''.join(_cell(text) for text in cells)}</tr>" for label, cells in body)
    return f'<div class="scroll"><table class="overall"><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table></div>'


def _figure(name: str) -> str:
    src = esc(quote(name))
    return f'<figure><a href="{src}"><img src="{src}" alt="{esc(name)}"></a><figcaption>{esc(name)}</figcaption></figure>'


def _figures(names: Sequence[str]) -> str:
    cls = "figs one" if len(names) == 1 else "figs"
    return f'<div class="{cls}">' + "".join(_figure(name) for name in names) + "</div>"


def _stat_figures(stats: list[str], figures: list[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Each stat's figures (its histogram, then its box plot or word cloud) and the figures of no stat."""
    listed = dict.fromkeys(figures)
    per_stat = []
    for stat in stats:
        names = [name for kind in ("hist", *_SECOND_FIGURES) if (name := f"{stat}-{kind}.png") in listed]
        for name in names:
            listed.pop(name)
        if names:
            per_stat.append((stat, names))
    return per_stat, list(listed)


def _extras(directory: Path, figures: list[str]) -> list[str]:
    """The correlation heatmaps and all-stats.png, listed or found in the directory."""
    found = {path.name for path in directory.glob("*.png")}
    return [name for name in sorted(set(figures) | found) if name == ALL_STATS or _CORRELATION.fullmatch(name)]


def render_index(directory: Path, frame_csv: Path, figures: list[str], title: str, notes: list[str]) -> str:
    """The page's text; the same inputs and directory give the same text."""
    stats, body = read_frame(frame_csv)
    extras = _extras(directory, figures)
    per_stat, others = _stat_figures(stats, [name for name in figures if name not in extras])
    anchors = {stat: f"stat-{index}" for index, (stat, _) in enumerate(per_stat)}
    notes_html = "".join(f"<li>{esc(note)}</li>" for note in notes)
    files = [name for name in (frame_csv.name, "overall.md") if (directory / name).is_file()]
    sections = [
        f"<header><h1>{esc(title)}</h1>" + (f'<ul class="notes">{notes_html}</ul>' if notes else ""),
        ('<nav class="files">' + "".join(f'<a href="{esc(quote(n))}">{esc(n)}</a>' for n in files) + "</nav>") if files else "",
        "</header>",
        f"<section><h2>Overall</h2>{_overall_table(stats, body, anchors)}</section>",
    ]
    if per_stat:
        sections.append("<section><h2>Stats</h2>")
        sections += [
            f'<section id="{anchors[stat]}" class="stat"><h3><code>{esc(stat)}</code></h3>{_figures(names)}</section>'
            for stat, names in per_stat
        ]
        sections.append("</section>")
    correlations = [name for name in extras if name != ALL_STATS]
    if correlations:
        sections.append(f"<section><h2>Correlation</h2>{_figures(correlations)}</section>")
    if ALL_STATS in extras:
        sections.append(f"<section><h2>All stats</h2>{_figures([ALL_STATS])}</section>")
    if others:
        sections.append(f"<section><h2>Other figures</h2>{_figures(others)}</section>")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>\n{_CSS}\n</style>",
            f"<script>{_ONERROR_JS}</script>",
            "</head><body>",
            *(section for section in sections if section),
            f"<script>{_MAIN_JS}</script>",
            "</body></html>",
            "",
        ]
    )


def write_index(directory: Path, frame_csv: Path, figures: list[str], title: str, notes: list[str]) -> Path:
    """Write `index.html` into the analysis directory (replaced atomically); returns its path."""
    target = Path(directory) / INDEX_NAME
    fsops.replace_atomic(target, render_index(Path(directory), Path(frame_csv), list(figures), title, list(notes)).encode())
    return target


__all__ = ["INDEX_NAME", "read_frame", "readable", "render_index", "write_index"]
