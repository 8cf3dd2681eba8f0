"""report: one self-contained HTML page with a job's timeline, per-node throughput and shards.

A recipe with deduplicators: the timeline holds the attempts of every segment and a lane per
deduplication stage with its units; a table lists the stages; the nodes, shards and backups
tables are the current segment's, as in `status`.

The page must open from a shared filesystem on a machine with no network, and it shows text
that workers wrote (hostnames, errors, paths), so everything is inline, every such string is
escaped, and a Content-Security-Policy lets only this module's own scripts (by hash) run.
Its style and scripts are the package's `observe/assets/` files, inlined as they are.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import importlib.resources
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from elastic_sharding import fsops
from elastic_sharding.destination import check_target, prepare_destination
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.html_format import NONE, as_dict, dicts, esc, fmt_bytes, fmt_int, fmt_rate, fmt_secs, iso, num
from elastic_sharding.observe.html_tables import Column, number, table
from elastic_sharding.observe.html_timeline import legend, timeline_svg
from elastic_sharding.observe.snapshot import AttemptView
from elastic_sharding.observe.stages import PHASES, UnitView
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


# -- tables ----------------------------------------------------------------------------------


def _running_text(item: dict[str, Any]) -> str:
    parts = [f"<code>{esc(item.get('shard_id'))}</code>"]
    detail = [str(item["phase"])] if item.get("phase") else []
    age, expected = num(item.get("age_secs")), num(item.get("expected_secs"))
    if age is not None:
        detail.append(f"{fmt_secs(age)}" + (f" of ~{fmt_secs(expected)}" if expected else ""))
    fraction = num(item.get("est_fraction"))
    if fraction is not None:
        detail.append(f"~{fraction * 100:.0f}%")
    if detail:
        parts.append(f"({esc(', '.join(detail))})")
    if item.get("backup_of"):
        parts.append("<em>backup</em>")
    if item.get("straggler"):
        parts.append('<span class="flag">straggler</span>')
    return " ".join(parts)


def _warm_text(item: dict[str, Any]) -> str:
    """A node's warm operator: instances, model loads, and the share of time all were busy."""
    fraction = num(item.get("all_busy_fraction"))
    busy = NONE if fraction is None else f"{fraction * 100:.0f}%"
    deaths = f", {fmt_int(item.get('deaths'))} replaced" if num(item.get("deaths")) else ""
    return (
        f"<code>{esc(item.get('op'))}</code> {fmt_int(item.get('instances'))} instance(s), "
        f"{fmt_int(item.get('loads'))} load(s){esc(deaths)}, all busy {busy}"
    )


def _lines(items: object, text: Callable[[dict[str, Any]], str]) -> str:
    return "<br>".join(text(item) for item in dicts(items)) or f'<span class="none">{NONE}</span>'


def _nodes_table(nodes: list[dict[str, Any]]) -> str:
    columns: list[Column[dict[str, Any]]] = [
        Column("Host", lambda node: esc(node.get("host")), cls="mono nowrap"),
        number("Workers", "active_workers", fmt_int),
        number("Shards done", "shards_done", fmt_int),
        number("Rows done", "rows_done", fmt_int),
        number("Bytes done", "bytes_done", fmt_bytes),
        number("Rows/s", "rows_per_sec", lambda value: fmt_rate(value, "rows")),
        number("Bytes/s", "bytes_per_sec", lambda value: fmt_rate(value, "bytes")),
        number("Failures", "failures", fmt_int),
        Column("Running now", lambda node: _lines(node.get("running"), _running_text)),
        Column("Warm operators", lambda node: _lines(node.get("warm_operators"), _warm_text)),
    ]
    return table(columns, sorted(nodes, key=lambda n: str(n.get("host"))), sortable=True)


def _phase_units(stage: dict[str, Any], phase: str) -> str:
    units = as_dict(as_dict(stage.get("units")).get(phase))
    if not units or (not num(units.get("done")) and not num(units.get("held")) and units.get("total") in (None, 0)):
        return NONE
    total = units.get("total")
    text = f"{fmt_int(units.get('done'))}/{'?' if total is None else fmt_int(total)}"
    if num(units.get("held")):
        text += f" ({fmt_int(units.get('held'))} held)"
    return esc(text)


def _stages_table(stages: list[dict[str, Any]]) -> str:
    def phase(stage: dict[str, Any]) -> str:
        if stage.get("phase") is None:
            return NONE
        return esc(stage.get("phase")) + (
            f" (round {fmt_int(stage.get('round'))})" if num(stage.get("round")) is not None else ""
        )

    def when(stage: dict[str, Any]) -> str:
        if num(stage.get("finished_at")) is not None and num(stage.get("started_at")) is not None:
            return esc(f"took {fmt_secs(float(stage['finished_at']) - float(stage['started_at']))}")
        if num(stage.get("eta_secs")) is not None:
            return esc(f"ETA {fmt_secs(stage.get('eta_secs'))}")
        return NONE

    columns: list[Column[dict[str, Any]]] = [
        number("Stage", "stage", fmt_int),
        Column("Operator", lambda stage: f"<code>{esc(stage.get('operator'))}</code>", cls="nowrap"),
        Column("State", lambda stage: esc(stage.get("state")), cls=lambda stage: f"stage-{esc(stage.get('state'))}"),
        Column("Phase", phase),
        *(
            Column(
                name.capitalize(), lambda stage, name=name: _phase_units(stage, name), title=f"{name} units: done/total (held)"
            )
            for name in PHASES
        ),
        Column("Started", lambda stage: esc(iso(stage.get("started_at"))), cls="nowrap"),
        Column("Took / ETA", when, cls="nowrap"),
        Column("Error", lambda stage: f"<pre>{esc(stage.get('error'))}</pre>" if stage.get("error") else "", cls="err"),
    ]
    return table(columns, stages)


def _shards_table(shards: list[dict[str, Any]], attempts: list[AttemptView], segment: object = 0) -> str:
    recorded: dict[str, int] = {}
    for view in attempts:
        if view.segment == (segment if isinstance(segment, int) else 0):
            recorded[view.shard_id] = recorded.get(view.shard_id, 0) + 1
    position = {id(shard): index for index, shard in enumerate(shards)}  # the Shard column sorts back to this order

    def shard_id(shard: dict[str, Any]) -> str:
        return str(shard.get("shard_id"))

    def state(shard: dict[str, Any]) -> str:
        return str(shard.get("state"))

    columns: list[Column[dict[str, Any]]] = [
        Column(
            "Shard", lambda shard: f"<code>{esc(shard_id(shard))}</code>", sort=lambda shard: position[id(shard)], cls="nowrap"
        ),
        Column(
            "State",
            lambda shard: esc(state(shard)),
            sort=lambda shard: STATE_ORDER.index(state(shard)) if state(shard) in STATE_ORDER else len(STATE_ORDER),
            cls=lambda shard: f"state-{state(shard)}" if state(shard) in STATE_ORDER else "",
        ),
        number("Rows in", "input_rows", fmt_int),
        number("Bytes in", "input_bytes", fmt_bytes),
        number("Rows out", "output_rows", fmt_int),
        Column("Host", lambda shard: esc(shard.get("host")), cls="mono nowrap"),
        Column("Attempt", lambda shard: esc(shard.get("attempt_id")), cls="mono"),
        number("Attempts", "attempts", fmt_int, title="attempts counted by status"),
        Column(
            "Recorded",
            lambda shard: fmt_int(recorded.get(shard_id(shard), 0)),
            value=lambda shard: recorded.get(shard_id(shard), 0),
            title="attempt directories found, those archived by retry included (bars on the timeline)",
        ),
        number("Failures", "failures", fmt_int),
        number("Took", "secs", fmt_secs, title="processing time of the attempt that completed the shard"),
        Column(
            "Last error", lambda shard: f"<pre>{esc(shard.get('last_error'))}</pre>" if shard.get("last_error") else "", cls="err"
        ),
    ]
    return table(columns, shards, shard=shard_id, sortable=True)


# The columns the problem tables share.
_SHARD: Column[dict[str, Any]] = Column("Shard", lambda item: f"<code>{esc(item.get('shard_id'))}</code>", cls="nowrap")
_HOST: Column[dict[str, Any]] = Column("Host", lambda item: esc(item.get("host")), cls="mono nowrap")
_ATTEMPT: Column[dict[str, Any]] = Column("Attempt", lambda item: esc(item.get("attempt_id")), cls="mono")


def _item_shard(item: dict[str, Any]) -> object:
    return item.get("shard_id")


def _failures_table(failures: list[dict[str, Any]]) -> str:
    columns = [
        _SHARD,
        Column("State", lambda item: esc(item.get("state"))),
        number("Failures", "failures", fmt_int),
        Column("Last error", lambda item: f"<pre>{esc(item.get('error'))}</pre>", cls="err"),
        Column("Log", lambda item: f"<code>{esc(item.get('log'))}</code>"),
    ]
    return table(columns, failures, shard=_item_shard)


def _factor(value: object) -> str:
    factor = num(value)
    return NONE if factor is None else f"{factor:.1f}×"


def _stragglers_table(stragglers: list[dict[str, Any]], rule: dict[str, Any]) -> str:
    """The stragglers, under the rule that flagged them: the backup trigger (`straggler_rule`)."""
    columns = [
        _SHARD,
        _HOST,
        _ATTEMPT,
        number("Running for", "age_secs", fmt_secs),
        number("Factor", "factor", _factor),
        Column("Why", lambda item: esc(item.get("straggler_reason") or NONE)),
    ]
    caption, factor = "", num(rule.get("factor"))
    if factor is not None:
        caption = (
            f"Processing over {factor:g}× the median shard's time for its size and {num(rule.get('min_secs')) or 0:g}s past it: "
            + ("an idle worker backs it up." if rule.get("backups") else "backups are off for this job (--backup-after 0).")
        )
    return (f'<p class="note">{esc(caption)}</p>' if caption else "") + table(columns, stragglers, shard=_item_shard)


# A backup's state in the colours of the shard state it resembles.
_BACKUP_STATE_CLASS = {"running": "state-running", "won": "state-done", "failed": "state-failed", "stale": "state-stale"}


def _backup_state(item: dict[str, Any]) -> str:
    text = esc(item.get("state"))
    if item.get("promoted"):
        text += " (handed the claim)"
    if item.get("nondeterministic") is True:
        text += ' <span class="flag">NOT DETERMINISTIC</span>'
    return text


def _backups_table(backups: list[dict[str, Any]]) -> str:
    columns = [
        _SHARD,
        Column("Original host", lambda item: esc(item.get("of_host")), cls="mono nowrap"),
        Column("Backup host", lambda item: esc(item.get("host")), cls="mono nowrap"),
        Column("State", _backup_state, cls=lambda item: _BACKUP_STATE_CLASS.get(str(item.get("state")), "")),
        number("Backup secs", "backup_secs", fmt_secs),
        number("Original secs", "original_secs", fmt_secs, title="the original's time when it stopped or the backup won"),
        number("Behind", "behind_secs", fmt_secs, title="how much longer the original had run than the backup needed"),
        number("Saved", "saved_secs", fmt_secs, title="known only when both attempts finished"),
        Column("Why", lambda item: esc(item.get("reason"))),
    ]
    return table(columns, backups, shard=_item_shard, sortable=True)


def _refused_table(refused: list[dict[str, Any]]) -> str:
    columns = [
        _HOST,
        number("PID", "pid", esc),
        Column("Reason", lambda item: esc(item.get("reason"))),
        number("Ago", "age_secs", fmt_secs),
        Column("Message", lambda item: f"<pre>{esc(item.get('message'))}</pre>", cls="err"),
    ]
    return table(columns, refused)


def _stale_table(stale: list[dict[str, Any]]) -> str:
    columns = [
        _SHARD,
        _HOST,
        number("PID", "pid", esc),
        _ATTEMPT,
        number("No heartbeat for", "heartbeat_age_secs", fmt_secs),
    ]
    return table(columns, stale, shard=_item_shard)


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
        sections.append(f"<section><h2>Deduplication stages</h2>{_stages_table(stages)}</section>")
    sections += [
        f"<section><h2>Nodes</h2>{_nodes_table(dicts(status.get('nodes')))}</section>",
        f"<section><h2>Shards</h2>{_shards_table(dicts(status.get('shards')), attempts, status.get('segment', 0))}</section>",
        f"<section><h2>Backups</h2>{_backups_table(dicts(status.get('backups')))}</section>",
        "<section><h2>Problems</h2>",
        f"<h3>Failed shards</h3>{_failures_table(dicts(status.get('failures')))}",
        f"<h3>Stragglers</h3>{_stragglers_table(dicts(status.get('stragglers')), as_dict(status.get('straggler_rule')))}",
        f"<h3>Refused nodes</h3>{_refused_table(dicts(status.get('refused_nodes')))}",
        f"<h3>Stale claims</h3>{_stale_table(dicts(status.get('stale_claims')))}</section>",
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
