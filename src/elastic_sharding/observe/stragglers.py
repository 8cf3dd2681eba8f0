"""Which running shards straggle, as `status` sees them: the backup trigger, judged from outside.

A worker that finds nothing to claim backs a running shard up once `claims.backups.StragglerRule`
says it straggles; `status` flags a straggler by that same rule, with the job's settings (the
manifest's `backup_after` and `backup_min_secs`; a worker started with its own `--backup-after`
judges by its own). With `backup_after` 0 the rule still flags, with the default factor, and
`status` says that no backup will start. What `status` sees differs from what a worker sees:

- The median is of every readable completion record of the segment's done shards (their
  `processing_secs`, as a worker reads them); a worker reads a sample of at most 64.
- The time in the phase is the owner's heartbeat time minus its phase start, both on the owner's
  clock. A worker adds how long it has watched that heartbeat unchanged, on its own clock; one
  read of the job directory cannot measure that without comparing two machines' clocks, so
  `status` may flag a shard up to one heartbeat interval after a worker could back it up.
- Only the attempt that holds the claim is judged (a backup is not, unless the claim was handed
  to it). A shard that already has its backup is still flagged while it straggles; whether an
  idle worker backs it up (the share of backups, the worker's own speed) is not status's to say.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elastic_sharding.claims.backups import StragglerRule, Straggling, secs_per_byte
from elastic_sharding.observe.snapshot import AttemptView, ShardView
from elastic_sharding.vocabulary import ShardState

if TYPE_CHECKING:
    from elastic_sharding.observe.metrics import JobMetrics


def median_secs_per_byte(views: list[ShardView], rule: StragglerRule) -> float | None:
    """The median processing seconds per byte of the done shards, once the rule has enough."""
    samples = [secs_per_byte(v.completion, v.spec) for v in views if v.state == ShardState.DONE]
    return rule.median([sample for sample in samples if sample is not None])


def judge(attempt: AttemptView, rule: StragglerRule, median: float | None) -> Straggling | None:
    """Whether a running attempt straggles: the claim's own attempt, by the owner's heartbeat."""
    if median is None or (attempt.backup_of is not None and not attempt.promoted):
        return None
    return rule.judge(attempt.phase, attempt.phase_secs, attempt.input_bytes, median)


def rule_text(rule: StragglerRule) -> str:
    return (
        f"processing over {rule.factor:g}x the median shard's time for their size and {rule.min_secs:g}s past it, "
        f"once {rule.min_done} shards are done"
    )


def rule_json(rule: StragglerRule, median: float | None) -> dict[str, Any]:
    return {
        "backups": rule.backs_up,
        "factor": rule.factor,
        "min_secs": rule.min_secs,
        "min_done": rule.min_done,
        "startup_allowance_secs": rule.startup_allowance_secs,
        "median_secs_per_byte": median,
    }


def straggler_lines(metrics: JobMetrics) -> list[str]:
    """The text `status` shows: the rule, then each straggler with why, and its running backup."""
    if not metrics.stragglers:
        return []
    rule = metrics.straggler_rule
    backing = {b.of_attempt_id: b.host for b in metrics.backups if b.state == "running"}
    then = "an idle worker backs them up" if rule.backs_up else "backups are off for this job (--backup-after 0): none starts"
    lines = [f"stragglers ({rule_text(rule)}; {then}):"]
    for r in metrics.stragglers:
        backup = f"; backup running on {backing[r.attempt_id]}" if r.attempt_id in backing else ""
        why = r.straggling.reason() if r.straggling is not None else ""
        lines.append(f"  {r.shard_id} on {r.host} (pid {r.pid}): {why}{backup}")
    return lines


__all__ = ["judge", "median_secs_per_byte", "rule_json", "rule_text", "straggler_lines"]
