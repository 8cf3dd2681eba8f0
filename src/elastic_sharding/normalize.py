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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

URL_PREFIXES = ("http://", "https://", "s3://", "gs://", "hdfs://")

_KIND_NAMES = {
    "bool": "a boolean",
    "int": "a number",
    "float": "a number",
    "str": "a string",
    "dict": "an object",
    "list": "a list",
}


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


@dataclass
class SchemaNode:
    """Union type of one JSON path over the whole input."""

    kind: str = "null"
    origin: str = ""
    fields: dict[str, SchemaNode] = field(default_factory=dict)
    item: SchemaNode | None = None
    count: int = 0
    has_null: bool = False

    def add(self, value: Any, path: str, origin: str) -> None:
        kind = _kind(value)
        if kind == "null":
            self.has_null = True
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
            row[key] = [_absolute_media(v, base_dir) for v in value]
        if self.index_key is not None and row.get(self.index_key) is None:
            row[self.index_key] = global_index
        return row


def _absolute_media(value: str, base_dir: str) -> str:
    if value.startswith(URL_PREFIXES) or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(base_dir, value))
