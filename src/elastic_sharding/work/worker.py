"""worker: claim shards until the job is complete, failed, or `--max-shards` is reached.

A recipe with deduplicators runs in segments (`segments.py`): the worker claims the shards of
segment 0, takes part in deduplication stage 1 once they are all done (hashing finished shards
while it waits for the last ones: `work/stages.py`), then claims the shards of segment 1, and so
on to the last segment.

One attempt at a time is published; with the warm runner the next (claimed-ahead) attempt is
already processing while the current one drains. A worker that finds nothing to claim may back
up a straggling shard of another worker (`claims.backups`); a worker whose attempts keep failing
for reasons of its node stops claiming (`node_health.py`). Each attempt runs in an isolated
`attempts/<shard>/<attempt>/` directory; its output is published only after it was collected,
validated and the claim re-checked. The loop is here; which shard to claim and when to take one
over is `claims.takeover`, one attempt is `attempt.py`, claiming the next one early `lookahead.py`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from elastic_sharding import confined, fsops
from elastic_sharding.claims.backups import BackupPolicy
from elastic_sharding.claims.protocol import Claim, Claims
from elastic_sharding.claims.takeover import REFRESH_POLLS, ShardScanner
from elastic_sharding.errors import EXIT_ERROR, EXIT_OK, JobStateError
from elastic_sharding.fsprobe import check_job_filesystem
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.cooperate import JOIN_ENV, help_until_prepared
from elastic_sharding.prepare.recipe import operator_entries
from elastic_sharding.records import Manifest, SegmentSpec
from elastic_sharding.segments import job_segments, segment_manifest
from elastic_sharding.settings import Overrides, with_overrides
from elastic_sharding.signals import on_stop_signals
from elastic_sharding.work.analysis import AnalysisWork
from elastic_sharding.work.attempt import AttemptSteps, Staged
from elastic_sharding.work.lookahead import ClaimAhead
from elastic_sharding.work.node_check import check_node
from elastic_sharding.work.node_health import NodeHealth
from elastic_sharding.work.runners import DEFAULT_RUNNER, AttemptContext, NodeRuntime, Runner, get_runner
from elastic_sharding.work.stages import StageWork

log = logging.getLogger(__name__)

# A warm runtime silent for one heartbeat interval is hung; never judge it on less than this.
MIN_HANG_SECS = 5.0


@dataclass
class WorkerOptions(Overrides):
    """A worker's command line: its overrides of the job's settings, and what only it has."""

    max_shards: int | None = None
    # `dlc` strict mode: the cap is per recipe segment, and a capped worker still takes part in
    # the deduplication stages (once the others have finished the segment).
    cap_each_segment: bool = False
    allow_version_mismatch: bool = False
    runner: str = DEFAULT_RUNNER


class Worker(AttemptSteps, ClaimAhead):
    """Claims shards until the job is complete or failed, or `--max-shards` is reached."""

    def __init__(self, job_dir: Path, options: WorkerOptions, runner: Runner | None = None):
        self.job_layout = JobLayout(Path(os.path.abspath(job_dir)))
        check_job_filesystem(self.job_layout.root)
        self.job_manifest = self.job_layout.load_manifest()
        self.segments = job_segments(self.job_manifest)
        self.options = options
        self.settings = with_overrides(self.job_manifest.request.settings, options)
        self.host = socket.gethostname()
        self.health = NodeHealth(self.job_layout)
        self._anchors: contextlib.ExitStack | None = None  # while `run` runs: see `_anchor_segment`
        self._enter_segment(self.segments[0], self.job_manifest)
        self.next_stage: StageWork | AnalysisWork | None = None
        self.runner = runner or get_runner(options.runner, self._node_runtime())
        self.overlaps = callable(getattr(self.runner, "begin", None))
        self.capped = False
        self.claimed = 0
        self.completed = 0
        self.current: AttemptContext | None = None
        self.staged: Staged | None = None
        self.last_rate: float | None = None
        self.last_end: float | None = None
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

    def _enter_segment(self, segment: SegmentSpec, manifest: Manifest) -> None:
        """Claim the shards of `segment` from now on (`manifest` lists them)."""
        self.segment = segment
        self.layout = self.job_layout.segment(segment.index)
        self.manifest = manifest
        self.claims = Claims(self.layout, self.host, os.getpid())
        shard_ids = [spec.shard_id for spec in manifest.shards]
        self.scanner = ShardScanner(
            self.layout,
            shard_ids,
            self.claims,
            self.settings.lock_timeout_secs,
            self.settings.max_retries,
            self._sweep_leftovers,
            refresh_secs=self.settings.poll_interval_secs * REFRESH_POLLS,
        )
        self.backups = BackupPolicy(self.claims, self.scanner, manifest, self.settings)
        if self._anchors is not None:
            self._anchor_segment()

    def _anchor_segment(self) -> None:
        """Hold the job's and the segment's directories open while claiming in it: each claim,
        record and attempt file is then reached relative to one of them, a NAS lookup of its
        name alone instead of one of every directory on its path (`confined.anchored`)."""
        assert self._anchors is not None
        self._anchors.close()
        self._anchors.enter_context(confined.anchored((self.job_layout.root, *self.layout.skeleton)))

    # -- the segments ---------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._anchors = contextlib.ExitStack()
            self._anchor_segment()
            return self._run_segments()
        finally:
            try:
                self.drop_staged("the worker is leaving")
                self.runner.close()
            finally:
                self._remove_raw_leftovers()
                if self._anchors is not None:
                    self._anchors.close()

    def _run_segments(self) -> int:
        check_node(self.job_layout, self.job_manifest, self.options.allow_version_mismatch)
        log.info(
            "worker on host=%s pid=%d: job %s, %d shards, %d recipe segment(s), runner=%s, ray_address=%s, lease %.0fs",
            self.host,
            os.getpid(),
            self.job_layout.root,
            len(self.job_manifest.shards),
            len(self.segments),
            self.runner.name,
            self.settings.ray_address,
            self.settings.lock_timeout_secs,
        )
        process = operator_entries(self._job_recipe(), self.job_layout.recipe)
        for position, segment in enumerate(self.segments):
            if position > 0:
                self._dedup_stage(position - 1, segment, process).run()
                manifest = segment_manifest(self.job_layout, self.job_manifest, segment.index)
                if manifest is None:
                    raise JobStateError(f"stage {segment.index} ended without keeping every shard; report this as a bug")
                self._enter_segment(segment, manifest)
            following = self.segments[position + 1] if position + 1 < len(self.segments) else None
            self.next_stage = self._dedup_stage(position, following, process) if following and segment.has_ops else None
            if following is None and self.job_manifest.analysis is not None:
                self.next_stage = AnalysisWork(self.job_layout, self.manifest, segment, self.settings, self._stopping)
            if segment.has_ops:
                if self.options.cap_each_segment:
                    self.claimed = 0
                for directory in self.layout.skeleton:
                    fsops.ensure_dir(directory)
                code = self._claim_loop()
                if code != EXIT_OK or self.capped:
                    return code
        if isinstance(self.next_stage, AnalysisWork):
            self.next_stage.run()
        return EXIT_OK

    def _stopping(self) -> bool:
        return self.stopping is not None

    def _await_segment_end(self) -> int:
        """Capped in this segment: wait (hashing finished shards for the next stage) until every
        shard of it is done, then go on with the stage; EXIT_ERROR if one failed terminally."""
        while True:
            if self.stopping:
                log.warning("worker stopping: %s", self.stopping)
                return EXIT_ERROR
            shard_ids = [spec.shard_id for spec in self.manifest.shards]
            failed = [shard_id for shard_id in shard_ids if confined.lexists(self.layout.failed(shard_id))]
            if failed:
                log.error("job has terminally failed shard(s): %s; run `retry` after fixing the cause", ", ".join(failed))
                return EXIT_ERROR
            if all(confined.lexists(self.layout.done(shard_id)) for shard_id in shard_ids):
                return EXIT_OK
            if self.next_stage is None or not self.next_stage.help():
                self._wake.wait(self.settings.poll_interval_secs)

    def _dedup_stage(self, previous: int, segment: SegmentSpec, process: list[tuple[str, dict]]) -> StageWork:
        """The deduplication stage before `segment`, which reads segment `previous`'s outputs."""
        if isinstance(self.next_stage, StageWork) and self.next_stage.index == segment.index:
            return self.next_stage
        return StageWork(
            self.job_layout,
            self.job_manifest,
            self.segments[previous],
            self.manifest,
            segment,
            process,
            self.settings,
            self._stopping,
            tuple(self._job_recipe().get("custom_operator_paths") or ()),
        )

    # -- the claim loop ---------------------------------------------------------------------

    def _claim_loop(self) -> int:
        while True:
            if self.stopping:
                log.warning("worker stopping: %s", self.stopping)
                return EXIT_ERROR
            if self.health.sick and self.scanner.other_hosts:
                log.error("this worker stops claiming: %s", self.health.stop_claiming())
                return EXIT_ERROR
            if self.staged is not None and not self.scanner.failed():
                staged, self.staged = self.staged, None
                self._execute(staged)
                continue
            if self.options.max_shards is not None and self.claimed >= self.options.max_shards:
                log.info("reached --max-shards %d; completed %d shard(s) here", self.options.max_shards, self.completed)
                if self.options.cap_each_segment and self.segment.index < len(self.segments) - 1:
                    return self._await_segment_end()
                self.capped = True
                return EXIT_OK
            claim, failed = self.scan()
            if failed:
                log.error("job has terminally failed shard(s): %s; run `retry` after fixing the cause", ", ".join(failed))
                return EXIT_ERROR
            if claim is not None:
                self.claimed += 1
                self.process(claim)
                continue
            if self.scanner.all_terminal():
                where = f" of segment {self.segment.index}" if len(self.segments) > 1 else ""
                log.info("all %d shards%s are done; completed %d here", len(self.manifest.shards), where, self.completed)
                return EXIT_OK
            if self.next_stage is not None and self.next_stage.help():
                continue
            backup = self.backups.pick()
            if backup is not None:
                self.process(backup)
                continue
            self._wake.wait(self.settings.poll_interval_secs)

    def scan(self) -> tuple[Claim | None, list[str]]:
        """One pass over the shards in manifest order: claim the first claimable one."""
        return self.scanner.next_claim()

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
