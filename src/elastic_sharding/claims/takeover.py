"""Which shard a worker claims next, and when it takes a claim over: the takeover decision.

A claim is stale only when this process has seen its heartbeat (token, seq) unchanged for a whole
lease on its own monotonic clock (P4, P5): no wall clock or file time is compared across nodes,
and a healthy shard that runs for many leases is never taken over because its heartbeat moves.
A stale claim whose completion is already published is repaired (marked done, P6) instead of
taken over; any other is taken over (`Claims.take_over`) and claimed afresh, which a quicker
worker may still win. A shard whose failures reached the retry limit becomes terminally failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from elastic_sharding import confined
from elastic_sharding.claims.heartbeat import read_claim_heartbeat
from elastic_sharding.claims.history import count_failures
from elastic_sharding.claims.protocol import Claim, Claims, read_claim
from elastic_sharding.claims.shard_state import shard_state
from elastic_sharding.layout import JobLayout
from elastic_sharding.records import ClaimRecord, Heartbeat
from elastic_sharding.vocabulary import ClaimStatus, ShardState

log = logging.getLogger(__name__)

# Near the end of the manifest, how many shards past the last claim the tail rule reads at least.
TAIL_WINDOW = 32


class StalenessObserver:
    """Judges claims stale by watching their heartbeat not change, on this process's own clock."""

    def __init__(self, lease_secs: float):
        self.lease = lease_secs
        self._seen: dict[str, tuple[str, int, float]] = {}

    def is_stale(self, shard_id: str, token: str, seq: int) -> bool:
        now = time.monotonic()
        seen = self._seen.get(shard_id)
        if seen is None or seen[0] != token or seen[1] != seq:
            self._seen[shard_id] = (token, seq, now)
            return False
        return now - seen[2] >= self.lease

    def unchanged_for(self, shard_id: str) -> float:
        seen = self._seen.get(shard_id)
        return time.monotonic() - seen[2] if seen else 0.0

    def forget(self, shard_id: str) -> None:
        self._seen.pop(shard_id, None)


class ShardScanner:
    """One worker's passes over the shards in manifest order; remembers the terminal ones."""

    def __init__(
        self,
        layout: JobLayout,
        shard_ids: list[str],
        claims: Claims,
        lease_secs: float,
        max_retries: int,
        on_done: Callable[[str], None],
    ):
        self.layout = layout
        self.shard_ids = shard_ids
        self.claims = claims
        self.max_retries = max_retries
        self.on_done = on_done  # a shard found done: its attempts' leftovers may be swept
        self.observer = StalenessObserver(lease_secs)
        self.terminal: dict[str, str] = {}
        self._failed: dict[str, None] = {}  # the terminally failed among them, in the order found
        self._first = 0  # shards before it are all terminal: a pass starts here
        self.position = 0  # where the last pass claimed (or ended)
        self.running_seen = 0  # other workers' running claims the last pass read before `position`
        # Other workers' live claims the last pass read, with their heartbeats and how long this
        # process has seen that heartbeat unchanged (on its own clock): what backups judge.
        self.running: dict[str, tuple[ClaimRecord, Heartbeat | None, float]] = {}
        self._avoid: dict[str, float] = {}  # shard -> until when (monotonic) this worker leaves it to others
        self.other_hosts: set[str] = set()  # hosts other than this one whose claims a pass has read

    def avoid(self, shard_id: str, secs: float) -> None:
        """Leave a shard to the other workers for `secs` (this node failed it for a reason of its own)."""
        self._avoid[shard_id] = time.monotonic() + secs

    def _avoided(self, shard_id: str) -> bool:
        until = self._avoid.get(shard_id)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._avoid[shard_id]
        return False

    def failed(self) -> list[str]:
        return list(self._failed)

    def mark_terminal(self, shard_id: str, status: str) -> None:
        """Remember a shard found (or made) terminal: no pass reads its claim again."""
        self.terminal[shard_id] = status
        if status == ClaimStatus.FAILED:
            self._failed[shard_id] = None

    def all_terminal(self) -> bool:
        return len(self.terminal) == len(self.shard_ids)

    def next_claim(self) -> tuple[Claim | None, list[str]]:
        """One pass: claim the first claimable shard; or the terminally failed shards."""
        failed = self.failed()
        if failed:
            return None, failed
        self.running_seen = 0
        self.running = {}
        for at in range(self._first, len(self.shard_ids)):
            shard_id = self.shard_ids[at]
            self.position = at
            if shard_id in self.terminal:
                if at == self._first:
                    self._first += 1
                continue
            try:
                record = read_claim(self.layout, shard_id)
            except ValueError as exc:
                log.warning("unreadable claim of %s (%s); skipping it this round", shard_id, exc)
                continue
            if record is not None and record.host != self.claims.host:
                self.other_hosts.add(record.host)
            if record is not None and record.status != ClaimStatus.RUNNING:
                self.mark_terminal(shard_id, record.status)
                self.observer.forget(shard_id)
                if record.status == ClaimStatus.FAILED:
                    return None, [shard_id]
                continue
            if record is None:
                completed = confined.lexists(self.layout.done(shard_id))
                state = shard_state(None, completed, not completed and confined.lexists(self.layout.failed(shard_id)))
                if state == ShardState.DONE:
                    self.claims.try_claim(shard_id, status=ClaimStatus.DONE)
                    self.mark_terminal(shard_id, ClaimStatus.DONE)
                    self.on_done(shard_id)  # its publisher died before recording it
                    continue
                if state == ShardState.FAILED:
                    self.mark_terminal(shard_id, ClaimStatus.FAILED)
                    return None, [shard_id]
                if self._avoided(shard_id):
                    continue
                claim = self.claims.try_claim(shard_id)
                if claim is not None:
                    return self._within_retry_limit(claim)
                continue
            stale, heartbeat = self._stale(record)
            if not stale:
                if (record.host, record.pid) != (self.claims.host, self.claims.pid):
                    self.running_seen += 1
                    self.running[shard_id] = (record, heartbeat, self.observer.unchanged_for(shard_id))
                continue
            unchanged = self.observer.unchanged_for(shard_id)
            self.observer.forget(shard_id)
            if confined.lexists(self.layout.done(shard_id)):
                # Completed, but its owner died before recording it in the claim (P6 repair).
                self.claims.repair_done(record, unchanged)
                self.mark_terminal(shard_id, ClaimStatus.DONE)
                self.on_done(shard_id)  # it may also have died before its sweep
                continue
            if self.claims.take_over(record, unchanged):
                claim = self.claims.try_claim(shard_id)
                if claim is not None:
                    return self._within_retry_limit(claim)
        return None, self.failed()

    def in_the_tail(self) -> bool:
        """Fewer unclaimed shards than busy workers, from where the last pass claimed on: a
        shard claimed ahead now would wait for this worker while another one goes idle. Never
        lists a directory: far from the end of the manifest it reads nothing (a worker holds at
        most two claims, so there are more shards left than busy workers could hold); near it,
        it reads the claims that are left, at most `TAIL_WINDOW` plus two per running claim."""
        if len(self.shard_ids) - self.position > TAIL_WINDOW + 2 * self.running_seen:
            return False
        unclaimed, busy = 0, self.running_seen
        for shard_id in self.shard_ids[self.position :]:
            if shard_id in self.terminal:
                continue
            try:
                record = read_claim(self.layout, shard_id)
            except ValueError:
                continue
            if record is None:
                unclaimed += 1
            elif record.status == ClaimStatus.RUNNING:
                busy += 1
        return unclaimed < busy

    def _stale(self, record: ClaimRecord) -> tuple[bool, Heartbeat | None]:
        heartbeat = read_claim_heartbeat(self.layout, record)
        if heartbeat is not None and heartbeat.token != record.token:
            heartbeat = None
        seq = heartbeat.seq if heartbeat is not None else 0
        return self.observer.is_stale(record.shard_id, record.token, seq), heartbeat

    def _within_retry_limit(self, claim: Claim) -> tuple[Claim | None, list[str]]:
        """After acquiring: a shard whose failures already reached the limit becomes terminal."""
        try:
            failures, last_attempt, last_error = count_failures(self.layout, claim.shard_id)
        except OSError:  # attempts/<shard> is a planted link (or unreadable): refuse, holding nothing
            self.claims.release(claim)
            raise
        if failures <= self.max_retries:
            return claim, []
        log.error("%s failed %d time(s) (limit %d retries): marking it failed", claim.shard_id, failures, self.max_retries)
        self.claims.mark_failed_terminal(claim, failures, last_attempt, last_error)
        self.mark_terminal(claim.shard_id, ClaimStatus.FAILED)
        return None, [claim.shard_id]
