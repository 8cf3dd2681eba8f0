"""The claim protocol: acquire a shard, take a stale claim over, fence, finish.

It relies only on create-once publish and rename (docs/design/protocol.md):

* A claim is `state/locks/<shard>.json`, published create-once with a random token. Only one
  publisher per name succeeds, so there is at most one live claim per shard (P1).
* The owner proves it is alive by rewriting `attempts/<shard>/<attempt>/heartbeat.json` with an
  increasing `seq` (`heartbeat.py`). The claim record itself is never rewritten while running, so
  a heartbeat can never resurrect a claim that was taken over.
* A claim is stale only when an observer has seen the same (token, seq) for a whole lease on its
  own `time.monotonic()` (P4, P5; the decision is `takeover.py`).
* Takeover renames the claim away under a unique name, checks that it moved the record it judged
  stale (else links it back), marks the old attempt superseded (create-once), and only then
  publishes a new claim, which can fail if a third worker was quicker.
* The owner re-reads its claim at every heartbeat and immediately before publishing; a missing or
  foreign token fences it: its child is stopped and nothing is published (P3). Completion itself
  is create-once, so even a fenced owner racing a publish cannot produce a second completion (P2).
* Terminal status is written into the claim record (P6): a finished shard's claim stays in
  place with `status: done|failed`, so a claimer never needs a negative lookup to skip it.
* A backup attempt of a running claim is a create-once `state/backups/<shard>.<claim token>.json`
  (at most one per claim). It may publish the completion while that claim still runs, or once
  the claim's owner handed the claim to it; whichever attempt publishes first wins (P2 again),
  the other sees the completion at its next heartbeat and stops. The claim's owner stays the
  owner of record: it marks the claim done when the backup won.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import string
import time
from dataclasses import dataclass, replace
from pathlib import Path

import orjson

from elastic_sharding import confined, fsops
from elastic_sharding.claims.history import read_attempt
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.records import (
    BackupRecord,
    ClaimRecord,
    CompletionRecord,
    FailureRecord,
    SupersededRecord,
    decode,
    encode,
)
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus

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


def removal_ticket(lock: Path, moved: Path, token: str) -> Path:
    """The create-once name that decides who may remove the lease record `token` of `lock`."""
    return moved.parent / f"{lock.name}.{token}.removal"


def _win_removal(ticket: Path) -> bool:
    mine = new_token().encode()
    if fsops.publish_once(ticket, mine):
        return True
    # A create whose reply was lost and retried reports EEXIST for the very file it made.
    try:
        return fsops.read_record(ticket, lambda data: data) == mine
    except (OSError, ValueError):
        return False


def remove_if_token(lock: Path, moved: Path, expected_token: str) -> bool:
    """Rename a lease record away if it still carries `expected_token`; put it back otherwise.

    Who removes the record of one token is decided first, by a create-once ticket named after the
    token (`removal_ticket`): of racing removers (two takeovers, a takeover and the owner's
    release) exactly one goes on. The rename cannot decide it alone on a caching client: a
    client whose name cache still maps `lock` to a record that another node has already moved
    away renames whatever holds the name now (the server goes by name), and then reads the moved
    name through its cache as the old record, token included (fault matrix seed 84113, trial 82:
    two nodes took over one dead claim within a second). Once the ticket is won, the name holds
    the token's record (only its owner rewrites it, keeping the token), so the check after the
    rename only guards against a record replaced by hand.

    True only if this call removed exactly the record it meant to: a record that was replaced
    between the caller's read and the rename is linked back (unless yet another one took its name,
    in which case the replaced owner fences itself at its next heartbeat).
    """
    if not _win_removal(removal_ticket(lock, moved, expected_token)):
        return False
    if not fsops.rename_away(lock, moved):
        return False
    try:
        token = orjson.loads(confined.read_bytes_nofollow(moved)).get("token")
    except (OSError, ValueError, AttributeError):
        token = None
    if token == expected_token:
        return True
    if not fsops.link_back(moved, lock):
        log.warning("%s was moved away by mistake and replaced meanwhile; its owner will fence itself", lock)
    return False


def read_backup(layout: JobLayout, shard_id: str, of_token: str) -> BackupRecord | None:
    path = layout.backup(shard_id, of_token)
    try:
        return fsops.read_record(path, lambda data: decode(BackupRecord, data, path))
    except ValueError:
        return None


def read_completion(layout: JobLayout, shard_id: str) -> CompletionRecord | None:
    """A shard's completion; None if there is none, ValueError if it is malformed."""
    path = layout.done(shard_id)
    return fsops.read_record(path, lambda data: decode(CompletionRecord, data, path))


@dataclass
class Claim:
    """A claim this worker holds, or (`backs_up` set) a backup attempt of another worker's claim."""

    shard_id: str
    token: str
    attempt_id: str
    record: ClaimRecord
    backs_up: ClaimRecord | None = None


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

    def try_backup(self, running: ClaimRecord, reason: str) -> Claim | None:
        """Start the one backup attempt of the running claim `running`; None if it has one already
        or it is no longer running."""
        token = new_token()
        now = time.time()
        backup = BackupRecord(
            shard_id=running.shard_id,
            token=token,
            attempt_id=new_attempt_id(self.host, token),
            host=self.host,
            pid=self.pid,
            of_token=running.token,
            of_attempt_id=running.attempt_id,
            at=now,
            reason=reason,
        )
        if not fsops.publish_once(self.layout.backup(running.shard_id, running.token), encode(backup)):
            return None
        record = ClaimRecord(running.shard_id, token, backup.attempt_id, self.host, self.pid, now, ClaimStatus.RUNNING, now)
        claim = Claim(running.shard_id, token, backup.attempt_id, record, backs_up=running)
        return claim if self.owns(claim) else None

    def _current(self, shard_id: str) -> ClaimRecord | None:
        try:
            return read_claim(self.layout, shard_id)
        except ValueError:
            return None

    def holds(self, claim: Claim) -> bool:
        """The claim record is this attempt's own (a backup's once it was handed the claim)."""
        current = self._current(claim.shard_id)
        return current is not None and current.token == claim.token

    def owns(self, claim: Claim) -> bool:
        """This attempt may publish: it holds the claim, or it backs up a claim that still runs."""
        current = self._current(claim.shard_id)
        if current is None:
            return False
        if current.token == claim.token:
            return True
        backs_up = claim.backs_up
        return backs_up is not None and current.token == backs_up.token and current.status == ClaimStatus.RUNNING

    def lost_to(self, claim: Claim) -> CompletionRecord | None:
        """The completion another attempt of the shard published first, if one did."""
        if not confined.lexists(self.layout.done(claim.shard_id)):
            return None
        try:
            completion = read_completion(self.layout, claim.shard_id)
        except ValueError:
            return None  # damaged: verify and merge report it; it is not this attempt's to judge
        return completion if completion is not None and completion.attempt_id != claim.attempt_id else None

    def backup_of(self, claim: Claim) -> BackupRecord | None:
        return read_backup(self.layout, claim.shard_id, claim.token)

    def hand_to_backup(self, claim: Claim, backup: BackupRecord) -> bool:
        """Make the backup attempt the claim's own (the owner's attempt failed or was drained):
        its heartbeat keeps the claim alive from now on and its failure counts, as an owner's."""
        if not self.holds(claim):
            return False
        record = replace(
            claim.record,
            token=backup.token,
            attempt_id=backup.attempt_id,
            host=backup.host,
            pid=backup.pid,
            updated_at=time.time(),
        )
        fsops.replace_atomic(self.layout.lock(claim.shard_id), encode(record))
        return True

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
        completion = read_completion(self.layout, stale.shard_id)
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
        if not self.holds(claim):
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
