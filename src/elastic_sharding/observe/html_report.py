"""report: one self-contained HTML page with a job's timeline, per-node throughput and shards.

A recipe with deduplicators: the timeline holds the attempts of every segment and a lane per
deduplication stage with its units; a table lists the stages; the nodes, shards and backups
tables are the current segment's, as in `status`.

The page must open from a shared filesystem on a machine with no network, and it shows text
that workers wrote (hostnames, errors, paths), so everything is inline, every such string is
escaped, and a Content-Security-Policy lets only this module's own scripts (by hash) run.
Its style and scripts are the package's `observe/assets/` files, inlined as they are. This module
builds the page and its header; the timeline is `html_timeline`'s, the tables `html_status_tables`'.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from elastic_sharding import fsops
from elastic_sharding.destination import check_target, prepare_destination
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.html_format import NONE, as_dict, dicts, esc, fmt_bytes, fmt_int, fmt_rate, fmt_secs, iso, num
from elastic_sharding.observe.html_status_tables import (
    backups_table,
    failures_table,
    nodes_table,
    refused_table,
    shards_table,
    stages_table,
    stale_table,
    stragglers_table,
)
from elastic_sharding.observe.html_timeline import legend, timeline_svg
from elastic_sharding.observe.snapshot import AttemptView
from elastic_sharding.observe.stages import UnitView
from elastic_sharding.observe.status import Status
from elastic_sharding.vocabulary import SHARD_STATES

STATE_ORDER = SHARD_STATES


# -- assets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Assets:
    css: str
    onerror_js: str  # in <head>, so that an error in the main script is recorded
    main_js: str
    csp: str


def _sha256_source(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def _asset(name: str) -> str:
    """An asset's text without the newline that ends the file."""
    path = importlib.resources.files("elastic_sharding.observe") / "assets" / name
    return path.read_text(encoding="utf-8").removesuffix("\n")


@functools.cache
def _assets() -> _Assets:
    onerror_js, main_js = _asset("onerror.js"), _asset("report.js")
    csp = (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src {_sha256_source(onerror_js)} {_sha256_source(main_js)}; base-uri 'none'; form-action 'none'"
    )
    return _Assets(_asset("report.css"), onerror_js, main_js, csp)


# -- header ----------------------------------------------------------------------------------


def _progress(status: dict[str, Any]) -> tuple[float | None, str]:
    progress = as_dict(status.get("progress"))
    percent = num(progress.get("percent"))
    rows_done = progress.get("rows_done", status.get("rows_done"))
    rows_total = progress.get("rows_total", status.get("rows_total"))
    if percent is None and num(rows_total):
        percent = 100.0 * (num(rows_done) or 0.0) / float(rows_total)
    shards = f"{fmt_int(progress.get('shards_done', as_dict(status.get('counts')).get('done')))}"
    shards += f"/{fmt_int(progress.get('shards_total', status.get('shards_total')))} shards"
    detail = f"{shards}, {fmt_int(rows_done)}/{fmt_int(rows_total)} rows"
    if num(progress.get("bytes_total")):
        detail += f", {fmt_bytes(progress.get('bytes_done'))}/{fmt_bytes(progress.get('bytes_total'))}"
    return percent, detail


def _progress_bar(percent: float) -> str:
    width = 320 * min(max(percent, 0.0), 100.0) / 100
    return (
        '<svg class="progress" width="320" height="12" role="img" aria-label="progress">'
        f'<rect class="progress-bg" width="320" height="12" rx="6"/><rect class="progress-fill" width="{width:.1f}" height="12" rx="6"/>'
        "</svg>"
    )


def _eta(status: dict[str, Any]) -> str:
    eta = as_dict(status.get("eta"))
    if num(eta.get("secs")) is None:
        return NONE
    text = f"{fmt_secs(eta.get('secs'))} (at {iso(eta.get('at'))})" if num(eta.get("at")) else fmt_secs(eta.get("secs"))
    return esc(text + (f", from {eta['basis']}" if eta.get("basis") else ""))


def _throughput(throughput: dict[str, Any]) -> str:
    now = [fmt_rate(throughput.get(key), unit) for key, unit in (("rows_per_sec", "rows"), ("bytes_per_sec", "bytes"))]
    text = ", ".join(rate for rate in now if rate != NONE) or "idle"
    if num(throughput.get("active_workers")) is not None:
        text += f" ({fmt_int(throughput.get('active_workers'))} active worker(s))"
    if num(throughput.get("overall_rows_per_sec")) is not None:
        text += f"; overall {fmt_rate(throughput.get('overall_rows_per_sec'), 'rows')}"
    return text


def _header(status: dict[str, Any], attempts: list[AttemptView], now: float) -> str:
    percent, detail = _progress(status)
    bar = f"{_progress_bar(percent)} <b>{percent:.1f}%</b> · " if percent is not None else ""
    rate = _throughput(as_dict(status.get("throughput")))
    counts = as_dict(status.get("counts"))
    chips = "".join(
        f'<span class="chip st-{esc(state)}">{esc(state)} <b>{fmt_int(counts[state])}</b></span>'
        for state in sorted(counts, key=lambda s: (STATE_ORDER.index(s) if s in STATE_ORDER else 99, str(s)))
    )
    hosts = sorted({view.host for view in attempts})
    items = [
        ("Job directory", f"<code>{esc(status.get('job_dir'))}</code>"),
        ("Job id", f"<code>{esc(status.get('job_id'))}</code>"),
        ("Generated", f"{esc(iso(now))} (status read {esc(iso(status.get('generated_at')))})"),
        ("Progress", bar + esc(detail)),
        ("Elapsed", esc(fmt_secs(status.get("elapsed_secs")))),
        ("Throughput", esc(rate)),
        ("ETA", _eta(status)),
        ("Attempts", f"{len(attempts)} on {len(hosts)} node(s)"),
    ]
    merged = as_dict(status.get("merged"))
    if merged:
        rows = f"{esc(merged.get('output_format'))}, {fmt_int(merged.get('rows'))} rows"
        items.append(("Merged output", f"<code>{esc(merged.get('output'))}</code> ({rows})"))
    elif num(status.get("output_rows")):
        items.append(("Output rows", f"{fmt_int(status.get('output_rows'))} so far (not merged yet)"))
    backups = as_dict(status.get("backup_counts"))
    if num(backups.get("started")):
        counts_text = ", ".join(f"{fmt_int(backups.get(state))} {state}" for state in ("running", "won", "lost", "failed"))
        items.append(("Backups", esc(f"{fmt_int(backups.get('started'))} started: {counts_text}")))
    total = num(status.get("segments_total"))
    if total is not None and total > 1:
        segment = f"{fmt_int(status.get('segment'))} of 0–{int(total) - 1}"
        items.insert(3, ("Recipe segment", esc(segment) + " (progress, nodes and shards below are this segment's)"))
    meta = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in items)
    return f'<header><h1>Job report</h1><dl class="meta">{meta}</dl><div class="chips">{chips}</div></header>'


# -- page ------------------------------------------------------------------------------------


def _json_for_script(status: dict[str, Any], attempts: list[AttemptView], units: list[UnitView]) -> str:
    """The data as JSON that cannot end the <script> element it sits in (every `<` escaped)."""
    payload = {
        "status": status,
        "attempts": [dataclasses.asdict(view) for view in attempts],
        "units": [dataclasses.asdict(unit) for unit in units],
    }
    text = orjson.dumps(payload, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    return text.replace("<", "\\u003c")


def render_report(status: dict[str, Any], attempts: list[AttemptView], now: float, units: list[UnitView] | None = None) -> str:
    """The whole report page; the same inputs always give the same bytes. `units` are the
    deduplication stages' units (`Status.stage_units`), drawn in a lane per stage."""
    assets = _assets()
    units = list(units or [])
    title = f"Job report {status.get('job_id') or ''}".strip()
    stages = dicts(status.get("stages"))
    names = {int(stage["stage"]): str(stage.get("operator") or "") for stage in stages if isinstance(stage.get("stage"), int)}
    sections = [
        _header(status, attempts, now),
        "<section><h2>Timeline</h2>" + legend(attempts, units),
        f'<div class="scroll">{timeline_svg(attempts, now, units, names)}</div></section>',
    ]
    if stages:
        sections.append(f"<section><h2>Deduplication stages</h2>{stages_table(stages)}</section>")
    sections += [
        f"<section><h2>Nodes</h2>{nodes_table(dicts(status.get('nodes')))}</section>",
        f"<section><h2>Shards</h2>{shards_table(dicts(status.get('shards')), attempts, status.get('segment', 0))}</section>",
        f"<section><h2>Backups</h2>{backups_table(dicts(status.get('backups')))}</section>",
        "<section><h2>Problems</h2>",
        f"<h3>Failed shards</h3>{failures_table(dicts(status.get('failures')))}",
        f"<h3>Stragglers</h3>{stragglers_table(dicts(status.get('stragglers')), as_dict(status.get('straggler_rule')))}",
        f"<h3>Refused nodes</h3>{refused_table(dicts(status.get('refused_nodes')))}",
        f"<h3>Stale claims</h3>{stale_table(dicts(status.get('stale_claims')))}</section>",
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{assets.csp}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>\n{assets.css}\n</style>",
            f"<script>{assets.onerror_js}</script>",
            "</head><body>",
            *sections,
            f'<script type="application/json" id="job-data">{_json_for_script(status, attempts, units)}</script>',
            f"<script>{assets.main_js}</script>",
            "</body></html>",
            "",
        ]
    )


def write_report(job_dir: Path, output: Path, lock_timeout: float | None = None) -> int:
    """Render the job's report to `output` (replaced atomically); returns the number of attempt bars."""
    layout = JobLayout(Path(os.path.abspath(job_dir)))
    output = check_target(output, layout)
    status = Status(layout.root, lock_timeout)
    attempts = status.history()
    page = render_report(status.as_json(), attempts, status.at, status.stage_units())
    destination = prepare_destination(output)
    try:
        with fsops.atomic_output(output) as out:
            out.write(page.encode())
            out.commit()
    except BaseException:
        destination.discard()
        raise
    return len(attempts)


__all__ = ["render_report", "write_report"]
