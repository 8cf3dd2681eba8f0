"""Units: named pieces of work that any number of processes on any nodes share through one
directory, with the claim/lease/fencing protocol of the shards.

A unit is claimed create-once (`<unit>.lock`), kept alive by a heartbeat (`<unit>.beat`) and done
when its result is published create-once (`<unit>.json`). A claim whose heartbeat an observer
sees unchanged for a whole lease, on its own monotonic clock, is taken over (the removal ticket of
`protocol.remove_if_token` decides the one remover); on the same host a claim of a dead pid is
taken over at once. A unit's result must depend only on its name and on what every process can
read, never on who computed it: a fenced straggler that publishes late then loses the create-once
race to identical bytes.

The cooperative prepare (`prepare/cooperate.py`), the deduplication stages (`dedup/cooperate.py`)
and the analysis (`analysis/cooperate.py`) are made of these units; each says which units exist,
in which order, and what one does. The two whole-dataset stages share `SharedStage`: phases of
units whose first failure ends every participant. A directory that vanishes under a participant
surfaces as `FileNotFoundError` from these calls: what that means is the caller's to decide.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from elastic_sharding import confined, crashpoints, errors, fsops
from elastic_sharding.claims.heartbeat import LeaseKeeper, read_heartbeat_file
from elastic_sharding.claims.protocol import new_token, remove_if_token
from elastic_sharding.claims.takeover import StalenessObserver, first_unclaimed
from elastic_sharding.errors import ElasticShardError
from elastic_sharding.records import DedupUnitDone, KeptShard, StageFailure, UnitClaim, decode, encode

log = logging.getLogger(__name__)


class UnitPaths(Protocol):
    """Where a set of units keeps its claims, heartbeats and results."""

    def lock(self, unit: str) -> Path: ...

    def stale_lock(self, unit: str, suffix: str) -> Path: ...

    def beat(self, unit: str) -> Path: ...

    def result(self, unit: str) -> Path: ...


class StagePaths(UnitPaths, Protocol):
    """A whole-dataset stage's units, plus where its first failure is published."""

    units: Path
    failed: Path


class _UnitKeeper(LeaseKeeper):
    def __init__(
        self, paths: UnitPaths, what: str, unit: str, token: str, interval: float, lease: float, on_lost: Callable[[str], None]
    ):
        super().__init__(f"{what}-{unit}", paths.beat(unit), token, interval, lease, on_lost)
        self.lock = paths.lock(unit)

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


class Units:
    """This process's side of one directory of units: claim, keep, complete, take over."""

    def __init__(self, paths: UnitPaths, what: str, lease_secs: float, heartbeat_secs: float, poll_secs: float):
        self.paths = paths
        self.what = what  # names the units in logs and heartbeats: "prepare", "dedup stage 1"
        self.lease_secs = lease_secs
        self.heartbeat_secs = heartbeat_secs
        self.poll_secs = poll_secs
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.observer = StalenessObserver(lease_secs)
        self._lost: str | None = None

    def is_done(self, name: str) -> bool:
        return self.paths.result(name).exists()

    def try_claim(self, name: str) -> str | None:
        """The claim's token if this process now holds `name` (taking a stale claim over)."""
        lock = self.paths.lock(name)
        try:
            current = fsops.read_record(lock, lambda data: decode(UnitClaim, data, lock))
        except ValueError:
            return None
        if current is not None:
            if not self._stale(name, current):
                return None
            moved = self.paths.stale_lock(name, f"stale-{new_token()[:8]}")
            if not remove_if_token(lock, moved, current.token):
                return None
            log.warning("%s: took over %s from host=%s pid=%d", self.what, name, current.host, current.pid)
            self.observer.forget(name)
        token = new_token()
        record = UnitClaim(token=token, host=self.host, pid=self.pid, at=time.time())
        return token if fsops.publish_once(lock, encode(record)) else None

    def _stale(self, name: str, claim: UnitClaim) -> bool:
        if claim.host == self.host and not _pid_alive(claim.pid):
            return True
        beat = read_heartbeat_file(self.paths.beat(name))
        seq = beat.seq if beat is not None and beat.token == claim.token else 0
        return self.observer.is_stale(name, claim.token, seq)

    def complete(self, name: str, token: str, do: Callable[[str], bytes], crash_point: str) -> bool:
        """Do a claimed unit under its heartbeat and publish its result; False if the claim was
        lost meanwhile and nobody published the unit (it is pending again)."""
        if self.is_done(name):
            return True  # claimed just as its previous owner published it

        def lost(reason: str) -> None:
            self._lost = reason
            log.warning("%s: lost %s: %s", self.what, name, reason)

        self._lost = None
        keeper = _UnitKeeper(self.paths, self.what, name, token, self.heartbeat_secs, self.lease_secs, lost)
        keeper.beat()
        keeper.start()
        try:
            crashpoints.reached(crash_point)
            result = do(name)
            crashpoints.reached(f"{crash_point}-done")
        finally:
            keeper.stop()
        if self._lost is not None:
            return self.is_done(name)
        fsops.publish_once(self.paths.result(name), result)
        return True

    def run_phase(
        self,
        names: list[str],
        do: Callable[[str], bytes],
        crash_point: str,
        check: Callable[[], None] = lambda: None,
        progress: Callable[[int], None] = lambda done: None,
    ) -> None:
        """Until every unit of `names` has a result: claim the first one nobody holds, do it.

        Units are claimed in order: first past the frontier (the units claimed when last read)
        without reading the claims behind it; once none is left there, one unit per pass from
        the first still pending (taking stale claims over, waiting for the others'). `check` runs
        before every pass (to raise when the work as a whole failed or stopped); `progress` hears
        how many units were found finished (this process's own, one at a time, then the rest).
        """
        pending = list(names)
        frontier, gap = 0, 1
        while pending:
            check()
            # Past the frontier, the first unit without a claim, by galloping (`first_unclaimed`):
            # O(log participants) reads a claim instead of one per unit the others hold.
            found = first_unclaimed(frontier, len(names), lambda at: confined.lexists(self.paths.lock(names[at])), gap)
            if found is not None:
                gap, frontier = found - frontier + 1, found + 1
                name = names[found]
                token = self.try_claim(name)
                if token is not None and self.complete(name, token, do, crash_point) and name in pending:
                    pending.remove(name)
                    progress(1)
                continue
            frontier = len(names)
            progressed = False
            still: list[str] = []
            for at, name in enumerate(pending):
                if self.is_done(name):
                    continue
                token = self.try_claim(name)
                if token is None:
                    still.append(name)
                    continue
                if not self.complete(name, token, do, crash_point):
                    still.append(name)
                progressed = True
                still += pending[at + 1 :]
                break
            progress(len(pending) - len(still))
            pending = still
            if pending and not progressed:
                time.sleep(self.poll_secs)


def unit_index(name: str) -> int:
    """The index a unit's name ends with (`StageLayout.unit_name`)."""
    return int(name.rsplit("-", 1)[1])


class SharedStage:
    """One process's share of a whole-dataset stage: phases of units (each phase complete before
    the next begins), where a unit that raises publishes `failed` create-once and every
    participant then ends with that first error, as the same type and exit code."""

    def __init__(
        self,
        paths: StagePaths,
        what: str,
        lease_secs: float,
        heartbeat_secs: float,
        poll_secs: float,
        stop: Callable[[], bool] = lambda: False,
    ):
        self.paths = paths
        self.what = what
        self.stop = stop
        self.units = Units(paths, what, lease_secs, heartbeat_secs, poll_secs)
        self._helped: set[str] = set()  # seen published by `help_once`: never looked at again

    def run_phase(self, names: list[str], do: Callable[[str], bytes], crash_point: str) -> None:
        """Every unit of `names` done by someone; `do(name)` makes one unit's result bytes."""
        fsops.make_dirs(self.paths.units)
        self.units.run_phase(names, self.guarded(do), crash_point, self.check)

    def help_once(self, names: list[str], ready: Callable[[str], bool], do: Callable[[str], bytes], crash_point: str) -> bool:
        """Do one unit of `names` that is `ready` and nobody holds (a phase begun early, while the
        work it reads is still being finished); False if there is none."""
        self.check()
        fsops.make_dirs(self.paths.units)
        for name in names:
            if name in self._helped:
                continue
            if self.units.is_done(name):
                self._helped.add(name)
                continue
            if not ready(name):
                continue
            token = self.units.try_claim(name)
            if token is not None:
                self.units.complete(name, token, self.guarded(do), crash_point)
                return True
        return False

    def counted(self, do: Callable[[int], int | KeptShard]) -> Callable[[str], bytes]:
        """A unit's work by its index, and its result record: a kept shard, or the count it made."""

        def run(name: str) -> bytes:
            started = time.monotonic()
            count = do(unit_index(name))
            if isinstance(count, KeptShard):
                return encode(count)
            return encode(DedupUnitDone(name, count, self.units.host, self.units.pid, round(time.monotonic() - started, 3)))

        return run

    def count(self, names: list[str]) -> int:
        """The sum of the counts the units `names` published (every one of them done)."""
        total = 0
        for name in names:
            path = self.paths.result(name)
            record = fsops.read_record(path, lambda data, path=path: decode(DedupUnitDone, data, path))
            if record is None:
                raise errors.JobStateError(
                    f"{path}: missing; the stage is incomplete: remove its directory (stages/<k>/ of the job) and every "
                    "later stages/<j>/, then run the workers again"
                )
            total += record.count
        return total

    def guarded(self, do: Callable[[str], bytes]) -> Callable[[str], bytes]:
        def run(name: str) -> bytes:
            try:
                return do(name)
            except Exception as exc:
                failure = exc if isinstance(exc, ElasticShardError) else ElasticShardError(f"{type(exc).__name__}: {exc}")
                self._publish_failure(name, failure)
                # The first failure published is everyone's, this participant's included.
                raise self.published_failure() or failure from exc

        return run

    def published_failure(self) -> ElasticShardError | None:
        path = self.paths.failed
        failed = fsops.read_record(path, lambda data: decode(StageFailure, data, path))
        if failed is None:
            return None
        return errors.rebuilt(failed.error, f"{failed.message} (in {failed.unit} on host={failed.host} pid={failed.pid})")

    def check(self) -> None:
        failed = self.published_failure()
        if failed is not None:
            raise failed
        if self.stop():
            raise errors.Interrupted(f"stopped during {self.what}")

    def _publish_failure(self, unit: str, exc: ElasticShardError) -> None:
        record = StageFailure(unit=unit, error=type(exc).__name__, message=str(exc), host=self.units.host, pid=self.units.pid)
        with contextlib.suppress(OSError):
            fsops.publish_once(self.paths.failed, encode(record))
