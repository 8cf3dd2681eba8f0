"""Claim-ahead: claim and stage the next shard while the current one still runs, so the node
never waits on a claim, an input check or a runtime's start between two shards.

The expectation comes from this worker's last shard (bytes per second), so nothing is claimed
ahead during the first shard, unless the runner overlaps attempts (the warm runner begins the
next shard at once, so it is claimed at once); at most one shard is ever held ahead; the
window is at most half a lease, and the queued claim is heartbeated like a running one. Until the
worker has finished a shard, nothing is claimed ahead before its runtime processes the first one.
Near the end of the job (fewer unclaimed shards than busy workers) nothing is claimed ahead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from elastic_sharding.layout import JobLayout
from elastic_sharding.records import Manifest, ShardSpec
from elastic_sharding.vocabulary import Phase

if TYPE_CHECKING:
    from elastic_sharding.claims.takeover import ShardScanner
    from elastic_sharding.work.attempt import Staged
    from elastic_sharding.work.runners import Runner
    from elastic_sharding.work.worker import Worker, WorkerOptions

log = logging.getLogger(__name__)

PHASE_POLL_SECS = 0.2


class Lookahead:
    """Claims the next shard once the current one is expected to end within the claim-ahead window.

    The expectation comes from this worker's last shard (bytes per second), so nothing is claimed
    ahead during the first shard, unless the runner overlaps attempts (the warm runner begins the
    next shard at once, so it is claimed at once); at most one shard is ever held ahead; the
    window is at most half a lease, and the queued claim is heartbeated like a running one.
    """

    def __init__(self, worker: Worker, spec: ShardSpec, phase: Callable[[], str]):
        self.worker = worker
        self.spec = spec
        self.phase = phase  # the current attempt's phase
        self.began = time.monotonic()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def start(self) -> None:
        settings = self.worker.settings
        window = min(settings.claim_ahead_secs, settings.lock_timeout_secs / 2)
        if window <= 0:
            return
        if self.worker.last_rate is not None:
            delay = max(0.0, self.spec.bytes / self.worker.last_rate - window)
        elif self.worker.overlaps:
            delay = 0.0  # the runtime starts the next shard as this one drains: claim it now
        else:
            return
        self._thread = threading.Thread(target=self._run, args=(delay,), name="claim-ahead", daemon=True)
        self._thread.start()

    def _run(self, delay: float) -> None:
        if self._done.wait(delay):
            return
        # Before its first shard is done a node may be one that cannot even start its runtime (a
        # throttled or broken node): it holds one shard, not two, until its runtime processes.
        while self.worker.completed == 0 and self.phase() != Phase.PROCESSING:
            if self._done.wait(PHASE_POLL_SECS):
                return
        try:
            self.worker.claim_ahead()
        except Exception:
            log.exception("claiming ahead failed; the next shard is claimed when this one ends")

    def finish(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


class ClaimAhead:
    """Claim-ahead, as a part of `Worker` (which sets every attribute below); the staged claim is
    run by the loop, or handed back by `drop_staged` when the worker leaves."""

    layout: JobLayout
    manifest: Manifest
    options: WorkerOptions
    runner: Runner
    overlaps: bool
    scanner: ShardScanner
    claimed: int
    staged: Staged | None
    stopping: str | None

    def claim_ahead(self) -> None:
        """Claim and stage the next shard while the current one runs (called by Lookahead)."""
        if self.stopping or self.staged is not None:
            return
        if self.options.max_shards is not None and self.claimed >= self.options.max_shards:
            return
        if self._in_the_tail():
            return
        claim, _failed = self.scan()
        if claim is None:
            return
        self.claimed += 1
        log.info("claimed %s ahead, while the current shard finishes", claim.shard_id)
        self.staged = self._stage(claim)
        if self.staged is not None and self.overlaps and not self.stopping:
            self.runner.begin(self.staged.ctx)  # type: ignore[attr-defined]

    def _in_the_tail(self) -> bool:
        """Fewer unclaimed shards than busy workers (`ShardScanner.in_the_tail`): the end of the
        job is left to plain claiming."""
        return self.scanner.in_the_tail()

    def drop_staged(self, why: str) -> None:
        """Hand a claimed-ahead shard back at once; it never started."""
        staged, self.staged = self.staged, None
        if staged is None:
            return
        staged.heartbeat.stop()
        self._cancel_begun(staged.ctx)
        self._record_failure(staged.claim, staged.record, staged.ctx, f"handed back while claimed ahead: {why}", handback=True)
