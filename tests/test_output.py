"""Collecting Ray's part files into one ordered, validated processed.jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_sharding.errors import AttemptFailed
from elastic_sharding.work.collect import collect


def parts(tmp_path: Path, *contents: bytes) -> Path:
    out = tmp_path / "ray-output.jsonl"
    out.mkdir()
    for i, body in enumerate(contents):
        (out / f"p_{i:06d}.json").write_bytes(body)
    return out


def test_parts_out_of_order_are_merged_by_row_index_and_the_key_removed(tmp_path):
    out = parts(
        tmp_path,
        b'{"__elastic_row__":12,"t":"c"}\n{"__elastic_row__":13,"t":"d"}\n',
        b'{"__elastic_row__":10,"t":"a"}\n{"__elastic_row__":11,"t":"b"}\n',
    )
    stats = collect(out, tmp_path / "processed.jsonl", 10, 4)
    assert (tmp_path / "processed.jsonl").read_bytes() == b'{"t":"a"}\n{"t":"b"}\n{"t":"c"}\n{"t":"d"}\n'
    assert stats.rows == 4 and stats.bytes == 40


def test_expanding_mapper_keeps_row_order_and_key_anywhere_in_the_row(tmp_path):
    out = parts(
        tmp_path,
        b'{"t":"b1","__elastic_row__":1}\n{"t":"b2","__elastic_row__":1}\n',
        b'{"__elastic_row__":0,"t":"a"}\n',
    )
    collect(out, tmp_path / "p.jsonl", 0, 2)
    assert (tmp_path / "p.jsonl").read_bytes() == b'{"t":"a"}\n{"t":"b1"}\n{"t":"b2"}\n'


def test_unordered_part_falls_back_to_a_full_sort(tmp_path):
    out = parts(tmp_path, b'{"__elastic_row__":1,"t":"b"}\n{"__elastic_row__":0,"t":"a"}\n')
    collect(out, tmp_path / "p.jsonl", 0, 2)
    assert (tmp_path / "p.jsonl").read_bytes() == b'{"t":"a"}\n{"t":"b"}\n'


def test_everything_filtered_is_an_empty_file(tmp_path):
    (tmp_path / "ray-output.jsonl").write_bytes(b"")
    stats = collect(tmp_path / "ray-output.jsonl", tmp_path / "p.jsonl", 0, 5)
    assert stats.rows == 0 and (tmp_path / "p.jsonl").read_bytes() == b""


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"t":"no index"}\n', "lost the ordering field"),
        (b'{"__elastic_row__":99,"t":"x"}\n', "outside this shard"),
        (b'{"__elastic_row__":0,"t":\n', "output"),
        (b"[1]\n", "not a JSON object"),
    ],
)
def test_bad_output_fails_the_attempt(tmp_path, body, message):
    out = parts(tmp_path, body)
    with pytest.raises(AttemptFailed, match=message):
        collect(out, tmp_path / "p.jsonl", 0, 2)
    assert not (tmp_path / "p.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ray-output.jsonl"]


def test_missing_output_fails_the_attempt(tmp_path):
    with pytest.raises(AttemptFailed, match="produced no output"):
        collect(tmp_path / "nothing", tmp_path / "p.jsonl", 0, 1)
