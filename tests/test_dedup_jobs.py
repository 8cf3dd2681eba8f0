"""Whole recipes with deduplicators, end to end: real Data-Juicer on a real local Ray per worker,
workers as separate processes with their own hostnames, the merged rows against one `dj-process`
run with Data-Juicer's default executor (tests/support/dj_default_run.py).

Prose with about 10 % planted exact, surface and near duplicates of rows anywhere before them
(tests/support/dedup_corpus.py), so most duplicates cross shard boundaries.
"""

from __future__ import annotations

import orjson
import pytest
from support.dedup_corpus import prose_rows
from support.dj_default_run import dj_default_rows
from support.e2e_support import needs_unshare, run_on_nodes
from support.exhaustive import exhaustive_only

pytestmark = [pytest.mark.e2e, needs_unshare]

# Three segments: nothing before the exact deduplicator, a mapper and a filter between the two,
# nothing after the simhash deduplicator (the Alpaca-CoT recipes' shape).
EXACT_THEN_SIMHASH = """\
project_name: exact-then-simhash
np: 1
text_keys: text
process:
  - document_deduplicator:
      lowercase: true
      ignore_non_character: true
  - whitespace_normalization_mapper:
  - text_length_filter:
      min_len: 30
  - document_simhash_deduplicator:
      tokenization: space
      window_size: 3
      lowercase: true
      num_blocks: 6
      hamming_distance: 4
"""

# Two segments with operators on both sides of the minhash deduplicator.
MINHASH = """\
project_name: minhash
np: 1
text_keys: text
process:
  - text_length_filter:
      min_len: 10
  - document_minhash_deduplicator:
      tokenization: space
      window_size: 3
      jaccard_threshold: 0.7
      num_permutations: 128
  - words_num_filter:
      min_num: 8
"""

ROWS = 700


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("dedup-corpus")
    data = root / "prose.jsonl"
    data.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in prose_rows(ROWS, seed=25)))
    return data


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """One default-executor run per recipe, computed once."""
    cache: dict[str, list[dict]] = {}

    def rows(name: str, text: str) -> list[dict]:
        if name not in cache:
            root = tmp_path_factory.mktemp(f"reference-{name}")
            recipe = root / "recipe.yaml"
            recipe.write_text(text)
            cache[name] = dj_default_rows(recipe, corpus, root / "run", np=2)
        return cache[name]

    return rows


def run_job(tmp_path, corpus, recipe_text: str, shards: int, workers: int) -> tuple[list[dict], dict]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text)
    return run_on_nodes(tmp_path, recipe, corpus, shards, workers, name="dedup-node")


@exhaustive_only  # CI: the pile-europarl and status-stages runs cover exact and simhash jobs
@pytest.mark.parametrize(("shards", "workers"), [(3, 1), (8, 3)])
def test_exact_first_simhash_last_keeps_the_rows_data_juicer_keeps(tmp_path, corpus, reference, shards, workers):
    expected = reference("exact-then-simhash", EXACT_THEN_SIMHASH)
    assert ROWS * 0.75 < len(expected) < ROWS * 0.97, "the corpus must have duplicates for both deduplicators to drop"
    rows, status = run_job(tmp_path, corpus, EXACT_THEN_SIMHASH, shards, workers)
    assert rows == expected
    assert status["complete"] and status["exit_code"] == 0 and [s["state"] for s in status["stages"]] == ["done", "done"]
    job = tmp_path / "job"
    assert sorted(p.name for p in (job / "stages").iterdir()) == ["1", "2"]
    # segment 0 and 2 have no operators: no attempt ran there; segment 1 ran every shard
    assert not (job / "attempts").exists() or not any((job / "attempts").iterdir())
    assert len(list((job / "stages" / "1" / "state" / "done").iterdir())) == shards
    assert not (job / "stages" / "2" / "attempts").exists()


@pytest.mark.parametrize(("shards", "workers"), [(3, 3), pytest.param(8, 1, marks=exhaustive_only)])
def test_minhash_between_two_filters_keeps_the_rows_data_juicer_keeps(tmp_path, corpus, reference, shards, workers):
    expected = reference("minhash", MINHASH)
    assert len(expected) < ROWS * 0.97
    rows, _status = run_job(tmp_path, corpus, MINHASH, shards, workers)
    assert rows == expected
