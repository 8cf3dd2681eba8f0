"""Which running shard an idle worker backs up, and whether it may: the backup decision.

Dynamic claiming balances the body of a job, not its tail: a node that is alive but slow keeps
heartbeating, so its shard is never taken over, and everyone waits for it. A worker that finds
nothing to claim may therefore start a *backup attempt* of a running shard (`Claims.try_backup`);
the first of the two attempts to publish wins (docs/concepts/claims-and-guarantees.md, "A node is
alive but slow", which describes the trigger for users):

- Whether a shard straggles is `StragglerRule`, the one definition of the trigger: `BackupPolicy`
  starts backups by it and `status` flags stragglers by it (`observe/stragglers.py`), each with
  what it can see. Its thresholds are the job's settings `backup_after` and `backup_min_secs`.
  It needs BACKUP_MIN_DONE completed shards: their processing seconds per byte (completion
  records' `processing_secs`) give the median. A shard straggles once its processing time exceeds
  `backup_after` x the median x its bytes, and that expectation by at least `backup_min_secs`; an
  attempt still starting (verifying its input, starting its runtime) once it has been at it
  STARTUP_ALLOWANCE_SECS longer than that: a node that cannot start its runtime would otherwise
  hold its one shard until the runtime's start-up timeout. With `backup_after` 0 (no backups) the
  rule still judges, with the default factor, so that `status` shows slow nodes; no backup starts.
- A candidate is another worker's live claim in the processing or a starting phase, without a
  backup yet, that straggles. Its time in the phase is the owner's (heartbeat time minus phase
  start, on its clock) plus how long this worker has seen that heartbeat unchanged (on its own):
  no clocks are compared across nodes, and a long heartbeat interval does not delay the backup.
  The median is of a bounded sample (SAMPLE completion records, and this worker's own shards).
- Of the candidates, the one with the longest estimated time left is backed up: with the rows it
  has done known, LATE's estimate (elapsed / progress - elapsed); otherwise (Ray does not report
  rows mid-shard) the one furthest past its expected time, relative to it.
- A worker whose own recent shards took over SLOW_WORKER_FACTOR x the median per byte does not
  back up others (it would be no faster); one that has finished none yet may. Its first shard
  does not count: it was slow to process anyway (Ray starts its worker processes on first use).
- At most max(1, floor(`backup_share` x live workers)) backup attempts run at once; the live
  workers are the owners of the running claims this worker saw, their backups, and itself.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from elastic_sharding import confined
from elastic_sharding.claims.heartbeat import read_heartbeat
from elastic_sharding.claims.history import read_attempt
from elastic_sharding.claims.protocol import Claim, Claims, read_backup, read_completion
from elastic_sharding.claims.takeover import ShardScanner, StalenessObserver
from elastic_sharding.records import BackupRecord, ClaimRecord, CompletionRecord, Heartbeat, Manifest, ShardSpec
from elastic_sharding.settings import DEFAULT_BACKUP_AFTER, DEFAULT_BACKUP_MIN_SECS, Settings
from elastic_sharding.vocabulary import STARTING_PHASES, AttemptStatus, ClaimStatus, Phase

log = logging.getLogger(__name__)

BACKUP_MIN_DONE = 3
STARTUP_ALLOWANCE_SECS = 60.0  # a healthy runtime starts in 5-20 s
SLOW_WORKER_FACTOR = 1.5
SAMPLE = 64  # completions read for the median; each is read once per worker
RECENT = 5  # this worker's own shards that say whether it is fast


def secs_per_byte(completion: CompletionRecord | None, spec: ShardSpec | None) -> float | None:
    """A completed shard's processing seconds per normalized byte: what the median is of (None for
    a record without `processing_secs`, written before backups existed, or an empty shard)."""
    if completion is None or completion.processing_secs is None or spec is None or spec.bytes <= 0:
        return None
    return completion.processing_secs / spec.bytes


@dataclass(frozen=True)
class Straggling:
    """How far a running attempt is past the time the median shard needed for its size."""

    phase: str
    phase_secs: float  # in its phase
    processing_secs: float  # in its phase, less the start-up allowance if it is still starting
    expected_secs: float  # the median shard's time for its size

    @property
    def overrun(self) -> float:
        return self.processing_secs / self.expected_secs if self.expected_secs > 0 else math.inf

    def reason(self) -> str:
        """Why it straggles: a backup record's reason, and `status`'s words for it."""
        allowed = self.phase_secs - self.processing_secs
        started = f" ({allowed:.0f}s allowed for starting)" if allowed > 0 else ""
        return (
            f"{self.phase} for {self.phase_secs:.0f}s{started}, {self.overrun:.1f}x the median shard's "
            f"{self.expected_secs:.1f}s for its size"
        )


@dataclass(frozen=True)
class StragglerRule:
    """When a running shard straggles: the trigger of its backup, and `status`'s straggler flag.

    `factor` and `min_secs` are the job's `backup_after` and `backup_min_secs`; `backs_up` is
    False for `backup_after` 0, which judges with the default factor and starts no backup."""

    factor: float = DEFAULT_BACKUP_AFTER
    min_secs: float = DEFAULT_BACKUP_MIN_SECS
    backs_up: bool = True
    min_done: int = BACKUP_MIN_DONE
    startup_allowance_secs: float = STARTUP_ALLOWANCE_SECS

    @classmethod
    def of(cls, settings: Settings) -> StragglerRule:
        backs_up = settings.backup_after > 0
        return cls(settings.backup_after if backs_up else DEFAULT_BACKUP_AFTER, settings.backup_min_secs, backs_up)

    def median(self, per_byte: Collection[float]) -> float | None:
        """The median seconds per byte of completed shards, once `min_done` are known."""
        return statistics.median(per_byte) if len(per_byte) >= self.min_done else None

    def judge(self, phase: str | None, phase_secs: float | None, shard_bytes: int, median: float) -> Straggling | None:
        """Whether an attempt `phase_secs` into `phase` straggles (None: it does not, or cannot be
        judged: queued, collecting or publishing, or a heartbeat without its phase's start)."""
        if phase_secs is None:
            return None
        if phase == Phase.PROCESSING:
            allowance = 0.0
        elif phase in STARTING_PHASES:
            allowance = self.startup_allowance_secs
        else:
            return None
        processing = phase_secs - allowance
        expected = median * shard_bytes
        if processing <= self.factor * expected or processing - expected < self.min_secs:
            return None
        return Straggling(phase, phase_secs, processing, expected)


@dataclass
class Candidate:
    record: ClaimRecord
    straggling: Straggling
    left_secs: float | None  # LATE's estimate, when the attempt reports rows done

    def rank(self) -> tuple[float, float]:
        return (self.left_secs if self.left_secs is not None else -1.0, self.straggling.overrun)

    def reason(self) -> str:
        return self.straggling.reason()


class BackupPolicy:
    """One worker's backup decisions over one recipe segment's shards."""

    def __init__(self, claims: Claims, scanner: ShardScanner, manifest: Manifest, settings: Settings):
        self.claims = claims
        self.scanner = scanner
        self.settings = settings
        self.rule = StragglerRule.of(settings)
        self.specs = {spec.shard_id: spec for spec in manifest.shards}
        self._per_byte: dict[str, float] = {}  # done shard -> its processing seconds per byte
        self._unreadable: set[str] = set()
        self.own: deque[float] = deque(maxlen=RECENT)  # this worker's seconds per byte, newest last
        self._finished_one = False
        self._observer = StalenessObserver(settings.lock_timeout_secs)

    @property
    def enabled(self) -> bool:
        return self.rule.backs_up

    def finished(self, shard_id: str, processing_secs: float | None) -> None:
        """This worker completed a shard: it counts for the median and for this worker's speed."""
        spec = self.specs.get(shard_id)
        if processing_secs is None or spec is None or spec.bytes <= 0:
            return
        if self._finished_one:
            self.own.append(processing_secs / spec.bytes)
        self._finished_one = True
        self._per_byte[shard_id] = processing_secs / spec.bytes

    def median_per_byte(self) -> float | None:
        """The median processing seconds per byte of completed shards (a sample of at most SAMPLE)."""
        if len(self._per_byte) < SAMPLE:
            done = [s for s, status in self.scanner.terminal.items() if status == ClaimStatus.DONE]
            unread = [s for s in done if s not in self._per_byte and s not in self._unreadable]
            for shard_id in unread[: SAMPLE - len(self._per_byte)]:
                self._read_completion(shard_id)
        return self.rule.median(list(self._per_byte.values()))

    def _read_completion(self, shard_id: str) -> None:
        try:
            completion = read_completion(self.claims.layout, shard_id)
        except (OSError, ValueError):
            completion = None
        per_byte = secs_per_byte(completion, self.specs.get(shard_id))
        if per_byte is None:
            self._unreadable.add(shard_id)
            return
        self._per_byte[shard_id] = per_byte

    def pick(self) -> Claim | None:
        """Start a backup attempt of the running shard that needs one most, if this worker may."""
        if not self.enabled or not self.scanner.running:
            return None
        median = self.median_per_byte()
        if median is None:
            return None
        if self.own and statistics.median(self.own) > SLOW_WORKER_FACTOR * median:
            return None
        # Judged first from what the last pass read, with no read here: an idle worker polls this
        # every interval, and most polls have no straggler to look at.
        candidates = []
        for shard_id, (record, heartbeat) in self.scanner.running.items():
            candidate = self._candidate(record, heartbeat, self.scanner.observer.unchanged_for(shard_id), median)
            if candidate is not None:
                candidates.append(candidate)
        if not candidates:
            return None
        workers, backups, backed_up = set(), 0, set()
        for shard_id, (record, _heartbeat) in self.scanner.running.items():
            workers.add((record.host, record.pid))
            backup = read_backup(self.claims.layout, shard_id, record.token)
            if backup is not None:
                workers.add((backup.host, backup.pid))
                backups += self._backup_running(shard_id, backup)
                backed_up.add(shard_id)
        candidates = [c for c in candidates if c.record.shard_id not in backed_up]
        workers.add((self.claims.host, self.claims.pid))
        if not candidates or backups >= max(1, math.floor(self.settings.backup_share * len(workers))):
            return None
        for candidate in sorted(candidates, key=Candidate.rank, reverse=True):
            shard_id = candidate.record.shard_id
            if confined.lexists(self.claims.layout.done(shard_id)):
                continue
            claim = self.claims.try_backup(candidate.record, candidate.reason())
            if claim is not None:
                log.warning(
                    "%s on host=%s pid=%s is straggling (%s): starting a backup attempt %s",
                    shard_id,
                    candidate.record.host,
                    candidate.record.pid,
                    candidate.reason(),
                    claim.attempt_id,
                )
                return claim
        return None

    def _candidate(self, record: ClaimRecord, heartbeat: Heartbeat | None, unchanged: float, median: float) -> Candidate | None:
        spec = self.specs.get(record.shard_id)
        if heartbeat is None or spec is None or heartbeat.phase_since is None:
            return None
        in_phase = max(0.0, heartbeat.wall_time - heartbeat.phase_since) + unchanged
        straggling = self.rule.judge(heartbeat.phase, in_phase, spec.bytes, median)
        if straggling is None:
            return None
        left = None
        if heartbeat.rows_done and spec.rows and heartbeat.rows_done < spec.rows:
            processing = straggling.processing_secs
            left = processing * spec.rows / heartbeat.rows_done - processing
        return Candidate(record, straggling, left)

    def _backup_running(self, shard_id: str, backup: BackupRecord) -> bool:
        """Whether a backup attempt still runs: not ended, and its heartbeat not stale (a backup
        whose worker died must not hold the share of backups for the rest of the job)."""
        try:
            attempt_dir = self.claims.layout.existing_attempt_dir(shard_id, backup.attempt_id)
            attempt = read_attempt(attempt_dir)
            heartbeat = read_heartbeat(attempt_dir)
        except OSError:
            return False
        if attempt is not None and attempt.status != AttemptStatus.RUNNING:
            return False
        seq = heartbeat.seq if heartbeat is not None and heartbeat.token == backup.token else 0
        return not self._observer.is_stale(backup.attempt_id, backup.token, seq)
