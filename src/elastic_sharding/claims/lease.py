"""Shard claims: acquire, heartbeat, observe staleness, take over, fence, finish.

The protocol (DESIGN §3), relying only on create-once publish and rename:

* A claim is `state/locks/<shard>.json`, published create-once with a random token. Only one
  publisher per name succeeds, so there is at most one live claim per shard (P1).
* The owner proves it is alive by rewriting `attempts/<shard>/<attempt>/heartbeat.json` with an
  increasing `seq`. The claim record itself is never rewritten while running, so a heartbeat can
  never resurrect a claim that was taken over.
* A claim is stale only when an observer has seen the same (token, seq) for a whole lease on its
  own `time.monotonic()` (P4, P5): no wall clock or file timestamp is compared across nodes.
* Takeover renames the claim away under a unique name, checks that it moved the record it judged
  stale (else links it back), marks the old attempt superseded (create-once), and only then
  publishes a new claim, which can fail if a third worker was quicker.
* The owner re-reads its claim at every heartbeat and immediately before publishing; a missing or
  foreign token fences it: its child is stopped and nothing is published (P3). Completion itself
  is create-once, so even a fenced owner racing a publish cannot produce a second completion (P2).
* Terminal status is written into the claim record (P6): a finished shard's claim stays in
  place with `status: done|failed`, so a claimer never needs a negative lookup to skip it.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from elastic_sharding import fsops
from elastic_sharding.layout import JobLayout, attempt_files, attempt_ids
from elastic_sharding.records import (
    AttemptRecord,
    ClaimRecord,
    CompletionRecord,
    FailureRecord,
    Heartbeat,
    SupersededRecord,
    decode,
    encode,
)
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus, Phase

log = logging.getLogger(__name__)


_HOST_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")


def new_token() -> str:
    return secrets.token_hex(16)


def new_attempt_id(host: str, token: str) -> str:
    safe_host = "".join(c if c in _HOST_CHARS else "_" for c in host)[:80] or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{safe_host}-{token[:8]}"


def read_claim(layout: JobLayout, shard_id: str) -> ClaimRecord | None:
    path = layout.lock(shard_id)
    return fsops.read_record(path, lambda data: decode(ClaimRecord, data, path))


def read_heartbeat_file(path: Path) -> Heartbeat | None:
    """A lease's heartbeat; None if missing or unreadable (observers then see no progress)."""
    try:
        return fsops.read_record(path, lambda data: decode(Heartbeat, data, path), attempts=2)
    except ValueError:
        return None


def read_heartbeat(attempt_dir: Path) -> Heartbeat | None:
    return read_heartbeat_file(attempt_files(attempt_dir)["heartbeat"])


def read_claim_heartbeat(layout: JobLayout, claim: ClaimRecord) -> Heartbeat | None:
    """The heartbeat of a claim's attempt; None also when a link was planted on the way to it."""
    try:
        return read_heartbeat(layout.existing_attempt_dir(claim.shard_id, claim.attempt_id))
    except fsops.LinkRefused as exc:
        log.warning("cannot read the heartbeat of %s: %s", claim.shard_id, exc)
        return None


def read_attempt(attempt_dir: Path) -> AttemptRecord | None:
    path = attempt_files(attempt_dir)["record"]
    try:
        return fsops.read_record(path, lambda data: decode(AttemptRecord, data, path), attempts=2)
    except ValueError:
        return None


SUPERSEDED_ERROR = "worker stopped heartbeating (crashed, hung or cut off); claim taken over"


def attempt_failure(record: AttemptRecord | None, superseded: bool) -> tuple[bool, str | None]:
    """Whether an attempt counts against the shard's retry limit, and the error to report for it."""
    status = record.status if record else None
    if status == AttemptStatus.SUCCEEDED or not (status == AttemptStatus.FAILED or superseded):
        return False, None
    if record is not None and record.error:
        return True, record.error
    return True, SUPERSEDED_ERROR if superseded else None


def count_failures(layout: JobLayout, shard_id: str) -> tuple[int, str | None, str | None]:
    """Failed or superseded attempts of a shard since its last `retry`, with the latest error.

    Raises LinkRefused if attempts/<shard> is a symbolic link: the shard cannot be judged."""
    root = layout.attempts_dir(shard_id)
    failures, last_id, last_error = 0, None, None
    for name in attempt_ids(root):
        attempt_dir = root / name
        record = read_attempt(attempt_dir)
        if record is not None and record.status == AttemptStatus.SUCCEEDED:
            continue
        counts, error = attempt_failure(record, fsops.lexists(attempt_files(attempt_dir)["superseded"]))
        if counts:
            failures += 1
            last_id = name
            last_error = error or last_error
    return failures, last_id, last_error


def remove_if_token(lock: Path, moved: Path, expected_token: str) -> bool:
    """Rename a lease record away if it still carries `expected_token`; put it back otherwise.

    True only if this call removed exactly the record it meant to: a record that was replaced
    between the caller's read and the rename is linked back (unless yet another one took its name,
    in which case the replaced owner fences itself at its next heartbeat).
    """
    if not fsops.rename_away(lock, moved):
        return False
    try:
        token = orjson.loads(fsops.read_bytes_nofollow(moved)).get("token")
    except (OSError, ValueError, AttributeError):
        token = None
    if token == expected_token:
        return True
    if not fsops.link_back(moved, lock):
        log.warning("%s was moved away by mistake and replaced meanwhile; its owner will fence itself", lock)
    return False


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


@dataclass
class Claim:
    shard_id: str
    token: str
    attempt_id: str
    record: ClaimRecord


class Claims:
    """Claim operations of one worker process."""

    def __init__(self, layout: JobLayout, host: str | None = None, pid: int | None = None):
        self.layout = layout
        self.host = host or socket.gethostname()
        self.pid = pid or os.getpid()

    def try_claim(self, shard_id: str, status: str = ClaimStatus.RUNNING) -> Claim | None:
        """Publish a claim; `status=done` restores the terminal claim of a completed shard whose
        owner died before recording it (or whose claim was removed by hand)."""
        token = new_token()
        now = time.time()
        record = ClaimRecord(
            shard_id=shard_id,
            token=token,
            attempt_id=new_attempt_id(self.host, token),
            host=self.host,
            pid=self.pid,
            claimed_at=now,
            status=status,
            updated_at=now,
        )
        if not fsops.publish_once(self.layout.lock(shard_id), encode(record)):
            return None
        return Claim(shard_id, token, record.attempt_id, record)

    def owns(self, claim: Claim) -> bool:
        try:
            current = read_claim(self.layout, claim.shard_id)
        except ValueError:
            return False
        return current is not None and current.token == claim.token

    def release(self, claim: Claim) -> bool:
        """Give a non-terminal claim back (after a failed attempt) so the shard is pending again."""
        return remove_if_token(
            self.layout.lock(claim.shard_id), self.layout.stale_lock(claim.shard_id, f"{claim.token}.released"), claim.token
        )

    def repair_done(self, stale: ClaimRecord, unchanged_secs: float) -> bool:
        """P6 repair: the shard's completion is published but its owner died before marking its
        claim done. The claim is replaced by a terminal one. If the published attempt is the
        stale claim's own, it is recorded as succeeded (its output is the one merge uses), not as
        superseded; any other stale attempt is superseded as in a takeover."""
        path = self.layout.done(stale.shard_id)
        completion = fsops.read_record(path, lambda data: decode(CompletionRecord, data, path))
        if completion is None or completion.attempt_id != stale.attempt_id:
            if not self.take_over(stale, unchanged_secs):
                return False
        else:
            lock = self.layout.lock(stale.shard_id)
            if not remove_if_token(
                lock, self.layout.stale_lock(stale.shard_id, f"{stale.token}.done-{new_token()[:8]}"), stale.token
            ):
                return False
            attempt_dir = self.layout.attempt_dir(stale.shard_id, stale.attempt_id)
            record = read_attempt(attempt_dir)
            if record is not None and record.status == AttemptStatus.RUNNING:
                done = replace(
                    record,
                    status=AttemptStatus.SUCCEEDED,
                    finished_at=completion.finished_at,
                    exit_code=0,
                    output_rows=completion.output_rows,
                    output_bytes=completion.output_bytes,
                    output_sha256=completion.output_sha256,
                )
                fsops.replace_atomic(attempt_files(attempt_dir)["record"], encode(done))
            log.warning(
                "%s was published by host=%s pid=%s, which died before recording it: marked done",
                stale.shard_id,
                stale.host,
                stale.pid,
            )
        self.try_claim(stale.shard_id, status=ClaimStatus.DONE)
        return True

    def take_over(self, stale: ClaimRecord, unchanged_secs: float, reason: str | None = None) -> bool:
        """Remove a claim judged stale; True if this worker removed exactly that claim.

        `reason` replaces the staleness explanation when the owner is known to be dead (a local
        launcher that reaped its worker process)."""
        mine = new_token()
        lock = self.layout.lock(stale.shard_id)
        if not remove_if_token(lock, self.layout.stale_lock(stale.shard_id, f"{stale.token}.stale-{mine[:8]}"), stale.token):
            return False
        attempt_dir = self.layout.attempt_dir(stale.shard_id, stale.attempt_id)
        fsops.ensure_dir(attempt_dir.parent)
        fsops.ensure_dir(attempt_dir)
        note = SupersededRecord(
            shard_id=stale.shard_id,
            attempt_id=stale.attempt_id,
            by_token=mine,
            by_host=self.host,
            by_pid=self.pid,
            at=time.time(),
            reason=reason or f"heartbeat unchanged for {unchanged_secs:.1f}s (lease) as observed by {self.host}",
        )
        fsops.publish_once(attempt_files(attempt_dir)["superseded"], encode(note))
        log.warning(
            "took over stale claim of %s from host=%s pid=%s (attempt %s)",
            stale.shard_id,
            stale.host,
            stale.pid,
            stale.attempt_id,
        )
        return True

    def finish(self, claim: Claim, status: str) -> bool:
        """Write the terminal status into the claim record, if the claim is still ours."""
        if not self.owns(claim):
            return False
        record = replace(claim.record, status=status, updated_at=time.time())
        fsops.replace_atomic(self.layout.lock(claim.shard_id), encode(record))
        claim.record = record
        return True

    def publish_completion(self, claim: Claim, record: CompletionRecord) -> bool:
        """Create-once completion; refused (False) if the claim is no longer ours (fencing)."""
        if not self.owns(claim):
            return False
        return fsops.publish_once(self.layout.done(claim.shard_id), encode(record))

    def publish_failure(self, shard_id: str, record: FailureRecord) -> bool:
        return fsops.publish_once(self.layout.failed(shard_id), encode(record))

    def mark_failed_terminal(self, claim: Claim, failures: int, last_attempt: str | None, last_error: str | None) -> None:
        record = FailureRecord(
            shard_id=claim.shard_id,
            failures=failures,
            last_attempt_id=last_attempt or claim.attempt_id,
            last_error=last_error or "unknown error",
            host=self.host,
            at=time.time(),
        )
        self.publish_failure(claim.shard_id, record)
        self.finish(claim, ClaimStatus.FAILED)


class LeaseKeeper(threading.Thread):
    """Renews a lease every `interval` by rewriting its heartbeat file with an increasing `seq`,
    and reports the lease's loss through `on_lost`, once.

    `check()` returns why the lease is no longer ours, or None. Ownership is also given up when
    the heartbeat cannot be written for half a lease (the node is cut off from the shared
    filesystem): beyond that point another node may take over.
    """

    def __init__(self, name: str, path: Path, token: str, interval: float, lease: float, on_lost: Callable[[str], None]):
        super().__init__(name=name, daemon=True)
        self.path = path
        self.token = token
        self.interval = interval
        self.lease = lease
        self.on_lost = on_lost
        self.seq = 0
        self.phase: str = Phase.STARTING
        self.progress: dict[str, Any] = {"phase_since": time.time()}
        self.lost_reason: str | None = None
        self._stop_event = threading.Event()

    def set_phase(self, phase: str, **progress: Any) -> None:
        """Enter `phase`; `progress` (Heartbeat's optional fields) rides on the next beats."""
        self.phase = phase
        self.note(phase_since=time.time(), **progress)

    def note(self, **progress: Any) -> None:
        """Add to the progress the next beats carry. The dict is replaced, never changed in place:
        the heartbeat thread may be reading it."""
        self.progress = {**self.progress, **progress}

    def beat(self) -> None:
        self.seq += 1
        beat = Heartbeat(
            token=self.token, seq=self.seq, wall_time=time.time(), phase=self.phase, pid=os.getpid(), **self.progress
        )
        fsops.replace_atomic(self.path, encode(beat))

    def check(self) -> str | None:
        raise NotImplementedError

    def run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop_event.wait(self.interval):
            try:
                reason = self.check()
                if reason is None:
                    self.beat()
                    last_ok = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a heartbeat thread that died would let the claim go stale unnoticed
                if not isinstance(exc, OSError):
                    log.exception("%s: heartbeat failed", self.name)
                reason = None
                if time.monotonic() - last_ok > self.lease / 2:
                    reason = f"heartbeat failed for over half a lease: {exc}"
            if reason is not None:
                self.lost_reason = reason
                self.on_lost(reason)
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=self.interval + 5)


class HeartbeatThread(LeaseKeeper):
    """Keeps a shard claim alive; fences the attempt the moment the claim is gone."""

    def __init__(
        self,
        claims: Claims,
        claim: Claim,
        attempt_dir: Path,
        interval: float,
        lease: float,
        on_lost: Callable[[str], None],
    ):
        def lost(reason: str) -> None:
            log.error("lost claim of %s: %s; stopping this attempt", claim.shard_id, reason)
            on_lost(reason)

        files = attempt_files(attempt_dir)
        super().__init__(f"heartbeat-{claim.shard_id}", files["heartbeat"], claim.token, interval, lease, lost)
        self.claims = claims
        self.claim = claim
        self.superseded = files["superseded"]

    def check(self) -> str | None:
        if fsops.lexists(self.superseded):
            return "this attempt was marked superseded by another worker"
        try:
            current = read_claim(self.claims.layout, self.claim.shard_id)
        except ValueError:
            return None
        if current is None:
            return "the claim record is gone"
        if current.token != self.claim.token:
            return f"the claim now belongs to host={current.host} pid={current.pid}"
        return None
