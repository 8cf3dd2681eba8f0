"""The one Arrow schema of a stream of JSON rows (for `parquet_output`), and where a row breaks it.

Arrow's own inference is not used: it turns a boolean into 1.0 in a column of floats (and a chunk
of rows holding both infers a double, while two chunks holding one each fail to unify), so its
answer would depend on how the rows are cut. Here every value is walked once, in order, with the
rules of a permissive union: null fits any type, integers and floats make a double, objects are
structs holding the union of their fields, a list's items one type; fields in order of first
appearance. Anything else (a boolean beside a number, a string beside an object, an integer past
64 bits) is a conflict, and `locate` walks the rows again to say which row, field and earlier row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

_KINDS: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str", dict: "dict", list: "list"}
_NUMBERS = ("int", "float")
_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63
_ARROW: dict[str | None, pa.DataType] = {
    None: pa.null(),
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
}


class Conflict(Exception):
    """A row that no single column type can hold together with the rows before it."""


class RowSchema:
    """The union type of the values seen at one place of the rows (the root: the rows themselves)."""

    __slots__ = ("kind", "fields", "item")

    def __init__(self) -> None:
        self.kind: str | None = None  # None: only nulls so far
        self.fields: dict[str, RowSchema] = {}
        self.item: RowSchema | None = None

    def add(self, value: Any) -> None:
        """Widen to hold `value` (not None), or raise Conflict. Called for every value of every
        row, so the common cases (a string or float where one is expected) skip the call."""
        kind = _KINDS[type(value)]
        if kind != self.kind:
            if self.kind is None:
                self.kind = kind
            elif kind in _NUMBERS and self.kind in _NUMBERS:
                self.kind = "float"
            else:
                raise Conflict
        if kind == "dict":
            fields = self.fields
            for key, sub in value.items():
                node = fields.get(key)
                if node is None:
                    node = fields[key] = RowSchema()
                if sub is None or (type(sub) is str and node.kind == "str") or (type(sub) is float and node.kind == "float"):
                    continue
                node.add(sub)
        elif kind == "list":
            item = self.item
            if item is None:
                item = self.item = RowSchema()
            for sub in value:
                if sub is not None:
                    item.add(sub)
        elif kind == "int" and not _INT64_MIN <= value < _INT64_END:
            raise Conflict

    def arrow_type(self) -> pa.DataType:
        if self.kind == "dict":
            return pa.struct([pa.field(key, node.arrow_type()) for key, node in self.fields.items()])
        if self.kind == "list":
            return pa.list_(self.item.arrow_type() if self.item is not None else pa.null())
        return _ARROW[self.kind]

    def arrow_schema(self) -> pa.Schema:
        """The schema of rows (the root's fields; no rows at all: no columns)."""
        return pa.schema(list(self.arrow_type())) if self.kind == "dict" else pa.schema([])


_NAMES = {"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string", "dict": "an object", "list": "a list"}


def locate(rows: Iterable[tuple[str, Any]]) -> str | None:
    """The first of `rows` ((where, row) in order) that conflicts with an earlier one, said in
    words (its field, type and place, and the earlier row's), or None if none does."""
    seen: dict[tuple[str, ...], tuple[str, str]] = {}
    for where, row in rows:
        problem = _walk(row, (), where, seen)
        if problem is not None:
            return problem
    return None


def _walk(value: Any, path: tuple[str, ...], where: str, seen: dict[tuple[str, ...], tuple[str, str]]) -> str | None:
    if value is None:
        return None
    kind = _KINDS[type(value)]
    name = ".".join(path) or "<row>"
    if kind == "int" and not _INT64_MIN <= value < _INT64_END:
        return f"field {name} is {value} in {where}, past the 64-bit integers of a Parquet column"
    first_kind, first_where = seen.setdefault(path, (kind, where))
    if first_kind != kind and not (first_kind in _NUMBERS and kind in _NUMBERS):
        return f"field {name} is {_NAMES[kind]} in {where} but {_NAMES[first_kind]} in {first_where}, and a Parquet column holds one type"
    if kind == "dict":
        children = [((*path, key), sub) for key, sub in value.items()]
    elif kind == "list":
        item = (*path[:-1], f"{path[-1]}[]") if path else ("[]",)
        children = [(item, sub) for sub in value]
    else:
        children = []
    for sub_path, sub in children:
        problem = _walk(sub, sub_path, where, seen)
        if problem is not None:
            return problem
    return None
