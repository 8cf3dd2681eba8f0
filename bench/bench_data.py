"""Benchmark inputs and recipes, generated fresh into the run's work directory.

The data is deterministic (seeded) so that two runs at the same size process the same bytes.
Rows look like web text: mixed word lengths, stray tabs and non-breaking spaces, e-mail
addresses, full-width punctuation and a few rows short enough for the length filter to drop,
so every operator of the CPU recipe has real work to do.
"""

from __future__ import annotations

import random
import re
import sys
import sysconfig
from array import array
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
    extra: dict[str, Any] | None = None,
) -> Path:
    """A Data-Juicer recipe; the same body serves our jobs and the plain `dj-process` baselines
    (`extra`: more top-level settings; a default-executor recipe gets no `ray_address`)."""
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
    if not executor.startswith("ray"):
        del config["ray_address"]
    if custom_ops:
        config["custom_operator_paths"] = [str(CUSTOM_OPS)]
    config.update(extra or {})
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


# -- deduplication ---------------------------------------------------------------------------------

DEDUP_FRACTION = 0.1  # planted duplicates, of all rows
SHORT_FRACTION = 0.02  # originals short enough for the dedup recipes' length filter to drop
_DEDUP_VOCABULARY = 4000
_DEDUP_COMMON = (  # the most frequent English words, in order; pronounceable pseudo-words follow
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you "
    "were her she there would their we him been has when who will more no if out so said what up its about into than "
    "them can only other new some could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off come since against go came "
    "right used take three house small water river stone light field city north south green early night morning "
    "winter summer road village market letter story mother father child friend king army church law school money"
)
_SYLLABLES = (
    ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "br", "ch", "st", "th", "tr"),
    ("a", "e", "i", "o", "u", "ai", "ea", "ou", "ee"),
    ("", "", "n", "r", "s", "t", "l", "nd", "st", "ng"),
)
_TABLE_BITS = 16


def _dedup_table() -> list[str]:
    """2**16 words, each filling about its Zipf share of the slots: a word is drawn by a 16-bit
    number. Fixed: the same table for every seed and machine."""
    rng = random.Random(20261203)
    words = list(dict.fromkeys(_DEDUP_COMMON.split()))
    seen = set(words)
    while len(words) < _DEDUP_VOCABULARY:
        word = "".join(rng.choice(part) for _ in range(rng.choice((1, 2, 2, 3))) for part in _SYLLABLES)
        if len(word) >= 2 and word not in seen:
            seen.add(word)
            words.append(word)
    weights = [1.0 / (rank + 2.0) ** 1.05 for rank in range(len(words))]
    total, size = sum(weights), 1 << _TABLE_BITS
    slots = [max(1, round(w / total * size)) for w in weights]
    slots[0] += size - sum(slots)
    return [word for word, count in zip(words, slots) for _ in range(count)]


def _draw(rng: random.Random, table: list[str], k: int) -> list[str]:
    numbers = array("H", rng.randbytes(2 * k))
    if sys.byteorder == "big":
        numbers.byteswap()  # the same words on every machine
    return [table[j] for j in numbers]


def _dedup_text(rng: random.Random, table: list[str], low: int, high: int) -> str:
    """A paragraph of `low`..`high` words in sentences: capitals, commas, numbers, end marks."""
    target = rng.randint(low, high)
    stream = _draw(rng, table, target + 16)
    out: list[str] = []
    at = 0
    while len(out) < target:
        k = 5 + int(rng.random() * 12)
        sentence = stream[at : at + k]
        at += k
        if rng.random() < 0.3:
            sentence.insert(rng.randrange(1, len(sentence) + 1), str(rng.randint(2, 2025)))
        if len(sentence) > 8 and rng.random() < 0.4:
            sentence[rng.randrange(2, len(sentence) - 2)] += ","
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += rng.choice(".....?!;")
        out += sentence
    return " ".join(out)


def _surface_copy(rng: random.Random, text: str) -> str:
    """The same text up to case, whitespace and punctuation (one to three of them)."""
    kinds = rng.sample(("case", "space", "punct"), rng.randint(1, 3))
    if "case" in kinds:
        style = rng.randrange(3)
        if style == 0:
            text = text.lower()
        elif style == 1:
            text = text.upper()
        else:
            text = " ".join(w.swapcase() if rng.random() < 0.2 else w for w in text.split(" "))
    if "space" in kinds:
        text = "".join(rng.choice(("  ", "\n", " \t")) if c == " " and rng.random() < 0.1 else c for c in text)
        text = rng.choice(("", " ", "\n")) + text + rng.choice(("", " ", "\n", "\t\n"))
    if "punct" in kinds:
        if rng.random() < 0.5:
            text = re.sub(r"[.,;!?]", "", text)
        else:
            text = text.replace(" ", ", ", 1).replace(".", "!", 1) + rng.choice((".", "!", "...", " -"))
    return text


def _near_copy(rng: random.Random, text: str, table: list[str]) -> str:
    """One to three words replaced, inserted or deleted anywhere."""
    tokens = text.split(" ")
    for _ in range(rng.randint(1, 3)):
        edit = rng.randrange(3)
        at = rng.randrange(len(tokens) + (edit == 1))
        if edit == 0:
            tokens[at] = _draw(rng, table, 1)[0]
        elif edit == 1:
            tokens.insert(at, _draw(rng, table, 1)[0])
        elif len(tokens) > 1:
            del tokens[at]
    return " ".join(tokens)


DEDUP_KINDS = ("original", "short", "exact", "surface", "near")


def write_dedup_dataset(path: Path, rows: int, seed: int = 20261203, dup_fraction: float = DEDUP_FRACTION) -> dict[str, int]:
    """Write `rows` rows `{"id", "text"}` of English-like prose (60-200 words, Zipf-distributed over a
    fixed vocabulary of 4,000 words, in sentences) with `dup_fraction` planted duplicates, each of a
    row picked uniformly from everything before it (so its source is anywhere earlier in the
    input, usually in another shard): 20 % exact copies, 30 % copies that differ only in case,
    whitespace or punctuation, 50 % near copies (one to three words replaced, inserted or deleted
    anywhere; a third of them copy an earlier near copy, so chains A~B~C appear). `SHORT_FRACTION`
    of the rows are short originals (5-15 words) for the length filter. Any prefix of the file is
    such a corpus too. Returns how many rows of each kind (`DEDUP_KINDS`) were written."""
    rng = random.Random(seed)
    table = _dedup_table()
    texts: list[str] = []
    near: list[int] = []
    counts = dict.fromkeys(DEDUP_KINDS, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=1 << 20) as out:
        chunk: list[bytes] = []
        for i in range(rows):
            draw = rng.random()
            if i and draw < dup_fraction:
                roll = rng.random()
                if roll < 0.2:
                    kind, text = "exact", texts[rng.randrange(i)]
                elif roll < 0.5:
                    kind, text = "surface", _surface_copy(rng, texts[rng.randrange(i)])
                else:
                    source = rng.choice(near) if near and rng.random() < 1 / 3 else rng.randrange(i)
                    kind, text = "near", _near_copy(rng, texts[source], table)
                    near.append(i)
            elif draw < dup_fraction + SHORT_FRACTION:
                kind, text = "short", _dedup_text(rng, table, 5, 15)
            else:
                kind, text = "original", _dedup_text(rng, table, 60, 200)
            texts.append(text)
            counts[kind] += 1
            chunk.append(orjson.dumps({"id": i, "text": text}) + b"\n")
            if len(chunk) == 4096:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
    return counts


def write_prefix(source: Path, target: Path, rows: int) -> Path:
    """The first `rows` lines of `source`."""
    with open(source, "rb") as src, open(target, "wb") as out:
        for _, line in zip(range(rows), src):
            out.write(line)
    return target


# The dedup recipes (model-free, so they run offline). Cheap operators on one side of the
# deduplicator: the simhash recipe runs them before it (a segment on Ray, then the stage), the
# exact one after it (the stage on the input shards, then a segment on Ray).
DEDUP_CHEAP_OPS: list[dict[str, Any]] = [
    {"whitespace_normalization_mapper": {"text_key": "text"}},
    {"text_length_filter": {"text_key": "text", "min_len": 100}},
]
# The parameters of Data-Juicer's published pile recipes (configs/data_juicer_recipes/pile-*-refine.yaml,
# e.g. pile-europarl-refine.yaml).
SIMHASH_DEDUP = {
    "document_simhash_deduplicator": {
        "tokenization": "space",
        "window_size": 6,
        "lowercase": True,
        "ignore_pattern": r"\p{P}",
        "num_blocks": 6,
        "hamming_distance": 4,
    }
}
EXACT_DEDUP = {"document_deduplicator": {"lowercase": True, "ignore_non_character": True}}
DEDUP_RECIPES: dict[str, list[dict[str, Any]]] = {
    "simhash": [*DEDUP_CHEAP_OPS, SIMHASH_DEDUP],
    "exact": [EXACT_DEDUP, *DEDUP_CHEAP_OPS],
}


# -- analysis ----------------------------------------------------------------------------------------

# The `analyze` recipe (model-free and download-free, so it runs offline): stats-producing filters
# over prose with line breaks (the license windows of `write_prose_dataset`, so the line-length
# statistics vary), `tokenization: false` where an operator could load a tokenizer, and one
# mapper, which `dj-analyze` skips. The thresholds do not matter: analysis never filters.
ANALYZE_OPS: list[dict[str, Any]] = [
    {"whitespace_normalization_mapper": {"text_key": "text"}},
    {"alphanumeric_filter": {"text_key": "text", "min_ratio": 0.25}},
    {"average_line_length_filter": {"text_key": "text", "min_len": 10}},
    {"character_repetition_filter": {"text_key": "text", "rep_len": 10, "max_ratio": 0.5}},
    {"maximum_line_length_filter": {"text_key": "text", "min_len": 10}},
    {"special_characters_filter": {"text_key": "text", "max_ratio": 0.25}},
    {"text_length_filter": {"text_key": "text", "min_len": 100}},
    {"words_num_filter": {"text_key": "text", "tokenization": False, "min_num": 10}},
    {"word_repetition_filter": {"text_key": "text", "tokenization": False, "rep_len": 10, "max_ratio": 0.5}},
]


# -- whole-dataset operators -------------------------------------------------------------------------

# Lines planted in many documents (each in about 30 % of them, so it is frequent in every shard),
# in a few (below the recipe's threshold) and lines Data-Juicer's line deduplicator never counts
# (a heading, a tag, a LaTeX environment, a one-character line). The shape of
# tests/support/global_corpus.py; generated here (the bench does not import tests/).
GLOBAL_BOILERPLATE = (
    "Home | About us | Contact | Privacy policy",
    "Copyright 2024 Example Media Group. All rights reserved.",
    "We use cookies to improve your experience on our site.",
    "Subscribe to our newsletter for weekly updates",
    "Share this article on social media",
)
GLOBAL_RARE = ("This line appears in only a few documents.", "Another rare repeated line here.")
GLOBAL_SKIPPED = ("# Chapter", "<div>", "\\begin{itemize}", "{}", "-")
GLOBAL_RARE_FRACTION = 0.0003  # of the documents: 60 of 200,000, below the recipe's threshold of 100
GLOBAL_LANGS = ("en", "zh", "fr", "de", None)
GLOBAL_TOPICS = ("sports", "politics", "science", "art", "travel", "food", "music", "cars")


def write_global_dataset(path: Path, rows: int, seed: int = 20261206) -> dict[str, int]:
    """Write `rows` rows `{"id", "text", "meta": {"score", "tags": {"lang"}}, "rank", "topic"}`: the
    text is one to three lines of prose (20-40 words each, the dedup rows' vocabulary; 5 % of the
    lines repeat an earlier line, so a few lines are in two or three documents), and each of the
    five `GLOBAL_BOILERPLATE` lines is inserted at a random place in 30 % of the documents; a
    `GLOBAL_RARE` line in `GLOBAL_RARE_FRACTION` of them, a `GLOBAL_SKIPPED` line in 30 %; 3 % of
    the documents are one boilerplate line and nothing else (empty once it is removed). `meta.score`
    is a number with many ties (0.0, 0.5, ... 5.0), `rank` an integer 0-20, `topic` Zipf-like.
    Any prefix of the file is such a corpus too. Returns counts of what was planted."""
    rng = random.Random(seed)
    table = _dedup_table()
    seen: list[str] = []
    counts = {"rows": 0, "prose_lines": 0, "repeated_lines": 0, "boilerplate_lines": 0, "rare_lines": 0,
              "skipped_lines": 0, "boilerplate_only_rows": 0}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=1 << 20) as out:
        chunk: list[bytes] = []
        for i in range(rows):
            lines: list[str] = []
            for _ in range(rng.randint(1, 3)):
                if seen and rng.random() < 0.05:
                    lines.append(seen[rng.randrange(len(seen))])
                    counts["repeated_lines"] += 1
                else:
                    lines.append(_dedup_text(rng, table, 20, 40))
                    if len(seen) < 50_000:
                        seen.append(lines[-1])
                counts["prose_lines"] += 1
            for line in GLOBAL_BOILERPLATE:
                if rng.random() < 0.3:
                    lines.insert(rng.randint(0, len(lines)), line)
                    counts["boilerplate_lines"] += 1
            if rng.random() < GLOBAL_RARE_FRACTION:
                lines.insert(rng.randint(0, len(lines)), rng.choice(GLOBAL_RARE))
                counts["rare_lines"] += 1
            if rng.random() < 0.3:
                lines.insert(rng.randint(0, len(lines)), rng.choice(GLOBAL_SKIPPED))
                counts["skipped_lines"] += 1
            if rng.random() < 0.03:
                lines = [rng.choice(GLOBAL_BOILERPLATE)]
                counts["boilerplate_only_rows"] += 1
            topic = GLOBAL_TOPICS[min(int(rng.paretovariate(1.2)) - 1, len(GLOBAL_TOPICS) - 1)]
            row = {
                "id": i,
                "text": "\n".join(lines),
                "meta": {"score": round(rng.random() * 10) / 2, "tags": {"lang": rng.choice(GLOBAL_LANGS)}},
                "rank": rng.randint(0, 20),
                "topic": topic,
            }
            chunk.append(orjson.dumps(row) + b"\n")
            counts["rows"] += 1
            if len(chunk) == 4096:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
    return counts


# The `global_ops` recipe (model-free): the line deduplicator on the input shards (a stage), a stats
# filter with loose bounds (a segment on Ray; it writes `__dj__stats__.text_len`, and drops the
# documents that were nothing but boilerplate), then two selectors, each a stage: the 5th to 95th
# percentile of the text length, then the top 80 % by `meta.score`.
GLOBAL_FREQUENCY_THRESHOLD = 100  # boilerplate is in ~30 % of the documents, a rare line in ~0.03 %
GLOBAL_OPS: list[dict[str, Any]] = [
    {"document_line_deduplicator": {"text_key": "text", "frequency_threshold": GLOBAL_FREQUENCY_THRESHOLD}},
    {"text_length_filter": {"text_key": "text", "min_len": 10, "max_len": 100000}},
    {
        "range_specified_field_selector": {
            "field_key": "__dj__stats__.text_len",
            "lower_percentile": 0.05,
            "upper_percentile": 0.95,
        }
    },
    {"topk_specified_field_selector": {"field_key": "meta.score", "top_ratio": 0.8}},
]
