"""Coordination primitives on a shared POSIX filesystem.

This is the only module that issues the syscalls the protocol's correctness rests on:
exclusive create, create-once publish (`link`), atomic replace (`rename`), rename-away and
fsync. Correctness never depends on fcntl/flock: on NFSv3 with `nolock`/`local_lock` those are
node-local. Readers of just-published records must tolerate attribute caches, so `read_record`
retries a read that comes back empty or unparsable instead of treating it as "free".

Every name here is opened, listed, created, linked, renamed and synced through `confined`, so no
coordination step ever goes through a link planted in the job directory, and a worker's steps go
relative to the job directories it holds open.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from elastic_sharding import confined

T = TypeVar("T")

STALE_HANDLE_SECS = 3.0
STALE_HANDLE_POLL = 0.02
MKDIR_VISIBLE_TRIES = 10


def ensure_dir(path: Path, parents: bool = False) -> None:
    """mkdir unless `path` already is a directory; a link (confined.LinkRefused) or a file in its place is
    refused, so nothing is ever created through a planted link. Missing parents are created
    only if asked (they are above the place the tool confines itself to)."""
    try:
        _mkdir_or_found(path, _is_own_dir)
    except FileNotFoundError:
        if not parents or path.parent == path:
            raise
        ensure_dir(path.parent, parents=True)
        ensure_dir(path)


def _is_own_dir(path: Path) -> bool:
    """True if `path` is a directory (never through a link), False if it does not show (yet)."""
    found = confined.kind(path)
    if found == "link":
        raise confined.LinkRefused(path)
    if found not in ("dir", None):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    return found == "dir"


def make_dirs(path: Path) -> list[Path]:
    """`mkdir -p` for a place outside the job directory (the directory of an `--output`).

    Existing components may be links and are followed, as in any path a user types; missing ones
    are created with `confined.DIR_MODE`, and one that another process creates meanwhile is fine. Returns
    the directories this call created, outermost first. If one cannot be created, those already
    made are removed again and the OSError names the directory that failed."""
    missing: list[Path] = []
    current = path
    while not _is_dir_in_the_way(current):
        missing.append(current)
        current = current.parent
    created: list[Path] = []
    try:
        for directory in reversed(missing):
            if _mkdir_or_found(directory, _is_dir_in_the_way):
                created.append(directory)
    except OSError:
        remove_dirs(created)
        raise
    if created:
        fsync_dir(created[0].parent)
    return created


def _is_dir_in_the_way(path: Path) -> bool:
    """True if `path` is a directory (through links), False if it is missing (or a component
    above it is not a directory: that one is found further up); NotADirectoryError for anything
    else in its place, naming it."""
    try:
        mode = os.stat(path).st_mode
    except NotADirectoryError:
        return False
    except FileNotFoundError:
        if not confined.is_link(path):
            return path.parent == path
        try:
            mode = os.stat(path).st_mode  # not a link after all: created meanwhile
        except FileNotFoundError:
            raise NotADirectoryError(errno.ENOTDIR, "is a broken symbolic link, not a directory", str(path)) from None
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, "is not a directory", str(path))
    return True


def _wait_out_stale(exc: OSError, stale_until: float | None) -> float:
    """In a retry loop: re-raise `exc` unless it is ESTALE and `STALE_HANDLE_SECS` have not passed
    since the first; then wait a poll and return the deadline. A client whose name cache still
    holds a handle another node has since replaced gets ESTALE until that entry expires."""
    if exc.errno != errno.ESTALE:
        raise exc
    stale_until = stale_until or time.monotonic() + STALE_HANDLE_SECS
    if time.monotonic() > stale_until:
        raise exc
    time.sleep(STALE_HANDLE_POLL)
    return stale_until


def _mkdir_or_found(directory: Path, is_dir: Callable[[Path], bool]) -> bool:
    """mkdir; True if this call created it, False if it was there. A caching NAS can say EEXIST
    before the directory shows (GlusterFS: also to both of two racing creators, or to a lone
    one), so when `is_dir` does not see it yet, mkdir and the lookup are retried for a while
    before that counts as an error. ENOENT while the parent shows as a directory is retried the
    same way (GlusterFS: a parent another node just made can be looked up before this client can
    create in it). ESTALE is retried for up to `STALE_HANDLE_SECS`; `is_dir` raises for anything
    else in its place."""
    stale_until: float | None = None
    attempt = 0
    while attempt < MKDIR_VISIBLE_TRIES:
        try:
            confined.mkdir(directory)
            return True
        except FileExistsError:
            if is_dir(directory):
                return False
            missed: OSError = FileExistsError(errno.EEXIST, "mkdir says it exists, yet it never shows", str(directory))
        except FileNotFoundError as exc:
            if confined.kind(directory.parent) != "dir":
                raise
            missed = exc
        except OSError as exc:
            stale_until = _wait_out_stale(exc, stale_until)
            continue
        attempt += 1
        time.sleep(0.02 * attempt)
    raise missed


def remove_dirs(created: list[Path]) -> None:
    """Remove directories `make_dirs` created, innermost first, each only while it is empty."""
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


@contextlib.contextmanager
def reported_as(path: Path, call: str, tmp: Path | None = None) -> Iterator[None]:
    """Report an OSError of the calls inside that names no file (a write to an open file) or the
    hidden temporary file `tmp` against `path`, the file the user knows, naming `call`. Errors
    that name any other file pass unchanged; the class and errno stay either way, so callers
    still catch FileNotFoundError and the like."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and (tmp is None or exc.filename != str(tmp)):
            raise
        raise _about(exc, path, call) from exc


def _about(exc: OSError, path: Path, call: str) -> OSError:
    return type(exc)(exc.errno, f"{call} failed: {exc.strerror or exc}", str(path))


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")


def probe_create(target: Path, create_once: bool = False) -> None:
    """Create and remove the confined.kind of temporary file `AtomicOutput` writes beside `target`: proves
    now, before any work, that the directory takes new files (permissions, a read-only mount).
    With `create_once`, also link it to a second name, as a create-once commit publishes it
    (a mount without hard links fails here, not after the whole job)."""
    tmp = _temp_name(target)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, confined.FILE_MODE))
    try:
        if create_once:
            linked = _temp_name(target)
            with reported_as(target, "link() of its temporary file", tmp):
                os.link(tmp, linked)
            os.unlink(linked)
    finally:
        os.unlink(tmp)


fsync_dir = confined.fsync_dir


def _create_temp(target: Path) -> tuple[Path, int]:
    """A new temporary file beside `target`, open for writing. Its name is random, so one that
    "exists" was created by this very call: a NAS client retried a create whose reply was lost
    (seen on GlusterFS under load, seed 84113 trial 130). That one is removed, and another name
    taken."""
    for attempt in range(3):
        tmp = _temp_name(target)
        try:
            with reported_as(target, "creating a temporary file for it", tmp):
                return tmp, confined.open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            with contextlib.suppress(OSError):
                confined.unlink(tmp)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _write_temp(target: Path, data: bytes, durable: bool = True) -> Path:
    tmp, fd = _create_temp(target)
    try:
        with reported_as(target, "writing its temporary file"):
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            confined.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _link_once(tmp: Path, target: Path) -> bool:
    """link(tmp, target); True if this call created target. Unlinks tmp either way."""
    try:
        try:
            confined.link(tmp, target)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            # NFS may report an error for a link that a retransmitted request did create:
            # the temp file's link count says what really happened.
            try:
                if confined.lstat(tmp).st_nlink == 2:
                    return True
            except OSError:
                pass
            with reported_as(target, "link() of its temporary file", tmp):
                raise exc
    finally:
        with contextlib.suppress(OSError):
            confined.unlink(tmp)


def publish_once(target: Path, data: bytes) -> bool:
    """Create `target` with `data` unless it exists. Returns False if another writer won.

    Content is complete and durable before the name appears, so no reader ever sees a partial
    record, and at most one publisher per name succeeds.
    """
    tmp = _write_temp(target, data)
    created = _link_once(tmp, target)
    if created:
        fsync_dir(target.parent)
    return created


def replace_atomic(target: Path, data: bytes, durable: bool = True) -> None:
    """Replace `target` with `data` in one step: readers see the old or the new content.
    `durable=False` skips both fsyncs, for a record that has no use after a crash of its writer's
    node (a heartbeat: stale by then anyway); readers still see a whole record."""
    tmp = _write_temp(target, data, durable)
    try:
        with reported_as(target, "rename() of its temporary file", tmp):
            confined.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            confined.unlink(tmp)
        raise
    if durable:
        fsync_dir(target.parent)


def rename_away(source: Path, destination: Path) -> bool:
    """Move `source` to a fresh `destination`; False if `source` is already gone."""
    try:
        confined.rename(source, destination)
    except FileNotFoundError:
        return False
    fsync_dir(source.parent)
    return True


def link_back(source: Path, target: Path) -> bool:
    """Put a record moved away by mistake back, unless a new one took its name meanwhile."""
    try:
        confined.link(source, target)
    except FileExistsError:
        return False
    with contextlib.suppress(OSError):
        confined.unlink(source)
    fsync_dir(target.parent)
    return True


def make_dir_exclusive(path: Path) -> bool:
    """mkdir that fails on an existing name: True if this call created it."""
    try:
        confined.mkdir(path)
    except FileExistsError:
        return False
    fsync_dir(path.parent)
    return True


def make_unique_dir(path: Path) -> bool:
    """`make_dir_exclusive` for a name nobody else can make (it carries this process's random
    token). A NAS client that lost an mkdir reply retries it and reports EEXIST for the directory
    it made (GlusterFS under load at 16 nodes: "attempt directory ... already exists"), which may
    show here only a moment later, or not at all until mkdir is tried again (at 32 nodes):
    `_mkdir_or_found`'s waits and retries. An empty real directory there is then ours. False only
    for a name that holds something else (a file, a link, a directory with entries) or never shows."""
    try:
        if not _mkdir_or_found(path, _is_own_dir):
            with os.scandir(path) as entries:
                if any(entries):
                    return False
    except (FileExistsError, NotADirectoryError, confined.LinkRefused):
        return False
    fsync_dir(path.parent)
    return True


def rename_dir(source: Path, destination: Path) -> bool:
    """Atomically publish a fully written directory; False if `destination` already exists."""
    try:
        os.rename(source, destination)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    fsync_dir(destination.parent)
    return True


def read_record(path: Path, parse: Callable[[bytes], T], attempts: int = 5, delay: float = 0.05) -> T | None:
    """Read and parse a small record; None if it does not exist.

    An empty or unparsable read is retried: on a NAS a reader can see a just-created file
    before its content. So is ESTALE, for up to `STALE_HANDLE_SECS`: a client whose name cache
    still points at a record another node has since replaced gets it until that cache entry
    expires (measured on GlusterFS's default caching: runs of ESTALE for up to its 1 s entry
    timeout while another node rewrites the record; NFS clients behave alike). A record that
    stays unparsable raises the parser's error; a symbolic link raises confined.LinkRefused (a ValueError
    too) at once.
    """
    last_error: Exception | None = None
    stale_until: float | None = None
    attempt = 0
    while attempt < attempts:
        try:
            data = confined.read_bytes_nofollow(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            stale_until = _wait_out_stale(exc, stale_until)
            continue
        try:
            if data:
                return parse(data)
            last_error = ValueError(f"{path}: empty record")
        except ValueError as exc:
            last_error = exc
        attempt += 1
        time.sleep(delay * attempt)
    assert last_error is not None
    raise last_error


class AtomicOutput:
    """A large file written under a temporary name and published only when complete.

    `commit()` fsyncs and then either replaces the target (`replace=True`) or publishes it
    create-once, so an interrupted writer never leaves a partial file under the final name.
    """

    def __init__(self, target: Path, replace: bool = True, buffering: int = 1 << 20):
        self.target = target
        self.replace = replace
        self.tmp, fd = _create_temp(target)
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=buffering)
        self._done = False

    def write(self, data: bytes) -> None:
        """Write to the temporary file; an error names the target (a file object has no name)."""
        try:
            self.file.write(data)
        except OSError as exc:
            raise _about(exc, self.target, "writing its temporary file") from exc

    def flush(self) -> None:
        with reported_as(self.target, "writing its temporary file"):
            self.file.flush()

    def commit(self, sync_dir: bool = True) -> bool:
        """`sync_dir=False`: the caller fsyncs the directory once for several files."""
        with reported_as(self.target, "writing its temporary file"):
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
        self._done = True
        if self.replace:
            with reported_as(self.target, "rename() of its temporary file", self.tmp):
                confined.replace(self.tmp, self.target)
            created = True
        else:
            created = _link_once(self.tmp, self.target)
        if sync_dir:
            fsync_dir(self.target.parent)
        return created

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            confined.unlink(self.tmp)


@contextlib.contextmanager
def atomic_output(target: Path, replace: bool = True) -> Iterator[AtomicOutput]:
    """Context manager form of `AtomicOutput`: aborts (removes the temp file) on any exception."""
    out = AtomicOutput(target, replace=replace)
    try:
        yield out
    except BaseException:
        out.abort()
        raise
    finally:
        if not out._done:
            out.abort()
