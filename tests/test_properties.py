"""Property tests.

- Validation: prepare's first pass (reader, parser, normalizer, schema, duplicate keys) on any
  bytes either accepts them or raises an `InputError` whose one-line message starts with the
  file and the 1-based number of the first bad line (checked against an independent validator,
  and against the exact line where a bad one was injected among good ones), whatever the read
  block size.
- Round trip: any accepted input splits into exactly n contiguous non-empty shards and comes back
  through prepare -> passthrough processing -> merge in the canonical form computed here
  independently (union of fields in first-seen order, missing fields null, ints widened to floats
  where a field also holds floats, compact JSON); input already in that form comes back byte for
  byte.

CI runs a modest number of examples; `HYPOTHESIS_PROFILE=long` runs 20 times more (manual runs).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.fakes import FakeRunner
from support.jobs import SIMPLE_RECIPE, fast_settings

import elastic_sharding.prepare.scan as scan_mod
import elastic_sharding.prepare.units as units_mod
from elastic_sharding.errors import InputError
from elastic_sharding.finish.merge import merge
from elastic_sharding.layout import JobLayout
from elastic_sharding.prepare.job import PrepareRequest, prepare
from elastic_sharding.prepare.jsonl import HashingLineReader, Offload
from elastic_sharding.prepare.normalize import RowNormalizer
from elastic_sharding.prepare.recipe import Recipe, load_recipe
from elastic_sharding.records import ROW_KEY
from elastic_sharding.work.worker import Worker, WorkerOptions

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", parent=settings.get_profile("ci"))
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """`n` examples in CI, 20 times as many under HYPOTHESIS_PROFILE=long."""
    return n * 20 if PROFILE == "long" else n


MEDIA_KEYS = ("images", "audios", "videos")
BLOCK_SIZES = st.sampled_from([1, 2, 3, 7, 64, 4096, 1 << 20])

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
# Keys that look like the ends of other keys once escaped: quotes, colons, backslashes, spaces.
tricky = st.sampled_from(['a"', 'b":', " :", 'x\\"', "k:", '\\":', ""])
keys = st.one_of(texts.filter(lambda k: k not in MEDIA_KEYS and k != ROW_KEY), tricky)


# ---- validation ---------------------------------------------------------------------------


def scan(path: Path, block_size: int, max_line: int = 1 << 20) -> None:
    """Prepare's first pass over one file, reading it in blocks of `block_size` bytes."""
    reader = partial(HashingLineReader, block_size=block_size)
    with mock.patch.object(scan_mod, "HashingLineReader", reader), Offload() as offload:
        scan_mod.scan_files([path], {path: str(path.parent)}, RowNormalizer(MEDIA_KEYS, None, ROW_KEY), offload, max_line)
        offload.drain()


class _Repeated(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise _Repeated
    return dict(pairs)


def _refuse(name: str) -> Any:
    raise ValueError(name)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _sound(value: Any) -> bool:
    """No infinite float (1e400) and no lone surrogate (the standard parser lets both through)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_sound(k) and _sound(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_sound(v) for v in value)
    return True


def independently_bad(line: bytes, lineno: int) -> bool:
    """Whether `line` alone breaks the input rules, judged with the standard library only."""
    if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
        return True
    try:
        value = json.loads(line.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return True
    return not isinstance(value, dict) or not _sound(value) or _depth(value) > 254


def split_lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def error_line(exc: InputError, path: Path) -> int:
    message = str(exc)
    assert "\n" not in message, message
    match = re.match(re.escape(str(path)) + r":(\d+): ", message)
    assert match, message
    return int(match.group(1))


JSONISH = [b"{", b"}", b"[", b"]", b'"a"', b'"b"', b":", b",", b"1", b"-2.5e3", b"null", b"true", b" ", b"\r", b"\n"]
JSONISH += [b"NaN", b"-Infinity", b'"\\"', b'"\\u00e9"', b'"\\ud800"', b"\xff", b"\xef\xbb\xbf", b"\t", b"\x00", b'"images"']
jsonish = st.lists(st.sampled_from(JSONISH), max_size=60).map(b"".join)


@settings(max_examples=examples(300))
@given(data=st.one_of(st.binary(max_size=200), jsonish), block_size=BLOCK_SIZES)
def test_any_bytes_are_accepted_or_refused_at_the_first_bad_line(data, block_size):
    with tempfile.TemporaryDirectory(prefix="es-prop-") as tmp:
        path = Path(tmp) / "d.jsonl"
        path.write_bytes(data)
        lines = split_lines(data)
        first_bad = next((n for n, line in enumerate(lines, 1) if independently_bad(line, n)), None)
        try:
            scan(path, block_size)
        except InputError as exc:
            n = error_line(exc, path)
            assert first_bad is not None or "field" in str(exc), str(exc)
            assert n == first_bad or (n < (first_bad or n + 1) and "field" in str(exc)), (str(exc), first_bad)
        else:
            assert first_bad is None, lines


# Good rows share one type per field so that only the injected line is bad.
good_rows = st.fixed_dictionaries(
    {},
    optional={
        "text": texts,
        "n": st.integers(-(2**63), 2**64 - 1),
        "f": st.floats(allow_nan=False, allow_infinity=False),
        "m": st.fixed_dictionaries({}, optional={"x": texts, 'q":': st.booleans(), "y": st.lists(st.integers(0, 9))}),
        "l": st.lists(st.fixed_dictionaries({}, optional={"k": st.none() | st.integers(0, 9), " :": texts})),
        "z": st.none(),
    },
)
SEPARATORS = [(",", ":"), (", ", ": "), (" , ", " : "), (",\t", "\t:\t"), ("\r,", "\r:")]


def dump(value: Any, seps: tuple[str, str], ascii_only: bool) -> str:
    """JSON text of `value`, where an object may be a list of (key, value) pairs (to repeat keys)."""
    if isinstance(value, Pairs):
        return (
            "{"
            + seps[0].join(json.dumps(k, ensure_ascii=ascii_only) + seps[1] + dump(v, seps, ascii_only) for k, v in value)
            + "}"
        )
    if isinstance(value, dict):
        return dump(Pairs(value.items()), seps, ascii_only)
    if isinstance(value, list):
        return "[" + seps[0].join(dump(v, seps, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


class Pairs(list):
    pass


def repeat_a_key(row: dict[str, Any], where: int) -> Pairs:
    """`row` with one key repeated: in the row itself, or in its nested object `m`."""
    pairs = Pairs(row.items())
    if where == 1:
        pairs.append(("m", Pairs([("x", "1"), ("x", "2")])))
    elif pairs:
        pairs.append((pairs[0][0], pairs[0][1]))
    else:
        pairs = Pairs([("text", "a"), ("text", "b")])
    return pairs


BAD_KINDS = {
    "truncated": r"malformed JSON|blank line|invalid UTF-8",  # a cut may split a character
    "repeated key": r"duplicate key '(m\.x|.*)'",
    "nan": r"malformed JSON: (NaN|Infinity|-Infinity) is not a JSON number",
    "garbage after": r"malformed JSON: unexpected content after document",
    "array": r"row is an array, not a JSON object",
    "number": r"row is a number, not a JSON object",
    "invalid utf-8": r"invalid UTF-8 at byte \d+",
    "blank": r"blank line",
    "type conflict": r"field c is a string here but a number at .*d.jsonl:1",
    "reserved": r"field '__elastic_row__' is reserved",
    "media": r"field 'images' must be a list of strings or null",
    "too long": r"line is \d+ bytes, over the limit of \d+",
    "too deep": r"nested too deeply",
}


@settings(max_examples=examples(300))
@given(
    rows=st.lists(good_rows, min_size=1, max_size=12),
    position=st.integers(0, 12),
    kind=st.sampled_from(sorted(BAD_KINDS)),
    seps=st.sampled_from(SEPARATORS),
    ascii_only=st.booleans(),
    crlf=st.booleans(),
    block_size=BLOCK_SIZES,
    data=st.data(),
)
def test_an_injected_bad_line_is_named_exactly(rows, position, kind, seps, ascii_only, crlf, block_size, data):
    good = [b'{"c": 1}'] + [dump(row, seps, ascii_only).encode() for row in rows]
    # Only "too long" runs under a limit just over the good lines (a CR included).
    max_line = max(map(len, good)) + 1 + data.draw(st.integers(0, 50)) if kind == "too long" else 1 << 20
    base = data.draw(st.sampled_from(good))
    bad = {
        "truncated": lambda: base[: data.draw(st.integers(0, len(base) - 1))],
        "repeated key": lambda: dump(repeat_a_key(orjson.loads(base), data.draw(st.integers(0, 1))), seps, ascii_only).encode(),
        "nan": lambda: (
            base[:-1]
            + (b", " if base != b"{}" else b"")
            + b'"v": '
            + data.draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"]))
            + b"}"
        ),
        "garbage after": lambda: base + data.draw(st.sampled_from([b" x", b"{}", b"1", b",", b"]"])),
        "array": lambda: b"[" + base + b"]",
        "number": lambda: b"42",
        "invalid utf-8": lambda: (
            b'{"text": "' + data.draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82"])) + b'"}'
        ),
        "blank": lambda: data.draw(st.sampled_from([b"", b" ", b"\t", b"\r"])),
        "type conflict": lambda: b'{"c": "one"}',
        "reserved": lambda: b'{"__elastic_row__": 1}',
        "media": lambda: b'{"images": "one.jpg"}',
        "too long": lambda: b'{"text": "' + b"x" * max_line + b'"}',
        "too deep": lambda: b'{"d": ' + b"[" * 300 + b"]" * 300 + b"}",
    }[kind]()
    at = 1 + min(position, len(good) - 1)  # 0-based index of the bad line; never the first line
    lines = good[:at] + [bad] + good[at:]
    end = b"\r\n" if crlf else b"\n"
    last_empty = at == len(lines) - 1 and bad == b""  # without a newline after it, it is no line at all
    payload = end.join(lines) + (end if last_empty else data.draw(st.sampled_from([end, b""])))
    with tempfile.TemporaryDirectory(prefix="es-prop-") as tmp:
        path = Path(tmp) / "d.jsonl"
        path.write_bytes(payload)
        try:
            scan(path, block_size, max_line)
        except InputError as exc:
            assert error_line(exc, path) == at + 1, (str(exc), lines)
            assert re.search(BAD_KINDS[kind], str(exc)), str(exc)
        else:
            raise AssertionError(f"accepted a {kind} line at {at + 1}: {lines}")


def test_good_lines_with_tricky_keys_and_spacing_are_accepted(tmp_path):
    """Colons, quotes and spaces in keys and strings, any JSON whitespace: never a false duplicate."""
    rows = [{'a":': 1, " :": {'\\":': 'x": y', "k : v": [{'"': 1}]}, "t": 'say \\" : "hi"'}, {"t": "Remarque : oui"}]
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(dump(row, seps, a).encode() for row in rows for seps in SEPARATORS for a in (True, False)))
    for block_size in (1, 5, 1 << 20):
        scan(path, block_size)


# ---- round trip ---------------------------------------------------------------------------

SCALAR_KINDS = {
    "str": texts,
    "int": st.integers(-(2**63), 2**63 - 1),
    "number": st.one_of(st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False)),
    "bool": st.booleans(),
    "null": st.none(),
}


def field_specs(depth: int) -> st.SearchStrategy[Any]:
    """A field's type: a scalar kind, ("obj", {key: spec}) or ("list", spec)."""
    scalar = st.sampled_from(sorted(SCALAR_KINDS))
    if depth == 0:
        return scalar
    inner = field_specs(depth - 1)
    return st.one_of(
        scalar,
        st.tuples(st.just("obj"), st.dictionaries(keys, inner, max_size=4)),
        st.tuples(st.just("list"), inner),
    )


def values_of(spec: Any) -> st.SearchStrategy[Any]:
    if isinstance(spec, str):
        return SCALAR_KINDS[spec]
    kind, sub = spec
    if kind == "list":
        return st.none() | st.lists(values_of(sub), max_size=3)
    return st.none() | objects_of(sub)


def objects_of(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any subset of the schema's fields, in any order."""
    names = sorted(schema)
    chosen = st.lists(st.sampled_from(names), unique=True) if names else st.just([])
    return chosen.flatmap(lambda ks: st.tuples(*(values_of(schema[k]) for k in ks)).map(lambda vs, ks=ks: dict(zip(ks, vs))))


@st.composite
def datasets(draw: st.DrawFn) -> list[dict[str, Any]]:
    schema = draw(st.dictionaries(keys, field_specs(2), max_size=6))
    return draw(st.lists(objects_of(schema), min_size=1, max_size=20))


class Shape:
    """The union of all values seen at one place, for the expected canonical form."""

    def __init__(self) -> None:
        self.fields: dict[str, Shape] = {}
        self.item: Shape | None = None
        self.floats = False

    def learn(self, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                self.fields.setdefault(key, Shape()).learn(sub)
        elif isinstance(value, list):
            self.item = self.item or Shape()
            for sub in value:
                self.item.learn(sub)
        elif isinstance(value, float):
            self.floats = True

    def canonical(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: shape.canonical(value.get(key)) for key, shape in self.fields.items()}
        if isinstance(value, list):
            return [self.item.canonical(v) for v in value] if self.item else value
        if self.floats and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value


def canonical_bytes(rows: list[dict[str, Any]]) -> bytes:
    shape = Shape()
    for row in rows:
        shape.learn(row)
    return b"".join(orjson.dumps(shape.canonical(row)) + b"\n" for row in rows)


_recipes: dict[bytes, Recipe] = {}


def load_recipe_once(path: Path, base: Path) -> Recipe:
    """Validating a recipe runs Data-Juicer's config parser (0.4 s, most of a round trip): these
    tests are about data, so each recipe text is validated once."""
    text = path.read_bytes()
    if text not in _recipes:
        _recipes[text] = load_recipe(path, base)
    return copy.deepcopy(_recipes[text])


def roundtrip(dataset_bytes: bytes, shards: int) -> bytes:
    tmp = Path(tempfile.mkdtemp(prefix="es-prop-"))
    try:
        dataset = tmp / "in.jsonl"
        dataset.write_bytes(dataset_bytes)
        recipe = tmp / "recipe.yaml"
        recipe.write_text(SIMPLE_RECIPE.format(dataset="given-in-the-request.jsonl"))
        job = tmp / "job"
        with mock.patch.object(units_mod, "load_recipe", load_recipe_once):
            manifest = prepare(PrepareRequest(recipe, dataset, job, shards, fast_settings()), quiet=True).manifest
        assert len(manifest.shards) == shards
        assert all(s.rows >= 1 for s in manifest.shards)
        assert [s.first_row for s in manifest.shards] == [sum(x.rows for x in manifest.shards[:i]) for i in range(shards)]
        for spec in manifest.shards:
            indices = [orjson.loads(line)[ROW_KEY] for line in (job / spec.path).read_bytes().splitlines()]
            assert indices == list(range(spec.first_row, spec.first_row + spec.rows))
        assert Worker(job, WorkerOptions(), runner=FakeRunner()).run() == 0
        out = tmp / "out.jsonl"
        merge(job, out, quiet=True)
        assert JobLayout(job).merge_record.exists()
        return out.read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@settings(max_examples=examples(100))
@given(
    rows=datasets(),
    canonical=st.booleans(),
    seps=st.sampled_from(SEPARATORS),
    ascii_only=st.booleans(),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    cut=st.floats(0, 1),
)
@example(
    rows=[{"n": 1}, {"n": 2.5, "o": {"x": [1, 2.5]}}, {}],
    canonical=False,
    seps=(", ", ": "),
    ascii_only=True,
    crlf=True,
    final_newline=False,
    cut=0.5,
)
@example(
    rows=[{"m": {"a": 1}}, {"m": {"b": [1, None]}}, {"m": None}, {"m": {}}],
    canonical=True,
    seps=(",", ":"),
    ascii_only=False,
    crlf=False,
    final_newline=True,
    cut=1.0,
)
@example(
    rows=[{"l": [{"k": 1}, None]}, {"l": [{"j": "é"}, {"k": 2}]}, {"l": []}],
    canonical=False,
    seps=(" , ", " : "),
    ascii_only=False,
    crlf=False,
    final_newline=True,
    cut=0.0,
)
@example(
    rows=[{'a"': 'x": y', " :": {'\\":': True}}, {"": None, 'a"': "Remarque : oui"}],
    canonical=False,
    seps=("\r,", "\r:"),
    ascii_only=True,
    crlf=True,
    final_newline=True,
    cut=0.7,
)
def test_any_accepted_input_comes_back_in_canonical_form(rows, canonical, seps, ascii_only, crlf, final_newline, cut):
    expected = canonical_bytes(rows)
    if canonical:
        source = expected
    else:
        end = b"\r\n" if crlf else b"\n"
        source = end.join(dump(row, seps, ascii_only).encode() for row in rows) + (end if final_newline else b"")
    shards = 1 + round(cut * (len(rows) - 1))
    assert roundtrip(source, shards) == expected


texts_200 = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)
# Rows already in prepare's canonical shape (one key order, compact JSON) come back byte for byte.
rows_strategy = st.lists(
    st.builds(lambda t, n: {"text": t, "n": n}, texts_200, st.integers(-(2**53), 2**53)), min_size=1, max_size=25
)


@settings(max_examples=examples(20))
@given(rows=rows_strategy, data=st.data())
def test_split_and_passthrough_roundtrip(rows, data):
    shards = data.draw(st.integers(1, len(rows)))
    dataset = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    assert roundtrip(dataset, shards) == dataset
