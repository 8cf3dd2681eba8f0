"""Where the lines of an input file come from: a byte range of a plain `.jsonl`, or the whole
decompressed stream of a `.jsonl.gz` / `.jsonl.zst`.

A plain file is read in parallel by byte ranges: a range owns the lines that *start* inside it,
so it skips the partial line it begins in and reads past its end to finish its last line. The
fingerprint of a range is the sha256 of exactly its bytes, whatever lines they hold, which is
what lets ranges read by different processes add up to a fingerprint of the whole file.

A compressed file cannot be entered in the middle, so it is one range. Its fingerprint is the
sha256 of the compressed bytes as stored. A stream that ends early or does not decompress is an
error naming the file and the decompressed line being read.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from elastic_sharding.errors import InputError

COMPRESSED_SUFFIXES = {".jsonl.gz": "gzip", ".jsonl.zst": "zstd"}
INPUT_SUFFIXES = (".jsonl", *COMPRESSED_SUFFIXES, ".parquet")
INPUT_KINDS = ".jsonl, .jsonl.gz, .jsonl.zst or .parquet"
_ZSTD_FEED = 128 << 10

Update = Callable[[bytes], Any] | None


def compression_of(path: Path | str) -> str | None:
    """'gzip', 'zstd' or None (plain JSONL), by the file name."""
    name = str(path)
    for suffix, kind in COMPRESSED_SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    return None


def is_input_name(name: str) -> bool:
    return name.endswith(INPUT_SUFFIXES)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, for error messages."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return f"file mode {mode:o}"


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading only if it is a regular file. O_NONBLOCK makes opening a FIFO that
    replaced the file return at once instead of waiting for a writer (it changes nothing for a
    regular file), so a swapped-in pipe is refused rather than hanging prepare."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"not a regular file ({file_kind(mode)}); inputs must be regular .jsonl files", path)
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


class Source:
    """Bytes of whole lines, read in blocks; `consumed` counts the file bytes read (progress)."""

    first_offset = 0

    def __init__(self, path: Path, handle: BinaryIO):
        self.path = path
        self.handle = handle
        self.consumed = 0

    def _read(self, size: int, lineno: int) -> bytes:
        try:
            data = self.handle.read(size)
        except OSError as exc:
            raise InputError(f"read failed: {exc.strerror or exc}", self.path, lineno) from None
        self.consumed += len(data)
        return data

    def read_lines(self, size: int, lineno: int) -> bytes:
        """Up to about `size` more bytes; b"" at the end. `lineno` is the line being read."""
        raise NotImplementedError

    def __enter__(self) -> Source:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.handle.close()


class RangeSource(Source):
    """The lines of a plain file that start in [start, end) (end None: to the end of the file),
    hashing exactly the bytes of [start, end) through `update`."""

    def __init__(self, path: Path, handle: BinaryIO, start: int, end: int | None, update: Update, max_line: int | None):
        super().__init__(path, handle)
        self.end = end
        self.update = update
        self.pos = start
        self.done = False
        self.buffer = b""
        self.first_offset = start
        if start > 0:
            handle.seek(start - 1)
            self.pos = start - 1
            before = self._read(1, 1)
            self.pos += len(before)
            if before != b"\n":
                self._skip_partial_line(max_line)

    def _next(self, size: int, lineno: int) -> bytes:
        data = self._read(size, lineno)
        lo, hi = self.pos, self.pos + len(data)
        self.pos = hi
        if self.update is not None and data and (self.end is None or lo < self.end):
            self.update(data if self.end is None or hi <= self.end else data[: self.end - lo])
        return data

    def _skip_partial_line(self, max_line: int | None) -> None:
        """Skip the line the range begins inside of: it belongs to the range before."""
        while True:
            data = self._next(1 << 20, 1)
            if not data:
                self.done = True
                return
            newline = data.find(b"\n")
            if newline >= 0:
                self.first_offset = self.pos - len(data) + newline + 1
                if self.end is not None and self.first_offset >= self.end:
                    self._hash_to_end()
                    self.done = True
                else:
                    self.buffer = data[newline + 1 :]
                return
            if self.end is not None and self.pos >= self.end:
                self.done = True  # no line starts in this range
                return

    def _hash_to_end(self) -> None:
        while self.end is not None and self.pos < self.end:
            if not self._next(min(1 << 20, self.end - self.pos), 1):
                return

    def read_lines(self, size: int, lineno: int) -> bytes:
        if self.buffer:
            data, self.buffer = self.buffer, b""
            start = self.pos - len(data)
        elif self.done:
            return b""
        else:
            start = self.pos
            data = self._next(size, lineno)
            if not data:
                self.done = True
                return b""
        if self.end is not None and self.pos >= self.end:
            # The last line of the range ends at the first newline at or after end - 1.
            newline = data.find(b"\n", max(0, self.end - 1 - start))
            if newline >= 0:
                self._hash_to_end()
                self.done = True
                return data[: newline + 1]
        return data


class _HashingReader:
    """A raw file object that hashes and counts what the decompressor reads from it."""

    def __init__(self, source: Source, update: Update):
        self.source = source
        self.update = update
        self.lineno = 1

    def read(self, size: int = -1) -> bytes:
        data = self.source._read(size if size >= 0 else 1 << 20, self.lineno)
        if self.update is not None and data:
            self.update(data)
        return data

    def readable(self) -> bool:
        return True


def _stream_error(kind: str, path: Path, lineno: int, exc: BaseException | None) -> InputError:
    if exc is None or isinstance(exc, EOFError):
        what = f"the {kind} stream is truncated: it ends before its end-of-stream marker"
    else:
        what = f"the {kind} stream is corrupt ({exc})"
    return InputError(
        f"{what}, while reading line {lineno} of its decompressed text; the file is damaged (an interrupted download "
        "or copy?): fetch or compress it again",
        path,
        lineno,
    )


class GzipSource(Source):
    def __init__(self, path: Path, handle: BinaryIO, update: Update, skip: int):
        super().__init__(path, handle)
        self.raw = _HashingReader(self, update)
        self.stream = gzip.GzipFile(fileobj=self.raw, mode="rb")  # type: ignore[arg-type]
        self._skip(skip)

    def _skip(self, count: int) -> None:
        while count > 0:
            data = self.read_lines(min(count, 8 << 20), 1)
            if not data:
                return
            count -= len(data)

    def read_lines(self, size: int, lineno: int) -> bytes:
        self.raw.lineno = lineno
        try:
            return self.stream.read(size)
        except (EOFError, OSError, zlib.error) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile) and exc.errno is not None:
                raise InputError(f"read failed: {exc.strerror or exc}", self.path, lineno) from None
            raise _stream_error("gzip", self.path, lineno, exc) from None


class ZstdSource(Source):
    """Every frame of a zstd stream in turn; a stream whose last frame is incomplete is refused
    (zstd's own stream reader returns what it has without a word)."""

    def __init__(self, path: Path, handle: BinaryIO, update: Update, skip: int):
        import zstandard

        super().__init__(path, handle)
        self.zstd = zstandard
        self.raw = _HashingReader(self, update)
        self.decompressor = zstandard.ZstdDecompressor()
        self.obj: Any = None
        self.pending = b""
        self.finished = False
        while skip > 0:
            data = self.read_lines(min(skip, 8 << 20), 1)
            if not data:
                break
            if len(data) > skip:
                self.pending = data[skip:]
            skip -= len(data)

    def read_lines(self, size: int, lineno: int) -> bytes:
        self.raw.lineno = lineno
        out = [self.pending] if self.pending else []
        have = len(self.pending)
        self.pending = b""
        while have < size and not self.finished:
            chunk = self.raw.read(_ZSTD_FEED)
            if not chunk:
                if self.obj is not None and not self.obj.eof:
                    raise _stream_error("zstd", self.path, lineno, None)
                self.finished = True
                break
            while chunk:
                if self.obj is None or self.obj.eof:
                    self.obj = self.decompressor.decompressobj()
                try:
                    data = self.obj.decompress(chunk)
                except self.zstd.ZstdError as exc:
                    raise _stream_error("zstd", self.path, lineno, exc) from None
                chunk = self.obj.unused_data if self.obj.eof else b""
                if data:
                    out.append(data)
                    have += len(data)
        return b"".join(out)


def open_source(path: Path, start: int, end: int | None, update: Update, max_line: int | None) -> Source:
    """The lines of `path` from byte `start` (a line start of the decompressed text for a
    compressed file, which is always read to its end)."""
    handle = open_regular(path)
    try:
        kind = compression_of(path)
        if kind == "gzip":
            return GzipSource(path, handle, update, start)
        if kind == "zstd":
            return ZstdSource(path, handle, update, start)
        return RangeSource(path, handle, start, end, update, max_line)
    except BaseException:
        handle.close()
        raise
