"""Whether the job directory's filesystem can coordinate workers, tried before anything is written.

The claim protocol rests on a handful of guarantees (exclusive create, create-once `link()`,
atomic `rename()`, durable writes, listings that show new names). A mount without them does not
fail cleanly: an `rclone mount` takes a whole prepared job and then fails every worker with EIO
from `link()`. So `prepare`, the launchers and every worker first run those very primitives
(`fsops`) on a few bytes in a private directory and refuse, in one line, a filesystem that gets
one wrong. Object-storage mounts known to lack them are refused by type even when the probe
passes: their failures depend on timing (write-back uploads, caches) more than on the call.

Each node probes its own mount (options differ per node); within one process a mount that
passed is not probed again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from elastic_sharding import confined, crashpoints, fsops
from elastic_sharding.errors import UnsuitableFilesystem

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
PROBE_PREFIX = ".elastic-shard-probe."
# FUSE views of object storage: no hard links, renames that copy, mtimes not kept, uploads
# that finish after close().
OBJECT_STORE_MOUNTS = {
    "fuse.rclone": "rclone mount",
    "fuse.s3fs": "s3fs",
    "fuse.ossfs": "ossfs",
    "fuse.goofys": "goofys",
    "fuse.gcsfuse": "gcsfuse",
    "fuse.mountpoint-s3": "Mountpoint for Amazon S3",
    "fuse.blobfuse2": "blobfuse2",
    "fuse.blobfuse": "blobfuse",
}
# Errors that say "not here, not now" (permissions, a read-only mount, no space) rather than
# "this filesystem lacks a guarantee": they get their own advice.
_NOT_WRITABLE = {
    errno.EACCES: "check the directory's owner and mode: workers on every node must be able to write it",
    errno.EROFS: "mount it read-write on this node",
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space or raise the quota",
}
_ADVICE = (
    "put --job-dir on a NAS/NFS/CPFS mount that every node shares; for object storage (OSS, S3, GCS), "
    "stage the job directory on such a POSIX mount instead"
)

_passed: set[str] = set()


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: the mount a path lies on."""

    mount_id: str
    point: Path
    fstype: str
    source: str

    def describe(self) -> str:
        return f"{self.fstype} mounted at {self.point} from {self.source}"


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def mount_of(path: Path) -> Mount | None:
    """The mount `path` (an existing directory) lies on, or None where mountinfo cannot be read.
    The longest mount point containing it wins; of mounts stacked on one point, the last one."""
    try:
        text = MOUNTINFO.read_text(errors="replace")
    except OSError:
        return None
    real = Path(os.path.realpath(path))
    best: Mount | None = None
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3:
            continue
        point = Path(_unescape(fields[4]))
        if point != real and point not in real.parents:
            continue
        if best is None or len(point.parts) >= len(best.point.parts):
            best = Mount(fields[0], point, fields[dash + 1], _unescape(fields[dash + 2]))
    return best


@dataclass(frozen=True)
class ProbeFailure:
    """What the probe saw go wrong: the step, in words, what happened, and the errno of a call
    that failed."""

    step: str
    problem: str
    errno: int | None = None

    def describe(self) -> str:
        return f"{self.step}: {self.problem}"


def _failed_with(code: int | None) -> str:
    if code is None:
        return "failed"
    return f"failed with {errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


class _Failed(Exception):
    def __init__(self, step: str, problem: str, code: int | None = None):
        super().__init__(problem)
        self.failure = ProbeFailure(step, problem, code)


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    """Turn an OSError of the calls in this step into the probe's failure, naming the step."""
    try:
        yield
    except OSError as exc:
        raise _Failed(name, _failed_with(exc.errno), exc.errno) from None


def _expect(condition: bool, step: str, problem: str) -> None:
    if not condition:
        raise _Failed(step, problem)


def _read(path: Path, step: str) -> bytes:
    with _step(step):
        return confined.read_bytes_nofollow(path)


def _second_create_refused(step: str, create: Callable[[], object]) -> None:
    """`create` (a second creator of a name that exists) must fail with EEXIST, or report a loss."""
    try:
        won = create()
    except FileExistsError:
        return
    except OSError as exc:
        raise _Failed(step, f"{_failed_with(exc.errno)} instead of EEXIST", exc.errno) from None
    _expect(won is False, step, "succeeded: two creators would both own one name")


def probe(directory: Path) -> ProbeFailure | None:
    """Try every guarantee the protocol needs in a new, uniquely named directory under
    `directory`, and remove it again whatever happens; None if all hold."""
    here = directory / f"{PROBE_PREFIX}{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
    step = "creating a probe directory (mkdir)"
    try:
        with _step(step):
            _expect(fsops.make_dir_exclusive(here), step, "its unique name already exists")
    except _Failed as failed:
        return failed.failure
    try:
        crashpoints.reached("probing")
        _run_checks(here)
    except _Failed as failed:
        _remove(here)
        return failed.failure
    except BaseException:
        _remove(here)
        raise
    return _remove(here)


def _run_checks(here: Path) -> None:
    created, linked = here / "created", here / "linked"
    payload = secrets.token_bytes(32)
    with _step("exclusive create (open with O_CREAT|O_EXCL)"), confined.create_file(created) as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    _second_create_refused("a second exclusive create of the same name", lambda: confined.create_file(created).close())
    step = "reading a written and fsynced file back through a fresh open"
    _expect(_read(created, step) == payload, step, "returned other bytes")

    first, second, third = (secrets.token_bytes(32) for _ in range(3))
    step = "publishing a record by hard link (link)"
    with _step(step):
        _expect(fsops.publish_once(linked, first), step, "reported the new name as taken")
    _expect(_read(linked, step) == first, step, "the published record reads back with other bytes")
    step = "a second link to the same name"
    _second_create_refused(step, lambda: fsops.publish_once(linked, second))
    _expect(_read(linked, step) == first, step, "changed the record that was published first")

    step = "replacing a record atomically (rename)"
    with _step(step):
        fsops.replace_atomic(linked, third)
    _expect(_read(linked, step) == third, step, "the replaced record reads back with other bytes")

    step = "listing the directory"
    with _step(step):
        names = set(confined.list_dir(here))
    _expect(names == {"created", "linked"}, step, f"shows {sorted(names)} instead of ['created', 'linked']")


def _remove(here: Path) -> ProbeFailure | None:
    """Remove the probe directory (and whatever a failed step left in it)."""
    try:
        for name in confined.list_dir(here):
            (here / name).unlink()
        os.rmdir(here)
    except FileNotFoundError:
        pass
    except OSError as exc:
        shutil.rmtree(here, ignore_errors=True)
        if confined.lexists(here):
            return ProbeFailure("removing the probe directory", _failed_with(exc.errno), exc.errno)
    return None


def remove_stale_probes(directory: Path) -> None:
    """Remove the probe directories of dead processes of this host (a probe killed by SIGKILL
    cannot clean up). Those of other hosts are left alone: their pids mean nothing here."""
    try:
        names = confined.list_dir(directory)
    except OSError:
        return
    host = socket.gethostname()
    for name, kind in names.items():
        if kind != "dir" or not name.startswith(PROBE_PREFIX):
            continue
        owner = name[len(PROBE_PREFIX) :].rpartition(".")[0]
        owner_host, _, pid = owner.rpartition(".")
        if owner_host == host and pid.isdigit() and not _alive(int(pid)):
            log.info("removing %s, left by a probe that was killed", directory / name)
            shutil.rmtree(directory / name, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process
        pass
    return True


def check_job_filesystem(job_root: Path, *, creating: bool = False) -> None:
    """Refuse (`UnsuitableFilesystem`, one line) a job directory whose filesystem cannot
    coordinate workers. The job directory is probed where it is; with `creating` (prepare and
    the launchers), one that does not exist yet is probed in its parent, where it will be made.
    A missing directory is left to the caller to report."""
    job_root = Path(os.path.abspath(job_root))
    directory = job_root if job_root.is_dir() else job_root.parent if creating and job_root.parent.is_dir() else None
    if directory is None:
        return
    mount = mount_of(directory)
    # A mount id is reused after an unmount: the rest of the line tells a new mount from an old one.
    key = f"{mount.mount_id} {mount.describe()}" if mount is not None else f"dev {os.stat(directory).st_dev}"
    if key in _passed:
        return
    if directory == job_root:
        remove_stale_probes(directory)
    where = mount.describe() if mount is not None else "filesystem type unknown (no /proc/self/mountinfo)"
    started = time.perf_counter()
    failure = probe(directory)
    log.debug("probed %s (%s) in %.1f ms", directory, where, (time.perf_counter() - started) * 1e3)
    if failure is not None and failure.errno in _NOT_WRITABLE:
        raise UnsuitableFilesystem(
            f"{job_root}: cannot write the job directory here ({where}): {failure.describe()}; {_NOT_WRITABLE[failure.errno]}"
        )
    known = OBJECT_STORE_MOUNTS.get(mount.fstype) if mount is not None else None
    if known is not None:
        seen = f"the probe saw: {failure.describe()}" if failure else "a probe passed here, but its failures depend on timing"
        raise UnsuitableFilesystem(
            f"{job_root}: the job directory is on {where}, an object-storage mount ({known}) that cannot coordinate "
            f"workers: no hard links, renames that copy, mtimes not kept ({seen}); {_ADVICE}"
        )
    if failure is not None:
        raise UnsuitableFilesystem(
            f"{job_root}: the job directory's filesystem cannot coordinate workers ({where}): {failure.describe()}; {_ADVICE}"
        )
    _passed.add(key)
