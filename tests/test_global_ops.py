"""Each whole-dataset stage (global_ops/) in one process, against the operator's own `run` on one
Data-Juicer dataset of the same rows: the same rows, in the same order, with the same values, at
several shard counts (contiguous cuts, empty shards included). The claims are the real ones
(claims/units.py) in a temporary stage directory; only the rows are handed over in memory.
"""

from __future__ import annotations

import random

import orjson
import pytest
from support.global_corpus import global_rows
from support.global_ops_reference import data_juicer_rows, no_model_cleanup  # noqa: F401 - an autouse fixture

from elastic_sharding.errors import RecipeError
from elastic_sharding.global_ops.cooperate import GlobalParticipant
from elastic_sharding.global_ops.operators import StageContext
from elastic_sharding.global_ops.registry import build
from elastic_sharding.records import KeptShard


def cut(rows: list[dict], shards: int) -> list[list[dict]]:
    rng = random.Random(shards)
    edges = sorted(rng.randint(0, len(rows)) for _ in range(shards - 1))
    bounds = [0, *edges, len(rows)]
    return [rows[bounds[i] : bounds[i + 1]] for i in range(shards)]


def stage_rows(tmp_path, name: str, params: dict, rows: list[dict], shards: int, participants: int = 1) -> list[dict]:
    parts = cut(rows, shards)
    lines = [[orjson.dumps(r) for r in part] for part in parts]
    out: dict[int, list[bytes]] = {}

    def keep(index, produced):
        out[index] = list(produced)
        return KeptShard(f"keep-{index:05d}", f"s{index}", "a", "t", 0, "", len(out[index]), 0, "", "h", 1, 0.0, 0.0)

    root = tmp_path / f"{name}-{shards}"
    for _ in range(participants):
        ctx = StageContext(root, shards, 1 << 30)
        participant = GlobalParticipant(
            build(name, params),
            ctx,
            lambda i: ((line, orjson.loads(line)) for line in lines[i]),
            lambda: [len(p) for p in parts],
            keep,
            60,
            5,
            0.01,
        )
        participant.run()
    return [orjson.loads(line) for index in range(shards) for line in out[index]]


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return global_rows(240, seed=11)


CASES = [
    ("document_line_deduplicator", {"frequency_threshold": 6}),
    ("document_line_deduplicator", {"frequency_threshold": 1, "lowercase": True, "ignore_special_character": True}),
    ("topk_specified_field_selector", {"field_key": "meta.score", "top_ratio": 0.3}),
    ("topk_specified_field_selector", {"field_key": "meta.score", "topk": 17, "reverse": False}),
    ("topk_specified_field_selector", {"field_key": "rank", "top_ratio": 0.5, "topk": 40}),
    ("topk_specified_field_selector", {"field_key": "rank", "topk": 1000}),
    ("range_specified_field_selector", {"field_key": "meta.score", "lower_percentile": 0.2, "upper_percentile": 0.7}),
    ("range_specified_field_selector", {"field_key": "rank", "lower_rank": 13, "upper_rank": 101}),
    ("range_specified_field_selector", {"field_key": "rank", "lower_percentile": 0.5, "upper_rank": 30}),
    ("range_specified_field_selector", {"field_key": "rank", "lower_percentile": 0.1}),
    ("frequency_specified_field_selector", {"field_key": "topic", "top_ratio": 0.5}),
    ("frequency_specified_field_selector", {"field_key": "meta.tags.lang", "topk": 3, "reverse": False}),
    ("frequency_specified_field_selector", {"field_key": "rank", "top_ratio": 0.3, "topk": 4}),
    ("tags_specified_field_selector", {"field_key": "meta.tags.lang", "target_tags": ["en", "fr"]}),
    ("random_selector", {"select_ratio": 0.3}),
    ("random_selector", {"select_num": 31}),
    ("random_selector", {"select_ratio": 0.9, "select_num": 12}),
    ("key_value_grouper", {"group_by_keys": ["topic"]}),
    ("key_value_grouper", {"group_by_keys": ["topic", "meta.tags.lang"]}),
]


@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{i}" for i, (n, _p) in enumerate(CASES)])
def test_a_stage_gives_the_rows_of_one_data_juicer_run(tmp_path, corpus, name, params):
    expected = data_juicer_rows(name, params, corpus)
    for shards in (1, 4, 9):
        assert stage_rows(tmp_path, name, params, corpus, shards) == expected, (name, params, shards)


def test_the_line_deduplicator_removes_planted_boilerplate(tmp_path, corpus):
    rows = stage_rows(tmp_path, "document_line_deduplicator", {"frequency_threshold": 6}, corpus, 5)
    assert len(rows) == len(corpus)
    assert not any("All rights reserved" in r["text"] for r in rows)
    assert any("# Chapter" in r["text"] for r in rows), "skipped lines stay however frequent"
    assert any(r["text"] == "" for r in rows), "a document of boilerplate only is left empty, not dropped"


def test_a_grouped_dataset_reversed_is_the_rows_in_group_order(tmp_path, corpus):
    grouped = data_juicer_rows("key_value_grouper", {"group_by_keys": ["topic"]}, corpus)
    expected = data_juicer_rows("naive_reverse_grouper", {}, grouped)
    assert stage_rows(tmp_path, "naive_reverse_grouper", {}, grouped, 3) == expected
    assert sorted(r["id"] for r in expected) == list(range(len(corpus)))


def test_two_participants_share_a_stage_and_agree(tmp_path, corpus):
    params = {"field_key": "rank", "top_ratio": 0.4}
    expected = data_juicer_rows("topk_specified_field_selector", params, corpus)
    assert stage_rows(tmp_path, "topk_specified_field_selector", params, corpus, 6, participants=2) == expected


def test_one_row_is_left_as_it_is(tmp_path, corpus):
    params = {"field_key": "rank", "topk": 0}
    assert stage_rows(tmp_path, "range_specified_field_selector", params, corpus[:1], 2) == corpus[:1]


@pytest.mark.parametrize(
    ("name", "params", "row", "message"),
    [
        ("topk_specified_field_selector", {"field_key": "topic", "topk": 3}, {"topic": "x"}, "only numbers"),
        ("topk_specified_field_selector", {"field_key": "meta.score", "topk": 3}, {"meta": {"score": "nan"}}, "NaN"),
        (
            "tags_specified_field_selector",
            {"field_key": "meta.lang", "target_tags": ["en"]},
            {"meta": {}},
            "has no field meta.lang",
        ),
        (
            "frequency_specified_field_selector",
            {"field_key": "meta", "topk": 1},
            {"meta": {"a": 1}},
            "not a string, number or null",
        ),
        ("naive_reverse_grouper", {}, {"text": "not grouped"}, "put a grouper before"),
    ],
)
def test_a_row_the_operator_cannot_take_is_named(tmp_path, name, params, row, message):
    rows = [{"rank": 1, "topic": "a", "meta": {"lang": "en", "score": 1}, "text": ["a"]}, row]
    with pytest.raises(RecipeError, match=message):
        stage_rows(tmp_path, name, params, rows, 2)


def test_naive_reverse_grouper_refuses_a_batch_meta_export_path():
    with pytest.raises(RecipeError, match="batch_meta_export_path"):
        build("naive_reverse_grouper", {"batch_meta_export_path": "/tmp/x.jsonl"})
