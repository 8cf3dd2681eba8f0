"""Heartbeats: how a lease holder proves it is alive, and how it learns it has lost the lease.

A holder rewrites its heartbeat file with an increasing `seq` every interval; observers judge
staleness by that file not changing (`takeover.py`), never by its time. Shard claims and the
cooperative prepare's units and the `dlc` submission's phases all keep their leases this way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_sharding import confined, fsops
from elastic_sharding.claims.protocol import Claim, Claims, read_claim
from elastic_sharding.layout import JobLayout, attempt_files
from elastic_sharding.records import ClaimRecord, Heartbeat, decode, encode
from elastic_sharding.vocabulary import ClaimStatus, Phase

log = logging.getLogger(__name__)


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
    except confined.LinkRefused as exc:
        log.warning("cannot read the heartbeat of %s: %s", claim.shard_id, exc)
        return None


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
        self._wake = threading.Event()

    def set_phase(self, phase: str, **progress: Any) -> None:
        """Enter `phase`; `progress` (Heartbeat's optional fields) rides on the next beats. The
        processing phase is beaten at once: other workers judge stragglers (and status the ETA)
        from when it began, and a heartbeat interval can be 30 s."""
        self.phase = phase
        self.note(phase_since=time.time(), **progress)
        if phase == Phase.PROCESSING:
            self._wake.set()

    def phase_secs(self, phase: str) -> float | None:
        """How long the holder has been in `phase`, if it is in it now (its own clock)."""
        return time.time() - self.progress["phase_since"] if self.phase == phase else None

    def note(self, **progress: Any) -> None:
        """Add to the progress the next beats carry. The dict is replaced, never changed in place:
        the heartbeat thread may be reading it."""
        self.progress = {**self.progress, **progress}

    def beat(self) -> None:
        self.seq += 1
        beat = Heartbeat(
            token=self.token, seq=self.seq, wall_time=time.time(), phase=self.phase, pid=os.getpid(), **self.progress
        )
        fsops.replace_atomic(self.path, encode(beat), durable=False)  # liveness, not state

    def check(self) -> str | None:
        raise NotImplementedError

    def run(self) -> None:
        last_ok = time.monotonic()
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop_event.is_set():
                return
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
        self._wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=self.interval + 5)


# The start of the reason an attempt stops when another attempt of its shard published first.
OUTRUN = "outrun"


class HeartbeatThread(LeaseKeeper):
    """Keeps a shard claim alive; fences the attempt the moment the claim is gone, and stops it
    the moment another attempt of its shard (a backup, or the claim a backup backs up) published."""

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
            if reason.startswith(OUTRUN):
                log.info("%s: %s; stopping this attempt", claim.shard_id, reason)
            else:
                log.error("lost claim of %s: %s; stopping this attempt", claim.shard_id, reason)
            on_lost(reason)

        files = attempt_files(attempt_dir)
        super().__init__(f"heartbeat-{claim.shard_id}", files["heartbeat"], claim.token, interval, lease, lost)
        self.claims = claims
        self.claim = claim
        self.superseded = files["superseded"]

    def check(self) -> str | None:
        if confined.lexists(self.superseded):
            return "this attempt was marked superseded by another worker"
        winner = self.claims.lost_to(self.claim)
        if winner is not None:
            return f"{OUTRUN}: attempt {winner.attempt_id} on {winner.host} published {self.claim.shard_id} first"
        try:
            current = read_claim(self.claims.layout, self.claim.shard_id)
        except ValueError:
            return None
        if current is None:
            return "the claim record is gone"
        if current.token == self.claim.token:
            return None
        backs_up = self.claim.backs_up
        if backs_up is not None and current.token == backs_up.token:
            return None if current.status == ClaimStatus.RUNNING else f"the claim it backs up ended ({current.status})"
        return f"the claim now belongs to host={current.host} pid={current.pid}"
