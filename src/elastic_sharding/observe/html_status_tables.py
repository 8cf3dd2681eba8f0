"""The report's tables, one per list of `status --json`: nodes, deduplication stages, shards,
backups, and the problems (failed shards, stragglers, refused nodes, stale claims).

Its own module because each table is only columns over the JSON objects (`html_tables.Column`):
what every column shows, how it sorts and which cells it flags, apart from the page they sit in
(`html_report`) and its timeline. Any value may be missing or of another type (it comes from
JSON), so every cell goes through `html_format`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastic_sharding.observe.html_format import NONE, as_dict, dicts, esc, fmt_bytes, fmt_int, fmt_rate, fmt_secs, iso, num
from elastic_sharding.observe.html_tables import Column, number, table
from elastic_sharding.observe.snapshot import AttemptView
from elastic_sharding.observe.stages import PHASES
from elastic_sharding.vocabulary import SHARD_STATES


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


def nodes_table(nodes: list[dict[str, Any]]) -> str:
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


def stages_table(stages: list[dict[str, Any]]) -> str:
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


def shards_table(shards: list[dict[str, Any]], attempts: list[AttemptView], segment: object = 0) -> str:
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
            sort=lambda shard: SHARD_STATES.index(state(shard)) if state(shard) in SHARD_STATES else len(SHARD_STATES),
            cls=lambda shard: f"state-{state(shard)}" if state(shard) in SHARD_STATES else "",
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


def failures_table(failures: list[dict[str, Any]]) -> str:
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


def stragglers_table(stragglers: list[dict[str, Any]], rule: dict[str, Any]) -> str:
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


def backups_table(backups: list[dict[str, Any]]) -> str:
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


def refused_table(refused: list[dict[str, Any]]) -> str:
    columns = [
        _HOST,
        number("PID", "pid", esc),
        Column("Reason", lambda item: esc(item.get("reason"))),
        number("Ago", "age_secs", fmt_secs),
        Column("Message", lambda item: f"<pre>{esc(item.get('message'))}</pre>", cls="err"),
    ]
    return table(columns, refused)


def stale_table(stale: list[dict[str, Any]]) -> str:
    columns = [
        _SHARD,
        _HOST,
        number("PID", "pid", esc),
        _ATTEMPT,
        number("No heartbeat for", "heartbeat_age_secs", fmt_secs),
    ]
    return table(columns, stale, shard=_item_shard)


__all__ = [
    "backups_table",
    "failures_table",
    "nodes_table",
    "refused_table",
    "shards_table",
    "stages_table",
    "stale_table",
    "stragglers_table",
]
