"""Data-Juicer's published pile-europarl refine recipe, as published (its simhash deduplicator
included), end to end: real Data-Juicer on a real local Ray per worker, three workers as separate
processes with their own hostnames; the merged rows equal one `dj-process` run with Data-Juicer's
default executor (tests/support/dj_default_run.py) on the same input: the same rows in the same
order with the same fields and statistics (floats to the last few bits, see `same_values`).

The input is real English text: the paragraphs, headings and code blocks of Python's own
documentation topics with about 10 % planted exact and near copies of rows far before them
(tests/support/pydoc_corpus.py), so copies cross shard boundaries. The recipe's filters load
models and a word list that Data-Juicer downloads on first use; this suite's machines reach only
package registries, so both runs find stand-ins built from the corpus in Data-Juicer's caches
(tests/support/offline_models.py). The recipe itself is the published file, untouched
(tests/data/recipes/pile-europarl-refine.yaml); the test replaces its placeholder paths only
through the CLI's `--dataset-path` and the reference run's own settings.
"""

from __future__ import annotations

import math

import orjson
import pytest
from support.dj_default_run import dj_default_rows
from support.e2e_support import needs_unshare, run_on_nodes
from support.jobs import TESTS
from support.offline_models import build_offline_models
from support.pydoc_corpus import pydoc_corpus

from elastic_sharding.layout import JobLayout

pytestmark = [pytest.mark.e2e, needs_unshare]

RECIPE = TESTS / "data" / "recipes" / "pile-europarl-refine.yaml"
BLOCKS = 1350  # the first 1350 blocks of the topics: 1,469 rows with the planted copies (Python 3.11.7)
SHARDS, WORKERS = 6, 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The input file and how each row was made, with Data-Juicer pointed at the stand-ins for this
    module (the environment reaches the workers, their Ray runtimes and the reference run)."""
    root = tmp_path_factory.mktemp("pile-europarl")
    rows, plan = pydoc_corpus(seed=11, limit=BLOCKS)
    data = root / "pydoc-topics.jsonl"
    data.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    env = build_offline_models([row["text"] for row in rows], root / "stand-ins")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        yield data, plan


def same_values(got, want) -> bool:
    """Equal, except that two floats need only be within a few units in the last place.

    Both executors hold a float statistic as pandas' JSON encoder writes it (10 decimal places:
    Ray Data's JSON export; the default executor's `__dj__stats__` column, a Hugging Face `Json`
    feature). The shard outputs are read back exactly (`0.8470588235`); the default executor reads
    its column back with pandas' JSON decoder, which is off in the last bits (`0.8470588235000001`).
    Everything else (ids, order, text, strings, integers, which statistics a row has) must be equal."""
    if isinstance(got, float) and isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-12)
    if isinstance(got, dict) and isinstance(want, dict):
        return list(got) == list(want) and all(same_values(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same_values(g, w) for g, w in zip(got, want))
    return type(got) is type(want) and got == want


def test_published_pile_europarl_recipe_keeps_the_rows_data_juicer_keeps(tmp_path, corpus):
    dataset, plan = corpus
    expected = dj_default_rows(RECIPE, dataset, tmp_path / "reference", np=2)
    rows, status = run_on_nodes(tmp_path, RECIPE, dataset, SHARDS, WORKERS, name="europarl-node")
    assert [row["id"] for row in rows] == [row["id"] for row in expected]
    differ = [(got, want) for got, want in zip(rows, expected) if not same_values(got, want)]
    assert not differ, f"{len(differ)} rows differ from the default executor's, the first: {differ[0]}"
    assert status["complete"] and status["exit_code"] == 0 and [s["state"] for s in status["stages"]] == ["done"]

    # Enough rows survive the published thresholds for the comparison to mean something, and the
    # filters (not only the deduplicator) drop rows: code, headings and short blocks.
    kept = {row["id"] for row in rows}
    assert 0.25 * len(plan) < len(kept) < 0.8 * len(plan)
    # The simhash deduplicator dropped rows: an exact copy passes every filter its source passes,
    # so a copy missing beside its kept source was dropped as a duplicate; many of them are in
    # another shard than their source.
    shard_of = {}
    for index, spec in enumerate(JobLayout(tmp_path / "job").load_manifest().shards):
        shard_of.update(dict.fromkeys(range(spec.first_row, spec.first_row + spec.rows), index))
    copies = [(row, made.source) for row, made in enumerate(plan) if made.kind == "exact" and made.source in kept]
    assert len(copies) >= 10 and not kept & {row for row, _source in copies}
    assert sum(shard_of[row] != shard_of[source] for row, source in copies) >= 5
    near = [row for row, made in enumerate(plan) if made.kind == "near" and made.source in kept]
    assert near and any(row not in kept for row in near), "some near copies (one word changed) are gone too"
