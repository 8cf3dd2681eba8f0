"""Cooperative prepare: any number of processes on any nodes share one prepare through the
shared directory, with the claim/lease/fencing protocol of the shards.

The work is a fixed list of units in five phases: scan units (byte ranges of the input), one cut
unit (merge the scans, place the shard boundaries), one write unit per shard, one recipe unit
(Data-Juicer's judgement of the recipe: seconds of imports, so the prepare's starter takes it
first and the others scan meanwhile), one final unit (fingerprints, manifest, publishing the
job). Each unit is claimed create-once
(`units/<unit>.lock`), kept alive by a heartbeat (`units/<unit>.beat`) and done when its result is
published create-once (`units/<unit>.json`). A claim whose heartbeat an observer sees unchanged for
a whole lease, on its own monotonic clock, is taken over; on the same host a claim of a dead pid is
taken over at once. A unit's result depends only on the plan, never on who computed it, so a
fenced straggler that publishes late can only lose the create-once race to identical bytes.

Everything lives in `.<job>.preparing/` beside the job directory; the job itself is built in its
`stage/` and renamed onto the job directory by the final unit, after which the rest is removed.
A prepare killed at any point leaves that directory, and the next prepare of the same request
(or any waiting participant) carries on from the units already done.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from elastic_sharding import confined, crashpoints, errors, fsops
from elastic_sharding.claims.heartbeat import LeaseKeeper, read_heartbeat_file
from elastic_sharding.claims.protocol import new_token, remove_if_token
from elastic_sharding.claims.takeover import StalenessObserver
from elastic_sharding.errors import ElasticShardError
from elastic_sharding.layout import PrepareLayout, preparing_dir
from elastic_sharding.progress import Progress
from elastic_sharding.records import PrepareFailure, PreparePlan, UnitClaim, decode, encode

log = logging.getLogger(__name__)

SCAN, CUT, WRITE, RECIPE, FINAL = "scan", "cut", "write", "recipe", "final"
_LABELS = {SCAN: "pass 1/2", WRITE: "pass 2/2"}


class Gone(Exception):
    """The prepare directory disappeared: the job was published, or the prepare failed and was
    cleaned up by the process that reported it."""


class PrepareDir(PrepareLayout):
    """A prepare under way (`layout.PrepareLayout`) and what can be read from it."""

    @classmethod
    def of(cls, job_root: Path) -> PrepareDir:
        return cls(preparing_dir(job_root), job_root)

    def published(self) -> bool:
        return (self.job_root / "manifest.json").is_file() and not confined.lexists(self.stage)

    def read_plan(self) -> PreparePlan | None:
        return fsops.read_record(self.plan, lambda data: decode(PreparePlan, data, self.plan))

    def remove(self) -> None:
        """Rename away first, so that nobody joins a directory half removed."""
        moved = self.root.with_name(f"{self.root.name}.removed-{new_token()[:8]}")
        if fsops.rename_away(self.root, moved):
            shutil.rmtree(moved, ignore_errors=True)


def unit_names(plan: PreparePlan) -> dict[str, list[str]]:
    return {
        SCAN: [f"scan-{i:05d}" for i in range(len(plan.units))],
        CUT: ["cut"],
        WRITE: [f"write-{i:05d}" for i in range(plan.num_shards)],
        RECIPE: ["recipe"],
        FINAL: ["final"],
    }


class Work(Protocol):
    """The units' work; each returns the bytes of its result record (and may write a blob)."""

    def scan(self, index: int) -> bytes: ...

    def cut(self) -> bytes: ...

    def write(self, index: int) -> bytes: ...

    def recipe(self) -> bytes: ...

    def final(self) -> bytes: ...


def failure_error(record: PrepareFailure) -> ElasticShardError:
    """The error a participant published, as the same exception type with the same message."""
    cls = getattr(errors, record.error, None)
    if not (isinstance(cls, type) and issubclass(cls, ElasticShardError)):
        cls = ElasticShardError
    exc = cls.__new__(cls)
    Exception.__init__(exc, record.message)
    if isinstance(exc, errors.InputError):
        exc.path, exc.line = None, None
    return exc


class _UnitKeeper(LeaseKeeper):
    def __init__(self, pdir: PrepareDir, unit: str, token: str, interval: float, lease: float, on_lost: Callable[[str], None]):
        super().__init__(f"prepare-{unit}", pdir.beat(unit), token, interval, lease, on_lost)
        self.lock = pdir.lock(unit)

    def check(self) -> str | None:
        try:
            current = fsops.read_record(self.lock, lambda data: decode(UnitClaim, data, self.lock))
        except ValueError:
            return None
        if current is None:
            return "the unit's claim is gone"
        if current.token != self.token:
            return f"the unit now belongs to host={current.host} pid={current.pid}"
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Participant:
    """One process's share of a prepare: claims units in order until the job is published."""

    def __init__(
        self, pdir: PrepareDir, plan: PreparePlan, work: Work, stop: Callable[[], bool] = lambda: False, quiet: bool = True
    ):
        self.quiet = quiet
        self.pdir = pdir
        self.plan = plan
        self.work = work
        self.stop = stop
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.observer = StalenessObserver(plan.lease_secs)
        self.units_done = 0
        self._lost: str | None = None

    def run(self, write_phase: Callable[[], None] | None = None) -> None:
        """Take part until the job is published (returns), a participant failed (raises its
        error), or the directory is gone (`Gone`). `write_phase` replaces `self.write_phase`."""
        names = unit_names(self.plan)
        work = self.work
        self._phase(SCAN, names[SCAN], lambda name: work.scan(int(name.split("-")[1])))
        self._phase(CUT, names[CUT], lambda name: work.cut())
        (write_phase or self.write_phase)()
        self._phase(RECIPE, names[RECIPE], lambda name: work.recipe())
        self._phase(FINAL, names[FINAL], lambda name: work.final())
        if self.pdir.published():
            self.pdir.remove()
            return
        while not self.pdir.published():
            self._check()
            time.sleep(self.plan.poll_secs)

    def take_first(self, phase: str) -> None:
        """Do the unit of a one-unit phase now if nobody has it (the prepare's starter does the
        recipe unit before anything else); otherwise leave it to `run`."""
        (name,) = unit_names(self.plan)[phase]
        if self.pdir.result(name).exists():
            return
        token = self._try_claim(name)
        if token is not None:
            self._do(phase, name, token, lambda _name: getattr(self.work, phase)())

    def write_phase(self) -> None:
        work = self.work
        self._phase(WRITE, unit_names(self.plan)[WRITE], lambda name: work.write(int(name.split("-")[1])))

    def _check(self) -> None:
        if self.pdir.published():
            # Whoever sees the job published removes what is left of its prepare: the final
            # unit's owner may have died between publishing the job and removing this directory.
            self.pdir.remove()
            raise Gone
        failed = fsops.read_record(self.pdir.failed, lambda data: decode(PrepareFailure, data, self.pdir.failed))
        if failed is not None:
            raise failure_error(failed)
        if not self.pdir.root.is_dir():
            raise Gone
        if self.stop():
            raise Gone

    def _phase(self, phase: str, names: list[str], do: Callable[[str], bytes]) -> None:
        label = _LABELS.get(phase)
        with Progress(label or phase, len(names), self.quiet or label is None, unit="unit" if phase == SCAN else "shard") as bar:
            pending = list(names)
            while pending:
                self._check()
                progressed = False
                still = []
                for name in pending:
                    if progressed:
                        still.append(name)
                        continue
                    if self.pdir.result(name).exists():
                        continue
                    token = self._try_claim(name)
                    if token is None:
                        still.append(name)
                        continue
                    if not self._do(phase, name, token, do):
                        still.append(name)
                    progressed = True
                bar.update(len(pending) - len(still))
                pending = still
                if pending and not progressed:
                    time.sleep(self.plan.poll_secs)

    def _try_claim(self, name: str) -> str | None:
        lock = self.pdir.lock(name)
        try:
            current = fsops.read_record(lock, lambda data: decode(UnitClaim, data, lock))
        except ValueError:
            return None
        if current is not None:
            if not self._stale(name, current):
                return None
            moved = self.pdir.stale_lock(name, f"stale-{new_token()[:8]}")
            if not remove_if_token(lock, moved, current.token):
                return None
            log.warning("prepare: took over %s from host=%s pid=%d", name, current.host, current.pid)
            self.observer.forget(name)
        token = new_token()
        record = UnitClaim(token=token, host=self.host, pid=self.pid, at=time.time())
        try:
            return token if fsops.publish_once(lock, encode(record)) else None
        except FileNotFoundError:
            raise Gone from None

    def _stale(self, name: str, claim: UnitClaim) -> bool:
        if claim.host == self.host and not _pid_alive(claim.pid):
            return True
        beat = read_heartbeat_file(self.pdir.beat(name))
        seq = beat.seq if beat is not None and beat.token == claim.token else 0
        return self.observer.is_stale(name, claim.token, seq)

    def _do(self, phase: str, name: str, token: str, do: Callable[[str], bytes]) -> bool:
        def lost(reason: str) -> None:
            self._lost = reason
            log.warning("prepare: lost %s: %s", name, reason)

        self._lost = None
        keeper = _UnitKeeper(self.pdir, name, token, self.plan.heartbeat_secs, self.plan.lease_secs, lost)
        try:
            keeper.beat()
        except FileNotFoundError:
            raise Gone from None
        keeper.start()
        try:
            crashpoints.reached(f"prepare-{phase}")
            try:
                result = do(name)
            except ElasticShardError as exc:
                if not self.pdir.root.is_dir() or self.pdir.published():
                    # A straggler whose records vanished (a record "missing"): the others published
                    # the job and removed the directory meanwhile. Not a failure of the prepare.
                    raise Gone from None
                self._publish_failure(exc)
                raise
            except Gone:
                raise
            except OSError as exc:
                if not self.pdir.root.is_dir() or self.pdir.published():
                    raise Gone from None
                failure = ElasticShardError(f"prepare failed: {exc}")
                self._publish_failure(failure)
                raise failure from exc
            crashpoints.reached(f"prepare-{phase}-done")
        finally:
            keeper.stop()
        if self._lost is not None:
            return self.pdir.result(name).exists()
        try:
            fsops.publish_once(self.pdir.result(name), result)
        except FileNotFoundError:
            raise Gone from None
        self.units_done += 1
        return True

    def _publish_failure(self, exc: ElasticShardError) -> None:
        record = PrepareFailure(error=type(exc).__name__, message=str(exc), host=self.host, pid=self.pid)
        with contextlib.suppress(OSError):
            fsops.publish_once(self.pdir.failed, encode(record))


# ---- helper processes ---------------------------------------------------------------------


def spawn_helpers(job_root: Path, count: int) -> list[subprocess.Popen[bytes]]:
    """Start `count` helper processes on this node that join the prepare of `job_root`."""
    procs = []
    for _ in range(count):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "elastic_sharding.prepare.cooperate", str(job_root)],
                stdin=subprocess.DEVNULL,
                start_new_session=False,
            )
        )
    return procs


def stop_helpers(procs: list[subprocess.Popen[bytes]], wait_secs: float = 30.0) -> None:
    """Helpers end by themselves once the job is published; whatever is left is terminated."""
    deadline = time.monotonic() + wait_secs
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def join(job_root: Path, stop: Callable[[], bool] = lambda: False, wait_secs: float = 0.0) -> bool:
    """Take part in the prepare of `job_root` that another process started (waiting up to
    `wait_secs` for its plan). True once the job is published (also when it already was, which
    a helper started late finds); False if there was no prepare to join or it failed (whoever
    reported the failure makes the command fail)."""
    from elastic_sharding.prepare.units import UnitWork

    pdir = PrepareDir.of(job_root)
    deadline = time.monotonic() + wait_secs
    while True:
        try:
            plan = pdir.read_plan()
        except ValueError:
            plan = None
        if plan is not None:
            break
        if pdir.published():
            return True
        if time.monotonic() >= deadline or stop():
            return False
        time.sleep(0.05)
    try:
        Participant(pdir, plan, UnitWork(pdir, plan), stop).run()
    except Gone:
        return pdir.published()
    except ElasticShardError as exc:
        log.info("prepare failed (reported by the participant that met it): %s", exc)
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESTALE) or not pdir.root.is_dir():
            return pdir.published()
        raise
    return True


class Assistant:
    """What a `dlc` instance does while another instance coordinates the prepare: once the plan
    is published, it works on units with `prepare_procs` processes (itself and helpers) until
    the job is published or the prepare fails (which the coordinator then reports)."""

    def __init__(self, job: Any):
        self.job_root = Path(os.path.abspath(job.job_dir))
        self.procs = job.prepare_procs
        self.done = False

    def __call__(self) -> None:
        if self.done or not PrepareDir.of(self.job_root).plan.exists():
            return
        self.done = True
        from elastic_sharding.prepare.job import usable_cores

        helpers = spawn_helpers(self.job_root, (self.procs or usable_cores()) - 1)
        try:
            join(self.job_root)
        finally:
            stop_helpers(helpers)


JOIN_ENV = "ELASTIC_SHARD_JOIN_PREPARE"


def help_until_prepared(job_root: Path, procs: int | None, stop: Callable[[], bool], poll_secs: float = 0.2) -> None:
    """For a worker started while its launcher still prepares (`mpi`): share the prepare with
    `procs` processes (itself and helpers) as soon as its plan exists, and return once the job is
    published. A failed prepare is the launcher's to report (it then stops the workers)."""
    pdir = PrepareDir.of(job_root)
    joined = False
    while not pdir.published():
        if stop():
            raise errors.Interrupted("stopped while waiting for the prepare")
        if not joined and pdir.plan.exists():
            joined = True
            from elastic_sharding.prepare.job import usable_cores

            helpers = spawn_helpers(job_root, (procs or usable_cores()) - 1)
            try:
                join(job_root, stop)
            finally:
                stop_helpers(helpers, wait_secs=0 if stop() else 30.0)
            continue
        time.sleep(poll_secs)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return 0 if join(Path(argv[0]), wait_secs=120.0) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
