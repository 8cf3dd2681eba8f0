"""Writing one shard in pass two.

Lines are batched into large blocks whose writing and hashing run on the offload thread, so
that parsing and normalizing the next rows overlaps them. A shard is published create-once: a
second writer of the same shard (after a takeover) wrote the same bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from elastic_sharding import fsops
from elastic_sharding.errors import InputError
from elastic_sharding.hashing_sink import HashingSink
from elastic_sharding.prepare.jsonl import Offload, line_too_long

DIRECT_BYTES = 64 << 10


class ShardWriter:
    """Writes one shard; lines are batched into large blocks whose writing and hashing run on
    the offload thread. Published create-once: a second writer of the same shard (after a
    takeover) wrote the same bytes."""

    FLUSH_BYTES = 4 << 20

    def __init__(self, path: Path, offload: Offload):
        self.offload = offload
        # Blocks arrive whole (`FLUSH_BYTES`), past any buffer; a small one keeps the shards of a
        # write unit, held open until they are committed together, cheap.
        self.out = fsops.AtomicOutput(path, replace=False, buffering=1 << 16)
        self.sha = hashlib.sha256()
        self.rows = 0
        self.bytes = 0
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, line: bytes) -> None:
        self.pending.append(line)
        self.pending_bytes += len(line)
        if self.pending_bytes >= self.FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            block = b"".join(self.pending)
            if self.pending_bytes < DIRECT_BYTES:  # a tiny shard: the hand-off would cost more
                self.offload.drain()
                _write_block(self.out, block, self.sha)
            else:
                self.offload.submit(_write_block, self.out, block, self.sha)
        self.rows += len(self.pending)
        self.bytes += self.pending_bytes
        self.pending = []
        self.pending_bytes = 0

    def finish(self) -> tuple[int, int, str]:
        """Every line written to the temporary file; `commit` publishes it."""
        self._flush()
        self.offload.drain()
        self.out.flush()
        return self.rows, self.bytes, self.sha.hexdigest()

    def commit(self, sync_dir: bool = True) -> None:
        self.out.commit(sync_dir)

    def abort(self) -> None:
        self.out.abort()


def _write_block(out: fsops.AtomicOutput, data: bytes, sha: Any) -> None:
    out.write(data)
    sha.update(data)


class HashingOutput(HashingSink):
    """A create-once temporary file that hashes what it is given (pyarrow writes a Parquet shard
    through it): `commit`/`abort` as `ShardWriter`."""

    def __init__(self, path: Path):
        self.out = fsops.AtomicOutput(path, replace=False)
        super().__init__(self.out.file)

    def commit(self, sync_dir: bool = True) -> None:
        self.out.commit(sync_dir)

    def abort(self) -> None:
        self.out.abort()


class ShardLineTooLong(Exception):
    """A row's shard line is over the limit though its input line is not (pass two)."""

    def __init__(self, size: int, limit: int, path: Path, lineno: int):
        self.size, self.limit, self.path, self.lineno = size, limit, path, lineno

    def error(self) -> InputError:
        what = "the row's shard line (null-filled missing fields, absolute media paths, row number added)"
        return line_too_long(self.size, self.limit, self.path, self.lineno, what=what)
