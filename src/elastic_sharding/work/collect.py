"""Collect a runner's output into one validated shard output (`processed.jsonl`, or
`processed.jsonl.zst` as `work/output_codec.py` stores it) in input order.

Ray writes a directory of part files (one per block) whose order is not the input order, or a
0-byte file when every row was filtered out. Every shard row carries its global input index in
`ROW_KEY`; collecting sorts on it (stably, so a Mapper that emits several rows per input keeps
their order) and removes it, keeping the rest of each exported line byte for byte.

Once collected, the raw export is a second copy of the shard's output that nothing reads (merge,
status and verify read the collected output only): the worker removes it (`remove_raw_output`)
before it publishes the completion, so a job directory holds each output once.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from elastic_sharding import confined, crashpoints, fsops
from elastic_sharding.errors import AttemptFailed, InputError
from elastic_sharding.hashing_sink import HashingSink
from elastic_sharding.layout import PROCESSED_NAMES
from elastic_sharding.prepare.jsonl import parse_object
from elastic_sharding.records import ROW_KEY
from elastic_sharding.vocabulary import OutputCodec
from elastic_sharding.work.output_codec import encoder, open_lines

log = logging.getLogger(__name__)

_PREFIX = b'{"' + ROW_KEY.encode() + b'":'


@dataclass
class OutputStats:
    """An output's JSONL lines; and, stored compressed, the file's own size and sha256."""

    rows: int
    bytes: int
    sha256: str
    stored_bytes: int | None = None
    stored_sha256: str | None = None


def part_files(ray_output: Path) -> list[Path]:
    """The runner's output files; a symbolic link in their place fails the attempt instead of being followed."""
    found = confined.kind(ray_output)
    if found is None:
        raise AttemptFailed(f"the runner produced no output at {ray_output}")
    if found == "link":
        raise AttemptFailed(f"output {confined.LinkRefused(ray_output)}")
    if found == "file":
        return [ray_output] if ray_output.stat().st_size else []
    entries = {name: kind for name, kind in confined.list_dir(ray_output).items() if not name.startswith(".")}
    links = sorted(name for name, kind in entries.items() if kind == "link")
    if links:
        raise AttemptFailed(f"output {confined.LinkRefused(ray_output / links[0])}")
    return sorted(ray_output / name for name, kind in entries.items() if kind == "file")


def remove_raw_output(ray_output: Path) -> bool:
    """Delete a runner's raw export (Ray's part-file directory, or the file in its place); True
    if nothing is left. A symbolic link is removed itself, never followed (rmtree never follows
    one inside the directory either). An error, e.g. a runner of a superseded attempt still
    writing into it, is logged and leaves the rest for a later sweep."""
    try:
        found = confined.kind(ray_output)
        if found is None:
            return True
        if found == "dir":
            shutil.rmtree(ray_output)
        else:
            os.unlink(ray_output)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove the raw output %s (%s); a later attempt or the worker's exit retries", ray_output, exc)
    return not confined.lexists(ray_output)


def remove_unused_output(attempt_dir: Path) -> None:
    """Delete an attempt's collected output (stored either way) that the shard's completion does
    not name, with the temporary files a collect killed midway left beside it (links removed,
    never followed)."""
    try:
        entries = confined.list_dir(attempt_dir)
    except OSError as exc:
        log.warning("cannot look for unused output in %s: %s", attempt_dir, exc)
        return
    prefixes = tuple(f".{name}.tmp-" for name in PROCESSED_NAMES.values())
    for name, found in sorted(entries.items()):
        if found != "dir" and (name in PROCESSED_NAMES.values() or name.startswith(prefixes)):
            try:
                os.unlink(attempt_dir / name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove the unused output %s: %s", attempt_dir / name, exc)


def _output_object(line: bytes, where: str) -> dict:
    try:
        return parse_object(line, where, None)
    except InputError as exc:
        raise AttemptFailed(f"output {exc}") from None


def strip_row_key(line: bytes, where: str) -> tuple[int, bytes]:
    """Return (row index, the exported line without the ordering field)."""
    if line.startswith(_PREFIX):
        end = line.find(b",", len(_PREFIX))
        if end == -1:
            end = line.find(b"}", len(_PREFIX))
        number = line[len(_PREFIX) : end]
        if number.isdigit():
            rest = line[end + 1 :] if line[end : end + 1] == b"," else line[end:]
            return int(number), b"{" + rest
    row = _output_object(line, where)
    index = row.pop(ROW_KEY, None)
    if not isinstance(index, int) or isinstance(index, bool):
        raise AttemptFailed(f"{where}: output row lost the ordering field {ROW_KEY!r} (an operator dropped unknown fields?)")
    return index, orjson.dumps(row)


def _read_part(
    part: Path, rank: int, first_row: int, last_row: int, fields: tuple[str, ...] | None
) -> Iterator[tuple[int, int, int, bytes]]:
    with confined.open_read(part, buffering=1 << 20) as handle:
        for lineno, line in enumerate(handle, 1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            where = f"{part.name}:{lineno}"
            index, body = strip_row_key(line, where)
            if not first_row <= index < last_row:
                raise AttemptFailed(f"{where}: row index {index} is outside this shard ({first_row}..{last_row - 1})")
            row = _output_object(body, where)
            if fields is not None:
                body = orjson.dumps({name: row[name] for name in fields if name in row})
            yield index, rank, lineno, body


def _write(processed: Path, codec: str, rows: Iterable[tuple[int, int, int, bytes]]) -> OutputStats:
    """Write rows that must arrive in (index, part, line) order; raises _OutOfOrder otherwise."""
    digest = hashlib.sha256()
    size = count = 0
    previous = (-1, -1, -1)
    with fsops.atomic_output(processed) as out:
        stored = HashingSink(out)  # type: ignore[arg-type]  # errors name the output
        with encoder(codec, stored) as lines:
            for index, rank, lineno, body in rows:
                key = (index, rank, lineno)
                if key < previous:
                    raise _OutOfOrder
                previous = key
                data = body + b"\n"
                lines.write(data)
                digest.update(data)
                size += len(data)
                count += 1
                if count == 1:
                    stored.flush()  # not the compressor's: a flush would end a zstd block here
                    crashpoints.reached("collecting")
        out.commit()
    stats = OutputStats(rows=count, bytes=size, sha256=digest.hexdigest())
    if OutputCodec(codec) is not OutputCodec.NONE:
        stats.stored_bytes, stats.stored_sha256 = stored.size, stored.digest.hexdigest()
    return stats


class _OutOfOrder(Exception):
    pass


def collect(
    ray_output: Path,
    processed: Path,
    first_row: int,
    rows: int,
    codec: str = OutputCodec.NONE,
    fields: tuple[str, ...] | None = None,
) -> OutputStats:
    """Write `processed` (atomically, stored as `codec`) from Ray's part files, validated and in
    input order; with `fields`, each row keeps only those (an analysis keeps its statistics).

    Rows inside one part file come in input order, so a streaming k-way merge of the parts
    suffices and memory stays constant; should a part ever be out of order internally, the
    collector falls back to sorting the whole shard in memory.
    """
    parts = part_files(ray_output)
    last_row = first_row + rows
    streams = [_read_part(part, rank, first_row, last_row, fields) for rank, part in enumerate(parts)]
    try:
        return _write(processed, codec, heapq.merge(*streams))
    except _OutOfOrder:
        everything = sorted(row for rank, part in enumerate(parts) for row in _read_part(part, rank, first_row, last_row, fields))
        return _write(processed, codec, everything)


def validated_lines(path: Path, codec: str = OutputCodec.NONE) -> Iterator[bytes]:
    """Yield a JSONL file's lines (with newline), read through `codec`; ValueError names the file
    and line of the first line that is truncated or not a JSON object; a symbolic link raises
    LinkRefused, unread."""
    with open_lines(path, codec) as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):
                raise ValueError(f"{path}:{lineno}: truncated (no newline at end)")
            try:
                parse_object(line, path, lineno)
            except InputError as exc:
                raise ValueError(str(exc)) from None
            yield line


def file_stats(path: Path, sink: BinaryIO | None = None, codec: str = OutputCodec.NONE) -> OutputStats:
    """Re-read and validate a JSONL file stored as `codec`: rows, bytes and sha256 of its lines,
    copying them to `sink` if given."""
    digest = hashlib.sha256()
    rows = size = 0
    for line in validated_lines(path, codec):
        digest.update(line)
        if sink is not None:
            sink.write(line)
        size += len(line)
        rows += 1
    return OutputStats(rows, size, digest.hexdigest())
