"""status: what a job's shards are doing, as text for people or JSON for machines."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from elastic_sharding.claims.submission import generations
from elastic_sharding.errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.observe.durations import format_duration
from elastic_sharding.observe.metrics import STRAGGLER_FACTOR, Node, Running, WarmOperator, job_metrics
from elastic_sharding.observe.snapshot import ShardView, counts, job_snapshot
from elastic_sharding.vocabulary import ShardState

JSON_SCHEMA_VERSION = 2


def _age(seconds: float | None) -> str:
    return format_duration(seconds, "status")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _shard_json(view: ShardView, attempts: int) -> dict[str, Any]:
    took = view.completion.finished_at - view.completion.started_at if view.completion else None
    return {
        "shard_id": view.shard_id,
        "state": view.state,
        "input_rows": view.spec.rows,
        "input_bytes": view.spec.bytes,
        "host": view.owner,
        "attempt_id": view.attempt_id,
        "attempts": attempts,
        "phase": view.heartbeat.phase if view.heartbeat is not None and view.state == ShardState.RUNNING else None,
        "heartbeat_age_secs": _round(view.heartbeat_age),
        "secs": _round(took),
        "failures": view.failures,
        "last_error": view.last_error,
        "output_rows": view.completion.output_rows if view.completion else None,
    }


def _running_json(item: Running) -> dict[str, Any]:
    return {
        "shard_id": item.shard_id,
        "attempt_id": item.attempt_id,
        "host": item.host,
        "pid": item.pid,
        "phase": item.phase,
        "age_secs": _round(item.age_secs, 1),
        "expected_secs": _round(item.expected_secs, 1),
        "est_fraction": _round(item.est_fraction),
        "straggler": item.straggler,
        "factor": _round(item.factor, 2),
    }


def _node_json(node: Node) -> dict[str, Any]:
    return {
        "host": node.host,
        "active_workers": node.active_workers,
        "shards_done": node.shards_done,
        "rows_done": node.rows_done,
        "bytes_done": node.bytes_done,
        "rows_per_sec": _round(node.rows_per_sec, 2),
        "bytes_per_sec": _round(node.bytes_per_sec, 1),
        "failures": node.failures,
        "running": [_running_json(item) for item in node.running],
        "warm_operators": [_warm_json(op) for op in node.warm_operators],
    }


def _warm_json(op: WarmOperator) -> dict[str, Any]:
    return {
        "op": op.op,
        "instances": op.instances,
        "loads": op.loads,
        "deaths": op.deaths,
        "rows": op.rows,
        "window_secs": _round(op.window_secs, 2),
        "all_busy_fraction": _round(op.all_busy_fraction, 4),
        "busy_fraction": _round(op.busy_fraction, 4),
    }


def warm_text(op: WarmOperator) -> str:
    """One line of a node's warm operator, as `status` and the HTML report show it."""
    fraction = op.all_busy_fraction
    busy = "-" if fraction is None else f"{100 * fraction:.0f}%"
    deaths = f", {op.deaths} replaced" if op.deaths else ""
    return f"{op.op}: {op.instances} instance(s), {op.loads} load(s){deaths}, all instances busy {busy}"


def terminal_failures(views: list[ShardView]) -> str | None:
    """The terminally failed shards in one line (at most three named), for a launcher's error;
    `Status.errors` is the per-shard form, with each one's log."""
    failed = [
        f"{v.shard_id} failed {v.failure.failures} time(s), last on host={v.failure.host}: {v.failure.last_error}"
        for v in views
        if v.failure is not None
    ]
    if not failed:
        return None
    return f"{len(failed)} shard(s) failed terminally: " + "; ".join(failed[:3]) + (" ..." if len(failed) > 3 else "")


class Status:
    """One read of a job directory: shard states, attempts, and the metrics derived from them."""

    def __init__(self, job_dir: Path, lock_timeout: float | None = None):
        self.layout = JobLayout(Path(os.path.abspath(job_dir)))
        self.manifest = self.layout.load_manifest()
        self.lock_timeout = lock_timeout if lock_timeout is not None else self.manifest.request.settings.lock_timeout_secs
        self.at = time.time()
        self.views, self.attempts = job_snapshot(self.layout, self.manifest, self.lock_timeout, self.at)
        self.metrics = job_metrics(self.views, self.attempts, self.at)
        self.counts = counts(self.views)
        self.runs = generations(self.layout.root)

    @property
    def exit_code(self) -> int:
        if self.counts[ShardState.FAILED]:
            return EXIT_ERROR
        if self.counts[ShardState.DONE] == len(self.views):
            return EXIT_OK
        return EXIT_INCOMPLETE

    def _log_of(self, view: ShardView) -> str | None:
        attempt_id = view.failure.last_attempt_id if view.failure is not None else None
        if attempt_id is None:
            failed = [a for a in self.attempts if a.shard_id == view.shard_id and a.archive is None and a.error]
            attempt_id = failed[-1].attempt_id if failed else None
        return None if attempt_id is None else str(attempt_files(self.layout.attempt_dir(view.shard_id, attempt_id))["log"])

    def failures(self) -> list[dict[str, Any]]:
        """Failed shards, and unfinished ones with a failed attempt, with the root cause and log."""
        return [
            {"shard_id": v.shard_id, "state": v.state, "failures": v.failures, "error": v.last_error, "log": self._log_of(v)}
            for v in self.views
            if v.state == ShardState.FAILED or (v.last_error and v.state != ShardState.DONE)
        ]

    def stale_claims(self) -> list[dict[str, Any]]:
        return [
            {
                "shard_id": v.shard_id,
                "host": v.owner,
                "pid": v.claim.pid if v.claim else None,
                "attempt_id": v.attempt_id,
                "heartbeat_age_secs": _round(v.heartbeat_age, 1),
            }
            for v in self.views
            if v.state == ShardState.STALE
        ]

    def as_json(self) -> dict[str, Any]:
        m = self.metrics
        per_shard = Counter(a.shard_id for a in self.attempts if a.archive is None)
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "job_dir": str(self.layout.root),
            "job_id": self.manifest.job_id,
            "generated_at": self.at,
            "lock_timeout_secs": self.lock_timeout,
            "stale_is_estimate": True,
            "complete": self.exit_code == EXIT_OK,
            "failed": self.counts[ShardState.FAILED] > 0,
            "exit_code": self.exit_code,
            "shards_total": len(self.views),
            "counts": self.counts,
            "rows_total": self.manifest.total_rows,
            "rows_done": m.rows_done,
            "output_rows": sum(v.completion.output_rows for v in self.views if v.completion),
            "hosts": sorted({v.completion.host for v in self.views if v.completion}),
            "progress": {
                "shards_done": m.shards_done,
                "shards_total": m.shards_total,
                "rows_done": m.rows_done,
                "rows_total": m.rows_total,
                "bytes_done": m.bytes_done,
                "bytes_total": m.bytes_total,
                "percent": round(m.percent, 2),
                "percent_bytes": round(m.percent_bytes, 2),
            },
            "started_at": m.started_at,
            "elapsed_secs": round(m.elapsed_secs, 1),
            "throughput": {
                "rows_per_sec": _round(m.rows_per_sec, 2),
                "bytes_per_sec": _round(m.bytes_per_sec, 1),
                "overall_rows_per_sec": _round(m.overall_rows_per_sec, 2),
                "active_workers": m.active_workers,
            },
            "eta": {"secs": _round(m.eta.secs, 1), "at": _round(m.eta.at, 1), "basis": m.eta.basis},
            "nodes": [_node_json(node) for node in m.nodes],
            "stragglers": [_running_json(item) for item in m.stragglers],
            "stale_claims": self.stale_claims(),
            "failures": self.failures(),
            "shards": [_shard_json(v, per_shard[v.shard_id]) for v in self.views],
            "launcher_runs": self.runs,
        }

    def errors(self, failed_only: bool = False) -> list[str]:
        """`<shard> last error: <root cause> (log: <path>)` for failed (and retrying) shards."""
        return [
            f"{item['shard_id']} last error: {item['error']}" + (f" (log: {item['log']})" if item["log"] else "")
            for item in self.failures()
            if item["state"] == ShardState.FAILED or not failed_only
        ]

    def summary_line(self) -> str:
        parts = ", ".join(f"{n} {state}" for state, n in self.counts.items())
        m = self.metrics
        return f"{self.layout.root}: {len(self.views)} shards: {parts}; input rows done {m.rows_done}/{m.rows_total} ({m.percent:.1f}%)"

    def progress_line(self) -> str:
        m = self.metrics
        parts = [f"{m.shards_done}/{m.shards_total} shards", f"{m.rows_done}/{m.rows_total} rows ({m.percent:.1f}%)"]
        parts.append(f"elapsed {_age(m.elapsed_secs)}")
        if m.rows_per_sec is not None:
            parts.append(f"{m.rows_per_sec:,.1f} rows/s now on {m.active_workers} worker(s)")
        if m.overall_rows_per_sec is not None:
            parts.append(f"{m.overall_rows_per_sec:,.1f} rows/s overall")
        if m.eta.secs is not None and m.eta.basis != "complete":
            at = time.strftime("%H:%M:%S", time.localtime(m.eta.at))
            parts.append(f"ETA {_age(m.eta.secs)} (about {at})")
        elif m.eta.basis != "complete":
            parts.append(f"ETA unknown: {m.eta.basis}")
        return "progress: " + "; ".join(parts)

    def _node_lines(self) -> list[str]:
        if not self.metrics.nodes:
            return []
        lines = [f"  {'node':<24} {'workers':>7} {'done':>5} {'rows':>10} {'rows/s':>9}  running"]
        for node in self.metrics.nodes:
            rate = "-" if node.rows_per_sec is None else f"{node.rows_per_sec:,.1f}"
            running = ", ".join(
                f"{r.shard_id} ({r.phase or 'running'}, {_age(r.age_secs)}{', STRAGGLER' if r.straggler else ''})"
                for r in node.running
            )
            lines.append(
                f"  {node.host[:24]:<24} {node.active_workers:>7} {node.shards_done:>5} {node.rows_done:>10} {rate:>9}  {running or '-'}"
            )
            lines.extend(f"  {'':<24}   warm op {warm_text(op)}" for op in node.warm_operators)
        return ["nodes:", *lines]

    def _shard_lines(self, show_all: bool) -> list[str]:
        interesting = self.views if show_all else [v for v in self.views if v.state not in (ShardState.PENDING, ShardState.DONE)]
        if not interesting:
            return []
        lines = [f"{'shard':<22} {'state':<8} {'rows':>9} {'host':<20} {'age/took':>8} {'fails':>5}  attempt"]
        for v in interesting:
            took = v.completion.finished_at - v.completion.started_at if v.completion else v.heartbeat_age
            lines.append(
                f"{v.shard_id:<22} {v.state:<8} {v.spec.rows:>9} {(v.owner or '-')[:20]:<20} "
                f"{_age(took):>8} {v.failures:>5}  {v.attempt_id or '-'}"
            )
        return lines

    def text(self, show_all: bool) -> str:
        lines = [self.summary_line(), self.progress_line(), *self._node_lines()]
        if self.metrics.stragglers:
            lines.append(f"stragglers (running over {STRAGGLER_FACTOR:g}x the median shard's time for their size):")
            lines += [
                f"  {r.shard_id} on {r.host} (pid {r.pid}): running {_age(r.age_secs)}, {r.factor or 0:.1f}x the typical time"
                for r in self.metrics.stragglers
            ]
        for item in self.stale_claims():
            lines.append(
                f"stale claim: {item['shard_id']} held by {item['host']} (pid {item['pid']}), "
                f"no heartbeat for {_age(item['heartbeat_age_secs'])}"
            )
        lines += self._shard_lines(show_all)
        lines += [f"  {line}" for line in self.errors()]
        if self.counts[ShardState.STALE]:
            lines.append(
                "  stale = no heartbeat for longer than the lock timeout by this machine's clock (an estimate); "
                "a worker takes such a claim over after watching it for one lease"
            )
        for run in self.runs:
            phases = ", ".join(
                f"{phase} {run[phase]['state']}" + (f" ({run[phase]['host']})" if "host" in run[phase] else "")
                for phase in ("prepare", "finalize")
            )
            abort = run["abort"]
            ending = (
                f"; ShardState.FAILED in {abort['phase']} on {abort['host']} (exit {abort['exit_code']}): {abort['reason']}"
                if abort
                else ""
            )
            lines.append(f"  dlc run {run['run_id']}: {phases}{ending}  [{run['dir']}]")
        if not show_all and any(v.state in (ShardState.PENDING, ShardState.DONE) for v in self.views):
            lines.append("  (--all lists every shard)")
        return "\n".join(lines)


__all__ = ["Status"]
