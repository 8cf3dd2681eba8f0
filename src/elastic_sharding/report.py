"""status: what a job's shards are doing, as text for people or JSON for machines."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .errors import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK
from .launch.coordination import generations
from .layout import JobLayout
from .state import DONE, FAILED, STATES, ShardView, counts, job_views

JSON_SCHEMA_VERSION = 1


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _shard_json(view: ShardView) -> dict[str, Any]:
    return {
        "shard_id": view.shard_id,
        "state": view.state,
        "input_rows": view.spec.rows,
        "input_bytes": view.spec.bytes,
        "host": view.owner,
        "attempt_id": view.attempt_id,
        "heartbeat_age_secs": None if view.heartbeat_age is None else round(view.heartbeat_age, 3),
        "failures": view.failures,
        "last_error": view.last_error,
        "output_rows": view.completion.output_rows if view.completion else None,
    }


class Status:
    def __init__(self, job_dir: Path, lock_timeout: float | None = None):
        self.layout = JobLayout(Path(os.path.abspath(job_dir)))
        self.manifest = self.layout.load_manifest()
        self.lock_timeout = lock_timeout if lock_timeout is not None else self.manifest.request.settings.lock_timeout_secs
        self.views = job_views(self.layout, self.manifest, self.lock_timeout)
        self.counts = counts(self.views)
        self.runs = generations(self.layout.root)
        self.at = time.time()

    @property
    def exit_code(self) -> int:
        if self.counts[FAILED]:
            return EXIT_ERROR
        if self.counts[DONE] == len(self.views):
            return EXIT_OK
        return EXIT_INCOMPLETE

    def as_json(self) -> dict[str, Any]:
        done_rows = sum(v.spec.rows for v in self.views if v.state == DONE)
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "job_dir": str(self.layout.root),
            "job_id": self.manifest.job_id,
            "generated_at": self.at,
            "lock_timeout_secs": self.lock_timeout,
            "stale_is_estimate": True,
            "complete": self.exit_code == EXIT_OK,
            "failed": self.counts[FAILED] > 0,
            "exit_code": self.exit_code,
            "shards_total": len(self.views),
            "counts": self.counts,
            "rows_total": self.manifest.total_rows,
            "rows_done": done_rows,
            "output_rows": sum(v.completion.output_rows for v in self.views if v.completion),
            "hosts": sorted({v.completion.host for v in self.views if v.completion}),
            "shards": [_shard_json(v) for v in self.views],
            "launcher_runs": self.runs,
        }

    def errors(self, failed_only: bool = False) -> list[str]:
        """`<shard> last error: <root cause> (log: <path>)` for failed (and retrying) shards."""
        lines = []
        for v in self.views:
            if v.state == FAILED or (not failed_only and v.last_error and v.state != DONE):
                log_hint = ""
                if v.failure is not None:
                    log_hint = f" (log: {self.layout.attempt_dir(v.shard_id, v.failure.last_attempt_id) / 'process.log'})"
                lines.append(f"{v.shard_id} last error: {v.last_error}{log_hint}")
        return lines

    def summary_line(self) -> str:
        parts = ", ".join(f"{n} {state}" for state, n in self.counts.items())
        done_rows = sum(v.spec.rows for v in self.views if v.state == DONE)
        pct = 100.0 * done_rows / self.manifest.total_rows if self.manifest.total_rows else 100.0
        return f"{self.layout.root}: {len(self.views)} shards: {parts}; input rows done {done_rows}/{self.manifest.total_rows} ({pct:.1f}%)"

    def text(self, show_all: bool) -> str:
        lines = [self.summary_line()]
        interesting = self.views if show_all else [v for v in self.views if v.state not in ("pending", DONE)]
        if interesting:
            lines.append(f"{'shard':<22} {'state':<8} {'rows':>9} {'host':<20} {'age/took':>8} {'fails':>5}  attempt")
            for v in interesting:
                took = v.completion.finished_at - v.completion.started_at if v.completion else v.heartbeat_age
                lines.append(
                    f"{v.shard_id:<22} {v.state:<8} {v.spec.rows:>9} {(v.owner or '-')[:20]:<20} "
                    f"{_age(took):>8} {v.failures:>5}  {v.attempt_id or '-'}"
                )
        lines += [f"  {line}" for line in self.errors()]
        if self.counts["stale"]:
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
                f"; FAILED in {abort['phase']} on {abort['host']} (exit {abort['exit_code']}): {abort['reason']}" if abort else ""
            )
            lines.append(f"  dlc run {run['run_id']}: {phases}{ending}  [{run['dir']}]")
        if not show_all and len(interesting) < len(self.views):
            lines.append("  (--all lists every shard)")
        return "\n".join(lines)


__all__ = ["Status", "STATES"]
