"""How a name inside the job directory is reached: never through a link, and relative to a
directory held open where there is one.

Whatever the tool reads from inside a job's directories is opened with O_NOFOLLOW and listed
without following links (`LinkRefused`), so a link planted in a shared directory can never make
it read or write elsewhere; everything it creates asks for `FILE_MODE`/`DIR_MODE`, which the
kernel narrows by the umask. A worker holds its job's directories open (`anchored`), and every
call here on a name below one of them is made relative to it (see "Anchored directories"). The
coordination steps built on these calls are in `fsops`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")

# Asked for on creation and narrowed by the kernel with the umask: 0644/0755 under umask 022, group-writable
# 0664/0775 under a group-shared 002, never world-writable (not even under umask 000).
FILE_MODE = 0o664
DIR_MODE = 0o775


class LinkRefused(OSError, ValueError):
    """A symbolic link where the tool expects a file or directory of its own: never followed.

    An OSError (ELOOP) for callers that report I/O errors, and a ValueError so that every reader
    that treats an unparsable record as unreadable treats a planted link the same way."""

    def __init__(self, path: Path | str):
        super().__init__(errno.ELOOP, "is a symbolic link, which elastic-shard never follows inside a job directory", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


# -- Anchored directories ----------------------------------------------------------------------
#
# A NAS client looks every component of a path up again once its cached entry expires (GlusterFS's
# FUSE client after 1 s, NFS after its `acdirmin`): a worker whose shard takes longer than that pays
# a lookup for each directory above each file it touches. A directory held open (anchored) for a
# worker's run is the start of the walk instead: a name in it costs the lookup of that name only,
# and a directory fsync needs no open (issue 44: 7 % fewer metadata operations a shard at 8 and at
# 32 nodes). Names elsewhere, and every call while nothing is anchored, go by path.

# An anchor failing with one of these is no longer trusted (a NAS client that lost its server may
# not bring handles opened before back); its calls go by path from then on.
_BROKEN_ANCHOR = frozenset({errno.EBADF, errno.EBADFD, errno.ESTALE, errno.ENOTCONN, errno.EIO})
# How many levels above a name its anchor may be (attempts/<shard>/<attempt>/<file>).
ANCHOR_DEPTH = 3


@dataclass
class _Anchor:
    fd: int
    holders: int = 1  # `anchored` blocks holding it
    calls: int = 0  # calls using its fd right now: it is closed only when both are 0
    closed: bool = False


_anchors: dict[str, _Anchor] = {}
_anchors_lock = threading.Lock()


@contextlib.contextmanager
def anchored(directories: Iterable[Path]) -> Iterator[None]:
    """Hold `directories` open while the block runs (never through a link), so that calls on a name
    in one of them, or up to `ANCHOR_DEPTH` levels below, are made relative to it. One that cannot
    be opened is not anchored.
    Blocks may nest and run in several threads; a directory replaced since another block
    anchored it is anchored anew (the old handle serves its holders until they leave)."""
    held: list[tuple[str, _Anchor]] = []
    try:
        for directory in directories:
            anchor = _hold(directory)
            if anchor is not None:
                held.append((str(directory), anchor))
        yield
    finally:
        for key, anchor in held:
            _release(key, anchor)


def _hold(directory: Path) -> _Anchor | None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    key = str(directory)
    try:
        mine = os.fstat(fd)
        with _anchors_lock:
            known = _anchors.get(key)
            if known is not None and not known.closed:
                seen = os.fstat(known.fd)
                if (seen.st_dev, seen.st_ino) == (mine.st_dev, mine.st_ino):
                    known.holders += 1
                    return known
            anchor = _anchors[key] = _Anchor(fd)
            fd = -1
            return anchor
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def _release(key: str, anchor: _Anchor) -> None:
    with _anchors_lock:
        anchor.holders -= 1
        if anchor.holders == 0 and _anchors.get(key) is anchor:
            del _anchors[key]
        close = anchor.holders == 0 and anchor.calls == 0 and not anchor.closed
        anchor.closed = anchor.closed or close
    if close:
        os.close(anchor.fd)


def _own(directory: Path) -> tuple[_Anchor, str] | None:
    """`directory`'s own anchor, in use by the caller until `_leave`."""
    key = str(directory)
    with _anchors_lock:
        anchor = _anchors.get(key)
        if anchor is None:
            return None
        anchor.calls += 1
        return anchor, key


def _nearest(path: Path) -> tuple[_Anchor, str, str] | None:
    """The nearest anchored directory at most `ANCHOR_DEPTH` levels above `path`, and `path`
    relative to it, in use by the caller until `_leave`."""
    text = str(path)
    cut = len(text)
    with _anchors_lock:
        for _ in range(ANCHOR_DEPTH):
            cut = text.rfind("/", 0, cut)
            if cut <= 0:
                return None
            anchor = _anchors.get(text[:cut])
            if anchor is not None:
                anchor.calls += 1
                return anchor, text[:cut], text[cut + 1 :]
    return None


def _leave(key: str, anchor: _Anchor, broken: bool) -> None:
    with _anchors_lock:
        anchor.calls -= 1
        if broken and _anchors.get(key) is anchor:
            del _anchors[key]
            anchor.holders = 0  # its blocks' releases find it gone
        close = anchor.holders <= 0 and anchor.calls == 0 and not anchor.closed
        anchor.closed = anchor.closed or close
    if close:
        os.close(anchor.fd)


def at(path: Path, call: Callable[[str | Path, int | None], T]) -> T:
    """`call(name, dir_fd)` relative to the nearest anchored directory above `path`, else
    `call(path, None)`. An error names `path`, as a call by path would."""
    found = _nearest(path) if _anchors else None
    if found is None:
        return call(path, None)
    anchor, key, name = found
    broken = False
    try:
        return call(name, anchor.fd)
    except OSError as exc:
        broken = exc.errno in _BROKEN_ANCHOR
        if exc.filename == name:
            exc.filename = str(path)
        raise
    finally:
        _leave(key, anchor, broken)


def at2(source: Path, target: Path, call: Callable[[str | Path, str | Path, int | None, int | None], T]) -> T:
    """`at` for a call on two names (link, rename): each relative to its nearest anchor, if any."""
    first = _nearest(source) if _anchors else None
    second = _nearest(target) if _anchors else None
    broken = False
    try:
        return call(
            first[2] if first else source,
            second[2] if second else target,
            first[0].fd if first else None,
            second[0].fd if second else None,
        )
    except OSError as exc:
        broken = exc.errno in _BROKEN_ANCHOR
        if first and exc.filename == first[2]:
            exc.filename = str(source)
        if second and exc.filename2 == second[2]:
            exc.filename2 = str(target)
        raise
    finally:
        for found in (first, second):
            if found is not None:
                _leave(found[1], found[0], broken)


def _dir_arg(fd: int | None) -> dict[str, int]:
    """The `dir_fd` argument, only where there is one (wrappers of the os calls need not take it)."""
    return {} if fd is None else {"dir_fd": fd}


def _dirs(source_fd: int | None, target_fd: int | None) -> dict[str, int]:
    found = {"src_dir_fd": source_fd, "dst_dir_fd": target_fd}
    return {key: fd for key, fd in found.items() if fd is not None}


def lstat(path: Path) -> os.stat_result:
    """os.lstat, relative to an anchored parent; an anchored directory itself is not looked up."""
    own = _own(path) if _anchors else None
    if own is not None:
        broken = False
        try:
            return os.fstat(own[0].fd)
        except OSError as exc:
            broken = exc.errno in _BROKEN_ANCHOR
            raise
        finally:
            _leave(own[1], own[0], broken)
    return at(path, lambda name, fd: os.stat(name, **_dir_arg(fd), follow_symlinks=False))


def unlink(path: Path) -> None:
    at(path, lambda name, fd: os.unlink(name, **_dir_arg(fd)))


def mkdir(path: Path, mode: int = DIR_MODE) -> None:
    at(path, lambda name, fd: os.mkdir(name, mode, **_dir_arg(fd)))


def link(source: Path, target: Path) -> None:
    at2(source, target, lambda a, b, fa, fb: os.link(a, b, **_dirs(fa, fb)))


def rename(source: Path, target: Path) -> None:
    at2(source, target, lambda a, b, fa, fb: os.rename(a, b, **_dirs(fa, fb)))


def replace(source: Path, target: Path) -> None:
    at2(source, target, lambda a, b, fa, fb: os.replace(a, b, **_dirs(fa, fb)))


def fsync_dir(path: Path) -> None:
    """Make a directory entry change durable (a no-op where directories cannot be opened or synced);
    an anchored directory is synced through its handle."""
    own = _own(path) if _anchors else None
    if own is not None:
        broken = False
        try:
            os.fsync(own[0].fd)
            return
        except OSError as exc:
            broken = exc.errno in _BROKEN_ANCHOR
            if not broken:
                return
        finally:
            _leave(own[1], own[0], broken)
    try:
        fd = at(path, lambda name, at_fd: os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, **_dir_arg(at_fd)))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(lstat(path).st_mode)
    except OSError:
        return False


def lexists(path: Path) -> bool:
    """Whether a name exists, a symbolic link included (and never followed)."""
    try:
        lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def kind(path: Path) -> str | None:
    """What `path` names ("file", "dir", "link" or "other"), without following it; None if missing."""
    try:
        mode = lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def refuse_link(path: Path) -> None:
    """Raise LinkRefused if `path` is a symbolic link; a missing path passes (its reader reports it)."""
    if kind(path) == "link":
        raise LinkRefused(path)


def open_nofollow(path: Path, flags: int = os.O_RDONLY, mode: int = FILE_MODE) -> int:
    """os.open that refuses (LinkRefused) a symbolic link at the last component of `path`."""
    try:
        return at(path, lambda name, fd: os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, **_dir_arg(fd)))
    except OSError as exc:
        # Linux says ELOOP for a link, or ENOTDIR when O_DIRECTORY was asked for.
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and is_link(path)):
            raise LinkRefused(path) from None
        raise


def open_read(path: Path, buffering: int = -1) -> BinaryIO:
    """Open a file for reading in binary mode, refusing a symbolic link (no extra syscall)."""
    return os.fdopen(open_nofollow(path), "rb", buffering=buffering)


def open_append(path: Path) -> BinaryIO:
    """Open (creating) a log for appending, refusing a symbolic link in its place."""
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def create_file(path: Path, buffering: int = -1) -> BinaryIO:
    """A new file (never an existing one, never through a link), opened for writing with `FILE_MODE`."""
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb", buffering=buffering)


def read_bytes_nofollow(path: Path) -> bytes:
    with open_read(path, buffering=0) as handle:
        return handle.read()


def list_dir(path: Path) -> dict[str, str]:
    """Names in a directory with their `kind` ("file", "dir", "link", "other"), following neither
    the directory itself (LinkRefused) nor its entries. Costs what os.listdir costs where the
    filesystem reports entry types."""
    fd = open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as entries:
            return {entry.name: _entry_kind(entry) for entry in entries}
    finally:
        os.close(fd)


def _entry_kind(entry: os.DirEntry) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"
