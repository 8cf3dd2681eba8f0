"""`image_deduplicator` and `video_deduplicator` across shards keep exactly Data-Juicer's rows.

- Fast, no torch and no PyAV: the key records of the stage's units against Data-Juicer's own
  `compute_hash` and `process` (`support.dj_dedup_reference.dj_kept`) on rows whose media hash is
  already computed (the operator then reads it instead of loading media), with and without
  `consider_text`, at several cuts; prepare refuses the Ray-only twins, naming the operator to use.
- End to end (real Data-Juicer + Ray, workers on their own hostnames, the merged rows against one
  default-executor `dj-process` run): an image-text corpus (`support.media_corpus`) through
  `image_deduplicator` (needs the `multimodal` extra: imagededup and torch, about 5.5 GB, so the
  exhaustive suite only), and a video-text corpus through `video_deduplicator` (needs only PyAV,
  about 100 MB: one case in CI where it is installed). Both skip, saying why, without them.
"""

from __future__ import annotations

import random
from importlib.util import find_spec
from pathlib import Path

import orjson
import pytest
from support.dj_dedup_reference import dj_kept
from support.dj_default_run import dj_default_rows
from support.e2e_support import needs_unshare, run_on_nodes, shard_job
from support.exhaustive import exhaustive_only
from support.media_corpus import MediaCorpus, image_corpus, video_corpus

from elastic_sharding.dedup.cooperate import StageParticipant
from elastic_sharding.dedup.rules import HASH_FIELDS, RAY_TWINS, SUPPORTED, DedupKind, DedupRule, media_key_digest
from elastic_sharding.dedup.stage import DedupPlan, DedupStage

INSTALL = "pip install -c constraints.txt -e '.[multimodal]' (CONTRIBUTING.md, 'The media deduplicators')"
needs_imagededup = pytest.mark.skipif(
    any(find_spec(name) is None for name in ("imagededup", "torch", "torchvision")),
    reason=f"image_deduplicator needs the multimodal extra (imagededup, torch, torchvision: about 5.5 GB): {INSTALL}",
)
needs_av = pytest.mark.skipif(
    find_spec("av") is None,
    reason="video_deduplicator needs PyAV (av, about 100 MB, in the multimodal extra): pip install -c constraints.txt av",
)
MEDIA_OPS = [pytest.param("image_deduplicator", marks=needs_imagededup), "video_deduplicator"]


# -- the keys, against Data-Juicer's own compute_hash and process (no media loaded) ------------


def hashed_rows(op_name: str, count: int, seed: int) -> list[dict]:
    """Rows whose media hash is already there (compute_hash keeps it), from small pools of
    hashes (a fifth of them "", no media) and texts, so keys repeat with and without the text."""
    rng = random.Random(seed)
    media = ["", "", *(f"{rng.getrandbits(64):016x}" * rng.randint(1, 2) for _ in range(8))]
    texts = ["a red kite", "A red kite", "the harbor at dawn", "", "窗外的河"]
    field = HASH_FIELDS[op_name]
    key = "images" if op_name == "image_deduplicator" else "videos"
    return [{"text": rng.choice(texts), key: [], field: rng.choice(media)} for _ in range(count)]


def run_units(root: Path, rule: DedupRule, rows: list[dict], shards: int, seed: int) -> list[int]:
    """Every unit of one stage over `rows` cut into `shards`; the kept rows' global indices."""
    bounds = [0, *sorted(random.Random(seed).sample(range(1, len(rows)), shards - 1)), len(rows)]
    pieces = [rows[bounds[i] : bounds[i + 1]] for i in range(shards)]
    stage = DedupStage(root, DedupPlan(rule, shards, bucket_parts=3, node_parts=min(2, shards)))
    final = StageParticipant(stage, lambda shard: pieces[shard], 5.0, 1.0, 0.01).run().final_round
    assert final is None, "an exact stage has no components phase"
    kept = []
    for shard, piece in enumerate(pieces):
        dropped = set(stage.drops(shard, final).tolist())
        kept += [bounds[shard] + i for i in range(len(piece)) if i not in dropped]
    return kept


@pytest.mark.parametrize("op_name", MEDIA_OPS)
@pytest.mark.parametrize("consider_text", [False, True])
def test_the_units_keep_the_rows_data_juicers_process_keeps(tmp_path, op_name, consider_text):
    rows = hashed_rows(op_name, 400, seed=43)
    args = {"consider_text": consider_text}
    expected = dj_kept(op_name, args, rows)
    assert 0 < len(expected) < len(rows) - 40
    field = HASH_FIELDS[op_name]
    without_media = [i for i, row in enumerate(rows) if row[field] == ""]
    # Without the text a row with no media is always kept; with it, such rows dedup by their text.
    assert (set(without_media) <= set(expected)) is not consider_text
    rule = DedupRule(op_name, args)
    assert rule.kind == DedupKind.EXACT and not DedupPlan.for_rows(rule, 1, 4, len(rows)).needs_components
    for shards in (1, 4, 9):
        assert run_units(tmp_path / f"{shards}", rule, rows, shards, seed=shards) == expected, shards


def test_a_key_is_128_bits_of_an_unambiguous_encoding():
    keys = ["", "ab", "abc", ("ab", "c"), ("a", "bc"), ("abc", ""), ("", "abc"), ("ab", "c", ""), "窗"]
    digests = [media_key_digest(key) for key in keys]
    assert all(len(d) == 16 for d in digests) and len(set(digests)) == len(keys)
    assert media_key_digest(("ab", "c")) == media_key_digest(("ab", "c"))


def test_the_media_deduplicators_are_exact_stages_with_their_own_hash_fields():
    from data_juicer.utils.constant import HashKeys

    assert SUPPORTED["image_deduplicator"] == SUPPORTED["video_deduplicator"] == DedupKind.EXACT
    assert (HASH_FIELDS["image_deduplicator"], HASH_FIELDS["video_deduplicator"]) == (HashKeys.imagehash, HashKeys.videohash)
    assert HASH_FIELDS["document_deduplicator"] == HashKeys.hash


@pytest.mark.parametrize("ray_op", ["ray_image_deduplicator", "ray_video_deduplicator"])
def test_prepare_refuses_the_ray_only_media_deduplicators_naming_the_twin(tmp_path, ray_op):
    dataset = tmp_path / "data.jsonl"
    dataset.write_text('{"text": "a", "images": [], "videos": []}\n')
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"dataset_path: {dataset}\nprocess:\n  - {ray_op}:\n")
    proc = shard_job("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "2", check=False)
    twin = RAY_TWINS[ray_op]
    assert twin == ray_op.removeprefix("ray_")
    assert proc.returncode == 2, proc.stderr
    assert f"process[0] {ray_op}: is Data-Juicer's Ray-only deduplicator" in proc.stderr
    assert f"use {twin} in its place" in proc.stderr
    assert not (tmp_path / "job").exists()


# -- end to end ----------------------------------------------------------------------------

IMAGE_RECIPES = {
    "phash": """\
project_name: image-dedup
np: 1
text_keys: text
process:
  - whitespace_normalization_mapper:
  - image_deduplicator:
      method: phash
""",
    "phash-with-text": """\
project_name: image-dedup-text
np: 1
text_keys: text
process:
  - image_deduplicator:
      method: phash
      consider_text: true
  - text_length_filter:
      min_len: 10
""",
}
VIDEO_RECIPE = """\
project_name: video-dedup
np: 1
text_keys: text
process:
  - whitespace_normalization_mapper:
  - video_deduplicator:
"""


def _reference(cache: dict, root: Path, name: str, recipe_text: str, dataset: Path) -> list[dict]:
    if name not in cache:
        (root / name).mkdir()
        recipe = root / name / "recipe.yaml"
        recipe.write_text(recipe_text)
        cache[name] = dj_default_rows(recipe, dataset, root / name / "run", np=2)
    return cache[name]


def _dropped_files(corpus: MediaCorpus, kept: list[dict], key: str) -> set[str]:
    """The media files named by the rows the reference dropped."""
    ids = {row["id"] for row in kept}
    rows = [orjson.loads(line) for line in corpus.dataset.read_bytes().splitlines()]
    return {Path(name).name for row in rows if row["id"] not in ids for name in row[key]}


def _run(tmp_path: Path, recipe_text: str, dataset: Path, shards: int, workers: int) -> tuple[list[dict], dict]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text)
    return run_on_nodes(tmp_path, recipe, dataset, shards, workers, name="media-node")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> MediaCorpus:
    return image_corpus(tmp_path_factory.mktemp("image-corpus"))


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> MediaCorpus:
    if find_spec("av") is None:
        pytest.skip("video_deduplicator needs PyAV (av): pip install -c constraints.txt av")
    return video_corpus(tmp_path_factory.mktemp("video-corpus"))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache: dict[str, list[dict]] = {}
    root = tmp_path_factory.mktemp("media-references")
    return lambda name, text, dataset: _reference(cache, root, name, text, dataset)


@pytest.mark.e2e
@needs_unshare
@needs_imagededup
@exhaustive_only  # torch: about 5.5 GB that CI does not install (CONTRIBUTING.md, 'The media deduplicators')
@pytest.mark.parametrize("recipe", sorted(IMAGE_RECIPES))
@pytest.mark.parametrize(("shards", "workers"), [(3, 1), (7, 3)])
def test_image_deduplicator_keeps_the_rows_data_juicer_keeps(tmp_path, images, references, recipe, shards, workers):
    expected = references(recipe, IMAGE_RECIPES[recipe], images.dataset)
    assert len(expected) < images.rows - images.byte_copies // 2, "the corpus must have duplicates to drop"
    if recipe == "phash":  # duplicates by bytes and by re-encoding alike, whatever their text
        dropped = _dropped_files(images, expected, "images")
        assert any(name.startswith("re") for name in dropped) and any(name.startswith("copy") for name in dropped)
    rows, status = _run(tmp_path, IMAGE_RECIPES[recipe], images.dataset, shards, workers)
    assert rows == expected
    assert status["complete"] and status["exit_code"] == 0 and [s["state"] for s in status["stages"]] == ["done"]


@pytest.mark.e2e
@needs_unshare
@needs_av
@pytest.mark.parametrize(("shards", "workers"), [(4, 3), pytest.param(2, 1, marks=exhaustive_only)])
def test_video_deduplicator_keeps_the_rows_data_juicer_keeps(tmp_path, videos, references, shards, workers):
    expected = references("video", VIDEO_RECIPE, videos.dataset)
    assert len(expected) < videos.rows - videos.byte_copies // 2, "the corpus must have duplicates to drop"
    dropped = _dropped_files(videos, expected, "videos")
    assert any(name.startswith("remux") for name in dropped), "a remuxed copy has the same packets: dropped"
    rows, status = _run(tmp_path, VIDEO_RECIPE, videos.dataset, shards, workers)
    assert rows == expected
    assert status["complete"] and status["exit_code"] == 0 and [s["state"] for s in status["stages"]] == ["done"]
