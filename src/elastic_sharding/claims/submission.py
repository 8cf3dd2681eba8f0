"""Coordination of one `dlc` submission through the shared directory: phases and the first failure.

Every instance of a submission runs the same command. For each phase (prepare, finalize) they
race to publish `<phase>.lock` create-once; the winner does the work under a heartbeated lease
and publishes `<phase>-result.json` once; the others wait for that result. A coordinator whose
heartbeat stops changing for a whole coordinator lease (as observed on the waiter's own monotonic
clock, like shard claims) is taken over. The phases are idempotent (prepare publishes its job
directory atomically and is a no-op when repeated; finalize re-verifies an existing merge), so
a slow coordinator that was taken over can at worst repeat work, never corrupt it.

The first failure of any instance is published once as `abort.lock` and `abort.json`; every
instance that sees it stops and exits with its exit code. Success and failure are decided by one
create-once `outcome.json` first, so a failure that races a finishing finalize cannot leave some
instances exiting 0 and others 2.

Each run id gets its own generation directory, so a new submission never sees the terminal
state of an earlier one and can recover an unchanged job directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_sharding import confined, crashpoints, fsops
from elastic_sharding.claims.heartbeat import LeaseKeeper, read_heartbeat_file
from elastic_sharding.claims.protocol import new_token, remove_if_token
from elastic_sharding.claims.takeover import StalenessObserver
from elastic_sharding.errors import EXIT_ERROR, Aborted, ElasticShardError, Interrupted
from elastic_sharding.layout import SubmissionLayout, coordination_root
from elastic_sharding.records import Heartbeat, Outcome, PhaseLock, PhaseResult, RunRecord, decode, encode

log = logging.getLogger(__name__)

PREPARE, FINALIZE = "prepare", "finalize"
MAX_COORDINATOR_HEARTBEAT = 10.0
PROGRESS_LOG_SECS = 60.0
RUN_HASH_RE = re.compile(r"^[0-9a-f]{16}$")


def run_hash(run_id: str) -> str:
    return hashlib.sha256(run_id.encode()).hexdigest()[:16]


def _read(path: Path, cls: type) -> Any:
    try:
        return fsops.read_record(path, lambda data: decode(cls, data, path))
    except ValueError as exc:
        raise ElasticShardError(f"corrupt coordination record {exc}") from None


class Generation(SubmissionLayout):
    """The coordination directory of one submission (run id) of one job directory."""

    def __init__(self, job_dir: Path, run_id: str):
        self.job_dir = Path(os.path.abspath(job_dir))
        self.run_id = run_id
        super().__init__(coordination_root(self.job_dir) / run_hash(run_id))
        self.host = socket.gethostname()

    def open(self) -> None:
        """Create the generation's directory; a link planted at any level of it is refused."""
        fsops.ensure_dir(self.root.parent, parents=True)
        fsops.ensure_dir(self.root)
        fsops.ensure_dir(self.stale_dir)
        record = RunRecord(self.run_id, str(self.job_dir), f"{self.host}:{os.getpid()}", time.time())
        fsops.publish_once(self.path("run.json"), encode(record))

    # -- the first failure ------------------------------------------------------------------

    def outcome(self) -> Outcome | None:
        return _read(self.path("outcome.json"), Outcome)

    def abort_record(self) -> Outcome | None:
        """The submission's failure, if it failed (from `outcome.json` too, in case the deciding
        instance died before writing abort.lock/abort.json)."""
        for name in ("abort.json", "abort.lock", "outcome.json"):
            record = _read(self.path(name), Outcome)
            if record is not None:
                return None if record.ok else record
        return None

    def raise_if_aborted(self) -> None:
        record = self.abort_record()
        if record is not None:
            raise aborted(record)

    def _outcome(self, ok: bool, phase: str, exit_code: int, reason: str) -> Outcome:
        return Outcome(self.run_id, ok, phase, exit_code, reason, self.host, os.getpid(), time.time())

    def _decide(self, outcome: Outcome) -> bool:
        return fsops.publish_once(self.path("outcome.json"), encode(outcome))

    def publish_abort(self, phase: str, exit_code: int, reason: str) -> Outcome | None:
        """Publish this failure unless another outcome was first. Returns the failure every
        instance uses, or None if the submission had already succeeded."""
        record = self._outcome(False, phase, exit_code, reason)
        if self._decide(record):
            fsops.publish_once(self.path("abort.lock"), encode(record))
            fsops.publish_once(self.path("abort.json"), encode(record))
            log.error("published the first failure of run %s (%s phase, exit code %d): %s", self.run_id, phase, exit_code, reason)
            return record
        outcome = self.outcome()
        if outcome is not None and outcome.ok:
            return None
        return self.abort_record() or record

    def publish_success(self, message: str) -> Outcome | None:
        """Decide that the submission succeeded; returns the failure that came first, if one did."""
        if self._decide(self._outcome(True, FINALIZE, 0, message)):
            return None
        outcome = self.outcome()
        if outcome is not None and outcome.ok:
            return None
        return self.abort_record()

    # -- phase results ----------------------------------------------------------------------

    def result(self, phase: str) -> PhaseResult | None:
        return _read(self.result_path(phase), PhaseResult)

    def publish_result(self, result: PhaseResult) -> PhaseResult:
        if fsops.publish_once(self.result_path(result.phase), encode(result)):
            return result
        return self.result(result.phase) or result

    def lock(self, phase: str) -> PhaseLock | None:
        return _read(self.lock_path(phase), PhaseLock)

    def phase_heartbeat(self, phase: str) -> Heartbeat | None:
        return read_heartbeat_file(self.heartbeat_path(phase))


def aborted(record: Outcome) -> Aborted:
    return Aborted(
        f"run {record.run_id} failed during {record.phase} on host={record.host} (exit code {record.exit_code}): "
        f"{record.reason}. Fix the cause, then submit again with a new run id: the job directory is reused and "
        "failed shards are requeued",
        record.exit_code,
    )


class _PhaseKeeper(LeaseKeeper):
    def __init__(self, gen: Generation, lock: PhaseLock, interval: float, lease: float):
        super().__init__(f"{lock.phase}-coordinator", gen.heartbeat_path(lock.phase), lock.token, interval, lease, self._lost)
        self.gen = gen
        self.lock = lock
        self.phase = lock.phase

    def _lost(self, reason: str) -> None:
        log.warning("lost the DLC %s coordinator lease: %s; another instance is repeating this phase", self.lock.phase, reason)

    def check(self) -> str | None:
        current = self.gen.lock(self.lock.phase)
        if current is None:
            return "the coordinator lock is gone"
        if current.token != self.lock.token:
            return f"it now belongs to host={current.host} pid={current.pid}"
        return None


def coordinator_heartbeat(lease: float) -> float:
    return min(MAX_COORDINATOR_HEARTBEAT, lease / 4)


def run_phase(
    gen: Generation,
    phase: str,
    work: Callable[[], tuple[str, dict[str, Any]]],
    lease: float,
    poll: float,
    wait_timeout: float,
    assist: Callable[[], None] | None = None,
) -> PhaseResult:
    """Run `phase` once for the whole submission: coordinate it if elected, else wait for it.

    `work` returns (message, details) or raises `ElasticShardError`. Returns the published
    result; a failed phase has also been published as the submission's abort. A waiting
    instance calls `assist` at every poll: it may take part in the coordinator's work.
    """
    observer = StalenessObserver(lease)
    deadline = time.monotonic() + wait_timeout
    took_over_from: str | None = None
    waiting_on: str | None = None
    next_note = 0.0
    while True:
        gen.raise_if_aborted()
        result = gen.result(phase)
        if result is not None:
            return result
        lock = gen.lock(phase)
        if lock is None:
            mine = PhaseLock(gen.run_id, phase, new_token(), gen.host, os.getpid(), time.time(), took_over_from)
            if fsops.publish_once(gen.lock_path(phase), encode(mine)):
                return _coordinate(gen, mine, work, lease)
            time.sleep(poll)  # another instance won; its record may not be visible here yet
            continue
        beat = gen.phase_heartbeat(phase)
        seq = beat.seq if beat is not None and beat.token == lock.token else 0
        if waiting_on != lock.token or time.monotonic() >= next_note:
            verb = "waiting" if waiting_on != lock.token else "still waiting"
            waiting_on, next_note = lock.token, time.monotonic() + PROGRESS_LOG_SECS
            log.info(
                "%s for the DLC %s coordinator host=%s pid=%d (run %s, heartbeat %d)",
                verb,
                phase,
                lock.host,
                lock.pid,
                gen.run_id,
                seq,
            )
        if observer.is_stale(phase, lock.token, seq):
            unchanged = observer.unchanged_for(phase)
            observer.forget(phase)
            moved = gen.stale_dir / f"{phase}.lock.{lock.token}.{new_token()[:8]}"
            if remove_if_token(gen.lock_path(phase), moved, lock.token):
                log.warning(
                    "the DLC %s coordinator host=%s pid=%d did not heartbeat for %.1fs (one coordinator lease): taking the phase over",
                    phase,
                    lock.host,
                    lock.pid,
                    unchanged,
                )
                took_over_from = f"{lock.host}:{lock.pid}"
            continue
        if time.monotonic() >= deadline:
            record = gen.publish_abort(
                phase,
                EXIT_ERROR,
                f"timed out after {wait_timeout:.0f}s (--wait-timeout-secs) waiting for the {phase} coordinator "
                f"host={lock.host} pid={lock.pid}",
            )
            if record is not None:
                raise aborted(record)
            continue  # it succeeded at the last moment: read the result
        if assist is not None:
            assist()
        time.sleep(poll)


def _coordinate(gen: Generation, lock: PhaseLock, work: Callable[[], tuple[str, dict[str, Any]]], lease: float) -> PhaseResult:
    suffix = f", taking over from {lock.took_over_from}" if lock.took_over_from else ""
    log.info("elected as DLC %s coordinator (run %s, hostname=%s%s)", lock.phase, gen.run_id, gen.host, suffix)
    keeper = _PhaseKeeper(gen, lock, coordinator_heartbeat(lease), lease)
    keeper.beat()
    keeper.start()
    crashpoints.reached(f"phase-locked:{lock.phase}")
    try:
        message, details = work()
        details = {**details, "pid": os.getpid()}
        result = PhaseResult(gen.run_id, lock.phase, True, 0, message, gen.host, time.time(), details)
    except (Interrupted, KeyboardInterrupt):
        # Hand the phase to another instance at once instead of after a lease.
        keeper.stop()
        remove_if_token(gen.lock_path(lock.phase), gen.stale_dir / f"{lock.phase}.lock.{lock.token}.released", lock.token)
        raise
    except ElasticShardError as exc:
        result = PhaseResult(gen.run_id, lock.phase, False, exc.exit_code, str(exc), gen.host, time.time())
    except Exception as exc:  # noqa: BLE001 - a crash of the phase must still end every instance
        result = PhaseResult(
            gen.run_id, lock.phase, False, EXIT_ERROR, f"internal error: {type(exc).__name__}: {exc}", gen.host, time.time()
        )
        log.exception("the DLC %s phase crashed", lock.phase)
    finally:
        keeper.stop()
    crashpoints.reached(f"phase-done:{lock.phase}")
    published = gen.publish_result(result)
    if not published.ok:
        gen.publish_abort(lock.phase, published.exit_code, published.message)
    return published


def generations(job_dir: Path) -> list[dict[str, Any]]:
    """A summary of every submission's coordination state, for `status` (read-only). Only real
    directories named like run hashes are read; links are never followed."""
    root = coordination_root(job_dir)
    try:
        entries = confined.list_dir(root)
    except OSError:
        return []
    summary = []
    for name in sorted(name for name, kind in entries.items() if kind == "dir" and RUN_HASH_RE.match(name)):
        directory = root / name
        try:
            run = _read(directory / "run.json", RunRecord)
        except ElasticShardError:
            run = None
        if run is None:
            continue
        gen = Generation(job_dir, run.run_id)
        entry: dict[str, Any] = {"run_id": run.run_id, "dir": str(directory), "created_at": run.created_at}
        entry.update({phase: {"state": "unreadable"} for phase in (PREPARE, FINALIZE)})
        try:
            for phase in (PREPARE, FINALIZE):
                result = gen.result(phase)
                lock = gen.lock(phase)
                if result is not None:
                    entry[phase] = {"state": "ok" if result.ok else "failed", "host": result.host, "message": result.message}
                elif lock is not None:
                    entry[phase] = {"state": "running", "host": lock.host, "pid": lock.pid}
                else:
                    entry[phase] = {"state": "not started"}
            abort = gen.abort_record()
        except ElasticShardError as exc:
            entry["error"] = str(exc)
            abort = None
        entry["abort"] = (
            None
            if abort is None
            else {
                "phase": abort.phase,
                "exit_code": abort.exit_code,
                "reason": abort.reason,
                "host": abort.host,
            }
        )
        summary.append(entry)
    summary.sort(key=lambda e: e["created_at"])
    return summary
