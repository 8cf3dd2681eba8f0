"""Cooperative prepare: any number of processes on any nodes share one prepare through the
shared directory, with the claim/lease/fencing protocol of the shards.

The work is a fixed list of units in five phases: scan units (byte ranges of the input), one cut
unit (merge the scans, place the shard boundaries), one write unit per shard, one recipe unit
(Data-Juicer's judgement of the recipe: seconds of imports, so the prepare's starter takes it
first and the others scan meanwhile), one final unit (fingerprints, manifest, publishing the
job). Units are claimed, kept alive, taken over and published by `claims/units.py`, in
`units/`; a unit's result depends only on the plan, never on who computed it.

Everything lives in `.<job>.preparing/` beside the job directory; the job itself is built in its
`stage/` and renamed onto the job directory by the final unit. A prepare killed at any point
leaves that directory, and the next prepare of the same request (or any waiting participant)
carries on from the units already done.

The directory (`prepare_dir.PrepareDir`) is swept away by every participant on its way out once
the job is published. A participant whose view of it breaks meanwhile waits, up to
`SETTLE_SECS`, for the job to show as published, and then exits with the job like everyone else.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from elastic_sharding import errors, fsops
from elastic_sharding.claims.units import Units
from elastic_sharding.errors import ElasticShardError
from elastic_sharding.prepare.prepare_dir import SETTLE_SECS, PrepareDir
from elastic_sharding.progress import Progress
from elastic_sharding.records import PrepareFailure, PreparePlan, decode, encode

log = logging.getLogger(__name__)

SCAN, CUT, WRITE, RECIPE, FINAL = "scan", "cut", "write", "recipe", "final"
_LABELS = {SCAN: "pass 1/2", WRITE: "pass 2/2"}


class Gone(Exception):
    """The prepare directory disappeared (or changed) under this participant and no published job
    showed within `SETTLE_SECS`: the prepare was abandoned, or failed and was cleaned up by the
    process that reported it."""


class Stopped(Gone):
    """This participant was asked to stop (`stop()`)."""


def write_range(plan: PreparePlan, unit: int) -> range:
    """The shards write unit `unit` writes."""
    first = unit * plan.shards_per_write
    return range(first, min(plan.num_shards, first + plan.shards_per_write))


def unit_names(plan: PreparePlan) -> dict[str, list[str]]:
    return {
        SCAN: [f"scan-{i:05d}" for i in range(len(plan.units))],
        CUT: ["cut"],
        WRITE: [f"write-{i:05d}" for i in range(-(-plan.num_shards // plan.shards_per_write))],
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


def _dir_id(path: Path) -> tuple[int, int] | None:
    """Which directory `path` names now: a prepare directory removed and made anew is another."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


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
        self.units = Units(pdir, "prepare", plan.lease_secs, plan.heartbeat_secs, plan.poll_secs)
        self._dir_id = _dir_id(pdir.root)

    def run(
        self, first: str | None = None, write_phase: Callable[[], None] | None = None, then: Callable[[], None] = lambda: None
    ) -> None:
        """Take part until the job is published: then sweep what is left of the prepare and
        return. Raises the error a participant published, `Gone` if the directory vanished and no
        job showed, `Stopped` if asked to stop. `first` names a one-unit phase to do before
        anything else if nobody has it (the prepare's starter takes the recipe unit first);
        `then` runs after it (the recipe's warnings, once Data-Juicer accepted it); `write_phase`
        replaces `self.write_phase`."""
        try:
            try:
                self._take_part(first, write_phase or self.write_phase, then)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ESTALE):
                    raise
                raise Gone from None
        except Stopped:
            raise
        except Gone:
            # This participant's view broke (a record or the directory vanished): most likely
            # another one published the job and removed it, which shows here only once this
            # node's name cache expires.
            if not self._settle():
                raise Gone from None
        self.pdir.sweep()

    def _take_part(self, first: str | None, write_phase: Callable[[], None], then: Callable[[], None]) -> None:
        names = unit_names(self.plan)
        work = self.work
        if first is not None:
            (name,) = names[first]
            if not self.units.is_done(name):
                token = self.units.try_claim(name)
                if token is not None:
                    self.units.complete(name, token, self._guarded(lambda _name: getattr(work, first)()), f"prepare-{first}")
        then()
        self._phase(SCAN, names[SCAN], lambda name: work.scan(int(name.split("-")[1])))
        self._phase(CUT, names[CUT], lambda name: work.cut())
        write_phase()
        self._phase(RECIPE, names[RECIPE], lambda name: work.recipe())
        self._phase(FINAL, names[FINAL], lambda name: work.final())
        while not self.pdir.published():
            self._check()
            time.sleep(self.plan.poll_secs)

    def _settle(self, secs: float = SETTLE_SECS, moved_is_gone: bool = False) -> bool:
        """Wait up to `secs` for the outcome another participant decides: True once the job
        shows as published; raises a published failure; False when `secs` passed without either.
        With `moved_is_gone`, a prepare directory no longer the one this participant joined
        raises `Gone` at once (`_fail` then leaves the verdict to `run`)."""
        deadline = time.monotonic() + secs
        while not self.pdir.published():
            if moved_is_gone and _dir_id(self.pdir.root) != self._dir_id:
                raise Gone
            failed = self._published_failure()
            if failed is not None:
                raise failed
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(self.plan.poll_secs, 0.1))
        return True

    def write_phase(self) -> None:
        work = self.work
        self._phase(WRITE, unit_names(self.plan)[WRITE], lambda name: work.write(int(name.split("-")[1])))

    def _published_failure(self) -> ElasticShardError | None:
        try:
            failed = fsops.read_record(self.pdir.failed, lambda data: decode(PrepareFailure, data, self.pdir.failed))
        except (OSError, ValueError):
            return None
        return errors.rebuilt(failed.error, failed.message) if failed is not None else None

    def _check(self) -> None:
        if self.pdir.published():
            raise Gone
        failed = self._published_failure()
        if failed is not None:
            raise failed
        if _dir_id(self.pdir.root) != self._dir_id:
            raise Gone
        if self.stop():
            raise Stopped

    def _phase(self, phase: str, names: list[str], do: Callable[[str], bytes]) -> None:
        label = _LABELS.get(phase)
        with Progress(label or phase, len(names), self.quiet or label is None, unit="unit" if phase == SCAN else "shard") as bar:
            self.units.run_phase(names, self._guarded(do), f"prepare-{phase}", self._check, bar.update)

    def _guarded(self, do: Callable[[str], bytes]) -> Callable[[str], bytes]:
        """A unit's work whose failure is published for every participant (`_fail`)."""

        def run(name: str) -> bytes:
            try:
                return do(name)
            except Gone:
                raise
            except ElasticShardError as exc:
                self._fail(exc, suspect=isinstance(exc, errors.JobStateError))
                raise
            except OSError as exc:
                failure = ElasticShardError(f"prepare failed: {exc}")
                self._fail(failure, suspect=True)
                raise failure from exc

        return run

    def _fail(self, failure: ElasticShardError, suspect: bool) -> None:
        """Publish `failure` for every participant, unless it is only this participant's view
        that broke (`Gone`). A record that reads missing or a filesystem error (`suspect`) is
        believed only if the directory is still the one this participant joined once
        `SETTLE_SECS` have passed: on another node, the publish and removal that caused it show
        only when the name cache expires."""
        if self._settle(SETTLE_SECS if suspect else 0.0, moved_is_gone=True):
            raise Gone
        self._publish_failure(failure)

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
            pdir.sweep()
            return True
        if time.monotonic() >= deadline or stop():
            return False
        time.sleep(0.05)
    try:
        Participant(pdir, plan, UnitWork(pdir, plan), stop).run()
    except Gone:
        return False
    except ElasticShardError as exc:
        log.info("prepare failed (reported by the participant that met it): %s", exc)
        return False
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
    published. A failed prepare is the launcher's to report (it then stops the workers). The
    launcher checked that the job directory's parent exists before it started this worker: where
    this node does not see it, the share is not mounted here, and waiting would never end."""
    if not job_root.parent.is_dir():
        raise errors.UsageError(
            f"the parent directory of --job-dir does not exist on this node ({socket.gethostname()}): {job_root.parent}. "
            "The launcher sees it, so the shared filesystem is not mounted here (or not at the same path); mount it "
            "at the same path on every node"
        )
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
