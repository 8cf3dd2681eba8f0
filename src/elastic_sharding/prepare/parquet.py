"""Parquet input: footers, the cut on row-group boundaries, and shards written as Parquet.

A Parquet input is never turned into JSON: each shard is a Parquet file of the input's own row
groups (or row ranges of them) with the ordering column `ROW_KEY` first, so Data-Juicer reads it
with its own Parquet reader (`ray.data.read_parquet`) and sees exactly the types it would see in
the input: nested structs and lists, nulls, timestamps, binary.

Scan units read footers only (and hash the bytes for the fingerprint); the cut places shard
boundaries from the row groups' uncompressed sizes, which is what the operators' work follows;
write units decode their row groups. A file whose footer does not parse, or whose row group lies
past the file's end or does not decode, is refused by name and row group.
"""

from __future__ import annotations

import base64
import heapq
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from elastic_sharding.errors import InputError, UsageError
from elastic_sharding.prepare.normalize import absolute_media

PARQUET_SUFFIX = ".parquet"
# Shards keep the input's row groups; zstd is the codec their bytes on the NAS are smallest in
# for the speed (bench/parquet.py measures it against the input's own codec).
SHARD_COMPRESSION = "zstd"
_FOOTER_TAIL = 8  # 4-byte footer length and the magic "PAR1"


class Footer(NamedTuple):
    """What a scan unit learns of one Parquet file: its schema (serialized) and row groups."""

    schema: str  # base64 of the Arrow IPC schema
    groups: list[list[int]]  # per row group: [rows, uncompressed bytes]


class Segment(NamedTuple):
    """Rows [first, first + rows) of one row group of one input file."""

    file: int
    group: int
    first: int
    rows: int


def is_parquet_name(name: str) -> bool:
    return name.endswith(PARQUET_SUFFIX)


def read_footer(path: Path, size: int, reserved: Sequence[str]) -> Footer:
    """The footer of `path`, checked: it parses, every column chunk lies inside the file, and no
    column takes a name the tool reserves."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(
            f"not a readable Parquet file ({_reason(exc)}): truncated, still being written, or another format? "
            "Replace it with a complete copy, or move it out of the dataset",
            path,
        ) from None
    for name in reserved:
        if name in schema.names:
            raise InputError(f"column {name!r} is reserved by elastic-sharding; rename it", path)
    groups = []
    limit = size - _FOOTER_TAIL
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            if start is None or start < 4 or start + chunk.total_compressed_size > limit:
                raise InputError(
                    f"row group {g} (column {chunk.path_in_schema!r}) lies outside the file's {size} bytes: the file is "
                    "corrupt or was cut short; replace it with a complete copy",
                    path,
                )
        groups.append([group.num_rows, group.total_byte_size])
    return Footer(base64.b64encode(schema.serialize().to_pybytes()).decode(), groups)


def load_schema(encoded: str) -> Any:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded)))


def schema_difference(first: Any, other: Any) -> str | None:
    """Why `other` is not `first` (names, order, types, nullability), in words; None if equal."""
    if other.equals(first, check_metadata=False):
        return None
    here, there = {f.name: f for f in other}, {f.name: f for f in first}
    for field in first:
        if field.name not in here:
            return f"it has no column {field.name!r}"
    for field in other:
        if field.name not in there:
            return f"its column {field.name!r} is not in the first file"
        if not field.type.equals(there[field.name].type):
            return f"its column {field.name!r} is {field.type}, {there[field.name].type} in the first file"
    if other.names != first.names:
        return f"its columns are in another order ({', '.join(other.names)})"
    return "its columns differ in nullability"


def check_media_columns(schema: Any, media_keys: Sequence[str], index_key: str | None, path: Path) -> None:
    """The columns the tool rewrites must have a type it can rewrite, as for JSONL rows."""
    import pyarrow as pa

    for key in media_keys:
        if key in schema.names:
            kind = schema.field(key).type
            lists = pa.types.is_list(kind) or pa.types.is_large_list(kind)
            if not (
                pa.types.is_null(kind)
                or (lists and (pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)))
            ):
                raise InputError(f"column {key!r} must be a list of strings (it is {kind})", path)
    if index_key is not None and index_key in schema.names:
        kind = schema.field(index_key).type
        if not (pa.types.is_integer(kind) or pa.types.is_null(kind)):
            raise InputError(f"column {index_key!r} (the recipe's index key) must be an integer column (it is {kind})", path)


def cut_row_groups(groups: Sequence[tuple[int, int, int, int]], num_shards: int) -> list[list[Segment]]:
    """Exactly `num_shards` non-empty shards of the row groups (file, group, rows, bytes), in order.

    With at least as many non-empty row groups as shards, shards are runs of whole row groups:
    shard i ends with the first row group at which the cumulative size reaches (i+1)/N of the
    total, but early enough that every later shard still gets one. With fewer row groups than
    shards, each row group is cut into row ranges: it gets one shard, and the others go one at a
    time to the row group whose share of the total size is furthest above its shards so far (a
    row group never gets more shards than rows), its rows split evenly, the first ranges taking
    the remainder."""
    filled = [g for g in groups if g[2] > 0]
    rows = sum(g[2] for g in filled)
    if num_shards > rows:
        raise UsageError(f"--num-shards {num_shards} exceeds the number of input rows ({rows})")
    if len(filled) >= num_shards:
        return _runs_of_groups(filled, num_shards)
    return _split_groups(filled, num_shards)


def _runs_of_groups(groups: Sequence[tuple[int, int, int, int]], count: int) -> list[list[Segment]]:
    total = sum(max(1, g[3]) for g in groups)
    shards: list[list[Segment]] = [[] for _ in range(count)]
    shard, acc = 0, 0
    for position, (file, group, rows, size) in enumerate(groups):
        shards[shard].append(Segment(file, group, 0, rows))
        acc += max(1, size)
        left_groups = len(groups) - position - 1
        left_shards = count - shard - 1
        if left_shards and (acc >= math.ceil(total * (shard + 1) / count) or left_groups == left_shards):
            shard += 1
    return shards


def _split_groups(groups: Sequence[tuple[int, int, int, int]], count: int) -> list[list[Segment]]:
    total = sum(max(1, g[3]) for g in groups)
    parts = [1] * len(groups)
    # Largest remainder, one shard at a time: the group whose ideal share exceeds its parts most.
    queue = [(-(count * max(1, g[3]) / total - 1), i) for i, g in enumerate(groups) if g[2] > 1]
    heapq.heapify(queue)
    for _ in range(count - len(groups)):
        _, i = heapq.heappop(queue)
        parts[i] += 1
        if parts[i] < groups[i][2]:
            heapq.heappush(queue, (-(count * max(1, groups[i][3]) / total - parts[i]), i))
    shards = []
    for (file, group, rows, _), k in zip(groups, parts):
        base, extra = divmod(rows, k)
        first = 0
        for j in range(k):
            take = base + (1 if j < extra else 0)
            shards.append([Segment(file, group, first, take)])
            first += take
    return shards


class ParquetShardWriter:
    """Pass two for one Parquet shard: its row groups decoded, the ordering column added first,
    media paths and the index key normalized as for JSONL rows, each segment written as one row
    group into a temporary file the caller commits (create-once, like a JSONL shard)."""

    def __init__(self, files: Sequence[Path], base: str, media_keys: Sequence[str], index_key: str | None, row_key: str):
        self.files = files
        self.base = base
        self.media_keys = tuple(media_keys)
        self.index_key = index_key
        self.row_key = row_key
        self._open: dict[int, Any] = {}

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()

    def read(self, segment: Segment, expected_rows: int) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.files[segment.file]
        try:
            reader = self._open.get(segment.file)
            if reader is None:
                reader = self._open[segment.file] = pq.ParquetFile(path)
            table = reader.read_row_group(segment.group)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(
                f"row group {segment.group} does not decode ({_reason(exc)}): the file is corrupt; replace it with a good copy",
                path,
            ) from None
        _check_binary_text(table, path, segment.group)
        if table.num_rows != expected_rows:
            raise InputError(
                f"row group {segment.group} holds {table.num_rows} rows, not the {expected_rows} its footer said when prepare "
                "began: the input changed while prepare was reading it; rerun prepare when the input is stable",
                path,
            )
        return table.slice(segment.first, segment.rows)

    def shape(self, table: Any, first_row: int) -> Any:
        """`table` with the ordering column first and the normalized columns replaced."""
        import pyarrow as pa

        index = pa.array(range(first_row, first_row + table.num_rows), type=pa.int64())
        for key in self.media_keys:
            if key in table.column_names and not pa.types.is_null(table.schema.field(key).type):
                column = table.column(key)
                values = [None if v is None else [absolute_media(p, self.base) for p in v] for v in column.to_pylist()]
                table = table.set_column(table.column_names.index(key), key, pa.array(values, type=column.type))
        if self.index_key is not None:
            key = self.index_key
            if key not in table.column_names:
                table = table.append_column(pa.field(key, pa.int64()), index)
            else:
                column = table.column(key)
                if column.null_count:
                    kind = column.type if pa.types.is_integer(column.type) else pa.int64()
                    filled = [
                        i if v is None else v for v, i in zip(column.to_pylist(), range(first_row, first_row + len(column)))
                    ]
                    table = table.set_column(table.column_names.index(key), pa.field(key, kind), pa.array(filled, type=kind))
        return table.add_column(0, pa.field(self.row_key, pa.int64(), nullable=False), index)

    def write(self, out: Any, tables: Sequence[Any]) -> None:
        """Every table as one row group, into the binary file object `out`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.PythonFile(out, mode="w")
        with pq.ParquetWriter(sink, tables[0].schema, compression=SHARD_COMPRESSION) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=max(1, table.num_rows))


def _check_binary_text(table: Any, path: Path, group: int) -> None:
    """Data-Juicer's JSON export (pandas) writes a binary value as UTF-8 text and fails on one
    that is not: found here, by column and row, instead of as a failed shard after the work."""
    import pyarrow as pa

    for name, column in zip(table.column_names, table.columns):
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            continue
        try:
            column.cast(pa.large_string())
        except pa.ArrowInvalid:
            row = next(i for i, v in enumerate(column.to_pylist()) if v is not None and not _is_utf8(v))
            raise InputError(
                f"row group {group}, row {row}: binary column {name!r} holds bytes that are not UTF-8 text, which "
                "Data-Juicer's JSON export cannot write; drop or re-encode the column (e.g. base64)",
                path,
            ) from None


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
