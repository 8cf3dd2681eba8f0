"""worker: claim shards until the job is complete, failed, or `--max-shards` is reached.

One attempt at a time is published; with the warm runner the next (claimed-ahead) attempt is
already processing while the current one drains. Each attempt runs in an isolated
`attempts/<shard>/<attempt>/` directory; its output is published only after it was collected,
validated and the claim re-checked. The loop is here; which shard to claim and when to take one
over is `claims.takeover`, one attempt is `attempt.py`, claiming the next one early `lookahead.py`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from elastic_sharding.claims.protocol import Claim, Claims
from elastic_sharding.claims.takeover import ShardScanner
from elastic_sharding.engine import engine_identity
from elastic_sharding.errors import EXIT_ERROR, EXIT_OK, VersionMismatchError
from elastic_sharding.fsprobe import check_job_filesystem
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.cooperate import JOIN_ENV, help_until_prepared
from elastic_sharding.records import Manifest
from elastic_sharding.settings import Overrides, with_overrides
from elastic_sharding.signals import on_stop_signals
from elastic_sharding.work.attempt import AttemptSteps, Staged
from elastic_sharding.work.lookahead import ClaimAhead
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


class Worker(AttemptSteps, ClaimAhead):
    """Claims shards until the job is complete or failed, or `--max-shards` is reached."""

    def __init__(self, job_dir: Path, options: WorkerOptions, runner: Runner | None = None):
        self.layout = JobLayout(Path(os.path.abspath(job_dir)))
        check_job_filesystem(self.layout.root)
        self.manifest = self.layout.load_manifest()
        self.options = options
        self.settings = with_overrides(self.manifest.request.settings, options)
        self.host = socket.gethostname()
        self.claims = Claims(self.layout, self.host, os.getpid())
        self.runner = runner or get_runner(options.runner, self._node_runtime())
        self.overlaps = callable(getattr(self.runner, "begin", None))
        shard_ids = [spec.shard_id for spec in self.manifest.shards]
        self.scanner = ShardScanner(
            self.layout, shard_ids, self.claims, self.settings.lock_timeout_secs, self.settings.max_retries, self._sweep_leftovers
        )
        self.claimed = 0
        self.completed = 0
        self.current: AttemptContext | None = None
        self.staged: Staged | None = None
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
            if self.staged is not None and not self.scanner.failed():
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
            if self.scanner.all_terminal():
                log.info("all %d shards are done; completed %d here", len(self.manifest.shards), self.completed)
                return EXIT_OK
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
