"""Which shard a worker claims next, and when it takes a claim over: the takeover decision.

A claim is stale only when this process has seen its heartbeat (token, seq) unchanged for a whole
lease on its own monotonic clock (P4, P5): no wall clock or file time is compared across nodes,
and a healthy shard that runs for many leases is never taken over because its heartbeat moves.
A stale claim whose completion is already published is repaired (marked done, P6) instead of
taken over; any other is taken over (`Claims.take_over`) and claimed afresh, which a quicker
worker may still win. A shard whose failures reached the retry limit becomes terminally failed.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from itertools import chain

from elastic_sharding import confined, fsops
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
# A running claim's heartbeat is read at most this many times a lease; see ShardScanner.
WATCHES_PER_LEASE = 4
# With nothing left past the frontier, a full pass at least every this many polls even if the
# claims directory looks unchanged (a NAS may cache a directory's attributes).
REFRESH_POLLS = 15
# Shards per done-block marker (`JobLayout.done_block`): the first worker whose full pass finds every
# claim of a block done publishes it; the others then skip that block's claims with one read.
DONE_BLOCK = 64
# How far at most a worker that lost a claim race jumps ahead (`_claim_past_frontier`).
MAX_JUMP = 64


def first_unclaimed(start: int, count: int, claimed: Callable[[int], bool], guess: int = 1) -> int | None:
    """The first index in [start, count) that `claimed` says is free, assuming the claimed ones
    from `start` on form a prefix (claims are made in order); None if all are claimed.

    Claimers that take items in order leave the items claimed since one's last look at the front
    of what is left: reading them one by one costs O(claimers) reads per claim, so a filesystem's
    load per item grows with the node count. This reads O(log k) for k claimed since: a first probe
    at `guess` (as many as last time), then galloping and a binary search. A hole the prefix
    assumption misses (a release) is for the caller's full pass to find."""
    low, step, high = start, max(1, guess), None
    while low < count:
        probe = min(low + step - 1, count - 1)
        if not claimed(probe):
            high = probe
            break
        low, step = probe + 1, (1 if step == guess else step * 2)
    if high is None:
        return None
    if high > low and claimed(high - 1):
        return high  # the one before is claimed: `high` is the first free one
    while low < high:
        mid = (low + high) // 2
        if claimed(mid):
            low = mid + 1
        else:
            high = mid
    return low


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
    """One worker's passes over the shards in manifest order; remembers the terminal ones.

    Claims are made in manifest order, so the claimed shards form a prefix of the manifest
    (holes come only from releases, takeovers and shards a worker avoids). A worker between two
    claims therefore does not re-read every claim behind it: it searches past its *frontier* (the
    end of the prefix it knows) by galloping, reading O(log k) claims where k shards were claimed
    since its last claim (k grows with the node count). Everything behind the frontier (releases,
    completions, stale claims to take over, backups) is the *full pass*'s: the original pass from
    the first non-terminal shard, made at the start, every `watch` x 0.5-1 seconds (at random:
    workers that started together must not all pass at once), and when nothing is left past the
    frontier; and then only if the claims directory changed since the last one (one stat) or
    `refresh` seconds went by. A heartbeat is read at most every `watch` seconds per
    claim: staleness is judged on this process's clock between reads, so a dead claim is taken
    over after between one lease and a lease plus `watch`. An idle worker thus costs a stat per
    poll, not a read of every running claim (docs/concepts/filesystems.md, "Load"). A full pass
    must learn that each shard behind it is done, which is one read per shard and worker; the
    done-block markers make that one read per `DONE_BLOCK` shards for all but the first worker.
    """

    def __init__(
        self,
        layout: JobLayout,
        shard_ids: list[str],
        claims: Claims,
        lease_secs: float,
        max_retries: int,
        on_done: Callable[[str], None],
        refresh_secs: float | None = None,
    ):
        self.layout = layout
        self.shard_ids = shard_ids
        self.claims = claims
        self.max_retries = max_retries
        self.on_done = on_done  # a shard found done: its attempts' leftovers may be swept
        self.observer = StalenessObserver(lease_secs)
        self.watch = lease_secs / WATCHES_PER_LEASE
        self.refresh = min(self.watch, refresh_secs if refresh_secs is not None else self.watch)
        self.terminal: dict[str, str] = {}
        self._failed: dict[str, None] = {}  # the terminally failed among them, in the order found
        self._first = 0  # shards before it are all terminal: a pass starts here
        self._frontier = 0  # shards before it were claimed when read (holes are the full pass's)
        self._full_at: float | None = None  # when the last full pass began (monotonic)
        self._full_every = self.watch  # until the next one: `watch` x a random 0.5-1 (see `_full_pass`)
        self._signature: tuple[int, ...] | None = None  # the claims directory as that pass found it
        self._beats: dict[str, tuple[str, Heartbeat | None, float]] = {}  # shard -> (token, heartbeat, read at)
        self._owners: dict[tuple[str, int], float] = {}  # other workers with a running claim -> last seen
        self._gap = 1  # how far past the frontier the last search found an unclaimed shard
        self._done_blocks: set[int] = set()  # blocks known done (marker read or published)
        # Running claims as last read, by their file's (inode, size, mtime): `_running_claim`.
        self._claim_files: dict[str, tuple[tuple[int, int, int], ClaimRecord]] = {}
        self.position = 0  # where the last pass claimed (or ended)
        self.running_seen = 0  # other workers' running claims the last pass read before `position`
        # Other workers' live claims the last full pass read, with their last heartbeats: what
        # backups judge (with `observer.unchanged_for`, how long it has not changed here).
        self.running: dict[str, tuple[ClaimRecord, Heartbeat | None]] = {}
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

    def rescan(self) -> None:
        """Make the next pass a full one: this worker gave a claim back (or knows of a change)."""
        self._full_at = None

    def failed(self) -> list[str]:
        return list(self._failed)

    def mark_terminal(self, shard_id: str, status: str) -> None:
        """Remember a shard found (or made) terminal: no pass reads its claim again."""
        self.terminal[shard_id] = status
        self._beats.pop(shard_id, None)
        self._claim_files.pop(shard_id, None)
        if status == ClaimStatus.FAILED:
            self._failed[shard_id] = None

    def all_terminal(self) -> bool:
        return len(self.terminal) == len(self.shard_ids)

    def next_claim(self) -> tuple[Claim | None, list[str]]:
        """Claim the next claimable shard (past the frontier, else by a full pass when one is due);
        or the terminally failed shards."""
        failed = self.failed()
        if failed:
            return None, failed
        now = time.monotonic()
        if self._full_at is not None and now - self._full_at < self._full_every:
            claim = self._claim_past_frontier()
            if claim is not None:
                return self._within_retry_limit(claim)
            if self._failed:
                return None, self.failed()
            if now - self._full_at < self.refresh and self._claims_signature() == self._signature:
                return None, []
        return self._full_pass()

    def _claims_signature(self) -> tuple[int, ...] | None:
        """The claims directory's attributes: any claim made, rewritten or moved away changes them."""
        try:
            st = confined.lstat(self.layout.locks_dir)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_nlink)

    def _probe(self, at: int) -> bool:
        """Whether shard `at` has a claim (or is terminal): one read, none for a known terminal one."""
        shard_id = self.shard_ids[at]
        if shard_id in self.terminal:
            return True
        try:
            record = read_claim(self.layout, shard_id)
        except ValueError:
            return True  # unreadable: the full pass warns about it
        if record is None:
            return False
        self._saw(record)
        if record.status != ClaimStatus.RUNNING:
            self.mark_terminal(shard_id, record.status)
        return True

    def _claim_past_frontier(self) -> Claim | None:
        """Gallop past the frontier to the first shard without a claim (the claimed ones past it
        are a prefix), and claim it. A lost race means other workers are searching right now and
        found the same shard: they would all race again for the next one (k racers: k²/2 lost
        publishes, each a written, synced and removed temporary file; 10 a shard at 32 nodes on a
        loaded machine, issue 44). So a loser jumps a random distance ahead, twice as far at each
        loss in a row; the shards it jumps over are the other racers' (or the full pass's)."""
        count = len(self.shard_ids)
        low = max(self._frontier, self._first)
        spread = 1
        while low < count:
            found = first_unclaimed(low, count, self._probe, self._gap)
            if found is None:
                break
            self._gap = found - low + 1
            self._frontier = found + 1
            self.position = found
            shard_id = self.shard_ids[found]
            low = found + 1
            if self._avoided(shard_id) or self._completed_unclaimed(shard_id):
                continue
            if self._failed:
                return None
            claim = self.claims.try_claim(shard_id)
            if claim is not None:
                return claim
            spread = min(2 * spread, MAX_JUMP)
            low += random.randrange(spread)
        self._frontier = count
        return None

    def _completed_unclaimed(self, shard_id: str) -> bool:
        """A shard without a claim that is done or failed anyway (its owner died before recording
        it, or its claim was removed by hand): recorded as terminal, never claimed."""
        completed = confined.lexists(self.layout.done(shard_id))
        state = shard_state(None, completed, not completed and confined.lexists(self.layout.failed(shard_id)))
        if state == ShardState.DONE:
            self.claims.try_claim(shard_id, status=ClaimStatus.DONE)
            self.mark_terminal(shard_id, ClaimStatus.DONE)
            self.on_done(shard_id)  # its publisher died before recording it
            return True
        if state == ShardState.FAILED:
            self.mark_terminal(shard_id, ClaimStatus.FAILED)
            return True
        return False

    def _saw(self, record: ClaimRecord) -> None:
        if record.host != self.claims.host:
            self.other_hosts.add(record.host)
        if record.status == ClaimStatus.RUNNING and (record.host, record.pid) != (self.claims.host, self.claims.pid):
            self._owners[(record.host, record.pid)] = time.monotonic()

    def _full_pass(self) -> tuple[Claim | None, list[str]]:
        """The pass from the first non-terminal shard: claim the first claimable one, judging every
        running claim on the way (repair, takeover) and noting them for backups."""
        self._full_at = time.monotonic()
        # Workers that started together would pass together, each reading every claim since the
        # last pass before any of them publishes a done-block marker (32 nodes: 29 claim reads
        # per shard, issue 44); spread, a pass mostly finds the markers of the one before it.
        self._full_every = self.watch * random.uniform(0.5, 1.0)
        self._signature = self._claims_signature()
        self.running_seen = 0
        self.running = {}
        for at in self._pass_order():
            shard_id = self.shard_ids[at]
            self.position = at
            self._frontier = max(self._frontier, at)
            if at % DONE_BLOCK == 0 and shard_id not in self.terminal:
                self._read_done_block(at)
            if shard_id in self.terminal:
                if at == self._first:
                    self._first += 1
                self._publish_done_block(at)
                continue
            try:
                record = self._running_claim(shard_id)
            except ValueError as exc:
                log.warning("unreadable claim of %s (%s); skipping it this round", shard_id, exc)
                continue
            if record is not None:
                self._saw(record)
            if record is not None and record.status != ClaimStatus.RUNNING:
                self.mark_terminal(shard_id, record.status)
                self.observer.forget(shard_id)
                if record.status == ClaimStatus.FAILED:
                    return None, [shard_id]
                self._publish_done_block(at)
                continue
            if record is None:
                if self._completed_unclaimed(shard_id):
                    if self._failed:
                        return None, [shard_id]
                    continue
                if self._avoided(shard_id):
                    continue
                claim = self.claims.try_claim(shard_id)
                if claim is not None:
                    self._frontier = max(self._frontier, at + 1)
                    return self._within_retry_limit(claim)
                continue
            stale, heartbeat = self._stale(record)
            if not stale:
                if (record.host, record.pid) != (self.claims.host, self.claims.pid):
                    self.running_seen += 1
                    self.running[shard_id] = (record, heartbeat)
                continue
            unchanged = self.observer.unchanged_for(shard_id)
            self.observer.forget(shard_id)
            self._beats.pop(shard_id, None)
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
        self._frontier = len(self.shard_ids)
        while self._first < len(self.shard_ids) and self.shard_ids[self._first] in self.terminal:
            self._first += 1  # blocks visited out of order: the next pass starts past every terminal one
        return None, self.failed()

    def _pass_order(self) -> Iterable[int]:
        """The shards a full pass visits: from the first non-terminal one to the end of the manifest,
        the blocks wholly behind the frontier in a random order. A pass must learn that each shard
        behind it is done, one read each unless a done-block marker spares a whole block. Workers
        that run out of work together (at the end of a job) would otherwise pass in step, each
        reading every claim before any of them publishes a marker: nodes x shards reads in a job,
        the largest of the reads per shard that grew with the node count at 32 nodes (issue 44).
        In random orders, a block is mostly read by one worker while the others are elsewhere, and
        they skip it by its marker when they get there. A hole behind the frontier may be claimed
        before an earlier one: any order is correct."""
        first, count = self._first, len(self.shard_ids)
        first_block, whole = first // DONE_BLOCK, min(self._frontier, count) // DONE_BLOCK
        if whole - first_block < 2:
            return range(first, count)
        blocks = list(range(first_block, whole))
        random.shuffle(blocks)
        behind = (range(max(block * DONE_BLOCK, first), (block + 1) * DONE_BLOCK) for block in blocks)
        return chain(*behind, range(whole * DONE_BLOCK, count))

    def _block_ids(self, block: int) -> list[str]:
        return self.shard_ids[block * DONE_BLOCK : (block + 1) * DONE_BLOCK]

    def _read_done_block(self, at: int) -> None:
        """At the start of a block behind the frontier: if its marker exists, every shard of it is
        done (markers are published only after reading every claim of the block done)."""
        block = at // DONE_BLOCK
        if block in self._done_blocks or (block + 1) * DONE_BLOCK > self._frontier:
            return
        if not confined.lexists(self.layout.done_block(block)):
            return
        self._done_blocks.add(block)
        for shard_id in self._block_ids(block):
            if shard_id not in self.terminal:
                self.mark_terminal(shard_id, ClaimStatus.DONE)
                self.observer.forget(shard_id)

    def _publish_done_block(self, at: int) -> None:
        """At the last shard of a block: publish its marker if every shard of it is known done."""
        block = at // DONE_BLOCK
        ids = self._block_ids(block)
        if at != block * DONE_BLOCK + len(ids) - 1 or block in self._done_blocks:
            return
        if all(self.terminal.get(shard_id) == ClaimStatus.DONE for shard_id in ids):
            self._done_blocks.add(block)
            marker = self.layout.done_block(block)
            with contextlib.suppress(OSError):  # a hint: the next full pass reads the claims instead
                if not confined.lexists(marker):  # a lookup, not a written and removed temporary file
                    fsops.publish_once(marker, f"{ids[0]} {ids[-1]}\n".encode())

    def _running_claim(self, shard_id: str) -> ClaimRecord | None:
        """The shard's claim, read again only if its file changed since this process last read it
        running: one `lstat` instead of an open and a read. A claim is only ever replaced by a new
        file (a rename over it) or moved away, so an unchanged (inode, size, mtime) is the same
        record; a full pass at the tail of a job, where every completion changes `state/locks/`
        and every idle worker passes again, then costs a stat per running claim."""
        try:
            st = confined.lstat(self.layout.lock(shard_id))
        except FileNotFoundError:
            self._claim_files.pop(shard_id, None)
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._claim_files.get(shard_id)
        if known is not None and known[0] == key:
            return known[1]
        record = read_claim(self.layout, shard_id)
        if record is not None and record.status == ClaimStatus.RUNNING:
            self._claim_files[shard_id] = (key, record)
        else:
            self._claim_files.pop(shard_id, None)
        return record

    def in_the_tail(self) -> bool:
        """Fewer unclaimed shards than busy workers, from where the last pass claimed on: a
        shard claimed ahead now would wait for this worker while another one goes idle. Never
        lists a directory: far from the end of the manifest it reads nothing (a worker holds at
        most two claims, so there are more shards left than busy workers could hold); near it
        (within `TAIL_WINDOW` plus two per busy worker), it finds the first unclaimed shard by
        galloping, O(log) reads: claims are made in order, so what is left past it is unclaimed,
        and the claims between are busy workers' unless already read done (made since this
        worker's last claim, they mostly still run). Reading every claim left instead cost each
        claim-ahead decision up to 32 plus two reads per busy worker: (32 + 2 x nodes)² reads a
        job (issue 44). The busy workers behind that point are those the full pass counted, or
        the other workers seen holding a claim within the last `watch` seconds, whichever is more."""
        now = time.monotonic()
        owners = sum(1 for seen in self._owners.values() if now - seen < self.watch)
        behind = max(self.running_seen, owners)
        count = len(self.shard_ids)
        if count - self.position > TAIL_WINDOW + 2 * behind:
            return False
        start = min(self.position, count)
        free = first_unclaimed(start, count, self._probe)
        free = count if free is None else free
        claimed = sum(1 for shard_id in self.shard_ids[start:free] if shard_id not in self.terminal)
        return count - free < behind + claimed

    def _stale(self, record: ClaimRecord) -> tuple[bool, Heartbeat | None]:
        """Whether the claim is stale, reading its heartbeat only if the last read of it (for this
        claim) is `watch` seconds old: between reads it is not judged."""
        now = time.monotonic()
        seen = self._beats.get(record.shard_id)
        if seen is not None and seen[0] == record.token and now - seen[2] < self.watch:
            return False, seen[1]
        heartbeat = read_claim_heartbeat(self.layout, record)
        if heartbeat is not None and heartbeat.token != record.token:
            heartbeat = None
        self._beats[record.shard_id] = (record.token, heartbeat, now)
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
