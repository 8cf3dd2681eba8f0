"""Row normalization applied by `prepare`, identical in both passes.

Why a schema: Ray's JSON reader gives every row of a block the union of the block's fields (a
missing field becomes null, struct sub-fields are unioned, ints mixed with floats become floats)
and fails on a field whose type changes. Which rows share a block depends on how the input is
split, so without help the output of a 4-shard run would differ from a 1-shard run. `prepare`
therefore learns the union schema of the whole input in pass one and writes every row in that
shape in pass two: every shard then looks like the whole dataset to Ray, and the merged output is
the same for any shard count. Type conflicts are rejected up front with both locations.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_sharding.errors import InputError
from elastic_sharding.records import ROW_KEY, PreparePlan

URL_PREFIXES = ("http://", "https://", "s3://", "gs://", "hdfs://")

_KIND_NAMES = {
    "bool": "a boolean",
    "int": "a number",
    "float": "a number",
    "str": "a string",
    "dict": "an object",
    "list": "a list",
}


_SCALAR_KINDS: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str"}
_KINDS: dict[type, str] = {**_SCALAR_KINDS, dict: "dict", list: "list", type(None): "null"}


class _Conflict(Exception):
    """A type conflict seen by the fast path; the slow path then raises the exact error."""


def _to_float(value: Any) -> Any:
    return float(value) if type(value) is int else value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, dict):
        return "dict"
    return "list"


@dataclass(slots=True)
class SchemaNode:
    """Union type of one JSON path over the whole input."""

    kind: str = "null"
    origin: str = ""
    fields: dict[str, SchemaNode] = field(default_factory=dict)
    item: SchemaNode | None = None
    count: int = 0
    nulls: int = 0

    def add(self, value: Any, path: str, origin: str) -> None:
        kind = _kind(value)
        if kind == "null":
            self.nulls += 1
            return
        if self.kind == "null":
            self.kind, self.origin = kind, origin
        elif self.kind != kind:
            if {self.kind, kind} == {"int", "float"}:
                self.kind = "float"
            else:
                raise InputError(
                    f"field {path or '<row>'} is {_KIND_NAMES[kind]} here but {_KIND_NAMES[self.kind]} at "
                    f"{self.origin}; Ray's JSON reader needs one type per field across the dataset"
                )
        self.count += 1
        if kind == "dict":
            for key, sub in value.items():
                node = self.fields.get(key)
                if node is None:
                    node = self.fields[key] = SchemaNode()
                node.add(sub, f"{path}.{key}" if path else key, origin)
        elif kind == "list":
            if self.item is None:
                self.item = SchemaNode()
            for i, sub in enumerate(value):
                self.item.add(sub, f"{path}[{i}]", origin)

    @property
    def has_null(self) -> bool:
        return self.nulls > 0

    def keys_seen(self) -> int:
        """How many keys the values added so far held, nested objects' included: every key adds
        one to its field's count or nulls, so no per-row counting is needed. Prepare compares it
        with the keys written in the input to find repeated ones (`jsonl.check_keys`)."""
        total = 0
        stack = [self]
        while stack:
            node = stack.pop()
            for sub in node.fields.values():
                total += sub.count + sub.nulls
                stack.append(sub)
            if node.item is not None:
                stack.append(node.item)
        return total

    def add_row(self, row: dict[str, Any], where: tuple[Path | str, int]) -> None:
        """`add(row, "", "<file>:<line>")` without building paths and origins for every row:
        prepare's first pass calls this once per input row."""
        try:
            self._add_fast(row, where)
        except _Conflict:
            try:
                self.add(row, "", f"{where[0]}:{where[1]}")
            except InputError as exc:
                raise InputError(str(exc), *where) from None  # "here" gets its file and line
            raise AssertionError("schema conflict not reproduced by the slow path") from None

    def _add_fast(self, value: Any, where: tuple[Path | str, int]) -> None:
        kind = _KINDS.get(type(value)) or _kind(value)
        if kind == "null":
            self.nulls += 1
            return
        if kind != self.kind:
            if self.kind == "null":
                self.kind, self.origin = kind, f"{where[0]}:{where[1]}"
            elif kind in ("int", "float") and self.kind in ("int", "float"):
                self.kind = "float"
            else:
                raise _Conflict
        self.count += 1
        if kind == "dict":
            fields = self.fields
            for key, sub in value.items():
                node = fields.get(key)
                if node is None:
                    node = fields[key] = SchemaNode()
                if _SCALAR_KINDS.get(type(sub)) == node.kind:
                    node.count += 1
                elif sub is None:
                    node.nulls += 1
                else:
                    node._add_fast(sub, where)
        elif kind == "list":
            item = self.item
            if item is None:
                item = self.item = SchemaNode()
            for sub in value:
                if _SCALAR_KINDS.get(type(sub)) == item.kind:
                    item.count += 1
                elif sub is None:
                    item.nulls += 1
                else:
                    item._add_fast(sub, where)

    def shaper(self) -> Callable[[Any], Any] | None:
        """A function equal to `shape` once the schema is final, or None where `shape` returns
        every value unchanged. It reuses (and may modify) the value instead of rebuilding it, and
        checks each dict's key order once instead of rebuilding the dict: prepare's second pass
        shapes every row."""
        if self.kind == "float":
            return _to_float
        if self.kind == "list" and self.item is not None:
            item = self.item.shaper()
            if item is None:
                return None
            return lambda value: None if value is None else [item(v) for v in value]
        if self.kind != "dict":
            return None
        keys = list(self.fields)
        subs = [(key, node.shaper()) for key, node in self.fields.items()]
        special = [(key, fn) for key, fn in subs if fn is not None]

        def shape_dict(value: Any) -> Any:
            if value is None:
                return None
            if list(value) != keys:
                return {key: value.get(key) if fn is None else fn(value.get(key)) for key, fn in subs}
            for key, fn in special:
                value[key] = fn(value[key])
            return value

        return shape_dict

    def shape(self, value: Any) -> Any:
        """`value` in the union shape: missing fields null, in first-seen order, ints as floats."""
        if value is None:
            return None
        if self.kind == "dict":
            return {key: node.shape(value.get(key)) for key, node in self.fields.items()}
        if self.kind == "list" and self.item is not None:
            return [self.item.shape(v) for v in value]
        if self.kind == "float" and type(value) is int:
            return float(value)
        return value

    def flatten(self) -> list[list[Any]]:
        """The tree as a flat list (records cannot nest as deep as JSON rows may): per node in
        preorder [parent, key (None for a list's item), kind, origin, count, nulls]."""
        out: list[list[Any]] = []
        stack: list[tuple[SchemaNode, int, str | None]] = [(self, -1, None)]
        while stack:
            node, parent, key = stack.pop()
            here = len(out)
            out.append([parent, key, node.kind, node.origin, node.count, node.nulls])
            children = [(sub, here, k) for k, sub in node.fields.items()]
            if node.item is not None:
                children.append((node.item, here, None))
            stack.extend(reversed(children))
        return out

    @staticmethod
    def unflatten(rows: list[list[Any]], origin: Callable[[str], str] = lambda o: o) -> SchemaNode:
        """Inverse of `flatten`; `origin` rewrites each recorded origin."""
        nodes: list[SchemaNode] = []
        for parent, key, kind, where, count, nulls in rows:
            node = SchemaNode(kind, origin(where) if where else where, count=count, nulls=nulls)
            if parent >= 0:
                if key is None:
                    nodes[parent].item = node
                else:
                    nodes[parent].fields[key] = node
            nodes.append(node)
        return nodes[0]

    def conflicts_with(self, later: SchemaNode) -> bool:
        """Whether `later` (the schema of the rows after this one's) gives some field a kind
        this one's rows contradict: then reading them in one pass would have failed."""
        if "null" not in (self.kind, later.kind) and self.kind != later.kind and {self.kind, later.kind} != {"int", "float"}:
            return True
        for key, sub in later.fields.items():
            mine = self.fields.get(key)
            if mine is not None and mine.conflicts_with(sub):
                return True
        return self.item is not None and later.item is not None and self.item.conflicts_with(later.item)

    def absorb(self, later: SchemaNode) -> None:
        """Become the schema of this one's rows followed by `later`'s (no conflict between them):
        the same tree, field order, kinds and origins as one pass over all of them."""
        if later.kind != "null":
            if self.kind == "null":
                self.kind, self.origin = later.kind, later.origin
            elif self.kind != later.kind:
                self.kind = "float"
        self.count += later.count
        self.nulls += later.nulls
        for key, sub in later.fields.items():
            mine = self.fields.get(key)
            if mine is None:
                self.fields[key] = sub
            else:
                mine.absorb(sub)
        if later.item is not None:
            if self.item is None:
                self.item = later.item
            else:
                self.item.absorb(later.item)

    def int_null_fields(self, path: str = "") -> list[str]:
        """Integer fields that are null or missing somewhere: Ray's JSON writer prints them as
        floats in any block that holds such a null, so their number format depends on blocks."""
        found = []
        for key, node in self.fields.items():
            sub_path = f"{path}.{key}" if path else key
            if node.kind == "int" and (node.has_null or node.count < self.count):
                found.append(sub_path)
            found.extend(node.int_null_fields(sub_path))
        return found


@dataclass
class RowNormalizer:
    """Media-path and index normalization of one row, before the schema shape is applied."""

    media_keys: tuple[str, ...]
    index_key: str | None
    row_key: str
    added_keys: int = 0  # index keys added to rows that had none: not in the input text

    @classmethod
    def of(cls, plan: PreparePlan) -> RowNormalizer:
        """A fresh normalizer of the rows of a prepare's plan (pass one, its re-scan, pass two)."""
        return cls(tuple(plan.media_keys), plan.index_key, ROW_KEY)

    def normalize(self, row: dict[str, Any], base_dir: str, global_index: int, path: Path, lineno: int) -> dict[str, Any]:
        if self.row_key in row:
            raise InputError(f"field {self.row_key!r} is reserved by elastic-sharding", path, lineno)
        for key in self.media_keys:
            if key not in row:
                continue
            value = row[key]
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise InputError(f"field {key!r} must be a list of strings or null", path, lineno)
            row[key] = [absolute_media(v, base_dir) for v in value]
        if self.index_key is not None and row.get(self.index_key) is None:
            if self.index_key not in row:
                self.added_keys += 1
            row[self.index_key] = global_index
        return row


def absolute_media(value: str, base_dir: str) -> str:
    if value.startswith(URL_PREFIXES) or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(base_dir, value))
