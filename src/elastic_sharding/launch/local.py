"""`local`: a whole job on this machine — prepare, N worker processes, finalize.

For one fat node, a laptop or the demo. Workers are separate processes (each with its own
node-local Ray runtime), exactly as on separate nodes. Because this launcher is the parent of
its workers, it knows for certain when one died: that worker's claims are handed back at once
instead of after a lease, so the surviving workers pick its shard up immediately.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import time

from elastic_sharding.children import child_env
from elastic_sharding.claims.protocol import Claims, read_claim
from elastic_sharding.errors import EXIT_OK, Interrupted
from elastic_sharding.launch.steps import (
    JobRequest,
    drain_with_parent,
    finalize,
    job_failure,
    preflight_job,
    prepare_job,
    worker_command,
)
from elastic_sharding.observe.status import Status
from elastic_sharding.segments import job_segments, segment_manifest
from elastic_sharding.signals import on_stop_signals
from elastic_sharding.vocabulary import ShardState

log = logging.getLogger(__name__)

STOP_GRACE_SECS = 30.0


def _release_claims_of(req: JobRequest, pid: int) -> list[str]:
    """Hand back the shard claims a dead worker held, in every recipe segment reached so far."""
    job = req.layout
    manifest = job.load_manifest()
    host = socket.gethostname()
    released = []
    for segment in job_segments(manifest):
        view = segment_manifest(job, manifest, segment.index)
        if view is None:
            break
        layout = job.segment(segment.index)
        claims = Claims(layout)
        for spec in view.shards if segment.has_ops else ():
            try:
                record = read_claim(layout, spec.shard_id)
            except ValueError:
                continue
            if record is None or record.status != ShardState.RUNNING or record.host != host or record.pid != pid:
                continue
            if claims.take_over(
                record, 0.0, reason=f"worker process {pid} on {host} exited; its local launcher handed the claim back"
            ):
                released.append(spec.shard_id if segment.index == 0 else f"{spec.shard_id} of segment {segment.index}")
    return released


def _exit_text(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _wait_for(req: JobRequest, procs: dict[int, subprocess.Popen[bytes]], interrupted: list[str]) -> list[str]:
    """Wait for every worker; a stop signal drains them all. Returns how the failed ones ended."""

    def on_signal(name: str) -> None:
        interrupted.append(name)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    failures: list[str] = []
    running = dict(procs)
    try:
        with on_stop_signals(on_signal):
            while running:
                for pid, proc in list(running.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    del running[pid]
                    if code == EXIT_OK:
                        continue
                    failures.append(f"worker pid {pid} {_exit_text(code)}")
                    if code < 0:
                        for shard_id in _release_claims_of(req, pid):
                            log.warning("worker pid %d %s; handed its claim of %s back", pid, _exit_text(code), shard_id)
                time.sleep(0.2)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_GRACE_SECS)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return failures


def _cpu_share(req: JobRequest, workers: int) -> list[str]:
    """Workers on one machine split its CPUs unless the job caps them: each one starts its own Ray
    runtime, and every runtime would otherwise size itself to the whole machine."""
    if workers < 2 or req.settings.ray_num_cpus is not None or req.settings.ray_address != "local":
        return []
    return ["--ray-num-cpus", str(max(1, (os.cpu_count() or 1) // workers))]


def run_local(req: JobRequest, workers: int, runner: str) -> int:
    preflight_job(req)
    if workers > req.num_shards:
        log.warning(
            "--workers %d > --num-shards %d: %d worker(s) will have nothing to do",
            workers,
            req.num_shards,
            workers - req.num_shards,
        )
    if req.prepare_procs is None:
        req = dataclasses.replace(req, prepare_procs=workers)  # the workers-to-be share the prepare
    message, _ = prepare_job(req)
    log.info("%s; starting %d local worker process(es)", message, workers)
    command = worker_command(req.layout.root, "--runner", runner, *_cpu_share(req, workers))
    env = child_env({})
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for _ in range(workers):
        proc = subprocess.Popen(command, env=env, preexec_fn=drain_with_parent)
        procs[proc.pid] = proc
    interrupted: list[str] = []
    failures = _wait_for(req, procs, interrupted)
    if interrupted:
        raise Interrupted(f"received {interrupted[0]}; workers handed their shards back")
    status = Status(req.layout.root)
    if status.exit_code != EXIT_OK:
        raise job_failure(status, failures)
    done = finalize(req, expect_nodes=1)
    log.info("%s", done.message)
    return EXIT_OK
