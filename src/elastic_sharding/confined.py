"""Confinement to the job directory: nothing the tool reads or creates inside it goes through a link.

Whatever the tool reads from inside a job's directories is opened with O_NOFOLLOW and listed
without following links (`LinkRefused`), so a link planted in a shared directory can never make
it read or write elsewhere; everything it creates asks for `FILE_MODE`/`DIR_MODE`, which the
kernel narrows by the umask. The coordination syscalls built on these are in `fsops`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

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


def is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def lexists(path: Path) -> bool:
    """Whether a name exists, a symbolic link included (and never followed)."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def kind(path: Path) -> str | None:
    """What `path` names ("file", "dir", "link" or "other"), without following it; None if missing."""
    try:
        mode = os.lstat(path).st_mode
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
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
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
