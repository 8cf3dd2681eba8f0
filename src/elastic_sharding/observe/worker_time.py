"""A worker's effective time on an attempt: the clock that `status` measures rates, the ETA and
backup races by.

Its own module because two readers share the rule: `metrics` (a worker's throughput, a running
attempt's age) and `backup_races` (how long a backup and its original ran). A worker is a
(host, pid); its effective time on an attempt starts when the attempt was staged or when the
worker's previous attempt ended, whichever is later, so a shard claimed ahead does not count its
wait in the queue; time spent starting the node's runtime (recorded by the warm runner,
`setup_secs`) is left out too, since the worker's next shards do not pay it.
"""

from __future__ import annotations

from collections import defaultdict

from elastic_sharding.observe.snapshot import AttemptView


def effective_starts(attempts: list[AttemptView]) -> dict[tuple[str, str], float]:
    """(shard, attempt) -> when its worker actually turned to it (the module docstring)."""
    by_worker: dict[tuple[str, int], list[AttemptView]] = defaultdict(list)
    for attempt in attempts:
        by_worker[(attempt.host, attempt.pid)].append(attempt)
    starts = {}
    for own in by_worker.values():
        previous_end = float("-inf")
        for attempt in sorted(own, key=lambda a: (a.ended_at is None, a.ended_at or 0.0, a.started_at)):
            starts[(attempt.shard_id, attempt.attempt_id)] = max(attempt.started_at, previous_end)
            if attempt.ended_at is not None:
                previous_end = max(previous_end, attempt.ended_at)
    return starts


def busy_secs(attempt: AttemptView, starts: dict[tuple[str, str], float]) -> float:
    """A finished attempt's time on its worker: from its effective start, less runtime start-up."""
    return worked_secs(attempt, starts, attempt.ended_at if attempt.ended_at is not None else attempt.started_at)


def worked_secs(attempt: AttemptView, starts: dict[tuple[str, str], float], until: float) -> float:
    """An attempt's time on its worker up to `until`, as `busy_secs` counts it."""
    start = starts.get((attempt.shard_id, attempt.attempt_id), attempt.started_at)
    return max(0.0, until - start - attempt.setup_secs)


__all__ = ["busy_secs", "effective_starts", "worked_secs"]
