"""worker: claim shards until the job is complete, failed, or `--max-shards` is reached.

One attempt at a time is published; with the warm runner the next (claimed-ahead) attempt is
already processing while the current one drains. Each attempt runs in an isolated
`attempts/<shard>/<attempt>/` directory; its output is published only after it was collected,
validated and the claim re-checked.

Ray's raw export is removed as soon as it is collected, before the completion is published (and
when an attempt fails): a job directory holds each shard's output once, in `processed.jsonl`.
An attempt killed between collecting and that removal leaves its raw export behind (and one
killed later, or fenced, its unused `processed.jsonl`); once the shard's completion is published,
when no other attempt's output can matter any more, the worker that published it removes every
such leftover of the shard's other attempts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from elastic_sharding import crashpoints, fsops
from elastic_sharding.claims.lease import (
    Claim,
    Claims,
    HeartbeatThread,
    StalenessObserver,
    count_failures,
    read_claim,
    read_claim_heartbeat,
)
from elastic_sharding.engine import engine_identity
from elastic_sharding.errors import EXIT_ERROR, EXIT_OK, AttemptFailed, AttemptInterrupted, JobStateError, VersionMismatchError
from elastic_sharding.fsprobe import check_job_filesystem
from elastic_sharding.layout import JobLayout, attempt_files, attempt_ids
from elastic_sharding.prepare.cooperate import JOIN_ENV, help_until_prepared
from elastic_sharding.records import AttemptRecord, CompletionRecord, Manifest, ShardSpec, encode, load, operator_stats
from elastic_sharding.settings import Overrides, with_overrides
from elastic_sharding.signals import on_stop_signals
from elastic_sharding.vocabulary import AttemptStatus, ClaimStatus, Phase
from elastic_sharding.work.collect import collect, remove_raw_output, remove_unused_output
from elastic_sharding.work.runners import DEFAULT_RUNNER, AttemptContext, NodeRuntime, Runner, get_runner

log = logging.getLogger(__name__)

# A warm runtime silent for one heartbeat interval is hung; never judge it on less than this.
MIN_HANG_SECS = 5.0


@dataclass
class WorkerOptions(Overrides):
    """A worker's command line: its overrides of the job's settings, and what only it has."""

    max_shards: int | None = None
    allow_version_mismatch: bool = False
    runner: str = DEFAULT_RUNNER


def check_engine(manifest: Manifest, allow_mismatch: bool) -> None:
    mine = engine_identity()
    recorded = (manifest.data_juicer_version, manifest.data_juicer_commit)
    current = (mine.data_juicer_version, mine.data_juicer_commit)
    if recorded == current:
        return
    message = (
        f"this worker runs Data-Juicer {current[0]} (commit {current[1] or 'n/a'}) but the job was prepared with "
        f"{recorded[0]} (commit {recorded[1] or 'n/a'})"
    )
    if not allow_mismatch:
        raise VersionMismatchError(message + "; install the same version on every node or pass --allow-version-mismatch")
    log.warning("%s; continuing because of --allow-version-mismatch", message)


def sha256_file(path: Path) -> str:
    """sha256 of a file inside the job directory (a symbolic link raises LinkRefused, unread)."""
    digest = hashlib.sha256()
    with fsops.open_read(path, buffering=0) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class _Staged:
    """A claimed attempt ready to run: its heartbeat already beats, its input is verified."""

    claim: Claim
    spec: ShardSpec
    record: AttemptRecord
    ctx: AttemptContext
    heartbeat: HeartbeatThread


class _Lookahead:
    """Claims the next shard once the current one is expected to end within the claim-ahead window.

    The expectation comes from this worker's last shard (bytes per second), so nothing is claimed
    ahead during the first shard, unless the runner overlaps attempts (the warm runner begins the
    next shard at once, so it is claimed at once); at most one shard is ever held ahead; the
    window is at most half a lease, and the queued claim is heartbeated like a running one.
    """

    def __init__(self, worker: Worker, spec: ShardSpec):
        self.worker = worker
        self.spec = spec
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
        try:
            self.worker.claim_ahead()
        except Exception:
            log.exception("claiming ahead failed; the next shard is claimed when this one ends")

    def finish(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


class Worker:
    def __init__(self, job_dir: Path, options: WorkerOptions, runner: Runner | None = None):
        self.layout = JobLayout(Path(os.path.abspath(job_dir)))
        check_job_filesystem(self.layout.root)
        self.manifest = self.layout.load_manifest()
        self.options = options
        self.settings = with_overrides(self.manifest.request.settings, options)
        self.host = socket.gethostname()
        self.claims = Claims(self.layout, self.host, os.getpid())
        self.observer = StalenessObserver(self.settings.lock_timeout_secs)
        self.runner = runner or get_runner(options.runner, self._node_runtime())
        self.overlaps = callable(getattr(self.runner, "begin", None))
        self.terminal: dict[str, str] = {}
        self.claimed = 0
        self.completed = 0
        self.current: AttemptContext | None = None
        self.staged: _Staged | None = None
        self.last_rate: float | None = None
        self.stopping: str | None = None
        self._wake = threading.Event()
        # Raw exports of this worker's attempts that a runner might still have been writing when
        # they were removed (or whose removal failed): removed again once the runner is closed.
        self._raw_leftovers: set[Path] = set()

    def _node_runtime(self) -> NodeRuntime:
        settings = self.settings
        return NodeRuntime(
            ray_address=settings.ray_address,
            num_cpus=settings.ray_num_cpus,
            num_gpus=settings.ray_num_gpus,
            object_store_mb=settings.ray_object_store_mb,
            temp_dir=settings.ray_temp_dir,
            custom_operator_paths=tuple(self._job_recipe().get("custom_operator_paths") or ()),
            env=self._attempt_env(),
            log_dir=self.layout.runtime_logs,
            hang_secs=max(settings.heartbeat_interval_secs, MIN_HANG_SECS),
        )

    # -- the claim loop ---------------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._claim_loop()
        finally:
            try:
                self.drop_staged("the worker is leaving")
                self.runner.close()
            finally:
                self._remove_raw_leftovers()

    def _claim_loop(self) -> int:
        check_engine(self.manifest, self.options.allow_version_mismatch)
        log.info(
            "worker on host=%s pid=%d: job %s, %d shards, runner=%s, ray_address=%s, lease %.0fs",
            self.host,
            os.getpid(),
            self.layout.root,
            len(self.manifest.shards),
            self.runner.name,
            self.settings.ray_address,
            self.settings.lock_timeout_secs,
        )
        while True:
            if self.stopping:
                log.warning("worker stopping: %s", self.stopping)
                return EXIT_ERROR
            if self.staged is not None and ClaimStatus.FAILED not in self.terminal.values():
                staged, self.staged = self.staged, None
                self._execute(staged)
                continue
            if self.options.max_shards is not None and self.claimed >= self.options.max_shards:
                log.info("reached --max-shards %d; completed %d shard(s) here", self.options.max_shards, self.completed)
                return EXIT_OK
            claim, failed = self.scan()
            if failed:
                log.error("job has terminally failed shard(s): %s; run `retry` after fixing the cause", ", ".join(failed))
                return EXIT_ERROR
            if claim is not None:
                self.claimed += 1
                self.process(claim)
                continue
            if len(self.terminal) == len(self.manifest.shards):
                log.info("all %d shards are done; completed %d here", len(self.manifest.shards), self.completed)
                return EXIT_OK
            self._wake.wait(self.settings.poll_interval_secs)

    def scan(self) -> tuple[Claim | None, list[str]]:
        """One pass over the shards in manifest order: claim the first claimable one."""
        failed = [shard for shard, status in self.terminal.items() if status == ClaimStatus.FAILED]
        if failed:
            return None, failed
        for spec in self.manifest.shards:
            shard_id = spec.shard_id
            if shard_id in self.terminal:
                continue
            try:
                record = read_claim(self.layout, shard_id)
            except ValueError as exc:
                log.warning("unreadable claim of %s (%s); skipping it this round", shard_id, exc)
                continue
            if record is None:
                if fsops.lexists(self.layout.done(shard_id)):
                    self.claims.try_claim(shard_id, status=ClaimStatus.DONE)
                    self.terminal[shard_id] = ClaimStatus.DONE
                    self._sweep_leftovers(shard_id)  # its publisher died before recording it
                    continue
                if fsops.lexists(self.layout.failed(shard_id)):
                    self.terminal[shard_id] = ClaimStatus.FAILED
                    return None, [shard_id]
                claim = self.claims.try_claim(shard_id)
                if claim is not None:
                    return (claim, []) if self._within_retry_limit(claim) else (None, [shard_id])
                continue
            if record.status in (ClaimStatus.DONE, ClaimStatus.FAILED):
                self.terminal[shard_id] = record.status
                self.observer.forget(shard_id)
                if record.status == ClaimStatus.FAILED:
                    return None, [shard_id]
                continue
            heartbeat = read_claim_heartbeat(self.layout, record)
            seq = heartbeat.seq if heartbeat is not None and heartbeat.token == record.token else 0
            if not self.observer.is_stale(shard_id, record.token, seq):
                continue
            unchanged = self.observer.unchanged_for(shard_id)
            self.observer.forget(shard_id)
            if fsops.lexists(self.layout.done(shard_id)):
                # Completed, but its owner died before recording it in the claim (P6 repair).
                self.claims.repair_done(record, unchanged)
                self.terminal[shard_id] = ClaimStatus.DONE
                self._sweep_leftovers(shard_id)  # it may also have died before its sweep
                continue
            if self.claims.take_over(record, unchanged):
                claim = self.claims.try_claim(shard_id)
                if claim is not None:
                    return (claim, []) if self._within_retry_limit(claim) else (None, [shard_id])
        failed = [shard for shard, status in self.terminal.items() if status == ClaimStatus.FAILED]
        return None, failed

    def _within_retry_limit(self, claim: Claim) -> bool:
        """After acquiring: a shard whose failures already reached the limit becomes terminal."""
        try:
            failures, last_attempt, last_error = count_failures(self.layout, claim.shard_id)
        except OSError:  # attempts/<shard> is a planted link (or unreadable): refuse, holding nothing
            self.claims.release(claim)
            raise
        if failures <= self.settings.max_retries:
            return True
        log.error(
            "%s failed %d time(s) (limit %d retries): marking it failed", claim.shard_id, failures, self.settings.max_retries
        )
        self.claims.mark_failed_terminal(claim, failures, last_attempt, last_error)
        self.terminal[claim.shard_id] = ClaimStatus.FAILED
        return False

    # -- one attempt --------------------------------------------------------------------------

    def process(self, claim: Claim) -> None:
        staged = self._stage(claim)
        if staged is not None:
            self._execute(staged)

    def _stage(self, claim: Claim) -> _Staged | None:
        """Everything before the engine runs: attempt dir and record, heartbeat, input check, recipe.

        Returns None when the attempt already failed here (recorded like any failed attempt).
        """
        crashpoints.reached("claimed")
        spec = self.manifest.shard(claim.shard_id)
        attempt_dir = self.layout.attempt_dir(claim.shard_id, claim.attempt_id)
        try:
            fsops.ensure_dir(attempt_dir.parent)
            created = fsops.make_dir_exclusive(attempt_dir)
        except OSError:
            self.claims.release(claim)
            raise
        if not created:
            self.claims.release(claim)
            raise JobStateError(f"attempt directory {attempt_dir} already exists")
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
        )
        heartbeat = HeartbeatThread(
            self.claims,
            claim,
            attempt_dir,
            self.settings.heartbeat_interval_secs,
            self.settings.lock_timeout_secs,
            on_lost=lambda reason: ctx.stop(f"claim lost: {reason}"),
        )
        heartbeat.note(attempt_started_at=record.started_at)
        ctx.set_phase = heartbeat.set_phase
        ctx.note = heartbeat.note
        try:
            heartbeat.beat()
            heartbeat.start()
            crashpoints.reached("staged")
            self._check_input(ctx, spec)
            return _Staged(claim, spec, record, ctx, heartbeat)
        except AttemptFailed as exc:
            heartbeat.stop()
            self._record_failure(claim, record, ctx, str(exc))
            return None
        except Exception as exc:
            heartbeat.stop()
            self._record_failure(claim, record, ctx, f"{type(exc).__name__}: {exc}")
            raise

    def _execute(self, staged: _Staged) -> None:
        claim, spec, record, ctx, heartbeat = staged.claim, staged.spec, staged.record, staged.ctx, staged.heartbeat
        files = attempt_files(ctx.attempt_dir)
        self.current = ctx
        if self.stopping:
            ctx.stop(self.stopping)  # the stop arrived while this attempt was being staged
        log.info("processing %s (%d rows) as attempt %s", claim.shard_id, spec.rows, claim.attempt_id)
        lookahead = _Lookahead(self, spec)
        try:
            if ctx.stop_reason() is not None:
                self._cancel_begun(ctx)
                raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
            lookahead.start()
            if self.last_rate:
                heartbeat.note(expected_secs=spec.bytes / self.last_rate)
            self.runner.run(ctx)
            if ctx.stop_reason() is not None:
                raise AttemptFailed(f"stopped: {ctx.stop_reason()}")
            ctx.set_phase(Phase.COLLECTING_OUTPUT, rows_done=spec.rows, bytes_done=spec.bytes)
            try:
                stats = collect(ctx.ray_output, files["processed"], spec.first_row, spec.rows)
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
            )
            record = replace(record, output_rows=stats.rows, output_bytes=stats.bytes, output_sha256=stats.sha256)
            crashpoints.reached("publishing")
            self._remove_raw(ctx.ray_output)
            if not self.claims.publish_completion(claim, completion):
                ctx.stop("claim lost before publishing")
                raise AttemptFailed("claim lost before publishing: this attempt's output is not used")
            self._sweep_leftovers(claim.shard_id, published=claim.attempt_id)
            crashpoints.reached("published")
            self.claims.finish(claim, ClaimStatus.DONE)
            self.completed += 1
            self.last_rate = spec.bytes / max(lookahead.elapsed() - ctx.setup_secs, 1e-3)
            record = replace(
                record,
                status=AttemptStatus.SUCCEEDED,
                finished_at=time.time(),
                exit_code=0,
                setup_secs=ctx.setup_secs or None,
                operators=operator_stats(ctx.operators),
            )
            fsops.replace_atomic(files["record"], encode(record))
            log.info(
                "done %s: %d -> %d rows in %.1fs", claim.shard_id, spec.rows, stats.rows, record.finished_at - record.started_at
            )
        except AttemptInterrupted as exc:
            self._record_failure(claim, record, ctx, f"interrupted: {exc}", handback=True)
        except AttemptFailed as exc:
            self._record_failure(claim, record, ctx, str(exc))
        except Exception as exc:
            # A problem on this side (disk full, a modified job recipe...) still ends the attempt
            # cleanly: recorded, claim handed back or failed, before the worker reports it.
            self._record_failure(claim, record, ctx, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            heartbeat.stop()
            self.current = None
            lookahead.finish()

    def _check_input(self, ctx: AttemptContext, spec: ShardSpec) -> None:
        ctx.set_phase(Phase.VERIFYING_INPUT)
        shard_path = self.layout.shard_input(spec.shard_id)
        try:
            digest = sha256_file(shard_path)
        except OSError as exc:
            raise AttemptFailed(f"cannot read shard input {shard_path}: {exc.strerror or exc}") from None
        if digest != spec.sha256:
            raise AttemptFailed(f"shard input {shard_path} is corrupt: sha256 {digest} != manifest {spec.sha256}")
        self._write_attempt_recipe(ctx, shard_path)
        ctx.set_phase(Phase.QUEUED)

    # -- claim-ahead ----------------------------------------------------------------------------

    def claim_ahead(self) -> None:
        """Claim and stage the next shard while the current one runs (called by _Lookahead)."""
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
        """Fewer unclaimed shards than busy workers: a shard held ahead here would wait for this
        worker while another one goes idle, so the end of the job is left to plain claiming.
        Two directory listings, no record reads."""

        def names(directory: Path) -> set[str]:
            try:
                return set(os.listdir(directory))
            except FileNotFoundError:
                return set()

        claimed = names(self.layout.state / "locks")
        busy = len(claimed - names(self.layout.state / "done") - names(self.layout.state / "failed"))
        return len(self.manifest.shards) - len(claimed) < busy

    def drop_staged(self, why: str) -> None:
        """Hand a claimed-ahead shard back at once; it never started."""
        staged, self.staged = self.staged, None
        if staged is None:
            return
        staged.heartbeat.stop()
        self._cancel_begun(staged.ctx)
        self._record_failure(staged.claim, staged.record, staged.ctx, f"handed back while claimed ahead: {why}", handback=True)

    def _cancel_begun(self, ctx: AttemptContext) -> None:
        if self.overlaps:
            self.runner.cancel(ctx)  # type: ignore[attr-defined]

    def _record_failure(
        self, claim: Claim, record: AttemptRecord, ctx: AttemptContext, error: str, handback: bool = False
    ) -> None:
        files = attempt_files(ctx.attempt_dir)
        lost = ctx.stop_reason() is not None and ctx.stop_reason().startswith("claim lost")
        status = AttemptStatus.FENCED if lost else AttemptStatus.FAILED
        if (self.stopping or handback) and not lost:
            status = AttemptStatus.INTERRUPTED
        record = replace(record, status=status, finished_at=time.time(), error=error, setup_secs=ctx.setup_secs or None)
        try:
            fsops.replace_atomic(files["record"], encode(record))
        except OSError as exc:
            log.error("could not record the outcome of %s: %s", claim.attempt_id, exc)
        # The log and Data-Juicer's work_dir stay for debugging; the rows it exported do not.
        # A warm runtime may still be ending a cancelled attempt: removed again at the exit.
        self._remove_raw(ctx.ray_output, again_at_exit=self.overlaps)
        if lost:
            log.error("%s: %s; nothing was published", claim.shard_id, error)
            return
        if status == AttemptStatus.INTERRUPTED:
            self.claims.release(claim)
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
        if failures > self.settings.max_retries:
            self.claims.mark_failed_terminal(claim, failures, last_attempt, error)
            self.terminal[claim.shard_id] = ClaimStatus.FAILED
        else:
            self.claims.release(claim)

    # -- raw exports --------------------------------------------------------------------------

    def _remove_raw(self, ray_output: Path, again_at_exit: bool = False) -> None:
        """Remove one of this worker's raw exports (it has been collected, or will never be)."""
        if not remove_raw_output(ray_output) or again_at_exit:
            self._raw_leftovers.add(ray_output)

    def _sweep_leftovers(self, shard_id: str, published: str | None = None) -> None:
        """Remove the raw exports the attempts of a completed shard left behind, and the collected
        output of every attempt but the one its completion record names (`published`; read from
        the record when not given: unreadable, only raw exports are removed).

        Only once the completion is published: before, an attempt not yet superseded (or one newer
        than the sweeper's) may still be collecting, and a part removed before it lists them
        would be silently missing from an output it may still publish."""
        if published is None:
            try:
                published = load(CompletionRecord, self.layout.done(shard_id)).attempt_id
            except (JobStateError, OSError) as exc:
                log.warning("%s: %s; only raw outputs are removed from its attempts", shard_id, exc)
        try:
            root = self.layout.attempts_dir(shard_id)
            names = attempt_ids(root)
        except OSError as exc:
            log.warning("cannot look for what the attempts of %s left behind: %s", shard_id, exc)
            return
        for name in names:
            files = attempt_files(root / name)
            if fsops.lexists(files["ray_output"]):
                log.info("removing the raw output %s, left behind by an attempt", files["ray_output"])
                self._remove_raw(files["ray_output"])
            if published is not None and name != published:
                remove_unused_output(files["processed"])

    def _remove_raw_leftovers(self) -> None:
        leftovers, self._raw_leftovers = self._raw_leftovers, set()
        for raw in sorted(leftovers):
            if not remove_raw_output(raw):
                log.warning("the raw output %s is left behind; nothing reads it, it can be removed", raw)

    def _attempt_env(self) -> dict[str, str]:
        env = {"PYTHONUNBUFFERED": "1"}
        cache = str(self.layout.cache_dir)
        for key in ("XDG_CACHE_HOME", "HF_HOME"):
            if not os.environ.get(key):
                env[key] = cache
        return env

    def _job_recipe(self) -> dict[str, Any]:
        try:
            raw = fsops.read_bytes_nofollow(self.layout.recipe)
            config: dict[str, Any] = yaml.safe_load(raw)
        except (OSError, yaml.YAMLError) as exc:
            raise JobStateError(f"cannot read the job's recipe {self.layout.recipe}: {exc}") from None
        if hashlib.sha256(raw).hexdigest() != self.manifest.recipe_sha256:
            raise JobStateError(f"{self.layout.recipe} was modified after prepare (sha256 differs from the manifest)")
        return config

    def _write_attempt_recipe(self, ctx: AttemptContext, shard_path: Path) -> None:
        config = self._job_recipe()
        config["dataset_path"] = str(shard_path)
        config["export_path"] = str(ctx.ray_output)
        config["work_dir"] = str(ctx.attempt_dir)
        config["executor_type"] = "ray"
        config["ray_address"] = self.settings.ray_address
        config.setdefault("skip_op_error", False)
        config.pop("export_type", None)
        config["export_shard_size"] = 0
        fsops.replace_atomic(ctx.recipe_path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True).encode())

    # -- signals --------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop claiming, and hand the current shard back at once (graceful drain)."""
        self.stopping = reason
        self._wake.set()
        for attempt in (self.current, self.staged.ctx if self.staged else None):
            if attempt is not None:
                attempt.stop(reason)


def run_worker(job_dir: Path, options: WorkerOptions, runner: Runner | None = None) -> int:
    """Run a worker with SIGTERM/SIGINT meaning "drain": stop claiming, hand back the shard.
    Started with `cooperate.JOIN_ENV` set (by `mpi`, before its prepare ends: the number of
    prepare processes, 0 for one per core), it first helps that prepare."""
    if os.environ.get(JOIN_ENV):
        stopping: list[str] = []
        with on_stop_signals(stopping.append):
            procs = int(os.environ[JOIN_ENV]) or None
            help_until_prepared(Path(os.path.abspath(job_dir)), procs, lambda: bool(stopping))
    worker = Worker(job_dir, options, runner)
    with on_stop_signals(lambda name: worker.request_stop(f"received {name}")):
        return worker.run()
