"""Image-text and video-text corpora for the media deduplicators, generated on disk.

Each corpus is a JSONL file whose rows name media files relative to it (as real datasets do;
prepare and Data-Juicer both make them absolute), with duplicates planted anywhere after their
original so that most cross shard boundaries:

- images (Pillow): smooth random pictures; a duplicate row names the same file, a byte-identical
  copy under another name, or the picture re-encoded: a JPEG's pixels saved as PNG (the same
  perceptual hash, other bytes) or a PNG saved as JPEG (its hash usually matches, sometimes a bit
  differs: an exact deduplicator then keeps both); some rows have two images, some none (their
  key is "": always kept without `consider_text`);
- videos (PyAV, the `multimodal` extra): a few tiny MPEG-4 clips; a duplicate names the same
  file, a byte-identical copy, or the clip remuxed into Matroska (the same packets, so the same
  packet md5, in a file whose bytes differ).

Half the duplicates repeat their original's text, so `consider_text` drops fewer of them.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import orjson
from PIL import Image

WORDS = ["river", "stone", "light", "garden", "window", "morning", "paper", "harbor", "field", "lantern", "bridge", "orchard"]


@dataclass(frozen=True)
class MediaCorpus:
    """The dataset file and what was planted in it (for the tests' sanity checks)."""

    dataset: Path
    rows: int
    byte_copies: int  # duplicates naming the same file or a byte-identical copy
    re_encoded: int  # duplicates naming a re-encoded (image) or remuxed (video) copy


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12)))


def _picture(rng: random.Random) -> Image.Image:
    """A smooth picture (a 6x6 random grid, upscaled): re-encoding keeps its perceptual hash."""
    grid = Image.new("RGB", (6, 6))
    grid.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(36)])
    return grid.resize((64, 64), Image.Resampling.BICUBIC)


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def _plant(rng: random.Random, originals: list[tuple[str, list[str]]], copies: dict[str, list[str]], count: int):
    """Yield (text, media, kind) rows: each original once, then `count` duplicates interleaved
    after their originals; kind is "byte" or "re-encoded"."""
    order: list[tuple[str, list[str], str]] = [(text, media, "original") for text, media in originals]
    for _ in range(count):
        source = rng.randrange(len(originals))
        text, media = originals[source]
        kind = rng.choice(["same", "byte", "re-encoded"])
        if kind != "same":
            media = [rng.choice(copies[f"{kind}:{name}"]) for name in media]
        text = text if rng.random() < 0.5 else _sentence(rng)
        at = rng.randrange(source + 1, len(order) + 1)
        order.insert(at, (text, media, "re-encoded" if kind == "re-encoded" else "byte"))
    return order


def image_corpus(root: Path, pictures: int = 16, duplicates: int = 22, text_only: int = 6, seed: int = 43) -> MediaCorpus:
    """`pictures` distinct pictures (a few rows show two), `duplicates` planted, `text_only` rows
    without images, in `root/images.jsonl` with the files under `root/images/`."""
    rng = random.Random(seed)
    folder = root / "images"
    folder.mkdir(parents=True)
    copies: dict[str, list[str]] = {}
    names = []
    for index in range(pictures):
        picture = _picture(rng)
        ext, other = ("png", "jpg") if index % 2 else ("jpg", "png")
        name = f"images/pic{index}.{ext}"
        picture.save(root / name, **({"quality": 95} if ext == "jpg" else {}))
        shutil.copyfile(root / name, root / f"images/copy{index}.{ext}")
        if other == "png":  # the JPEG's own pixels, losslessly: the same hash, other bytes
            with Image.open(root / name) as decoded:
                decoded.save(root / f"images/re{index}.png")
        else:  # a JPEG of the PNG: its hash usually matches, or differs in a bit or two
            picture.save(root / f"images/re{index}.jpg", quality=95)
        copies[f"byte:{name}"] = [name, f"images/copy{index}.{ext}"]
        copies[f"re-encoded:{name}"] = [f"images/re{index}.{other}"]
        names.append(name)
    originals = []
    for index, name in enumerate(names):
        media = [name, names[index - 1]] if index % 5 == 4 else [name]
        originals.append((_sentence(rng), media))
    order = _plant(rng, originals, copies, duplicates)
    for _ in range(text_only):  # no image: never dropped without consider_text, whatever the text
        text = order[rng.randrange(len(order))][0] if rng.random() < 0.5 else _sentence(rng)
        order.insert(rng.randrange(len(order) + 1), (text, [], "none"))
    rows = [{"id": n, "text": text, "images": media} for n, (text, media, _) in enumerate(order)]
    _write_rows(root / "images.jsonl", rows)
    kinds = [kind for _, _, kind in order]
    return MediaCorpus(root / "images.jsonl", len(rows), kinds.count("byte"), kinds.count("re-encoded"))


def _clip(path: Path, rng: random.Random, frames: int = 6) -> None:
    """A tiny MPEG-4 clip of random flat frames."""
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for _ in range(frames):
            pixels = np.full((32, 32, 3), [rng.randrange(256) for _ in range(3)], dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _remux(source: Path, target: Path) -> None:
    """The same packets in another container (no re-encoding)."""
    import av

    with av.open(str(source)) as inp, av.open(str(target), "w") as out:
        in_stream = inp.streams.video[0]
        out_stream = out.add_stream(template=in_stream)  # PyAV 13 (the extra pins it)
        for packet in inp.demux(in_stream):
            if packet.dts is None:
                continue
            packet.stream = out_stream
            out.mux(packet)


def video_corpus(root: Path, clips: int = 5, duplicates: int = 9, text_only: int = 3, seed: int = 44) -> MediaCorpus:
    """`clips` distinct clips, `duplicates` planted, `text_only` rows without video, in
    `root/videos.jsonl` with the files under `root/videos/`."""
    rng = random.Random(seed)
    folder = root / "videos"
    folder.mkdir(parents=True)
    copies: dict[str, list[str]] = {}
    originals = []
    for index in range(clips):
        name = f"videos/clip{index}.mp4"
        _clip(root / name, rng)
        shutil.copyfile(root / name, root / f"videos/copy{index}.mp4")
        _remux(root / name, root / f"videos/remux{index}.mkv")
        copies[f"byte:{name}"] = [name, f"videos/copy{index}.mp4"]
        copies[f"re-encoded:{name}"] = [f"videos/remux{index}.mkv"]
        originals.append((_sentence(rng), [name]))
    order = _plant(rng, originals, copies, duplicates)
    for _ in range(text_only):
        order.insert(rng.randrange(len(order) + 1), (_sentence(rng), [], "none"))
    rows = [{"id": n, "text": text, "videos": media} for n, (text, media, _) in enumerate(order)]
    _write_rows(root / "videos.jsonl", rows)
    kinds = [kind for _, _, kind in order]
    return MediaCorpus(root / "videos.jsonl", len(rows), kinds.count("byte"), kinds.count("re-encoded"))
