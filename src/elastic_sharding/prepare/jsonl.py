"""Strict JSONL: UTF-8, no BOM, one JSON object per line, no blank lines, no repeated keys, no
line longer than the engine can read.

Every rejection names the file and the 1-based line. Reading hashes the raw bytes as it goes so
callers fingerprint an input in the same pass that validates it. Input is read, hashed and split
in large blocks (per-line Python work is the cost of a multi-GB prepare), and hashing and writing
of those blocks run on a helper thread: hashlib and file writes release the GIL, so they overlap
with JSON parsing on another core.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from elastic_sharding.errors import InputError
from elastic_sharding.prepare.sources import Source, open_source

BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
READ_BUFFER = 1 << 20
BLOCK_SIZE = 8 << 20
# How far past the limit a too-long line is still read (not kept) to say its exact size.
_MEASURE_LIMIT = 1 << 30


class Offload:
    """Runs block-sized, GIL-releasing work (hash updates, writes) on one helper thread, in
    submission order, with a bounded backlog so memory stays constant. Errors surface in the
    caller at the next `submit` or at `drain`."""

    def __init__(self, backlog: int = 4):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastic-io")
        self._pending: deque[Future[Any]] = deque()
        self._backlog = backlog

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future = self._pool.submit(fn, *args)
        self._pending.append(future)
        while len(self._pending) > self._backlog:
            self._pending.popleft().result()
        return future

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


def line_too_long(size: int, limit: int, path: Path | str, lineno: int, *, exact: bool = True, what: str = "line") -> InputError:
    return InputError(
        f"{what} is {'' if exact else 'more than '}{size} bytes, over the limit of {limit}: the engine's JSON reader "
        "(pyarrow, reading each shard for Data-Juicer) cannot read a line longer than its block size; "
        "raise read_options.block_size in the recipe to allow longer lines",
        path,
        lineno,
    )


class HashingLineReader:
    """Yield a file's lines in blocks while hashing every byte read.

    Lines come without their newline; a trailing CR is left in place (JSON allows it as
    whitespace). Blank lines are not filtered here: they fail to parse, and `parse_object` names
    them (one check per bad line instead of one per line). A line longer than `max_line` bytes
    (newline not counted) is refused after the lines before it were given out, and is never
    buffered past the limit.
    """

    def __init__(
        self,
        path: Path,
        offload: Offload | None = None,
        block_size: int = BLOCK_SIZE,
        max_line: int | None = None,
        count_colons: bool = False,
        *,
        start: int = 0,
        end: int | None = None,
        first_line: int = 1,
        hashing: bool = True,
    ):
        self.path = path
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.lines = 0
        # The bytes of the lines last given out ("\n"-separated), for `check_keys`.
        self.block: memoryview = memoryview(b"")
        self.source: Source | None = None
        self._offload = offload
        self._block_size = block_size
        self._max_line = max_line
        self._count_colons = count_colons
        self._colons: Future[int] | int | None = None
        self._start = start
        self._end = end
        self._first_line = first_line
        self._hashing = hashing

    def colons(self) -> int:
        """The number of colons in `block`, counted on the offload thread where there is one
        (numpy releases the GIL), so the check costs the parsing thread next to nothing."""
        colons = self._colons
        if colons is None:
            colons = self._colons = count_colons(self.block)
        return colons if isinstance(colons, int) else colons.result()

    def _set_block(self, block: memoryview) -> None:
        self.block = block
        self._colons = None
        if self._count_colons and self._offload is not None:
            self._colons = self._offload.submit(count_colons, block)

    def blocks(self) -> Iterator[tuple[int, list[bytes]]]:
        """Yield (number of the first line, lines) per block read; `lines` counts the lines the
        consumer has been given once it asks for the next block."""
        update: Callable[[bytes], Any] | None = None
        if self._hashing:
            digest = self.sha256.update
            update = digest if self._offload is None else lambda data: self._offload.submit(digest, data)
        limit = self._max_line
        lineno = self._first_line
        pieces: list[bytes] = []
        pending = 0
        with open_source(self.path, self._start, self._end, update, limit) as handle:
            self.source = handle
            while True:
                block = handle.read_lines(self._block_size, lineno)
                if not block:
                    break
                self.size += len(block)
                if b"\n" not in block:
                    pieces.append(block)
                    pending += len(block)
                    if limit is not None and pending > limit:
                        self._check_bom(lineno, pieces[0])
                        del block, pieces[:]  # keep no more than the block being read while measuring
                        raise self._measure(handle, pending, lineno, limit)
                    continue
                if pieces:
                    pieces.append(block)
                    block = b"".join(pieces)
                    pieces = []
                lines = block.split(b"\n")
                tail = lines.pop()
                self._check_bom(lineno, lines[0])
                long_at = -1 if limit is None else _first_long_line(block, len(block) - len(tail), limit)
                if long_at >= 0:
                    long = block.count(b"\n", 0, long_at)
                    if long:
                        self._set_block(memoryview(block)[:long_at])
                        yield lineno, lines[:long]
                    raise line_too_long(len(lines[long]), limit, self.path, lineno + long)
                self._set_block(memoryview(block)[: len(block) - len(tail)])
                yield lineno, lines
                lineno += len(lines)
                self.lines = lineno - 1
                pending = len(tail)
                if tail:
                    if limit is not None and pending > limit:
                        del block, lines, tail  # keep no more than the block being read while measuring
                        self._set_block(memoryview(b""))
                        raise self._measure(handle, pending, lineno, limit)
                    pieces.append(tail)
        if pieces:
            last = b"".join(pieces)
            self._check_bom(lineno, last)
            self._set_block(memoryview(last))
            yield lineno, [last]
            self.lines = lineno

    def _check_bom(self, lineno: int, first: bytes) -> None:
        if self._start == 0 and lineno == self._first_line and first.startswith(BOM):
            raise InputError("starts with a UTF-8 byte-order mark; save the file without a BOM", self.path, 1)

    def _measure(self, handle: Source, seen: int, lineno: int, limit: int) -> InputError:
        """The error for a line found longer than `limit` after `seen` bytes: reads on to its end
        (up to a bound) to say its size, keeping nothing."""
        size = seen
        try:
            while size < _MEASURE_LIMIT:
                block = handle.read_lines(self._block_size, lineno)
                if not block:
                    return line_too_long(size, limit, self.path, lineno)
                end = block.find(b"\n")
                if end >= 0:
                    return line_too_long(size + end, limit, self.path, lineno)
                size += len(block)
        except (OSError, InputError):
            pass
        return line_too_long(size, limit, self.path, lineno, exact=False)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line) one by one, CR removed and blank lines rejected."""
        for first, lines in self.blocks():
            for lineno, line in enumerate(lines, first):
                if line.endswith(b"\r"):
                    line = line[:-1]
                if not line.strip():
                    raise line_error(line, self.path, lineno)
                yield lineno, line


def _first_long_line(data: bytes, end: int, limit: int) -> int:
    """Where the first line longer than `limit` starts in data[:end] (whole lines), or -1. Jumps
    from newline to the last newline within `limit` bytes: a few searches per block instead of a
    length check per line."""
    start = 0
    while end - start > limit:
        newline = data.rfind(b"\n", start, start + limit + 1)
        if newline < 0:
            return start
        start = newline + 1
    return -1


def line_error(line: bytes, path: Path | str, lineno: int | None) -> InputError:
    """Why an input line is not a JSON object, named by file and line (blank lines included)."""
    if not line.strip():
        return InputError("blank line; every line must be one JSON object", path, lineno)
    return _object_error(line, path, lineno)


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null"}


class _Constant(ValueError):
    """NaN, Infinity or -Infinity met by the standard parser: only said in error messages."""


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


def _object_error(line: bytes, path: Path | str, lineno: int | None) -> InputError:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if lineno == 1 and line.startswith(UTF16_BOMS):
            return InputError("starts with a UTF-16 byte-order mark; inputs must be UTF-8", path, lineno)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as uexc:
            return InputError(f"invalid UTF-8 at byte {uexc.start}", path, lineno)
        if "\x00" in text:
            return InputError(f"NUL byte at byte {line.index(0)}: not UTF-8 JSON text (UTF-16 or binary data?)", path, lineno)
        try:
            json.loads(text, parse_constant=_refuse_constant)
        except _Constant as cexc:
            column = exc.colno - str(cexc).startswith("-")  # orjson points after the sign
            return InputError(
                f"malformed JSON: {cexc} is not a JSON number (column {column}); write null or a string instead",
                path,
                lineno,
            )
        except (ValueError, RecursionError):
            pass
        return InputError(f"malformed JSON: {exc.msg} (column {exc.colno})", path, lineno)
    return InputError(f"row is {_JSON_KINDS.get(type(value), 'not an object')}, not a JSON object", path, lineno)


def parse_object(line: bytes, path: Path | str, lineno: int | None) -> dict[str, Any]:
    """Parse one line as a JSON object or raise an `InputError` that says what is wrong."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise line_error(line, path, lineno) from None
    if type(value) is not dict:
        raise line_error(line, path, lineno)
    return value


def dumps_line(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row) + b"\n"


# Repeated keys. orjson keeps the last value of a repeated key without a word, so a row whose text
# holds more keys than the parsed object lost data. Counting keys per line would cost as much as
# parsing it (a per-line count of '":' alone is half of orjson's time, and it can miss a repeat:
# in {"a" : 1, "a" : "\":"} it finds one key, as many as the parser keeps). Instead, per block of
# lines: every key's colon directly follows its closing quote or JSON whitespace (space, tab, CR;
# a line holds no LF), one colon per key, and any other colon sits inside a string. So the colons
# in a block (counted by numpy on the I/O thread), and more tightly those after a quote or
# whitespace, are never fewer than the keys written; equal to the keys the parser kept (which the
# schema counts anyway), no key was repeated. Only a block where they differ is looked at line by
# line, and only a line where they differ is parsed again keeping every key.


@cache
def _key_ends() -> Any:
    import numpy as np

    table = np.zeros(256, dtype=bool)
    table[[ord('"'), ord(" "), ord("\t"), ord("\r")]] = True
    return table


def count_colons(block: memoryview) -> int:
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == ord(":")))


def check_keys(block: memoryview, lines: list[bytes], first: int, path: Path | str, keys: int, colons: int) -> None:
    """Raise an `InputError` for the first of `lines` (numbered from `first`, held in `block`
    separated by newlines, `colons` colons in all) whose objects repeat a key; `keys` is the
    number of keys the parser kept over all of them."""
    if colons == keys:
        return
    import numpy as np

    data = np.frombuffer(block, dtype=np.uint8)
    at = np.flatnonzero(data == ord(":"))
    at = at[at > 0]
    at = at[_key_ends()[data[at - 1]]]
    if at.size == keys:
        return
    per_line = np.bincount(np.searchsorted(np.flatnonzero(data == ord("\n")), at), minlength=len(lines)).tolist()
    for i in np.flatnonzero(per_line).tolist():
        line = lines[i]
        if per_line[i] != count_keys(orjson.loads(line)):
            error = duplicate_key_error(line, path, first + i)
            if error is not None:
                raise error


def first_duplicate_key(lines: list[bytes], first: int, path: Path | str) -> InputError | None:
    """The error for the first of `lines` that repeats a key, checked exactly (for error paths)."""
    for i, line in enumerate(lines):
        error = duplicate_key_error(line, path, first + i)
        if error is not None:
            return error
    return None


def count_keys(value: Any) -> int:
    """Keys of every object in a parsed JSON value."""
    if type(value) is dict:
        return len(value) + sum(count_keys(v) for v in value.values() if type(v) in (dict, list))
    if type(value) is list:
        return sum(count_keys(v) for v in value if type(v) in (dict, list))
    return 0


class _Pairs(list):
    """An object as the standard parser read it: every (key, value) pair, repeats kept."""


def duplicate_key_error(line: bytes, path: Path | str, lineno: int) -> InputError | None:
    """The error naming the first repeated key of `line` (by its path in the row), or None."""
    try:
        found = _repeated(json.loads(line, object_pairs_hook=_Pairs), "")
    except (ValueError, RecursionError):
        return None  # not JSON the standard parser takes: other checks name the problem
    if found is None:
        return None
    return InputError(
        f"duplicate key {found!r}: an object holds it twice and JSON parsers silently keep only one value; remove or rename one",
        path,
        lineno,
    )


def _repeated(value: Any, path: str) -> str | None:
    """Path of the first repeated key in `value`, in the order the text has them."""
    if type(value) is _Pairs:
        seen = set()
        for key, sub in value:
            sub_path = f"{path}.{key}" if path else key
            if key in seen:
                return sub_path
            seen.add(key)
            found = _repeated(sub, sub_path)
            if found is not None:
                return found
    elif type(value) is list:
        for i, sub in enumerate(value):
            found = _repeated(sub, f"{path}[{i}]")
            if found is not None:
                return found
    return None
