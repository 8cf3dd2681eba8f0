"""`dlc`: the same command on every node of a Worker-broadcast job (PAI-DLC PyTorch-style jobs).

Each instance: elect one prepare coordinator, work as a worker, wait until every shard is done,
elect one finalize coordinator (verify + merge), and exit with the submission's common code.
Coordination goes only through the shared directory (`claims/submission.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from elastic_sharding.claims.protocol import read_claim
from elastic_sharding.claims.shard_state import shard_state
from elastic_sharding.claims.submission import (
    FINALIZE,
    PREPARE,
    PROGRESS_LOG_SECS,
    Generation,
    aborted,
    run_phase,
)
from elastic_sharding.errors import EXIT_ERROR, EXIT_OK, Aborted, ElasticShardError, Interrupted, UsageError
from elastic_sharding.launch.scheduler import Placement, detect, resolve_run_id
from elastic_sharding.launch.steps import JobRequest, check_same_request, finalize, preflight_job, prepare_job
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.snapshot import job_views
from elastic_sharding.observe.status import terminal_failures
from elastic_sharding.prepare.cooperate import Assistant
from elastic_sharding.progress import Progress
from elastic_sharding.records import Manifest, PhaseResult, SegmentSpec
from elastic_sharding.segments import job_segments, segment_manifest, stage_failure
from elastic_sharding.signals import on_stop_signals
from elastic_sharding.vocabulary import ClaimStatus, ShardState
from elastic_sharding.work.worker import Worker, WorkerOptions

log = logging.getLogger(__name__)


@dataclass
class DlcOptions:
    job: JobRequest
    nodes: int | None
    require_all_nodes: bool
    run_id: str | None
    wait_timeout_secs: float
    poll_interval_secs: float
    coordinator_lease_secs: float
    runner: str
    explain: bool = False


def strict_claim_cap(nodes: int | None, num_shards: int, require_all_nodes: bool) -> int | None:
    """The per-Worker claim cap of strict mode, or None in elastic mode.

    With a cap of ceil(S/N), N workers can always finish S shards; every worker is guaranteed at
    least one shard only if the other N-1 workers, each taking the whole cap, leave one over:
    S - (N-1)*ceil(S/N) >= 1. Any other combination could let a Worker go without a shard, so it
    is refused before anything starts.
    """
    if nodes is not None and nodes < 1:
        raise UsageError("--nodes must be at least 1")
    if not require_all_nodes:
        if nodes is not None and nodes > num_shards:
            log.warning("--nodes %d > --num-shards %d: some Workers will have nothing to do", nodes, num_shards)
        return None
    if nodes is None:
        raise UsageError("--require-all-nodes needs --nodes N (the number of Workers that must each complete a shard)")
    cap = math.ceil(num_shards / nodes)
    if num_shards - (nodes - 1) * cap < 1:
        hint = f"use a multiple of {nodes}, e.g. --num-shards {nodes * max(1, num_shards // nodes)}"
        raise UsageError(
            f"--require-all-nodes with --nodes {nodes} and --num-shards {num_shards} is impossible to guarantee: with the "
            f"per-Worker cap of {cap} shard(s), {nodes - 1} Workers can take all {num_shards} shards and leave one Worker "
            f"without a shard; {hint}"
        )
    return cap


class _Instance:
    def __init__(self, opts: DlcOptions, cap: int | None, run_id: str, placement: Placement):
        self.opts = opts
        self.placement = placement
        self.cap = cap
        self.gen = Generation(opts.job.job_dir, run_id)
        self.layout = opts.job.layout
        self.host = socket.gethostname()
        self.phase = PREPARE
        self.worker: Worker | None = None

    # -- signals: drain the worker, or stop waiting ---------------------------------------------

    def on_signal(self, name: str) -> None:
        reason = f"received {name}"
        if self.worker is not None:
            self.worker.request_stop(reason)
        else:
            raise Interrupted(reason)

    # -- the whole run ---------------------------------------------------------------------------

    def run(self) -> int:
        opts = self.opts
        self.gen.open()
        mode = f"strict ({opts.nodes} nodes, at most {self.cap} shard(s) per Worker)" if self.cap else "elastic"
        where = self.placement
        if where.node_index is not None:
            place = f"{where.scheduler.value} node {where.node_index} of {where.nodes or '?'} {where.node_name}"
        else:
            place = f"{where.scheduler.value}, no node index"
        log.info(
            "DLC instance hostname=%s pid=%d (%s): run %s, %s mode, coordination %s",
            self.host,
            os.getpid(),
            place,
            self.gen.run_id,
            mode,
            self.gen.root,
        )
        lease, poll, wait = opts.coordinator_lease_secs, opts.poll_interval_secs, opts.wait_timeout_secs
        try:
            self.phase = PREPARE
            prepared = run_phase(self.gen, PREPARE, lambda: prepare_job(opts.job), lease, poll, wait, Assistant(opts.job))
            self._check(prepared)
            if not self._is_mine(prepared):
                check_same_request(opts.job)
            self.phase = "work"
            self._work()
            self.phase = "wait"
            self._wait_for_completion()
            self.phase = FINALIZE
            expect = opts.nodes if opts.require_all_nodes and opts.nodes else 1
            result = run_phase(self.gen, FINALIZE, lambda: self._finalize(expect), lease, poll, wait)
            self._check(result)
        except (Interrupted, Aborted):
            raise
        except ElasticShardError as exc:
            # Another instance may have published the failure first: report its record, so every
            # instance prints one message and exits with one code.
            record = self.gen.abort_record() or self.gen.publish_abort(self.phase, exc.exit_code, str(exc))
            if record is not None:
                raise aborted(record) from None
            log.warning("this instance failed after the run had already succeeded; exiting like every other instance: %s", exc)
            return EXIT_OK
        except Exception as exc:
            # A crash of this instance still ends every other instance with one code.
            if self.gen.abort_record() is None:
                self.gen.publish_abort(self.phase, EXIT_ERROR, f"{type(exc).__name__}: {exc} (host={self.host})")
            raise
        if not self._is_mine(result):
            log.info("finalized by hostname=%s: %s", result.host, result.message)
        return EXIT_OK

    def _is_mine(self, result: PhaseResult) -> bool:
        return result.host == self.host and result.details.get("pid") == os.getpid()

    def _check(self, result: Any) -> None:
        if not result.ok:
            record = self.gen.abort_record()
            raise aborted(record) if record is not None else ElasticShardError(result.message)

    def _work(self) -> None:
        self.gen.raise_if_aborted()
        opts = self.opts
        log.info("Starting DLC worker on hostname=%s", self.host)
        options = WorkerOptions(
            max_shards=self.cap, cap_each_segment=True, poll_interval_secs=opts.poll_interval_secs, runner=opts.runner
        )
        worker = Worker(self.layout.root, options)
        stop_watch = threading.Event()
        watcher = threading.Thread(target=self._watch_abort, args=(worker, stop_watch), name="abort-watch", daemon=True)
        self.worker = worker
        watcher.start()
        try:
            code = worker.run()
        finally:
            self.worker = None
            stop_watch.set()
            watcher.join()
        self.gen.raise_if_aborted()
        if worker.stopping:
            raise Interrupted(worker.stopping)
        if code != EXIT_OK:
            raise ElasticShardError(self._failure_summary(worker) or "the worker failed")

    def _watch_abort(self, worker: Worker, stop: threading.Event) -> None:
        while not stop.wait(self.opts.poll_interval_secs):
            try:
                record = self.gen.abort_record()
            except (OSError, ElasticShardError):
                continue
            if record is not None:
                worker.request_stop(f"run {record.run_id} failed on host={record.host}: {record.reason}")
                return

    @staticmethod
    def _failure_summary(worker: Worker) -> str | None:
        """The failed shards of the segment the worker stopped in."""
        timeout = worker.manifest.request.settings.lock_timeout_secs
        return terminal_failures(job_views(worker.layout, worker.manifest, timeout))

    def _wait_for_completion(self) -> None:
        """Strict mode: a capped Worker waits for the others. Elastic: usually already complete.
        In a recipe with deduplicators every segment's shards count, and each stage."""
        manifest = self.layout.load_manifest()
        deadline = time.monotonic() + self.opts.wait_timeout_secs
        next_note = time.monotonic()
        finished: set[tuple[int, str]] = set()
        segments = job_segments(manifest)
        total = len(manifest.shards) * max(1, sum(segment.has_ops for segment in segments))
        with Progress("shards done", total, self.opts.job.quiet, unit="shard") as progress:
            while True:
                self.gen.raise_if_aborted()
                pending = self._pending(manifest, segments, finished, progress)
                if not pending:
                    return
                now = time.monotonic()
                if now >= deadline:
                    raise ElasticShardError(
                        f"timed out after {self.opts.wait_timeout_secs:.0f}s (--wait-timeout-secs) waiting for "
                        f"{len(pending)} shard(s): {', '.join(pending[:5])}"
                        + (" (strict mode: is every Worker running?)" if self.cap else "")
                    )
                if now >= next_note:
                    log.info("waiting for %d shard(s): %s", len(pending), ", ".join(pending[:5]))
                    next_note = now + PROGRESS_LOG_SECS
                time.sleep(self.opts.poll_interval_secs)

    def _pending(
        self, manifest: Manifest, segments: list[SegmentSpec], finished: set[tuple[int, str]], progress: Progress
    ) -> list[str]:
        """What the job still waits for, in its first unfinished segment; raises on a failure."""
        for segment in segments:
            if segment.index > 0:
                failure = stage_failure(self.layout, segment.index)
                if failure is not None:
                    raise ElasticShardError(failure)
            view = segment_manifest(self.layout, manifest, segment.index)
            if view is None:
                return [f"stage {segment.index}"]
            if not segment.has_ops:
                continue
            layout = self.layout.segment(segment.index)
            pending = []
            for spec in view.shards:
                if (segment.index, spec.shard_id) in finished:
                    continue
                state, holder = _shard_state(layout, spec.shard_id)
                if state == ShardState.FAILED:
                    summary = terminal_failures(job_views(layout, view, manifest.request.settings.lock_timeout_secs))
                    raise ElasticShardError(summary or f"{spec.shard_id} failed terminally")
                if state == ShardState.DONE:
                    finished.add((segment.index, spec.shard_id))
                    progress.update(1)
                else:
                    where = f" of segment {segment.index}" if segment.index else ""
                    pending.append(f"{spec.shard_id}{where} ({holder})")
            if pending:
                return pending
        return []

    def _finalize(self, expect_nodes: int) -> tuple[str, dict[str, Any]]:
        done = finalize(self.opts.job, expect_nodes)
        first_failure = self.gen.publish_success(done.message)
        if first_failure is not None:
            raise aborted(first_failure)
        log.info("%s", done.message)
        details = {
            "shards": done.shards,
            "hosts": done.hosts,
            "output": str(done.output),
            "rows": done.rows,
            "output_format": done.output_format,
        }
        return done.message, details


def _shard_state(layout: JobLayout, shard_id: str) -> tuple[str, str]:
    try:
        claim = read_claim(layout, shard_id)
    except ValueError:
        claim = None
    state = shard_state(claim, layout.done(shard_id).exists(), layout.failed(shard_id).exists())
    if claim is not None and claim.status in (ClaimStatus.DONE, ClaimStatus.FAILED):
        return state, claim.host
    if state in (ShardState.DONE, ShardState.FAILED):
        return state, state.value
    return state, "unclaimed" if claim is None else f"claimed by host={claim.host}"


def explain(opts: DlcOptions, placement: Placement) -> str:
    """The `--explain` text, with a warning for each refusal the same command would meet at start."""
    lines = [placement.describe()]
    for check in (
        lambda: resolve_run_id(opts.run_id, placement),
        lambda: strict_claim_cap(placement.nodes, opts.job.num_shards, opts.require_all_nodes),
    ):
        try:
            check()
        except UsageError as exc:
            lines.append(f"warning: this command would stop here: {exc}")
    return "\n".join(lines)


def run_dlc(opts: DlcOptions) -> int:
    """Node count and run id come from the flags, else from the scheduler the command runs under."""
    placement = detect(os.environ).overridden(opts.nodes, opts.run_id)
    if opts.explain:
        sys.stdout.write(explain(opts, placement) + "\n")
        return EXIT_OK
    for warning in placement.warnings:
        log.warning("%s", warning)
    nodes = placement.nodes
    cap = strict_claim_cap(nodes, opts.job.num_shards, opts.require_all_nodes)
    run_id = resolve_run_id(opts.run_id, placement)
    preflight_job(opts.job)
    opts = dataclasses.replace(opts, nodes=nodes)
    instance = _Instance(opts, cap, run_id, placement)
    with on_stop_signals(instance.on_signal):
        return instance.run()
