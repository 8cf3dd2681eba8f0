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

from elastic_sharding.dedup import arrays
from elastic_sharding.errors import RecipeError
from elastic_sharding.global_ops import selectors
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
    return run_stage(tmp_path, name, params, rows, shards, participants)[0]


def run_stage(
    tmp_path, name: str, params: dict, rows: list[dict], shards: int, participants: int = 1
) -> tuple[list[dict], GlobalParticipant]:
    """The rows kept, in order, and the (last) participant, whose context and operator read the
    stage's files."""
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
    return [orjson.loads(line) for index in range(shards) for line in out[index]], participant


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


def sources_listed(participant: GlobalParticipant) -> list[list[int]]:
    """The shards each keep unit gathers from, checked to be exactly those whose placements hold
    rows for it."""
    ctx, op = participant.ctx, participant.op
    listed = [op.sources(ctx, target) for target in range(ctx.num_shards)]
    placed = [
        [s for s in range(ctx.num_shards) if len(arrays.read(ctx.shard_file("place", s, ".idx"), target))]
        for target in range(ctx.num_shards)
    ]
    assert listed == placed
    return listed


RANKING = [case for case in CASES if case[0] in ("topk_specified_field_selector", "range_specified_field_selector")]


@pytest.mark.parametrize(("name", "params"), RANKING, ids=[f"{n}-{i}" for i, (n, _p) in enumerate(RANKING)])
def test_a_ranking_selector_ranked_in_many_buckets_units_gives_the_same_rows(tmp_path, corpus, monkeypatch, name, params):
    """Each buckets unit ranks one range of global ranks; ranges end inside runs of equal values
    (the corpus is full of ties), so the rows of one value are ranked by two units or more."""
    monkeypatch.setattr(selectors, "RANKED_PER_UNIT", 7)
    expected = data_juicer_rows(name, params, corpus)
    for shards in (4, 9):
        rows, participant = run_stage(tmp_path, name, params, corpus, shards)
        assert participant.op.reduce_count(participant.ctx) == 35
        assert rows == expected, (name, params, shards)
        sources_listed(participant)


# Reordering operators, and whether a keep unit must gather from several shards (`many`) and a
# shard of the next segment is left without rows (`none`) at 9 shards.
SOURCES_CASES = [
    ("topk_specified_field_selector", {"field_key": "rank", "top_ratio": 0.3}, True, False),
    ("topk_specified_field_selector", {"field_key": "meta.score", "topk": 5, "reverse": False}, False, True),
    ("topk_specified_field_selector", {"field_key": "rank"}, False, False),  # nothing selected away: in place
    ("range_specified_field_selector", {"field_key": "meta.score", "lower_rank": 3, "upper_rank": 40}, True, False),
    ("range_specified_field_selector", {"field_key": "rank", "lower_rank": 100, "upper_rank": 104}, False, True),
    ("frequency_specified_field_selector", {"field_key": "topic", "topk": 2}, True, False),
    ("frequency_specified_field_selector", {"field_key": "meta.tags.lang", "topk": 1, "reverse": False}, True, False),
    ("random_selector", {"select_num": 7}, False, True),
    ("random_selector", {"select_ratio": 0.5}, True, False),
    ("key_value_grouper", {"group_by_keys": ["topic"]}, True, True),
]


@pytest.mark.parametrize(
    ("name", "params", "many", "none"), SOURCES_CASES, ids=[f"{n}-{i}" for i, (n, *_rest) in enumerate(SOURCES_CASES)]
)
def test_a_keep_unit_opens_exactly_the_shards_that_give_it_rows(tmp_path, corpus, name, params, many, none):
    """Each keep unit gathers only from the shards its source list names (so a stage opens about
    a file per shard, not one per pair of shards): a source missing from it would lose that
    source's rows, so the list must be exactly the placements holding rows for the shard. And a
    unit done twice writes the same bytes, as a unit taken over after a crash does."""
    shards = 9
    rows, participant = run_stage(tmp_path / "a", name, params, corpus, shards)
    assert rows == data_juicer_rows(name, params, corpus)
    ctx = participant.ctx
    listed = sources_listed(participant)
    assert any(len(sources) >= 2 for sources in listed) == many, listed
    assert any(not sources for sources in listed) == none, listed
    _again, other = run_stage(tmp_path / "b", name, params, corpus, shards)
    written = {path.relative_to(ctx.data()): path.read_bytes() for path in ctx.data().rglob("*") if path.is_file()}
    again = {path.relative_to(other.ctx.data()): path.read_bytes() for path in other.ctx.data().rglob("*") if path.is_file()}
    assert written == again


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
