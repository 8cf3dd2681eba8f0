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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from elastic_sharding import confined
from elastic_sharding.errors import JobStateError

FORMAT_VERSION = 1
ROW_KEY = "__elastic_row__"
# What a `--analyze` job keeps of each row: dj-analyze's stats export holds exactly Data-Juicer's
# statistics and meta fields (`Fields.stats`, `Fields.meta`), in this order.
STATS_EXPORT_FIELDS = ("__dj__stats__", "__dj__meta__")
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
    "of_token": ("token", TOKEN_RE),
    "of_attempt_id": ("attempt id", ATTEMPT_ID_RE),
    "backup_of": ("attempt id", ATTEMPT_ID_RE),
}

R = TypeVar("R")


MAX_SHARDS = 99_999  # shard ids carry five digits: part-NNNNN-of-NNNNN


def shard_id_for(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def encode(record: Any) -> bytes:
    """orjson writes dataclasses itself (their fields, in order), without `asdict`'s deep copy of
    a manifest or cut of 20,000 shards."""
    return orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n"


class _Bad(ValueError):
    """A value that does not fit its type, and where it is below the record being decoded."""

    def __init__(self, message: str, path: str = ""):
        super().__init__(message)
        self.message = message
        self.path = path

    def under(self, step: str) -> _Bad:
        self.path = step + self.path
        return self


Convert = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


@functools.cache
def _converter(tp: Any) -> Convert:
    """The checking conversion of a value of type `tp`, built once per type: decoding a large
    record (a manifest or a cut of 20,000 shards) then costs one call per value, not a walk of
    the type's annotations for every element."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = _converter(next(a for a in args if a is not type(None)))
        if type(None) not in args:
            return inner

        def optional(value: Any) -> Any:
            return None if value is None else inner(value)

        return optional
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = _list_converter(_converter(item_tp))
        if item_tp not in (int, str, bool):
            return items

        def plain(value: Any) -> Any:
            if type(value) is list and all(type(v) is item_tp for v in value):
                return value
            return items(value)

        return plain
    if origin is dict:

        def mapping(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Bad("expected an object")
            return value

        return mapping
    if dataclasses.is_dataclass(tp):
        return _record_converter(tp)
    if tp is Any:
        return _identity
    if tp is float:

        def real(value: Any) -> Any:
            if type(value) is float:
                return value
            if type(value) is int:
                return float(value)
            raise _Bad(f"expected float, got {type(value).__name__}")

        return real

    def leaf(value: Any) -> Any:
        if type(value) is tp or (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
            return value
        raise _Bad(f"expected {tp.__name__}, got {type(value).__name__}")

    return leaf


def _list_converter(item: Convert) -> Convert:
    def items(value: Any) -> Any:
        if not isinstance(value, list):
            raise _Bad("expected a list")
        try:
            return [item(v) for v in value]
        except _Bad as exc:
            for i, v in enumerate(value):  # only on error: which element it was
                try:
                    item(v)
                except _Bad:
                    raise exc.under(f"[{i}]") from None
            raise

    return items


def _record_converter(cls: type) -> Convert:
    plan: list[tuple[str, Convert, bool, tuple[str, re.Pattern[str]] | None]] = []

    def record(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _Bad("expected an object")
        if not plan:  # built on first use: a record type may refer to itself
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                plan.append((f.name, _converter(hints[f.name]), required, PATH_FIELDS.get(f.name)))
        kwargs = {}
        for name, convert, required, checked in plan:
            if name in value:
                try:
                    got = kwargs[name] = convert(value[name])
                except _Bad as exc:
                    raise exc.under(f".{name}") from None
                if checked is not None and isinstance(got, str) and not checked[1].match(got):
                    raise _Bad(f"{got!r} is not a valid {checked[0]}", f".{name}")
            elif required:
                raise _Bad(f"missing field {name!r}")
        return cls(**kwargs)

    return record


def from_dict(cls: type[R], data: Any, where: str = "record") -> R:
    try:
        return _converter(cls)(data)
    except _Bad as exc:
        raise ValueError(f"{where}{exc.path}: {exc.message}") from None


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
