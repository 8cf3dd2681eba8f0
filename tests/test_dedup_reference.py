"""The ground truth of the distributed deduplicators, checked against itself: `dj_kept`
(tests/support/dj_dedup_reference.py) runs Data-Juicer's own `document_deduplicator`,
`document_simhash_deduplicator` and `document_minhash_deduplicator` and must equal a brute-force
reading of each operator's source (md5 of the transformed, stripped text, first kept; simhash
clusters over distinct values within the Hamming distance, first kept; minhash rows that share any
band bucket, first kept), on the planted-duplicate prose of tests/support/dedup_corpus.py. The
corpus must give every operator work (duplicates found, near ones that md5 misses, chains) and the
reference must never install a package nor reuse another call's results."""

from __future__ import annotations

import hashlib
import re
import string
from collections import Counter

import numpy as np
import pytest
from support.dedup_corpus import KINDS, prose_corpus, prose_rows
from support.dj_dedup_reference import REF_INDEX, InstallAttempted, _sealed, build_op, dj_hashes, dj_kept

N = 3000
SEED = 11
DD = "document_deduplicator"
SIMHASH = "document_simhash_deduplicator"
MINHASH = "document_minhash_deduplicator"
CHARACTER_SIMHASH = {"tokenization": "character", "window_size": 4}
SMALL_MINHASH = {"num_bands": 8, "num_rows_per_band": 4, "num_permutations": 32}
# Rows in front of the corpus for the exact deduplicator's edge cases: case, whitespace around the
# text (stripped before the md5), inner whitespace, punctuation and digits, empty and blank texts.
EDGE_ROWS = ["Hello, World 42!", "hello world", "  Hello, World 42!\n", "Hello,World 4 2!", "HELLO WORLD 7", "", " ", "\t\n"]


@pytest.fixture(scope="module")
def corpus():
    return prose_corpus(N, SEED)


@pytest.fixture(scope="module")
def kept(corpus):
    """kept(op_name, **op_args): dj_kept over the corpus, each configuration run once per module."""
    rows = corpus[0]
    results: dict = {}

    def get(op_name: str, **op_args) -> list[int]:
        key = (op_name, tuple(sorted(op_args.items())))
        if key not in results:
            results[key] = dj_kept(op_name, op_args, rows)
        return results[key]

    return get


def _components(n: int, edges) -> dict[int, list[int]]:
    """Union-find over rows 0..n-1: each connected component's rows, by its smallest row."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the root is always the smallest row
    members: dict[int, list[int]] = {}
    for x in range(n):
        members.setdefault(find(x), []).append(x)
    return members


def _first_of_each_component(n: int, edges) -> list[int]:
    return sorted(_components(n, edges))


# --- (a) document_deduplicator: md5 of the transformed, stripped text; the first occurrence kept ---

NON_CHARACTER = re.compile(r"\s+|\d+|[" + re.escape(string.punctuation) + "]")


def _md5_kept(texts: list[str], lowercase: bool, ignore_non_character: bool) -> list[int]:
    seen: set[str] = set()
    keep = []
    for i, text in enumerate(texts):
        if lowercase:
            text = text.lower()
        if ignore_non_character:
            text = NON_CHARACTER.sub("", text)
        digest = hashlib.md5(text.strip().encode("utf-8")).hexdigest()
        if digest not in seen:
            seen.add(digest)
            keep.append(i)
    return keep


@pytest.mark.parametrize("options", [{}, {"lowercase": True, "ignore_non_character": True}], ids=["default", "lower-ignore"])
def test_document_deduplicator_equals_first_of_each_md5(corpus, options):
    rows = [{"id": -1 - i, "text": text} for i, text in enumerate(EDGE_ROWS)] + corpus[0]
    texts = [row["text"] for row in rows]
    expected = _md5_kept(texts, options.get("lowercase", False), options.get("ignore_non_character", False))
    assert dj_kept(DD, options, rows) == expected
    assert len(expected) < len(rows)


def test_document_deduplicator_edge_rows_as_documented():
    rows = [{"text": text} for text in EDGE_ROWS]
    # default: only the surrounding whitespace goes (row 2 is row 0; " " and "\t\n" are "")
    assert dj_kept(DD, {}, rows) == [0, 1, 3, 4, 5]
    assert dj_kept(DD, {"lowercase": True, "ignore_non_character": True}, rows) == [0, 5]
    assert dj_kept(DD, {"lowercase": True}, rows) == [0, 1, 3, 4, 5]


# --- (b) document_simhash_deduplicator: components over distinct simhash values, first row kept ---


def _simhash_kept(values: list[int], hamming_distance: int) -> tuple[list[int], dict[int, list[int]]]:
    """The rows kept, and the components (by first row) of the graph over distinct values."""
    distinct = sorted(set(values))
    array = np.array(distinct, dtype=np.uint64)
    edges = []
    for i in range(len(array) - 1):
        close = np.nonzero(np.bitwise_count(array[i + 1 :] ^ array[i]) <= hamming_distance)[0]
        edges += [(i, i + 1 + int(j)) for j in close]
    value_components = _components(len(distinct), edges)
    component_of_value = {distinct[m]: root for root, members in value_components.items() for m in members}
    rows_by_component: dict[int, list[int]] = {}
    for row, value in enumerate(values):
        rows_by_component.setdefault(component_of_value[value], []).append(row)
    groups = {rows[0]: rows for rows in rows_by_component.values()}
    return sorted(groups), groups


def _short_rows(rows: list[dict], words: int = 8) -> list[dict]:
    return [{"id": row["id"], "text": " ".join(row["text"].split(" ")[:words])} for row in rows]


@pytest.mark.parametrize("options", [{}, CHARACTER_SIMHASH], ids=["default", "character-4"])
def test_simhash_deduplicator_equals_components_of_close_values(corpus, kept, options):
    if options:
        rows = _short_rows(corpus[0][:1500])
        actual = dj_kept(SIMHASH, options, rows)
    else:
        rows = corpus[0]
        actual = kept(SIMHASH)
    values = [int(v) for v in dj_hashes(SIMHASH, options, [row["text"] for row in rows])]
    expected, groups = _simhash_kept(values, hamming_distance=4)
    assert actual == expected
    assert len(expected) < len(rows), "the planted duplicates are found"
    assert any(len({values[r] for r in group}) > 1 for group in groups.values()), "some cluster joins different values"


# --- (c) document_minhash_deduplicator: rows sharing any band bucket are one cluster, first kept ---


def _minhash_kept(bands: list[list[bytes]]) -> tuple[list[int], list[tuple[int, int]]]:
    first_in_bucket: dict[tuple[int, bytes], int] = {}
    edges = []
    for row, row_bands in enumerate(bands):
        for band, value in enumerate(row_bands):
            first = first_in_bucket.setdefault((band, value), row)
            if first != row:
                edges.append((first, row))
    return _first_of_each_component(len(bands), edges), edges


@pytest.mark.parametrize("options, shape", [({}, (25, 10)), (SMALL_MINHASH, (8, 4))], ids=["default", "8x4"])
def test_minhash_deduplicator_equals_components_of_shared_buckets(corpus, kept, options, shape):
    rows = corpus[0]
    bands = dj_hashes(MINHASH, options, [row["text"] for row in rows])
    num_bands, rows_per_band = shape
    assert {len(b) for b in bands} == {num_bands} and {len(v) for b in bands for v in b} == {8 * rows_per_band}
    expected, _ = _minhash_kept(bands)
    assert kept(MINHASH, **options) == expected
    assert len(expected) < len(rows)


# --- (d) the corpus gives every operator work ---


def test_every_reference_run_finds_the_planted_duplicates(corpus, kept):
    rows, plan = corpus
    runs = {
        "md5": kept(DD),
        "md5 lower+ignore": kept(DD, lowercase=True, ignore_non_character=True),
        "simhash": kept(SIMHASH),
        "minhash": kept(MINHASH),
        "minhash 8x4": kept(MINHASH, **SMALL_MINHASH),
    }
    for name, keep in runs.items():
        assert 0.8 * N < len(keep) < N, name
    removed = {name: set(range(N)) - set(keep) for name, keep in runs.items()}
    kinds = {name: Counter(plan[i].kind for i in rows_removed) for name, rows_removed in removed.items()}
    assert removed["md5"] < removed["md5 lower+ignore"], "case/space/punctuation/digit copies need the options"
    for near in ("simhash", "minhash", "minhash 8x4"):
        assert removed[near] - removed["md5 lower+ignore"], f"{near} finds duplicates no md5 finds"
        assert kinds[near]["boundary"] > 0.5 * sum(p.kind == "boundary" for p in plan), near
    assert kinds["minhash"]["near"] > 0.5 * sum(p.kind == "near" for p in plan)
    far = [i for i in removed["minhash"] if plan[i].source >= 0 and i - plan[i].source > N // 2]
    assert far, "duplicates of rows far before them (another shard) are found"


def test_chains_join_rows_that_are_not_directly_similar(corpus, kept):
    """A~B~C: minhash joins rows that share no bucket, simhash values more than 4 bits apart."""
    texts = [row["text"] for row in corpus[0]]
    bands = dj_hashes(MINHASH, {}, texts)
    _, edges = _minhash_kept(bands)
    components = _components(N, edges)
    bucket_sets = [set(enumerate(b)) for b in bands]
    chained = [
        members
        for members in components.values()
        if any(not bucket_sets[a] & bucket_sets[c] for a in members for c in members if a < c)
    ]
    assert chained, "some minhash cluster is a chain"
    values = [int(v) for v in dj_hashes(SIMHASH, {}, texts)]
    _, groups = _simhash_kept(values, 4)
    far_apart = [g for g in groups.values() if max(int(values[a] ^ values[c]).bit_count() for a in g for c in g) > 4]
    assert far_apart, "some simhash cluster is a chain"
    assert kept(MINHASH) == sorted(m[0] for m in components.values())


# --- the reference itself: edge cases that the distributed version must match, isolation, no installs ---


def test_texts_below_the_shingle_window_are_one_cluster():
    """Fewer words than the window: no shingles, so simhash 0 and minhash all-max, whatever the words."""
    texts = ["", " ", "one", "two words", "a b c d", "five words in a row", "a text of six words here", "x y z w v u t"]
    rows = [{"text": text} for text in texts]
    assert dj_kept(SIMHASH, {}, rows) == [0, 6, 7]  # window 6: everything under six words is simhash 0
    assert dj_kept(MINHASH, {}, rows) == [0, 5, 6, 7]  # window 5
    assert dj_kept(DD, {}, rows) == [0, 2, 3, 4, 5, 6, 7]


def test_an_existing_hash_column_is_trusted_not_recomputed():
    """compute_hash returns a row unchanged when its hash column is already there (Data-Juicer's
    'computed already' check): the input's own `__dj__hash` decides."""
    rows = [{"text": "same", "__dj__hash": "x"}, {"text": "other", "__dj__hash": "x"}, {"text": "same", "__dj__hash": "y"}]
    assert dj_kept(DD, {}, rows) == [0, 2]


def test_calls_are_independent_and_rows_are_checked():
    a, b = {"text": "alpha beta"}, {"text": "gamma delta"}
    assert dj_kept(DD, {}, [a, a]) == [0]
    assert dj_kept(DD, {}, [a, b]) == [0, 1]
    assert dj_kept(DD, {}, [b, a, a, b]) == [0, 1]
    assert dj_kept(DD, {}, [a]) == [0] and dj_kept(DD, {}, []) == []
    with pytest.raises(ValueError, match="null"):
        dj_kept(DD, {}, [a, {"text": None}])
    with pytest.raises(ValueError, match=REF_INDEX):
        dj_kept(DD, {}, [{"text": "x", REF_INDEX: 1}])
    with pytest.raises(ValueError, match="Deduplicator"):
        build_op("text_length_filter", {})


def test_data_juicer_may_not_install_anything_during_a_run():
    from data_juicer.utils.lazy_loader import LazyLoader

    installer = LazyLoader.__dict__["_install_package"]
    with _sealed(), pytest.raises(InstallAttempted):
        LazyLoader("surely_not_an_installed_module_xyz")._load()
    assert LazyLoader.__dict__["_install_package"] is installer, "the installer is put back after the call"


def test_prose_rows_is_deterministic_and_plants_far_duplicates():
    rows, plan = prose_corpus(2000, 5)
    assert rows == prose_rows(2000, 5) and rows != prose_rows(2000, 6)
    assert [row["id"] for row in rows] == list(range(2000))
    counts = Counter(p.kind for p in plan)
    assert set(counts) == set(KINDS) and 0.07 * 2000 < sum(counts[k] for k in KINDS[2:]) < 0.13 * 2000
    assert all(plan[i].source < i for i in range(2000))
    words = [len(row["text"].split()) for row, p in zip(rows, plan) if p.kind == "original"]
    assert min(words) >= 40 and max(words) <= 140
    distances = [i - p.source for i, p in enumerate(plan) if p.source >= 0]
    assert sum(distances) / len(distances) > 400, "sources are spread over the whole input"
