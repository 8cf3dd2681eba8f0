"""The supported deduplicators and how each one's own hash becomes bucket records.

The hash itself is always Data-Juicer's: the operator is built from the recipe through its
registry and its `compute_hash` runs on every row as the row looks after the previous segment of
the recipe, exactly what `Deduplicator.run` maps over the dataset. What is ours is only how rows
that the operator's `process` would group are brought into one partition:

- `document_deduplicator` groups rows with equal md5: the bucket is the md5 itself;
- `document_simhash_deduplicator` connects distinct simhash values at Hamming distance at most
  `hamming_distance` (what `simhash.find_all` returns) and rows with equal values: two values
  that close agree on at least `num_blocks - hamming_distance` of `num_blocks` blocks, so one
  bucket per choice of that many blocks holds every such pair (the pairs are checked exactly);
- `document_minhash_deduplicator` connects rows that share any band bucket: the bucket is the
  band's index and bytes (a 128-bit BLAKE2b digest of them, so a false collision has a chance of
  about one in 2**100 even for a billion rows);
- `image_deduplicator` and `video_deduplicator` keep the first row of each key, where the key is
  the media hash (the images' concatenated perceptual hashes, the md5 of the video packets) or,
  with `consider_text`, the pair (media hash, text md5). Keys have no fixed length, so the bucket
  is a 128-bit BLAKE2b digest of an unambiguous encoding of the key. Their `process` keeps every
  row whose key is falsy: without `consider_text` a row with no image or video (hash "") takes no
  part and gets no record; a pair is never falsy, so with it every row takes part.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from elastic_sharding.dedup.arrays import KEYS, position
from elastic_sharding.errors import RecipeError


class DedupKind(StrEnum):
    EXACT = "exact"
    SIMHASH = "simhash"
    MINHASH = "minhash"


SUPPORTED = {
    "document_deduplicator": DedupKind.EXACT,
    "document_simhash_deduplicator": DedupKind.SIMHASH,
    "document_minhash_deduplicator": DedupKind.MINHASH,
    "image_deduplicator": DedupKind.EXACT,
    "video_deduplicator": DedupKind.EXACT,
}

# Data-Juicer's Ray-only deduplicators keep whichever duplicate reaches their shared state first,
# so a run cannot be repeated row for row; they are refused with the twin whose rule we reproduce.
RAY_TWINS = {
    "ray_document_deduplicator": "document_deduplicator",
    "ray_bts_minhash_deduplicator": "document_minhash_deduplicator",
    "ray_bts_minhash_cpp_deduplicator": "document_minhash_deduplicator",
    "ray_image_deduplicator": "image_deduplicator",
    "ray_video_deduplicator": "video_deduplicator",
}

# The field each operator's compute_hash fills (Data-Juicer's HashKeys), checked on its output.
HASH_FIELDS = {
    "document_deduplicator": "__dj__hash",
    "document_simhash_deduplicator": "__dj__simhash",
    "document_minhash_deduplicator": "__dj__minhash",
    "image_deduplicator": "__dj__imagehash",
    "video_deduplicator": "__dj__videohash",
}
# The operators whose key is a media hash, paired with the text md5 under `consider_text`.
MEDIA_DEDUPLICATORS = frozenset({"image_deduplicator", "video_deduplicator"})
TEXT_HASH_FIELD = HASH_FIELDS["document_deduplicator"]

SIMHASH_DEFAULTS = {"num_blocks": 6, "hamming_distance": 4}


@dataclass(frozen=True)
class DedupRule:
    """One deduplicator of a recipe: its name, its arguments as the recipe gives them."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> DedupKind:
        return SUPPORTED[self.name]

    def build(self) -> Any:
        """The operator, built by Data-Juicer from the recipe entry."""
        from data_juicer.ops import load_ops

        (op,) = load_ops([{self.name: dict(self.args)}])
        return op

    def simhash_blocks(self) -> tuple[int, int]:
        blocks = int(self.args.get("num_blocks", SIMHASH_DEFAULTS["num_blocks"]))
        distance = int(self.args.get("hamming_distance", SIMHASH_DEFAULTS["hamming_distance"]))
        if not 0 < distance < blocks <= 64:
            raise RecipeError(
                f"{self.name}: hamming_distance ({distance}) must be at least 1 and less than num_blocks ({blocks}), "
                "and num_blocks at most 64, as Data-Juicer's documentation of the operator says; fix the recipe"
            )
        return blocks, distance

    def fanout(self, op: Any) -> int:
        """Bucket records per row."""
        if self.kind == DedupKind.SIMHASH:
            blocks, distance = self.simhash_blocks()
            return math.comb(blocks, blocks - distance)
        if self.kind == DedupKind.MINHASH:
            return int(op.num_bands)
        return 1

    def hash_fields(self, op: Any) -> tuple[str, ...]:
        """The fields of compute_hash's output the key is made of, in the order `process` reads them."""
        field_name = HASH_FIELDS[self.name]
        if self.name in MEDIA_DEDUPLICATORS and getattr(op, "consider_text", False):
            return field_name, TEXT_HASH_FIELD
        return (field_name,)

    def key_records(self, op: Any, rows: Iterable[dict], shard_index: int) -> np.ndarray:
        """The bucket records of one shard's rows, in row order; `op` is `self.build()`."""
        fields = self.hash_fields(op)
        media = self.name in MEDIA_DEDUPLICATORS
        hashes: list[Any] = []
        for row_index, row in enumerate(rows):
            try:
                sample = op.compute_hash(dict(row))
            except Exception as exc:  # noqa: BLE001 - the operator's own code: any error is the row's
                raise RecipeError(
                    f"{self.name}: Data-Juicer's compute_hash failed on row {row_index + 1} of shard {shard_index}: "
                    f"{type(exc).__name__}: {exc}; fix the data or the recipe"
                ) from None
            kinds = (str,) if media else (str, list)
            missing = [f for f in fields if not isinstance(sample, dict) or not isinstance(sample.get(f), kinds)]
            if missing:
                source = "media files or text field" if media else "text field"
                raise RecipeError(
                    f"{self.name}: Data-Juicer's compute_hash gave no {missing[0]} for row {row_index + 1} of shard "
                    f"{shard_index} (is its {source} missing or of the wrong type?); fix the data or the recipe"
                )
            hashes.append(tuple(sample[f] for f in fields) if len(fields) > 1 else sample[fields[0]])
        base = position(shard_index, 0)
        if media:
            return _media_records(hashes, base)
        if self.kind == DedupKind.EXACT:
            return _exact_records(hashes, base)
        if self.kind == DedupKind.SIMHASH:
            return _simhash_records(hashes, base, *self.simhash_blocks())
        return _minhash_records(hashes, base)


def media_key_digest(key: str | tuple[str, ...]) -> bytes:
    """128 bits of a media deduplicator's key: a tag for a string or a pair, then each part
    length-prefixed, so no two distinct keys have the same encoding."""
    parts = (key,) if isinstance(key, str) else key
    encoded = [part.encode("utf-8", "surrogatepass") for part in parts]
    data = (b"s" if isinstance(key, str) else b"t" + len(parts).to_bytes(4, "little")) + b"".join(
        len(part).to_bytes(8, "little") + part for part in encoded
    )
    return hashlib.blake2b(data, digest_size=16).digest()


def _media_records(keys: list[str | tuple[str, ...]], base: int) -> np.ndarray:
    """One record per row whose key `process` would look up (a truthy one): the rest are kept."""
    rows = [index for index, key in enumerate(keys) if key]
    digests = np.frombuffer(b"".join(media_key_digest(keys[i]) for i in rows), dtype=">u8").reshape(-1, 2)
    records = np.empty(len(rows), dtype=KEYS)
    records["k1"] = digests[:, 0] if rows else 0
    records["k2"] = digests[:, 1] if rows else 0
    records["pos"] = base + np.array(rows, dtype=np.int64)
    records["val"] = 0
    return records


def _exact_records(hashes: list[str], base: int) -> np.ndarray:
    records = np.empty(len(hashes), dtype=KEYS)
    digests = np.frombuffer(b"".join(bytes.fromhex(h) for h in hashes), dtype=">u8").reshape(-1, 2)
    records["k1"] = digests[:, 0] if len(hashes) else 0
    records["k2"] = digests[:, 1] if len(hashes) else 0
    records["pos"] = base + np.arange(len(hashes))
    records["val"] = 0
    return records


def block_masks(blocks: int) -> list[int]:
    """64 bits cut into `blocks` contiguous blocks as even as possible."""
    edges = [round(i * 64 / blocks) for i in range(blocks + 1)]
    return [((1 << (edges[i + 1] - edges[i])) - 1) << edges[i] for i in range(blocks)]


def combination_masks(blocks: int, distance: int) -> np.ndarray:
    masks = block_masks(blocks)
    combos = itertools.combinations(range(blocks), blocks - distance)
    return np.array([sum(masks[i] for i in combo) for combo in combos], dtype=np.uint64)


def _simhash_records(hashes: list[str], base: int, blocks: int, distance: int) -> np.ndarray:
    values = np.array([int(h) for h in hashes], dtype=np.uint64)
    masks = combination_masks(blocks, distance)
    records = np.empty((len(values), len(masks)), dtype=KEYS)
    records["k1"] = np.arange(len(masks), dtype=np.uint64)[None, :]
    records["k2"] = values[:, None] & masks[None, :]
    records["pos"] = (base + np.arange(len(values)))[:, None]
    records["val"] = values[:, None]
    return records.reshape(-1)


def _minhash_records(hashes: list[list[bytes]], base: int) -> np.ndarray:
    bands = len(hashes[0]) if hashes else 0
    digests = b"".join(
        hashlib.blake2b(band_index.to_bytes(4, "little") + band, digest_size=16).digest()
        for row in hashes
        for band_index, band in enumerate(row)
    )
    pairs = np.frombuffer(digests, dtype=">u8").reshape(-1, 2)
    records = np.empty(len(pairs), dtype=KEYS)
    records["k1"] = pairs[:, 0] if len(pairs) else 0
    records["k2"] = pairs[:, 1] if len(pairs) else 0
    records["pos"] = np.repeat(base + np.arange(len(hashes)), bands)
    records["val"] = 0
    return records
