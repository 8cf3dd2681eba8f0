"""Coordination primitives on a shared POSIX filesystem.

This is the only module that issues the syscalls the protocol's correctness rests on:
exclusive create, create-once publish (`link`), atomic replace (`rename`), rename-away and
fsync. Correctness never depends on fcntl/flock: on NFSv3 with `nolock`/`local_lock` those are
node-local. Readers of just-published records must tolerate attribute caches, so `read_record`
retries a read that comes back empty or unparsable instead of treating it as "free".
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")

FILE_MODE = 0o644


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(path: Path) -> None:
    """Make a directory entry change durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temp(target: Path, data: bytes) -> Path:
    tmp = _temp_name(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _link_once(tmp: Path, target: Path) -> bool:
    """link(tmp, target); True if this call created target. Unlinks tmp either way."""
    try:
        try:
            os.link(tmp, target)
            return True
        except FileExistsError:
            return False
        except OSError:
            # NFS may report an error for a link that a retransmitted request did create:
            # the temp file's link count says what really happened.
            try:
                if os.stat(tmp).st_nlink == 2:
                    return True
            except OSError:
                pass
            raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


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


def replace_atomic(target: Path, data: bytes) -> None:
    """Replace `target` with `data` in one step: readers see the old or the new content."""
    tmp = _write_temp(target, data)
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def rename_away(source: Path, destination: Path) -> bool:
    """Move `source` to a fresh `destination`; False if `source` is already gone."""
    try:
        os.rename(source, destination)
    except FileNotFoundError:
        return False
    fsync_dir(source.parent)
    return True


def link_back(source: Path, target: Path) -> bool:
    """Put a record moved away by mistake back, unless a new one took its name meanwhile."""
    try:
        os.link(source, target)
    except FileExistsError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(source)
    fsync_dir(target.parent)
    return True


def make_dir_exclusive(path: Path) -> bool:
    """mkdir that fails on an existing name: True if this call created it."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
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
    before its content. A record that stays unparsable raises the parser's error.
    """
    last_error: Exception | None = None
    for attempt in range(attempts):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            if data:
                return parse(data)
            last_error = ValueError(f"{path}: empty record")
        except ValueError as exc:
            last_error = exc
        time.sleep(delay * (attempt + 1))
    assert last_error is not None
    raise last_error


class AtomicOutput:
    """A large file written under a temporary name and published only when complete.

    `commit()` fsyncs and then either replaces the target (`replace=True`) or publishes it
    create-once, so an interrupted writer never leaves a partial file under the final name.
    """

    def __init__(self, target: Path, replace: bool = True):
        self.target = target
        self.replace = replace
        self.tmp = _temp_name(target)
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)
        self._done = False

    def commit(self) -> bool:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self._done = True
        if self.replace:
            os.replace(self.tmp, self.target)
            created = True
        else:
            created = _link_once(self.tmp, self.target)
        fsync_dir(self.target.parent)
        return created

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


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
