"""Strict JSONL: UTF-8, no BOM, one JSON object per line, no blank lines.

Every rejection names the file and the 1-based line. Reading hashes the raw bytes as it goes so
callers fingerprint an input in the same pass that validates it. Input is read, hashed and split
in large blocks (per-line Python work is the cost of a multi-GB prepare), and hashing and writing
of those blocks run on a helper thread: hashlib and file writes release the GIL, so they overlap
with JSON parsing on another core.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from .errors import InputError

BOM = b"\xef\xbb\xbf"
READ_BUFFER = 1 << 20
BLOCK_SIZE = 8 << 20


class Offload:
    """Runs block-sized, GIL-releasing work (hash updates, writes) on one helper thread, in
    submission order, with a bounded backlog so memory stays constant. Errors surface in the
    caller at the next `submit` or at `drain`."""

    def __init__(self, backlog: int = 4):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastic-io")
        self._pending: deque[Future[Any]] = deque()
        self._backlog = backlog

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._pending.append(self._pool.submit(fn, *args))
        while len(self._pending) > self._backlog:
            self._pending.popleft().result()

    def drain(self) -> None:
        """Wait until everything submitted so far is done (re-raising its first error)."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Offload:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class HashingLineReader:
    """Yield a file's lines in blocks while hashing every byte read.

    Lines come without their newline; a trailing CR is left in place (JSON allows it as
    whitespace). Blank lines are not filtered here: they fail to parse, and `parse_object` names
    them (one check per bad line instead of one per line).
    """

    def __init__(self, path: Path, offload: Offload | None = None, block_size: int = BLOCK_SIZE):
        self.path = path
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.lines = 0
        self._offload = offload
        self._block_size = block_size

    def blocks(self) -> Iterator[tuple[int, list[bytes]]]:
        """Yield (number of the first line, lines) per block read; `lines` counts the lines the
        consumer has been given once it asks for the next block."""
        try:
            handle = open(self.path, "rb", buffering=0)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", self.path) from None
        update = self.sha256.update
        lineno = 1
        pieces: list[bytes] = []
        with handle:
            while True:
                try:
                    block = handle.read(self._block_size)
                except OSError as exc:
                    raise InputError(f"read failed: {exc.strerror or exc}", self.path, lineno) from None
                if not block:
                    break
                if self._offload is not None:
                    self._offload.submit(update, block)
                else:
                    update(block)
                self.size += len(block)
                if b"\n" not in block:
                    pieces.append(block)
                    continue
                if pieces:
                    pieces.append(block)
                    block = b"".join(pieces)
                    pieces = []
                lines = block.split(b"\n")
                tail = lines.pop()
                if tail:
                    pieces.append(tail)
                if lineno == 1 and lines[0].startswith(BOM):
                    raise InputError("starts with a UTF-8 byte-order mark; save the file without a BOM", self.path, 1)
                yield lineno, lines
                lineno += len(lines)
                self.lines = lineno - 1
        if pieces:
            last = b"".join(pieces)
            if lineno == 1 and last.startswith(BOM):
                raise InputError("starts with a UTF-8 byte-order mark; save the file without a BOM", self.path, 1)
            yield lineno, [last]
            self.lines = lineno

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line) one by one, CR removed and blank lines rejected."""
        for first, lines in self.blocks():
            for lineno, line in enumerate(lines, first):
                if line.endswith(b"\r"):
                    line = line[:-1]
                if not line.strip():
                    raise line_error(line, self.path, lineno)
                yield lineno, line


def line_error(line: bytes, path: Path | str, lineno: int | None) -> InputError:
    """Why an input line is not a JSON object, named by file and line (blank lines included)."""
    if not line.strip():
        return InputError("blank line; every line must be one JSON object", path, lineno)
    return _object_error(line, path, lineno)


def _object_error(line: bytes, path: Path | str, lineno: int | None) -> InputError:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as uexc:
            return InputError(f"invalid UTF-8 at byte {uexc.start}", path, lineno)
        return InputError(f"malformed JSON: {exc.msg} (column {exc.colno})", path, lineno)
    kind = "an array" if isinstance(value, list) else f"a JSON {type(value).__name__}"
    return InputError(f"row is {kind}, not a JSON object", path, lineno)


def parse_object(line: bytes, path: Path | str, lineno: int | None) -> dict[str, Any]:
    """Parse one line as a JSON object or raise an `InputError` that says what is wrong."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _object_error(line, path, lineno) from None
    if not isinstance(value, dict):
        raise _object_error(line, path, lineno)
    return value


def dumps_line(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row) + b"\n"
