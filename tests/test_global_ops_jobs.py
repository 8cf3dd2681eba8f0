"""Whole recipes with the whole-dataset operators of global_ops/, end to end: real Data-Juicer on
a real local Ray per worker, workers as separate processes with their own hostnames, the merged
rows against one `dj-process` run with Data-Juicer's default executor, at two shard counts and
with 1 and 3 workers (tests/support/global_corpus.py: boilerplate lines planted across shards,
fields with ties to select and group on).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from support.dj_default_run import dj_default_rows
from support.e2e_support import needs_unshare, run_on_nodes
from support.exhaustive import exhaustive_only
from support.global_corpus import global_rows

pytestmark = [pytest.mark.e2e, needs_unshare]

# Boilerplate line removal between two filters (a web-text pipeline's shape).
LINES = """\
project_name: lines
np: 1
text_keys: text
process:
  - text_length_filter:
      min_len: 5
  - document_line_deduplicator:
      frequency_threshold: 6
  - words_num_filter:
      min_num: 3
"""

# Selectors on a statistic, a nested field and a grouping field, with ties everywhere.
SELECT = """\
project_name: select
np: 1
text_keys: text
process:
  - text_length_filter:
      min_len: 10
  - range_specified_field_selector:
      field_key: __dj__stats__.text_len
      lower_percentile: 0.1
      upper_percentile: 0.9
  - topk_specified_field_selector:
      field_key: meta.score
      top_ratio: 0.6
      reverse: false
  - frequency_specified_field_selector:
      field_key: topic
      top_ratio: 0.5
  - words_num_filter:
      min_num: 3
"""

# A group-by and its inverse, then selectors on the regrouped rows. Five groups: at 7 shards the
# segments after the grouper have empty shards, and the last one has an operator to run on them.
GROUP = """\
project_name: group
np: 1
text_keys: text
process:
  - key_value_grouper:
      group_by_keys: [meta.tags.lang]
  - naive_reverse_grouper:
  - tags_specified_field_selector:
      field_key: meta.tags.lang
      target_tags: [en, zh, fr]
  - random_selector:
      select_ratio: 0.5
  - whitespace_normalization_mapper:
"""

# A group-by and an aggregator on each group (a custom one: Data-Juicer's call a model API), last,
# so its batch meta is in the output.
AGGREGATE = f"""\
project_name: aggregate
np: 1
text_keys: text
custom_operator_paths: [{Path(__file__).parent / "support" / "group_summary_aggregator.py"}]
process:
  - text_length_filter:
      min_len: 10
  - key_value_grouper:
      group_by_keys: [topic]
  - group_summary_aggregator:
"""

RECIPES = {"lines": LINES, "select": SELECT, "group": GROUP, "aggregate": AGGREGATE}
IN_CI = ("group", "aggregate")  # the in-process tests (test_global_ops.py) cover every operator against Data-Juicer
ROWS = 400


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    data = tmp_path_factory.mktemp("global-corpus") / "rows.jsonl"
    data.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in global_rows(ROWS, seed=7)))
    return data


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    cache: dict[str, list[dict]] = {}

    def rows(name: str) -> list[dict]:
        if name not in cache:
            root = tmp_path_factory.mktemp(f"reference-{name}")
            recipe = root / "recipe.yaml"
            recipe.write_text(RECIPES[name])
            cache[name] = dj_default_rows(recipe, corpus, root / "run", np=2)
        return cache[name]

    return rows


@pytest.mark.parametrize(
    ("name", "shards", "workers"),
    [
        pytest.param(name, shards, workers, marks=() if name in IN_CI and workers == 3 else exhaustive_only)
        for name in sorted(RECIPES)
        for shards, workers in ((7, 3), (3, 1))
    ],
)
def test_a_recipe_with_whole_dataset_operators_gives_data_juicers_rows(tmp_path, corpus, reference, name, shards, workers):
    expected = reference(name)
    assert 0 < len(expected) < ROWS
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPES[name])
    rows, status = run_on_nodes(tmp_path, recipe, corpus, shards, workers, name="global-node")
    assert rows == expected
    assert status["complete"] and status["exit_code"] == 0
    assert all(stage["state"] == "done" for stage in status["stages"])
    if name == "aggregate":
        assert sum(row["__dj__batch_meta__"]["count"] for row in rows) == sum(len(row["text"]) for row in rows)
