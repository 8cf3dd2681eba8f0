"""Benchmark inputs and recipes, generated fresh into the run's work directory.

The data is deterministic (seeded) so that two runs at the same size process the same bytes.
Rows look like web text: mixed word lengths, stray tabs and non-breaking spaces, e-mail
addresses, full-width punctuation and a few rows short enough for the length filter to drop,
so every operator of the CPU recipe has real work to do.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import Any

import orjson
import yaml

BENCH_DIR = Path(__file__).resolve().parent
CUSTOM_OPS = BENCH_DIR / "ops" / "bench_ops"

_WORDS = [
    "data",
    "juicer",
    "shard",
    "worker",
    "claim",
    "lease",
    "node",
    "ray",
    "cluster",
    "merge",
    "prepare",
    "recipe",
    "filter",
    "mapper",
    "text",
    "sample",
    "quality",
    "corpus",
    "token",
    "language",
    "model",
    "training",
    "pipeline",
    "elastic",
    "shared",
    "filesystem",
    "process",
    "batch",
    "block",
    "export",
    "import",
    "schema",
    "manifest",
    "heartbeat",
    "takeover",
    "output",
    "input",
    "row",
    "column",
    "value",
]
_ODD_SPACES = ("\t", "\u00a0", "\u2009", "  ", "\u200b")
_PUNCT = ("，", "。", "！", "？", "；", "：", ",", ".", "!", "?")


def _text(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice(_WORDS)  # too short: dropped by text_length_filter
    parts: list[str] = []
    for _ in range(rng.randint(20, 70)):
        word = rng.choice(_WORDS)
        if rng.random() < 0.1:
            word = word.upper()
        parts.append(word)
        roll = rng.random()
        if roll < 0.08:
            parts.append(rng.choice(_PUNCT))
        elif roll < 0.11:
            parts.append(rng.choice(_ODD_SPACES))
        elif roll < 0.12:
            parts.append(f"{rng.choice(_WORDS)}{rng.randint(1, 999)}@example.com")
    return " ".join(parts)


def write_dataset(path: Path, rows: int, seed: int = 20261101) -> Path:
    """Write `rows` JSONL rows with an `id`, a `text` and a small `meta` object."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=1 << 20) as out:
        chunk: list[bytes] = []
        for i in range(rows):
            row = {"id": i, "text": _text(rng), "meta": {"source": rng.choice(("web", "book", "code")), "n": rng.randint(0, 9)}}
            chunk.append(orjson.dumps(row) + b"\n")
            if len(chunk) == 4096:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
    return path


PROSE_DIRS = (Path("/usr/share/common-licenses"),)
PROSE_ROW_CHARS = (900, 1500)  # a row's text length, uniform: ~1.2 K characters, ~1.3 KB a JSON row


def prose_corpus() -> tuple[str, list[tuple[str, str]]]:
    """Real prose found on this machine, in a fixed order: the license texts of
    /usr/share/common-licenses, else the LICENSE files of the installed Python packages, else
    seeded word salad. Returns (where it came from, [(name, text)])."""
    for root in PROSE_DIRS:
        files = sorted({p.resolve() for p in root.glob("*") if p.is_file()}) if root.is_dir() else []
        texts = [(p.name, p.read_text(errors="replace")) for p in files]
        if texts := [(name, text) for name, text in texts if len(text) > 2 * PROSE_ROW_CHARS[1]]:
            return str(root), texts
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in site.glob("*.dist-info/**/LICEN[SC]E*") if p.is_file())
    texts = [(p.parent.name if p.parent.name != "licenses" else p.parents[1].name, p.read_text(errors="replace")) for p in files]
    if texts := [(name, text) for name, text in texts if len(text) > 2 * PROSE_ROW_CHARS[1]]:
        return f"{site}/*.dist-info LICENSE files", texts
    rng = random.Random(7)
    return "seeded word salad", [(f"salad-{k}", " ".join(rng.choice(_WORDS) for _ in range(4000))) for k in range(8)]


def write_prose_dataset(path: Path, rows: int, seed: int = 20261201) -> tuple[Path, str]:
    """Write `rows` rows of real prose, `{"id", "text", "meta"}`, ~1.3 KB each: a seeded window
    of one of the `prose_corpus` texts, cut at spaces. Returns (path, where the prose came from)."""
    source, texts = prose_corpus()
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    low, high = PROSE_ROW_CHARS
    with open(path, "wb", buffering=1 << 20) as out:
        chunk: list[bytes] = []
        for i in range(rows):
            name, text = texts[rng.randrange(len(texts))]
            start = text.find(" ", rng.randrange(len(text) - high)) + 1
            end = text.rfind(" ", start, start + rng.randint(low, high))
            row = {"id": i, "text": text[start:end], "meta": {"source": name, "offset": start, "lang": "en"}}
            chunk.append(orjson.dumps(row) + b"\n")
            if len(chunk) == 4096:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
    return path, source


def write_tiny_dataset(path: Path, rows: int) -> Path:
    """Rows as small as a valid row gets: for measuring coordination, not processing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps({"id": i, "text": f"row {i}"}) + b"\n" for i in range(rows)))
    return path


CPU_OPS: list[dict[str, Any]] = [
    {"whitespace_normalization_mapper": {"text_key": "text"}},
    {"clean_email_mapper": {"text_key": "text"}},
    {"punctuation_normalization_mapper": {"text_key": "text"}},
    {"alphanumeric_filter": {"text_key": "text", "min_ratio": 0.5}},
    {"character_repetition_filter": {"text_key": "text", "rep_len": 10, "max_ratio": 0.9}},
    {"special_characters_filter": {"text_key": "text", "max_ratio": 0.5}},
    {"text_length_filter": {"text_key": "text", "min_len": 20, "max_len": 100000}},
]


def write_recipe(
    path: Path,
    dataset: Path,
    export: Path,
    ops: list[dict[str, Any]],
    executor: str = "ray",
    custom_ops: bool = False,
) -> Path:
    """A Data-Juicer recipe; the same body serves our jobs and the plain `dj-process` baselines."""
    config: dict[str, Any] = {
        "project_name": "elastic-bench",
        "dataset_path": str(dataset),
        "export_path": str(export),
        "work_dir": str(path.parent / f"{path.stem}-work"),
        "executor_type": executor,
        "ray_address": "local",
        "skip_op_error": False,
        "process": ops,
    }
    if custom_ops:
        config["custom_operator_paths"] = [str(CUSTOM_OPS)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


# The prepare_coop recipe: prepare validates it (and imports Data-Juicer); the workers never get far.
TRIVIAL_OPS: list[dict[str, Any]] = [{"whitespace_normalization_mapper": {"text_key": "text"}}]


def sleep_ops(ms_per_row: float) -> list[dict[str, Any]]:
    """The heterogeneous-nodes recipe: one cheap real op plus the per-row sleep."""
    return [{"whitespace_normalization_mapper": {"text_key": "text"}}, {"bench_sleep_mapper": {"ms_per_row": ms_per_row}}]


def model_ops(load_log: Path, mode: str, load_secs: float, ms_per_row: float) -> list[dict[str, Any]]:
    """The warm-operator recipe: the stand-in model op (`bench_model_mapper`) alone, one instance.
    `num_proc: 1` because two actors would hold both CPUs of a 2-core box and a plain
    `dj-process` would deadlock waiting for a CPU to read its input."""
    settings = {"load_secs": load_secs, "ms_per_row": ms_per_row, "load_log": str(load_log)}
    return [{"bench_model_mapper": {**settings, "ray_execution_mode": mode, "num_proc": 1}}]
