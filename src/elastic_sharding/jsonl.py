"""Strict JSONL: UTF-8, no BOM, one JSON object per line, no blank lines.

Every rejection names the file and the 1-based line. Reading hashes the raw bytes as it goes so
callers fingerprint an input in the same pass that validates it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from .errors import InputError

BOM = b"\xef\xbb\xbf"
READ_BUFFER = 1 << 20


class HashingLineReader:
    """Iterate over (line number, line bytes without newline) while hashing every byte read."""

    def __init__(self, path: Path):
        self.path = path
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.lines = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        try:
            handle = open(self.path, "rb", buffering=READ_BUFFER)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", self.path) from None
        with handle:
            update = self.sha256.update
            lineno = 0
            try:
                for raw in handle:
                    lineno += 1
                    update(raw)
                    self.size += len(raw)
                    line = raw[:-1] if raw.endswith(b"\n") else raw
                    if line.endswith(b"\r"):
                        line = line[:-1]
                    if lineno == 1 and line.startswith(BOM):
                        raise InputError("starts with a UTF-8 byte-order mark; save the file without a BOM", self.path, 1)
                    if not line.strip():
                        raise InputError("blank line; every line must be one JSON object", self.path, lineno)
                    self.lines = lineno
                    yield lineno, line
            except OSError as exc:
                raise InputError(f"read failed: {exc.strerror or exc}", self.path, lineno + 1) from None


def parse_object(line: bytes, path: Path | str, lineno: int | None) -> dict[str, Any]:
    """Parse one line as a JSON object or raise an `InputError` that says what is wrong."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise InputError(f"invalid UTF-8 at byte {uexc.start}", path, lineno) from None
        raise InputError(f"malformed JSON: {exc.msg} (column {exc.colno})", path, lineno) from None
    if not isinstance(value, dict):
        kind = "an array" if isinstance(value, list) else f"a JSON {type(value).__name__}"
        raise InputError(f"row is {kind}, not a JSON object", path, lineno)
    return value


def dumps_line(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row) + b"\n"
