"""The deduplication units (`elastic_sharding.dedup`) against Data-Juicer's own operators.

The reference is Data-Juicer's code run the way its default executor runs a deduplicator
(`support.dj_dedup_reference`); ours runs the units of one stage over the same rows cut into
shards, with several partition counts, and must keep exactly the same rows in the same order.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from support.dedup_corpus import prose_rows
from support.dj_dedup_reference import dj_kept

from elastic_sharding.dedup import arrays, components
from elastic_sharding.dedup.arrays import PAIRS, position
from elastic_sharding.dedup.cooperate import StageParticipant
from elastic_sharding.dedup.rules import DedupRule
from elastic_sharding.dedup.stage import RECORDS_PER_BUCKET_UNIT, ROWS_PER_NODE_PART, DedupPlan, DedupStage
from elastic_sharding.errors import JobStateError, RecipeError

OPERATORS = [
    ("document_deduplicator", {}),
    ("document_deduplicator", {"lowercase": True, "ignore_non_character": True}),
    ("document_simhash_deduplicator", {}),
    ("document_simhash_deduplicator", {"tokenization": "character", "window_size": 4, "hamming_distance": 3}),
    ("document_minhash_deduplicator", {}),
    ("document_minhash_deduplicator", {"num_bands": 8, "num_rows_per_band": 4, "num_permutations": 32}),
]
CUTS = [(1, 1, 1), (4, 3, 2), (11, 7, 11)]  # shards, bucket partitions, node partitions


def cut(rows: list[dict], shards: int, seed: int) -> list[list[dict]]:
    bounds = [0, *sorted(random.Random(seed).sample(range(1, len(rows)), shards - 1)), len(rows)]
    return [rows[bounds[i] : bounds[i + 1]] for i in range(shards)]


def run_stage(root: Path, rule: DedupRule, pieces: list[list[dict]], bucket_parts: int, node_parts: int) -> list[int]:
    """Every unit of one stage, in order, by one participant in this process; the kept rows' global indices."""
    stage = DedupStage(root, DedupPlan(rule, len(pieces), bucket_parts, node_parts))
    final = StageParticipant(stage, lambda shard_index: pieces[shard_index], 5.0, 1.0, 0.01).run().final_round
    kept, base = [], 0
    for shard_index, piece in enumerate(pieces):
        dropped = set(stage.drops(shard_index, final).tolist())
        kept += [base + i for i in range(len(piece)) if i not in dropped]
        base += len(piece)
    return kept


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return prose_rows(2500, seed=7)


@pytest.mark.parametrize(("name", "args"), OPERATORS, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_the_units_keep_exactly_the_rows_data_juicer_keeps(tmp_path, corpus, name, args):
    expected = dj_kept(name, args, corpus)
    assert 0 < len(expected) < len(corpus)
    rule = DedupRule(name, args)
    for shards, bucket_parts, node_parts in CUTS:
        got = run_stage(tmp_path / f"{shards}", rule, cut(corpus, shards, seed=shards), bucket_parts, node_parts)
        assert got == expected, (shards, bucket_parts, node_parts, len(got), len(expected))


def random_graph(nodes: int, edges: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pairs = np.empty(edges, dtype=PAIRS)
    shards = rng.integers(0, 5, size=(edges, 2))
    rows = rng.integers(0, nodes, size=(edges, 2))
    pairs["node"] = (shards[:, 0] << 32) | rows[:, 0]
    pairs["other"] = (shards[:, 1] << 32) | rows[:, 1]
    return pairs[pairs["node"] != pairs["other"]]


def propagate(edges: np.ndarray, num_shards: int, node_parts: int) -> tuple[dict[int, int], int]:
    """The components rounds in memory, partitioned as the stage partitions them."""
    both = np.concatenate([edges, np.array(list(zip(edges["other"], edges["node"], strict=True)), dtype=PAIRS)])
    part_of = (both["node"] >> 32) * node_parts // num_shards
    adjacency, state, outbox = {}, {}, {}
    for q in range(node_parts):
        adjacency[q], state[q], outbox[q] = components.first_round(both[part_of == q])
    rounds = 0
    while any(len(m) for m in outbox.values()):
        rounds += 1
        inbox = {
            q: np.concatenate([m[(m["node"] >> 32) * node_parts // num_shards == q] for m in outbox.values()]) for q in state
        }
        for q in state:
            state[q], outbox[q] = components.next_round(adjacency[q], state[q], inbox[q])
    return {int(n): int(label) for q in state for n, label in zip(state[q]["node"], state[q]["other"], strict=True)}, rounds


@pytest.mark.parametrize("seed", range(6))
def test_label_propagation_finds_the_smallest_position_of_every_component(seed):
    edges = random_graph(nodes=400, edges=500 + 300 * seed, seed=seed)
    labels, _ = propagate(edges, num_shards=5, node_parts=1 + seed % 5)
    names = np.unique(np.concatenate([edges["node"], edges["other"]]))
    index = np.searchsorted(names, np.concatenate([edges["node"], edges["other"]]))
    half = len(edges)
    graph = coo_matrix((np.ones(half), (index[:half], index[half:])), shape=(len(names), len(names)))
    _, component = connected_components(graph, directed=False)
    smallest = {c: int(names[component == c].min()) for c in np.unique(component)}
    assert labels == {int(n): smallest[c] for n, c in zip(names, component, strict=True)}


def test_a_long_chain_settles_in_as_many_rounds_as_it_is_long_and_keeps_its_first_row():
    # A chain whose smallest position is at the far end: the worst case, one hop per round.
    chain = [position(s, r) for s in range(3) for r in range(20)][::-1]
    edges = np.array(list(zip(chain[:-1], chain[1:], strict=True)), dtype=PAIRS)
    labels, rounds = propagate(edges, num_shards=3, node_parts=3)
    assert set(labels.values()) == {position(0, 0)}
    assert len(chain) // 2 <= rounds <= len(chain)


def test_a_unit_run_twice_writes_identical_bytes_and_the_second_copy_loses(tmp_path, corpus):
    rule = DedupRule("document_simhash_deduplicator", {})
    op = rule.build()
    stage = DedupStage(tmp_path, DedupPlan(rule, 2, 3, 2))
    pieces = cut(corpus[:600], 2, seed=1)
    for shard_index, piece in enumerate(pieces):
        stage.write_keys(op, shard_index, piece)
    stage.run_bucket(1)
    first = stage.files.bucket_file(1).read_bytes()
    stage.run_bucket(1)  # a takeover of a unit whose owner had already published
    assert stage.files.bucket_file(1).read_bytes() == first
    assert sorted(p.name for p in stage.files.bucket_file(1).parent.iterdir()) == ["00001.rec"], "no temporary file left"


def test_a_damaged_record_file_is_refused_naming_it(tmp_path):
    target = tmp_path / "x.rec"
    data = np.arange(10, dtype=arrays.POSITIONS)
    assert arrays.write(target, data, np.array([0] * 4 + [1] * 6), 2)
    assert arrays.read(target, 1).tolist() == list(range(4, 10))
    target.write_bytes(target.read_bytes()[:-8])
    with pytest.raises(JobStateError, match=r"x\.rec: truncated \(5 of 6 records\)"):
        arrays.read(target, 1)
    target.write_bytes(b"not a record file")
    with pytest.raises(JobStateError, match=r"x\.rec: not a dedup record file"):
        arrays.read(target)
    with pytest.raises(JobStateError, match=r"missing\.rec: missing"):
        arrays.read(tmp_path / "missing.rec")


def test_a_simhash_distance_the_operator_cannot_use_is_refused_naming_both_settings():
    with pytest.raises(RecipeError, match=r"hamming_distance \(6\) must be .* less than num_blocks \(6\)"):
        DedupRule("document_simhash_deduplicator", {"num_blocks": 6, "hamming_distance": 6}).simhash_blocks()


def test_a_plan_bounds_what_one_unit_holds_whatever_the_input_size():
    rule = DedupRule("document_simhash_deduplicator", {})
    small = DedupPlan.for_rows(rule, fanout=15, num_shards=8, rows=10_000)
    assert (small.bucket_parts, small.node_parts) == (1, 1)
    for rows in (10_000_000, 100_000_000):
        plan = DedupPlan.for_rows(rule, fanout=15, num_shards=2_000, rows=rows)
        assert rows * 15 / plan.bucket_parts <= RECORDS_PER_BUCKET_UNIT, "a bucket unit sorts at most its bound"
        assert rows / plan.node_parts <= ROWS_PER_NODE_PART
    assert DedupPlan.for_rows(rule, fanout=15, num_shards=3, rows=10**9).node_parts == 3, "never more node partitions than shards"
