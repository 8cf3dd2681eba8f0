"""The sha256 and size of a published file, taken from the bytes as they are written.

Its own module because it coordinates nothing, unlike `fsops` that it is used beside: a writer
(a Parquet shard, a collected shard output, a converted merge) learns what it published without
reading the file back, whatever writes through the sink (pyarrow, zstandard, its own loops).
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO


class HashingSink:
    """A binary file object that hashes and counts what is written on to `file` (pyarrow and
    zstandard both write through it); closing it leaves `file` to its owner."""

    def __init__(self, file: BinaryIO):
        self.file = file
        self.digest = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        self.file.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.closed = True


__all__ = ["HashingSink"]
