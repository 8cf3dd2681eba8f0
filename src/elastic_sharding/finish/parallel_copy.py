"""The byte-moving parts of `merge` and `verify`: hashing shard outputs on many threads, copying
byte ranges with `copy_file_range`, linking or copying a file into a directory.

Every function here runs on worker threads: `hashlib` (for more than 2 KiB at a time), `readinto`,
`os.copy_file_range`, `os.pread`/`os.pwrite`, `fsync` and `link` all release the GIL, so shards are
read, hashed and copied on as many cores as there are. `copy_file_range` lets the kernel move the
bytes (a reflink on XFS/btrfs, a server-side copy on NFS 4.2, a page-cache copy elsewhere) instead
of bringing them into this process; where it is not available for a pair of files (`EXDEV`,
`ENOSYS`, `EINVAL`, `EOPNOTSUPP`, or a filesystem that copies nothing) a read/write loop takes over.

A source is identified by (device, inode, size, mtime) when it is first looked at; every later
open checks it is still that file, so bytes hashed and bytes copied come from one unchanged file.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from elastic_sharding import confined

T = TypeVar("T")
R = TypeVar("R")

COPY_FALLBACK_ERRNOS = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})
COPY_CHUNK = 64 << 20  # per copy_file_range call: large, yet a stop request is seen within one chunk
RING = 3  # read buffers in flight per hashing pipeline
MAX_THREADS = 32


def thread_count(items: int) -> int:
    """Threads for `items` independent pieces of work: one each, bounded by the CPUs."""
    return max(1, min(items, os.cpu_count() or 1, MAX_THREADS))


@dataclass(frozen=True)
class Identity:
    """What a source file was when first looked at."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class SourceError(Exception):
    """Reading a source failed or it is not the file first looked at: the caller names the shard."""

    def __init__(self, cause: OSError | str):
        super().__init__(cause)
        self.cause = cause


class Stopped(Exception):
    """Another thread failed first; this piece of work gave up."""


def identify(path: Path) -> Identity:
    """The identity of a regular file, never through a link (LinkRefused); OSError as raised."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise confined.LinkRefused(path)
    if not stat.S_ISREG(st.st_mode):
        raise SourceError(f"{path} is not a regular file")
    return Identity.of(st)


def open_source(path: Path, expected: Identity) -> int:
    """An fd of `path`, which must still be the file `expected` describes."""
    try:
        fd = confined.open_nofollow(path)
    except OSError as exc:
        raise SourceError(exc) from None
    try:
        check_same(fd, path, expected)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_same(fd: int, path: Path, expected: Identity) -> None:
    if Identity.of(os.fstat(fd)) != expected:
        raise SourceError(f"{path} changed while it was being merged")


def _read_into(fd: int, view: memoryview, path: Path) -> int:
    try:
        return os.readv(fd, [view])
    except OSError as exc:
        raise SourceError(exc) from None


class Content(NamedTuple):
    """What one read of a shard output proves: its sha256 and its rows (newlines), the two
    facts of its completion record that a changed record could contradict."""

    sha256: str
    rows: int


def hash_file(path: Path, expected: Identity, block_size: int, stop: threading.Event | None = None) -> Content:
    """sha256 and rows of `path` (still `expected`), read once in `block_size` blocks."""
    fd = open_source(path, expected)
    try:
        digest = hashlib.sha256()
        buffer = bytearray(block_size)
        view = memoryview(buffer)
        size = rows = 0
        while n := _read_into(fd, view, path):
            if stop is not None and stop.is_set():
                raise Stopped
            digest.update(view[:n])
            rows += buffer.count(b"\n", 0, n)
            size += n
        check_same(fd, path, expected)
        if size != expected.size:
            raise SourceError(f"{path} changed while it was being merged")
        return Content(digest.hexdigest(), rows)
    finally:
        os.close(fd)


def hash_range(fd: int, size: int, block_size: int) -> str:
    """sha256 of the first `size` bytes of `fd`, a file this process has just written
    (DestinationError if it cannot be read back)."""
    digest = hashlib.sha256()
    buffer = bytearray(block_size)
    view = memoryview(buffer)
    done = 0
    while done < size:
        try:
            n = os.preadv(fd, [view[: min(block_size, size - done)]], done)
        except OSError as exc:
            raise DestinationError(exc) from None
        if not n:
            raise DestinationError(OSError(f"it ends at byte {done} of {size} written"))
        digest.update(view[:n])
        done += n
    return digest.hexdigest()


class OrderedHasher:
    """sha256 of the concatenation of files, in order, and of each file on its own, reading every
    byte once: this thread reads and feeds the concatenation's digest, a helper thread feeds the
    file's (the first file's digest is the concatenation's start, so it is hashed once). The
    concatenation's digest is inherently sequential; everything else overlaps it."""

    def __init__(self, block_size: int, stop: threading.Event, on_block: Callable[[int], None] = lambda n: None):
        self.block_size = block_size
        self.stop = stop
        self.on_block = on_block
        self.whole = hashlib.sha256()
        self.failed_at = -1  # the file being read when `run` raised
        self._first = True

    def run(self, files: Sequence[tuple[Path, Identity]], on_file: Callable[[int, Future[Content]], None]) -> str:
        """Hash every file in order; `on_file(i, future)` gets each file's own digest and rows (a
        future of the helper thread, resolved in file order). Returns the concatenation's digest."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastic-hash") as helper:
            buffers = [bytearray(self.block_size) for _ in range(RING)]
            busy: deque[Future[Any] | None] = deque([None] * RING)
            for index, (path, expected) in enumerate(files):
                self.failed_at = index
                on_file(index, self._one(helper, buffers, busy, path, expected))
            self.failed_at = -1
            for future in busy:
                if future is not None:
                    future.result()
        return self.whole.hexdigest()

    def _one(
        self, helper: ThreadPoolExecutor, buffers: list[bytearray], busy: deque, path: Path, expected: Identity
    ) -> Future[Content]:
        """This thread feeds the concatenation's digest; the helper counts the rows and feeds
        the file's own digest (except for the first file, whose digest is the concatenation's)."""
        first, self._first = self._first, False
        own = self.whole if first else hashlib.sha256()
        rows = [0]

        def feed(buffer: bytearray, n: int) -> None:
            if not first:
                own.update(memoryview(buffer)[:n])
            rows[0] += buffer.count(b"\n", 0, n)

        fd = open_source(path, expected)
        try:
            size = 0
            slot = 0
            while True:
                if self.stop.is_set():
                    raise Stopped
                pending = busy[slot]
                if pending is not None:
                    pending.result()  # the helper is done with this buffer
                    busy[slot] = None
                view = memoryview(buffers[slot])
                n = _read_into(fd, view, path)
                if not n:
                    break
                busy[slot] = helper.submit(feed, buffers[slot], n)
                self.whole.update(view[:n])
                size += n
                self.on_block(n)
                slot = (slot + 1) % RING
            check_same(fd, path, expected)
            if size != expected.size:
                raise SourceError(f"{path} changed while it was being merged")
        finally:
            os.close(fd)
        if first:
            digest = own.hexdigest()  # `own` is `whole`, which goes on with the next file
            return helper.submit(lambda: Content(digest, rows[0]))
        return helper.submit(lambda: Content(own.hexdigest(), rows[0]))


class DestinationError(Exception):
    """Writing the destination failed; the caller names the file the user knows."""

    def __init__(self, cause: OSError):
        super().__init__(cause)
        self.cause = cause


def copy_range(
    src: int,
    dst: int,
    count: int,
    src_offset: int,
    dst_offset: int,
    block_size: int,
    stop: threading.Event | None = None,
) -> bool:
    """Copy `count` bytes from `src` at `src_offset` to `dst` at `dst_offset` (file positions
    untouched); True if copy_file_range did it all, False if the read/write loop had to help.
    A source that ends early is a SourceError; a failing write a DestinationError."""
    done = 0
    kernel = hasattr(os, "copy_file_range")
    used_kernel_only = True
    while done < count:
        if stop is not None and stop.is_set():
            raise Stopped
        if kernel:
            try:
                n = os.copy_file_range(src, dst, min(count - done, COPY_CHUNK), src_offset + done, dst_offset + done)
            except OSError as exc:
                if exc.errno not in COPY_FALLBACK_ERRNOS:
                    raise DestinationError(exc) from None
                n = 0
            if n:
                done += n
                continue
            kernel = False  # unsupported here, or a filesystem that copies nothing: copy the rest by hand
        used_kernel_only = False
        done += _copy_by_hand(src, dst, count - done, src_offset + done, dst_offset + done, block_size, stop)
    return used_kernel_only


def _copy_by_hand(
    src: int, dst: int, count: int, src_offset: int, dst_offset: int, block_size: int, stop: threading.Event | None
) -> int:
    buffer = bytearray(min(block_size, max(count, 1)))
    view = memoryview(buffer)
    done = 0
    while done < count:
        if stop is not None and stop.is_set():
            raise Stopped
        want = view[: min(len(buffer), count - done)]
        try:
            n = os.preadv(src, [want], src_offset + done)
        except OSError as exc:
            raise SourceError(exc) from None
        if not n:
            raise SourceError("it ended before its recorded size while being copied")
        write_at(dst, want[:n], dst_offset + done)
        done += n
    return done


def write_at(fd: int, data: memoryview | bytes, offset: int) -> None:
    """All of `data` at `offset` of `fd` (pwrite may write less); DestinationError on failure."""
    view = memoryview(data)
    written = 0
    while written < len(view):
        try:
            written += os.pwrite(fd, view[written:], offset + written)
        except OSError as exc:
            raise DestinationError(exc) from None


_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int, offset: int, count: int) -> None:
    """Ask the kernel to start writing a just-copied range to disk now (Linux sync_file_range,
    SYNC_FILE_RANGE_WRITE: it does not wait, and durability still comes from the final fsync),
    so that the disk works while the rest is copied and hashed instead of only during the
    fsync; nothing where unavailable."""
    function = _sync_file_range()
    if function is not None:
        function(fd, offset, count, _SYNC_FILE_RANGE_WRITE)


def link_or_copy(source: Path, expected: Identity, target: Path, block_size: int, stop: threading.Event | None = None) -> bool:
    """Put the file `source` (still `expected`) at the new name `target`: a hard link where the
    filesystem allows one (True), else a copy, fsynced (False)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except FileNotFoundError as exc:
        if not confined.lexists(source):
            raise SourceError(exc) from None
        raise DestinationError(exc) from None
    except OSError:
        pass  # another filesystem, no hard links there, protected_hardlinks, too many links: copy
    else:
        if Identity.of(os.lstat(target)) != expected:
            raise SourceError(f"{source} changed while it was being merged")
        return True
    fd = open_source(source, expected)
    try:
        try:
            out = confined.open_nofollow(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except OSError as exc:
            raise DestinationError(exc) from None
        try:
            copy_range(fd, out, expected.size, 0, 0, block_size, stop)
            try:
                os.fsync(out)
            except OSError as exc:
                raise DestinationError(exc) from None
        finally:
            os.close(out)
        check_same(fd, source, expected)
    finally:
        os.close(fd)
    return False


def run_all(pool: ThreadPoolExecutor, work: Callable[[T], R], items: Iterable[T], stop: threading.Event) -> list[R]:
    """`work(item)` for every item on `pool`; results in item order. On the first failure the
    rest is stopped (work not started is cancelled, running work sees `stop`), and the failure
    of the earliest item that failed is raised (a `Stopped` only when nothing else failed)."""
    futures = [pool.submit(_unless_stopped, work, item, stop) for item in items]
    errors: dict[int, Exception] = {}
    results: list[Any] = [None] * len(futures)
    try:
        for index, future in enumerate(futures):
            try:
                results[index] = future.result()
            except CancelledError:
                errors[index] = Stopped()
            except Exception as exc:  # noqa: BLE001 - re-raised below, in item order
                errors[index] = exc
                _stop(stop, futures)
    except BaseException:
        _stop(stop, futures)
        wait(futures)  # nothing may still write where the caller is about to clean up
        raise
    if errors:
        real = {i: e for i, e in errors.items() if not isinstance(e, Stopped)}
        raise (real or errors)[min(real or errors)]
    return results


def _stop(stop: threading.Event, futures: list[Future[Any]]) -> None:
    stop.set()
    for future in futures:
        future.cancel()


def _unless_stopped(work: Callable[[T], R], item: T, stop: threading.Event) -> R:
    if stop.is_set():
        raise Stopped
    return work(item)
