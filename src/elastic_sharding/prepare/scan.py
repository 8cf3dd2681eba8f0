"""Pass one of prepare: validate every line, fingerprint every file, learn the union schema and
the total normalized size.

A scan unit keeps, beside its result, each row's line length, weight (its normalized JSON size)
and whether an index is added to it (`unit_blob`): the cut places the shard boundaries from
them, and pass two re-reads the input by them.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from elastic_sharding.errors import InputError, JobStateError
from elastic_sharding.prepare.jsonl import HashingLineReader, Offload, check_keys, first_duplicate_key, parse_object
from elastic_sharding.prepare.normalize import RowNormalizer, SchemaNode


class _Scan(NamedTuple):
    schema: SchemaNode
    rows: int
    weight: int
    lengths: array[int]
    weights: array[int]
    added: bytearray
    pieces: list[list[Any]]


def scan_pieces(
    files: list[Path],
    pieces: list[list[int | None]],
    base: str,
    normalizer: RowNormalizer,
    offload: Offload,
    max_line: int,
    schema: SchemaNode | None = None,
    first_row: int | None = None,
    first_lines: list[int] | None = None,
) -> _Scan:
    """Pass one over byte ranges: validate and normalize every row, learn the schema and each
    row's weight (its normalized JSON size) and line length.

    Alone (`first_row` None) a range does not know the rows before it: origins are then
    "<piece>:<line in the piece>" and an added index is weighed as one digit (the cut unit
    corrects both). Given the schema of everything before and where the range starts, it is
    exactly the one-pass scan of the whole input, and raises the same error.

    Repeated keys are looked for once per block (`check_keys`), with the key count the schema
    keeps anyway; a row that fails another check is first checked for a repeated key in the rows
    up to it, so the error always names the first bad line."""
    schema = schema if schema is not None else SchemaNode()
    add_row = schema.add_row
    normalize = normalizer.normalize
    index_key = normalizer.index_key
    dumps = orjson.dumps
    lengths = array("I")
    weights = array("I")
    added = bytearray()
    out: list[list[Any]] = []
    weight = 0
    index = first_row or 0
    keys_before = schema.keys_seen() - normalizer.added_keys
    for number, (file, start, end) in enumerate(pieces):
        path = files[file]
        rows_before = len(lengths)
        name: Any = path if first_row is not None else str(number)
        line0 = first_lines[number] if first_lines is not None else 1
        reader = HashingLineReader(path, offload, max_line=max_line, count_colons=True, start=start, end=end, first_line=line0)
        for first, lines in reader.blocks():
            try:
                for lineno, line in enumerate(lines, first):
                    row = parse_object(line, path, lineno)
                    adds = index_key is not None and row.get(index_key) is None
                    row = normalize(row, base, index if first_row is not None else 0, path, lineno)
                    size = len(dumps(row)) + 1
                    weight += size
                    weights.append(size)
                    lengths.append(len(line))
                    added.append(adds)
                    add_row(row, (name, lineno))
                    index += 1
            except (InputError, orjson.JSONEncodeError) as exc:
                duplicate = first_duplicate_key(lines[: lineno - first + 1], first, path)
                if duplicate is not None:
                    raise duplicate from None
                if isinstance(exc, orjson.JSONEncodeError):  # only nesting beyond orjson.dumps's depth gets here
                    raise InputError(
                        f"objects and lists nested too deeply to write back as JSON ({exc}; orjson writes at most 254 levels)",
                        path,
                        lineno,
                    ) from None
                raise
            keys_now = schema.keys_seen() - normalizer.added_keys  # keys of the input text so far
            check_keys(reader.block, lines, first, path, keys_now - keys_before, reader.colons())
            keys_before = keys_now
        offload.drain()
        source = reader.source
        offset = source.first_offset if source is not None else start
        out.append([offset, len(lengths) - rows_before, reader.sha256.hexdigest()])
    return _Scan(schema, index - (first_row or 0), weight, lengths, weights, added, out)


def scan_files(files: list[Path], base_of: dict[Path, str], normalizer: RowNormalizer, offload: Offload, max_line: int) -> _Scan:
    """Pass one over whole files in one process (every file from its start, in order)."""
    bases = set(base_of.values())
    base = bases.pop() if len(bases) == 1 else ""
    return scan_pieces(files, [[i, 0, None] for i in range(len(files))], base, normalizer, offload, max_line, first_row=0)


def unit_blob(scan: _Scan) -> bytes:
    return scan.lengths.tobytes() + scan.weights.tobytes() + bytes(scan.added)


def read_blob(path: Path, rows: int) -> tuple[Any, Any, Any]:
    import numpy as np

    data = path.read_bytes()
    if len(data) != rows * 9:
        raise JobStateError(f"{path}: {len(data)} bytes, expected {rows * 9} for {rows} rows")
    lengths = np.frombuffer(data, dtype=np.uint32, count=rows)
    weights = np.frombuffer(data, dtype=np.uint32, count=rows, offset=rows * 4)
    added = np.frombuffer(data, dtype=np.uint8, count=rows, offset=rows * 8)
    return lengths, weights, added


_POWERS_OF_TEN = [10**k for k in range(1, 19)]


def digits(first: int, rows: int) -> Any:
    """The number of decimal digits of each row index first .. first + rows - 1."""
    import numpy as np

    index = np.arange(first, first + rows, dtype=np.int64)
    return np.searchsorted(np.array(_POWERS_OF_TEN, dtype=np.int64), index, side="right") + 1
