"""Real English text available offline: the paragraphs of Python's own documentation topics
(`pydoc_data.topics`, the standard library's copy of the language reference that `help()` shows),
with planted duplicates: `pydoc_corpus(seed)`.

Every distinct block of the topics (text between blank lines: prose paragraphs, but also headings,
grammar rules and code examples, as a crawl would find them) in the module's topic order, one row
each, and after about `dup_fraction` of them a planted duplicate of an earlier prose paragraph
(at least 20 words) picked from the first half of the rows before it, so the source is far back
and, on a few shards, in another shard:

- exact copies;
- near copies: one word replaced by another word of the topics.

Same Python, same seed, same rows (the topics text is fixed within a Python release).
"""

from __future__ import annotations

import pydoc_data.topics
import random
import re
from typing import NamedTuple

_BLANK_LINE = re.compile(r"\n[ \t]*\n")
KINDS = ("original", "exact", "near")


class Planted(NamedTuple):
    """How a row was made: `kind` is one of KINDS; `source` the row it copies (-1 for an original)."""

    kind: str
    source: int


def topic_blocks() -> list[str]:
    """Every distinct non-empty block of the documentation topics, in topic order."""
    blocks: dict[str, None] = {}
    for text in pydoc_data.topics.topics.values():
        for block in _BLANK_LINE.split(text):
            block = "\n".join(line.rstrip() for line in block.strip("\n").split("\n"))
            if block.strip():
                blocks.setdefault(block, None)
    return list(blocks)


def is_prose(block: str) -> bool:
    """A paragraph of running text: no indented (code or grammar) line, at least 20 words."""
    return not any(line.startswith(" ") for line in block.split("\n")) and len(block.split()) >= 20


def _near(rng: random.Random, text: str, words: list[str]) -> str:
    """`text` with one word (not the first) replaced by another word of the topics."""
    tokens = text.split(" ")
    at = rng.randrange(1, len(tokens))
    tail = tokens[at][len(tokens[at].rstrip(".,;:\n")) :]  # keep the punctuation and line break after it
    tokens[at] = rng.choice(words) + tail
    return " ".join(tokens)


def pydoc_corpus(seed: int, dup_fraction: float = 0.1, limit: int | None = None) -> tuple[list[dict], list[Planted]]:
    """Rows `{"id": i, "text": ...}` of the topic blocks (the first `limit`) with planted duplicates,
    and for each row how it was made."""
    rng = random.Random(seed)
    blocks = topic_blocks()[:limit]
    words = sorted({w for b in blocks if is_prose(b) for w in re.findall(r"\b[a-z]{4,12}\b", b)})
    texts: list[str] = []
    plan: list[Planted] = []
    prose: list[int] = []  # rows that are prose originals: the sources of planted copies
    for block in blocks:
        if is_prose(block):
            prose.append(len(texts))
        texts.append(block)
        plan.append(Planted("original", -1))
        if len(prose) > 8 and rng.random() < dup_fraction:
            source = rng.choice([p for p in prose if p < len(texts) // 2] or prose)
            if rng.random() < 0.4:
                planted, text = Planted("exact", source), texts[source]
            else:
                planted, text = Planted("near", source), _near(rng, texts[source], words)
            texts.append(text)
            plan.append(planted)
    return [{"id": i, "text": text} for i, text in enumerate(texts)], plan
