"""One attempt at a shard: stage it (attempt directory, record, heartbeat, verified input, the
attempt's recipe), run it, collect and validate its output, publish its completion, or record
why it failed and hand the claim back or fail the shard.

The worker's loop (`worker.py`) decides which claims to run; this is what running one means.
A job directory holds each shard's output once, in `processed.jsonl`: what attempts leave
behind is removed (`leftovers.py`); each attempt runs its own copy of the job's recipe
(`attempt_recipe.py`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from elastic_sharding import confined, crashpoints, fsops
from elastic_sharding.claims.backups import BackupPolicy
from elastic_sharding.claims.heartbeat import OUTRUN, HeartbeatThread
from elastic_sharding.claims.history import count_failures, read_attempt
from elastic_sharding.claims.protocol import Claim, Claims
from elastic_sharding.claims.takeover import ShardScanner
from elastic_sharding.errors import AttemptFailed, AttemptInterrupted, JobStateError
from elastic_sharding.layout import JobLayout, attempt_files, processed_file
from elastic_sharding.records import (
    STATS_EXPORT_FIELDS,
    AttemptRecord,
    CompletionRecord,
    Manifest,
    SegmentSpec,
    ShardSpec,
    encode,
    operator_stats,
)
from elastic_sharding.settings import Settings
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus, Phase
from elastic_sharding.work.attempt_recipe import AttemptRecipes
from elastic_sharding.work.collect import collect, remove_unused_output
from elastic_sharding.work.leftovers import AttemptLeftovers
from elastic_sharding.work.lookahead import Lookahead
from elastic_sharding.work.node_health import NodeHealth, avoid_secs, is_node_local
from elastic_sharding.work.runners import AttemptContext, Runner

log = logging.getLogger(__name__)


def sha256_file(path: Path) -> str:
    """sha256 of a file inside the job directory (a symbolic link raises LinkRefused, unread)."""
    digest = hashlib.sha256()
    with confined.open_read(path, buffering=0) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Staged:
    """A claimed attempt ready to run: its heartbeat already beats, its input is verified."""

    claim: Claim
    spec: ShardSpec
    record: AttemptRecord
    ctx: AttemptContext
    heartbeat: HeartbeatThread


class AttemptSteps(AttemptRecipes, AttemptLeftovers):
    """The attempt state machine, as a part of `Worker` (which sets every attribute below)."""

    layout: JobLayout
    manifest: Manifest
    job_manifest: Manifest
    segment: SegmentSpec
    settings: Settings
    host: str
    claims: Claims
    scanner: ShardScanner
    backups: BackupPolicy
    health: NodeHealth
    runner: Runner
    overlaps: bool
    completed: int
    current: AttemptContext | None
    last_rate: float | None
    last_end: float | None  # when this worker's previous attempt ended (wall clock)
    stopping: str | None
    _raw_leftovers: set[Path]

    def process(self, claim: Claim) -> None:
        staged = self._stage(claim)
        if staged is not None:
            self._execute(staged)

    def _stage(self, claim: Claim) -> Staged | None:
        """Everything before the engine runs: attempt dir and record, heartbeat, input check, recipe.

        Returns None when the attempt already failed here (recorded like any failed attempt).
        """
        crashpoints.reached("claimed")
        spec = self.manifest.shard(claim.shard_id)
        attempt_dir = self.layout.attempt_dir(claim.shard_id, claim.attempt_id)
        try:
            fsops.ensure_dir(attempt_dir.parent)
            created = fsops.make_unique_dir(attempt_dir)
        except OSError:
            self._release(claim)
            raise
        if not created:
            self._release(claim)
            raise JobStateError(
                f"attempt directory {attempt_dir} already exists; run the worker again (it takes a new attempt id)"
            )
        files = attempt_files(attempt_dir)
        record = AttemptRecord(
            shard_id=claim.shard_id,
            attempt_id=claim.attempt_id,
            token=claim.token,
            host=self.host,
            pid=os.getpid(),
            runner=self.runner.name,
            started_at=time.time(),
            input_rows=spec.rows,
            backup_of=claim.backs_up.attempt_id if claim.backs_up is not None else None,
        )
        fsops.replace_atomic(files["record"], encode(record))
        ctx = AttemptContext(
            shard_id=claim.shard_id,
            attempt_id=claim.attempt_id,
            attempt_dir=attempt_dir,
            recipe_path=files["recipe"],
            log_path=files["log"],
            ray_output=files["ray_output"],
            env=self._attempt_env(),
            stats_only=self.job_manifest.analysis is not None,
        )
        heartbeat = HeartbeatThread(
            self.claims,
            claim,
            attempt_dir,
            self.settings.heartbeat_interval_secs,
            self.settings.lock_timeout_secs,
            on_lost=lambda reason: ctx.stop(reason if reason.startswith(OUTRUN) else f"claim lost: {reason}"),
        )
        heartbeat.note(attempt_started_at=record.started_at)
        ctx.set_phase = heartbeat.set_phase
        ctx.note = heartbeat.note
        try:
            heartbeat.beat()
            heartbeat.start()
            crashpoints.reached("staged")
            self._check_input(ctx, spec)
            return Staged(claim, spec, record, ctx, heartbeat)
        except AttemptFailed as exc:
            heartbeat.stop()
            self._record_failure(claim, record, ctx, str(exc), node_local=is_node_local(exc))
            return None
        except Exception as exc:
            heartbeat.stop()
            self._record_failure(claim, record, ctx, f"{type(exc).__name__}: {exc}")
            raise

    def _execute(self, staged: Staged) -> None:
        claim, spec, record, ctx, heartbeat = staged.claim, staged.spec, staged.record, staged.ctx, staged.heartbeat
        files = attempt_files(ctx.attempt_dir)
        self.current = ctx
        if self.stopping:
            ctx.stop(self.stopping)  # the stop arrived while this attempt was being staged
        role = f"a backup of attempt {claim.backs_up.attempt_id}" if claim.backs_up is not None else "attempt"
        log.info("processing %s (%d rows) as %s %s", claim.shard_id, spec.rows, role, claim.attempt_id)
        lookahead = Lookahead(self, spec, lambda: heartbeat.phase)
        try:
            if ctx.stop_reason() is not None:
                self._cancel_begun(ctx)
                raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
            lookahead.start()
            if self.last_rate:
                heartbeat.note(expected_secs=spec.bytes / self.last_rate)
            if spec.rows:
                self.runner.run(ctx)
            else:  # a stage left this shard empty: nothing to run (Data-Juicer's reader refuses an empty file)
                fsops.make_dirs(ctx.ray_output)
            if ctx.stop_reason() is not None:
                raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
            processing_secs = self._processing_secs(heartbeat)
            ctx.set_phase(Phase.COLLECTING_OUTPUT, rows_done=spec.rows, bytes_done=spec.bytes)
            try:
                codec = self.settings.shard_output_codec
                fields = STATS_EXPORT_FIELDS if ctx.stats_only else None
                stats = collect(ctx.ray_output, processed_file(ctx.attempt_dir, codec), spec.first_row, spec.rows, codec, fields)
            except OSError as exc:
                raise AttemptFailed(f"collecting output failed: {exc}") from None
            ctx.set_phase(Phase.PUBLISHING)
            completion = CompletionRecord(
                shard_id=claim.shard_id,
                attempt_id=claim.attempt_id,
                token=claim.token,
                host=self.host,
                pid=os.getpid(),
                input_rows=spec.rows,
                input_sha256=spec.sha256,
                output_rows=stats.rows,
                output_bytes=stats.bytes,
                output_sha256=stats.sha256,
                started_at=record.started_at,
                finished_at=time.time(),
                processing_secs=processing_secs,
                output_codec=codec,
                stored_bytes=stats.stored_bytes,
                stored_sha256=stats.stored_sha256,
            )
            record = replace(record, output_rows=stats.rows, output_bytes=stats.bytes, output_sha256=stats.sha256)
            crashpoints.reached("publishing")
            self._remove_raw(ctx.ray_output)
            if not self.claims.publish_completion(claim, completion):
                winner = self.claims.lost_to(claim)
                if winner is not None:
                    ctx.stop(f"{OUTRUN}: attempt {winner.attempt_id} on {winner.host} published {claim.shard_id} first")
                    raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
                ctx.stop("claim lost before publishing")
                raise AttemptFailed("claim lost before publishing: this attempt's output is not used")
            self._sweep_leftovers(claim.shard_id, published=claim.attempt_id)
            crashpoints.reached("published")
            holds = self.claims.finish(claim, ClaimStatus.DONE)
            if not holds and claim.backs_up is not None:
                log.warning(
                    "%s: the backup attempt %s won; attempt %s on host=%s stops at its next heartbeat",
                    claim.shard_id,
                    claim.attempt_id,
                    claim.backs_up.attempt_id,
                    claim.backs_up.host,
                )
            self.completed += 1
            self.health.succeeded()
            self.backups.finished(claim.shard_id, processing_secs)
            if spec.bytes:  # an empty shard (left so by a stage) says nothing of the rate
                self.last_rate = spec.bytes / max(lookahead.elapsed() - ctx.setup_secs, 1e-3)
            record = replace(
                record,
                status=AttemptStatus.SUCCEEDED,
                finished_at=time.time(),
                exit_code=0,
                setup_secs=ctx.setup_secs or None,
                operators=operator_stats(ctx.operators),
                promoted=holds and claim.backs_up is not None,
            )
            fsops.replace_atomic(files["record"], encode(record))
            log.info(
                "done %s: %d -> %d rows in %.1fs", claim.shard_id, spec.rows, stats.rows, record.finished_at - record.started_at
            )
        except AttemptInterrupted as exc:
            self._record_failure(claim, record, ctx, f"interrupted: {exc}", handback=True)
        except AttemptFailed as exc:
            self._record_failure(claim, record, ctx, str(exc), node_local=is_node_local(exc))
        except Exception as exc:
            # A problem on this side (disk full, a modified job recipe...) still ends the attempt
            # cleanly: recorded, claim handed back or failed, before the worker reports it.
            self._record_failure(claim, record, ctx, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            heartbeat.stop()
            self.current = None
            self.last_end = time.time()
            lookahead.finish()

    def _processing_secs(self, heartbeat: HeartbeatThread) -> float | None:
        """The time this shard had the worker's processing to itself: from when it began processing
        or when the worker's previous attempt ended, whichever is later. A warm runtime processes a
        claimed-ahead shard beside the current one, and the overlap must not count twice in the
        median shard time that backups measure stragglers by."""
        secs = heartbeat.phase_secs(Phase.PROCESSING)
        if secs is None or self.last_end is None:
            return secs
        return min(secs, time.time() - self.last_end)

    def _check_input(self, ctx: AttemptContext, spec: ShardSpec) -> None:
        ctx.set_phase(Phase.VERIFYING_INPUT)
        shard_path = self.layout.shard_input(spec.shard_id, Path(spec.path).suffix)
        try:
            digest = sha256_file(shard_path)
        except OSError as exc:
            raise AttemptFailed(f"cannot read shard input {shard_path}: {exc.strerror or exc}") from None
        if digest != spec.sha256:
            raise AttemptFailed(f"shard input {shard_path} is corrupt: sha256 {digest} != manifest {spec.sha256}")
        self._write_attempt_recipe(ctx, shard_path)
        ctx.set_phase(Phase.QUEUED)

    def _cancel_begun(self, ctx: AttemptContext) -> None:
        if self.overlaps:
            self.runner.cancel(ctx)  # type: ignore[attr-defined]

    def _record_failure(
        self,
        claim: Claim,
        record: AttemptRecord,
        ctx: AttemptContext,
        error: str,
        handback: bool = False,
        node_local: bool = False,
    ) -> None:
        files = attempt_files(ctx.attempt_dir)
        reason = ctx.stop_reason() or ""
        beaten = reason.startswith(OUTRUN)
        lost = reason.startswith("claim lost")
        if not (beaten or lost or handback) and self._published_by_another(claim):
            # It failed while (or because) another attempt published the shard, before the
            # heartbeat's stop reached it: beaten, not a failure of the shard.
            beaten = True
        status = AttemptStatus.BEATEN if beaten else AttemptStatus.FENCED if lost else AttemptStatus.FAILED
        if (self.stopping or handback) and not (lost or beaten):
            status = AttemptStatus.INTERRUPTED
        node_local = node_local and status == AttemptStatus.FAILED
        backs_up = claim.backs_up
        promoted = backs_up is not None and self.claims.holds(claim)
        record = replace(
            record,
            status=status,
            finished_at=time.time(),
            error=error,
            setup_secs=ctx.setup_secs or None,
            operators=operator_stats(ctx.operators),
            promoted=promoted,
            node_local=node_local,
        )
        try:
            fsops.replace_atomic(files["record"], encode(record))
        except OSError as exc:
            log.error("could not record the outcome of %s: %s", claim.attempt_id, exc)
        # The log and Data-Juicer's work_dir stay for debugging; the rows it exported do not.
        # A warm runtime may still be ending a cancelled attempt: removed again at the exit.
        self._remove_raw(ctx.ray_output, again_at_exit=self.overlaps)
        if beaten:
            self._after_beaten(claim, record, ctx.attempt_dir)
            return
        if node_local:
            self.health.failed(error)
            if self.scanner.other_hosts:  # alone in the job, nobody else would take it
                self.scanner.avoid(claim.shard_id, avoid_secs(self.settings.poll_interval_secs))
        if lost:
            log.error("%s: %s; nothing was published", claim.shard_id, error)
            return
        if backs_up is not None and not promoted:
            log.warning(
                "%s: backup attempt %s ended (%s: %s); attempt %s goes on",
                claim.shard_id,
                claim.attempt_id,
                status,
                error,
                backs_up.attempt_id,
            )
            return
        if status == AttemptStatus.INTERRUPTED:
            if not self._hand_to_backup(claim):
                self._release(claim)
            log.warning("%s: handed back (%s)", claim.shard_id, error)
            return
        failures, last_attempt, last_error = count_failures(self.layout, claim.shard_id)
        log.error(
            "%s attempt %s failed (%d of %d allowed): %s",
            claim.shard_id,
            claim.attempt_id,
            failures,
            self.settings.max_retries + 1,
            error,
        )
        log.error("  log: %s", files["log"])
        if self._hand_to_backup(claim):
            return
        if failures > self.settings.max_retries:
            self.claims.mark_failed_terminal(claim, failures, last_attempt, error)
            self.scanner.mark_terminal(claim.shard_id, ClaimStatus.FAILED)
        else:
            self._release(claim)

    def _release(self, claim: Claim) -> None:
        """Give the claim back; the next pass is a full one, so that this worker sees the shard
        it handed back (behind its frontier) as claimable again."""
        self.claims.release(claim)
        self.scanner.rescan()

    def _hand_to_backup(self, claim: Claim) -> bool:
        """Hand a claim whose attempt ended without output to its backup attempt, if one runs:
        the backup goes on as the claim's own attempt instead of the shard being claimed afresh."""
        backup = self.claims.backup_of(claim)
        if backup is None:
            return False
        try:
            attempt = read_attempt(self.layout.existing_attempt_dir(claim.shard_id, backup.attempt_id))
        except OSError:
            attempt = None
        if attempt is not None and attempt.status != AttemptStatus.RUNNING:
            return False
        if not self.claims.hand_to_backup(claim, backup):
            return False
        log.warning(
            "%s: handed the claim to its backup attempt %s on host=%s pid=%s",
            claim.shard_id,
            backup.attempt_id,
            backup.host,
            backup.pid,
        )
        return True

    def _published_by_another(self, claim: Claim) -> bool:
        try:
            return self.claims.lost_to(claim) is not None
        except OSError:
            return False

    def _after_beaten(self, claim: Claim, record: AttemptRecord, attempt_dir: Path) -> None:
        """Another attempt of the shard published first: nothing of this one is used. The owner
        of record marks the claim done; two finished outputs that differ are reported loudly."""
        winner = self.claims.lost_to(claim)
        remove_unused_output(attempt_dir)
        if self.claims.holds(claim):
            self.claims.finish(claim, ClaimStatus.DONE)
        self.scanner.mark_terminal(claim.shard_id, ClaimStatus.DONE)
        if winner is None:
            log.warning("%s: attempt %s stopped: another attempt published first", claim.shard_id, claim.attempt_id)
            return
        log.info(
            "%s: attempt %s stopped: attempt %s on %s published first; nothing of this one is used",
            claim.shard_id,
            claim.attempt_id,
            winner.attempt_id,
            winner.host,
        )
        if record.output_sha256 is not None and record.output_sha256 != winner.output_sha256:
            log.error(
                "%s: NOT DETERMINISTIC: attempts %s and %s of the same shard produced different outputs "
                "(sha256 %s, %d rows vs %s, %d rows); the published one (%s) is used. A recipe whose output "
                "depends on the run breaks the guarantee that every run of the job gives the same bytes",
                claim.shard_id,
                winner.attempt_id,
                claim.attempt_id,
                winner.output_sha256,
                winner.output_rows,
                record.output_sha256,
                record.output_rows or 0,
                winner.attempt_id,
            )
