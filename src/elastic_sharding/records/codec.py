"""The JSON encoding of records: format constants, the id patterns, encode and validated decode.

Every record is written whole (create-once or atomic replace, see `fsops`), so a reader sees
either nothing or a complete record. Decoding validates types and names the file on error, and
every field that becomes part of a path (shard and attempt ids, tokens) against its pattern, so a
record can never lead the tool outside the job directory.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import orjson

from elastic_sharding import confined
from elastic_sharding.errors import JobStateError

FORMAT_VERSION = 1
ROW_KEY = "__elastic_row__"
SHARD_ID_RE = re.compile(r"^part-(\d{5})-of-(\d{5})$")
ATTEMPT_ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9_.-]{1,80}-[0-9a-f]{8}$")
TOKEN_RE = re.compile(r"^[0-9a-f]{32}$")
# Fields that name files or directories (attempt dirs, stale-lock names); checked on every decode.
PATH_FIELDS = {
    "shard_id": ("shard id", SHARD_ID_RE),
    "attempt_id": ("attempt id", ATTEMPT_ID_RE),
    "last_attempt_id": ("attempt id", ATTEMPT_ID_RE),
    "token": ("token", TOKEN_RE),
    "by_token": ("token", TOKEN_RE),
}

R = TypeVar("R")


def shard_id_for(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def encode(record: Any) -> bytes:
    return orjson.dumps(dataclasses.asdict(record), option=orjson.OPT_INDENT_2) + b"\n"


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        (item_tp,) = typing.get_args(tp)
        return [_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """Resolving annotations costs more than decoding a small record, and workers decode many."""
    return typing.get_type_hints(cls)


def from_dict(cls: type[R], data: Any, where: str = "record") -> R:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object")
    hints = _type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            value = kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
            checked = PATH_FIELDS.get(f.name)
            if checked is not None and isinstance(value, str) and not checked[1].match(value):
                raise ValueError(f"{where}.{f.name}: {value!r} is not a valid {checked[0]}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: missing field {f.name!r}")
    return cls(**kwargs)


def decode(cls: type[R], data: bytes, path: Path | str) -> R:
    """Decode a record; a malformed one raises ValueError naming `path` (retried by readers)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return from_dict(cls, obj, str(path))


def load(cls: type[R], path: Path) -> R:
    """Read a required record; a missing, corrupt or symlinked one is a job-state error."""
    try:
        return decode(cls, confined.read_bytes_nofollow(path), path)
    except FileNotFoundError:
        raise JobStateError(f"{path}: missing; the job directory is incomplete: restore it, or prepare a new --job-dir") from None
    except confined.LinkRefused as exc:
        raise JobStateError(str(exc)) from None
    except ValueError as exc:
        raise JobStateError(f"corrupt record {exc}; restore it, or prepare a new --job-dir") from None
