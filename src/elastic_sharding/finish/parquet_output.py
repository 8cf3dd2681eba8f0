"""The `parquet` format: every row of every shard, in manifest order, under one Arrow schema.

Two passes over the shard outputs, each output proven against its record on each read. The first
parses every row (orjson; never `pyarrow.json`, which turns ISO-date strings into timestamps)
and learns the union schema of them all (`row_schema`): a field null in one shard and a string in
another is a string column, ints and floats make a double, objects are the union of their fields,
in order of first appearance. The second converts the rows to that schema and writes them.

The bytes depend on the rows only, never on the shard count: the schema is a union (the same
whatever the cut), and row groups are cut over the whole row stream — every `ROW_GROUP_ROWS`
rows, or sooner once a group holds `ROW_GROUP_BYTES` of JSON (which bounds memory and keeps
Arrow's string arrays under their 2 GiB limit) — with fixed writer settings (`WRITER_OPTIONS`).

Parquet holds one type per column: a field that is a string in one row and an object in another
(or a boolean beside a number, an integer past 64 bits, an object that never has a field) cannot
be written, and the merge is refused naming the shard, the line and the field. Read back, a field
a row lacked is null and an int in a double column is a float: the rows are the JSONL rows in the
union shape.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from elastic_sharding.errors import UsageError
from elastic_sharding.finish.row_schema import Conflict, RowSchema, locate
from elastic_sharding.finish.shard_reader import lines
from elastic_sharding.finish.validate import Source

ROW_GROUP_ROWS = 65536
ROW_GROUP_BYTES = 256 << 20
CHUNK_ROWS = 4096  # rows converted at a time (inside a group): bounds the parsed objects held at once
WRITER_OPTIONS: dict[str, Any] = {
    "version": "2.6",
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "data_page_version": "1.0",
    "store_schema": True,
    "write_page_index": False,
}
_ARROW_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError)
ADVICE = "publish jsonl or jsonl.zst instead (--output-format), or change the recipe so the field has one type"


# -- pass one: the schema ---------------------------------------------------------------------------


def infer_schema(
    sources: list[Source], stop: threading.Event | None = None, on_rows: Callable[[int], None] = lambda n: None
) -> pa.Schema:
    """The union schema of every shard output's rows (each output proven on the same read)."""
    union = RowSchema()
    for index, source in enumerate(sources):
        conflict = False
        for _, batch in lines(source, stop):
            on_rows(len(batch))
            if conflict:
                continue  # read on: the shard is proven (or refused) before its rows are blamed
            try:
                for line in batch:
                    union.add(orjson.loads(line))
            except Conflict as exc:
                conflict = True
                cause: Exception = exc
        if conflict:
            raise refusal(sources[: index + 1], cause)
    schema = union.arrow_schema()
    if not schema.names and any(source.record.output_rows for source in sources):
        raise UsageError(
            f"cannot publish Parquet: every row of the job's {len(sources)} shard output(s) is {{}}, and Parquet keeps no rows without a column; {ADVICE}"
        )
    _refuse_empty_objects(schema, sources)
    return schema


def _refuse_empty_objects(schema: pa.Schema, sources: list[Source]) -> None:
    """Parquet has no column for an object without fields (one that is `{}` in every row)."""

    def empty(path: str, kind: pa.DataType) -> str | None:
        if pa.types.is_struct(kind):
            if kind.num_fields == 0:
                return path
            return next((hit for f in kind if (hit := empty(f"{path}.{f.name}", f.type))), None)
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return empty(f"{path}[]", kind.value_type)
        return None

    for field in schema:
        path = empty(field.name, field.type)
        if path is not None:
            raise UsageError(
                f"cannot publish Parquet: field {path} is an empty object in every row of the job's "
                f"{len(sources)} shard output(s), and Parquet has no column for an object without fields; {ADVICE}"
            )


# -- pass two: the rows -----------------------------------------------------------------------------


class ParquetSink:
    """Rows in, row groups out: a group is written when it is full, whichever shard its rows
    came from, so the file does not depend on where the shards were cut."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema, group_rows: int | None = None, group_bytes: int | None = None):
        self.schema = schema
        self.kind = pa.struct(list(schema))
        self.group_rows = group_rows or ROW_GROUP_ROWS
        self.group_bytes = group_bytes or ROW_GROUP_BYTES
        self.writer = pq.ParquetWriter(sink, schema, **WRITER_OPTIONS)
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.rows = 0

    def add(self, batch: list[bytes]) -> None:
        for line in batch:
            self.pending.append(line)
            self.pending_bytes += len(line)
            if len(self.pending) >= self.group_rows or self.pending_bytes >= self.group_bytes:
                self._write_group()

    def finish(self) -> None:
        """Write the last (partial) group."""
        if self.pending:
            self._write_group()

    def close(self) -> None:
        """Write the footer: after `finish`, or to let go of a failed file."""
        self.writer.close()

    def _write_group(self) -> None:
        pending, self.pending, self.pending_bytes = self.pending, [], 0
        chunks = [
            pa.array([orjson.loads(line) for line in pending[start : start + CHUNK_ROWS]], type=self.kind)
            for start in range(0, len(pending), CHUNK_ROWS)
        ]
        table = pa.Table.from_struct_array(pa.concat_arrays(chunks))  # contiguous: pages do not depend on the chunks
        self.writer.write_table(table, row_group_size=len(pending))
        self.rows += len(pending)


def write_rows(
    sources: list[Source], sink: ParquetSink, stop: threading.Event | None = None, on_rows: Callable[[int], None] = lambda n: None
) -> None:
    """Every row of `sources`, in order, into `sink` (each output proven on the same read again)."""
    for index, source in enumerate(sources):
        for _, batch in lines(source, stop):
            with _converting(sources[: index + 1]):
                sink.add(batch)
            on_rows(len(batch))
    with _converting(sources):
        sink.finish()


@contextlib.contextmanager
def _converting(sources: list[Source]) -> Iterator[None]:
    """Arrow refusing rows of `sources` (the last one being read) is a UsageError that says which
    row and field; an I/O error writing the file is not about the rows and passes unchanged."""
    try:
        yield
    except _ARROW_ERRORS as exc:
        if isinstance(exc, OSError):
            raise
        raise refusal(sources, exc) from None


def write_parquet(
    sources: list[Source],
    schema: pa.Schema,
    out: BinaryIO,
    stop: threading.Event | None = None,
    on_rows: Callable[[int], None] = lambda n: None,
) -> int:
    """Write `sources` as one Parquet file into `out`; returns its rows."""
    sink = ParquetSink(out, schema)
    try:
        write_rows(sources, sink, stop, on_rows)
    except BaseException:
        with contextlib.suppress(Exception):  # the file is discarded: its footer does not matter
            sink.close()
        raise
    sink.close()
    return sink.rows


# -- a refused row, located -------------------------------------------------------------------------


def refusal(sources: list[Source], cause: Exception) -> UsageError:
    """Why the rows of `sources` (the last one being read) cannot be Parquet: the first row, in
    order, whose field contradicts an earlier row's type, found by reading them all again."""

    def rows() -> Iterator[tuple[str, Any]]:
        for source in sources:
            for number, batch in lines(source):
                for offset, line in enumerate(batch):
                    yield f"{source.record.shard_id} line {number + offset} ({source.path})", orjson.loads(line)

    problem = locate(rows())
    if problem is not None:
        return UsageError(f"cannot publish Parquet: {problem}; {ADVICE}")
    last = sources[-1]
    return UsageError(
        f"cannot publish Parquet: the rows of {last.record.shard_id} ({last.path}) do not convert to Arrow ({cause}); {ADVICE}"
    )
