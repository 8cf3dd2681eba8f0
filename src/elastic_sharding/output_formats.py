"""The formats `merge` publishes (JSONL, zstd-compressed JSONL, Parquet) and how one is chosen.

The format follows the `--output` name unless `--output-format` says otherwise; a flag that
contradicts the name is refused, since a `.jsonl` file that holds Parquet would mislead every
reader that picks files by suffix (Data-Juicer, Ray Data, Hugging Face `datasets`). A directory
output carries no suffix of its own: its parts do, and it is JSONL unless the flag says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from elastic_sharding.errors import UsageError
from elastic_sharding.layout import JobLayout
from elastic_sharding.records import SHARD_ID_RE

JSONL = "jsonl"
JSONL_ZST = "jsonl.zst"
PARQUET = "parquet"
FORMATS = (JSONL, JSONL_ZST, PARQUET)
_SUFFIX = {JSONL: ".jsonl", JSONL_ZST: ".jsonl.zst", PARQUET: ".parquet"}
# Name endings that say a format (checked in this order): `x.json.zst` is compressed JSON lines too.
_NAMED = (
    (".parquet", PARQUET),
    (".jsonl.zst", JSONL_ZST),
    (".json.zst", JSONL_ZST),
    (".zst", JSONL_ZST),
    (".jsonl", JSONL),
    (".json", JSONL),
)


def suffix(output_format: str) -> str:
    return _SUFFIX[output_format]


def _named(name: str) -> tuple[str, str] | None:
    """The ending of a file name that says a format, and the format; None for `out.txt`."""
    lowered = name.lower()
    return next(((ending, found) for ending, found in _NAMED if lowered.endswith(ending)), None)


def choose_format(output: str | os.PathLike[str] | None, requested: str | None, directory: bool) -> str:
    """The format to publish: `requested` (`--output-format`) if given, else the one the `--output`
    file name says, else JSONL. A requested format the file name contradicts is a UsageError."""
    if requested is not None and requested not in FORMATS:
        raise UsageError(f"--output-format {requested} is not one of {', '.join(FORMATS)}; choose one of them")
    if directory or output is None:
        return requested or JSONL
    text = os.fspath(output)
    named = _named(Path(text).name)
    if named is None or requested in (None, named[1]):
        return requested or (named[1] if named else JSONL)
    ending, found = named
    raise UsageError(
        f"--output {text} names a {found} file but --output-format is {requested}; name the output "
        f"{text[: -len(ending)]}{suffix(requested)}, or leave --output-format out to publish {found}"
    )


def default_output(layout: JobLayout, output_format: str) -> Path:
    """The output of a launcher run without `--output`: the job's `merged.jsonl`, with the format's suffix."""
    base = layout.default_output
    return base.with_name(base.name.removesuffix(suffix(JSONL)) + suffix(output_format))


def default_outputs(layout: JobLayout) -> list[Path]:
    return [default_output(layout, output_format) for output_format in FORMATS]


def part_name(shard_id: str, output_format: str = JSONL) -> str:
    """A shard's file in a directory output: names sort in manifest order, as shard ids do."""
    return f"{shard_id}{suffix(output_format)}"


def is_part_name(name: str) -> bool:
    """Whether `name` is a part file of a directory output, in any format."""
    return any(name.endswith(end) and SHARD_ID_RE.match(name[: -len(end)]) for end in _SUFFIX.values())
