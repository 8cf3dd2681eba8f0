"""A deterministic corpus of English-like prose for the deduplicators: `prose_rows(n, seed)`.

Paragraphs of 40-120 words (Zipf-distributed over a fixed vocabulary of about 4,000 words: common
English words first, then pronounceable pseudo-words), in sentences with capitals, commas, final
punctuation and numbers. A `dup_fraction` of the rows are planted duplicates of an earlier row
picked uniformly from everything before it (so the source is usually far back, in another shard):

- exact copies (every deduplicator finds them);
- surface copies that differ only in case, whitespace, punctuation or digits (`document_deduplicator`
  with `lowercase` and `ignore_non_character` finds them; leading/trailing whitespace alone is found
  even without those options, the md5 is taken of the stripped text);
- boundary copies: a word added, dropped or replaced at the very start or end (one shingle changes:
  simhash with hamming distance 4 and minhash with Jaccard 0.7 find most of them);
- near copies: one to three words replaced, inserted or deleted anywhere (minhash finds most,
  simhash some).

A near or boundary copy is often made from an earlier near copy, so chains A~B~C appear where A
and C are not directly similar. A few rows are tiny texts: empty, whitespace only, one word, and
two to six words (below and at the shingle windows of 5 and 6 words).
"""

from __future__ import annotations

import random
import re
import sys
from array import array
from functools import cache
from typing import NamedTuple

VOCABULARY_SIZE = 4000
TINY_FRACTION = 0.004

_COMMON_WORDS = (  # the most frequent words, in order
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you "
    "were her she there would their we him been has when who will more no if out so said what up its about into than "
    "them can only other new some could time these two may then do first any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off come since against go came "
    "right used take three house small water river stone light field city north south green early night morning "
    "winter summer road village market letter story mother father child friend king army church law school money"
)
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z")
_ONSETS += ("br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr", "sk", "sp")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ea", "io", "ou", "ee")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "rk", "ng")
_ENDINGS = (".", ".", ".", ".", ".", "?", "!", ";")
_SURFACE = ("case", "space", "punct", "digit")
KINDS = ("original", "tiny", "exact", "surface", "boundary", "near")
_TABLE = 1 << 16


@cache
def _vocabulary() -> tuple[list[str], list[str]]:
    """The words, most frequent first, and a table of 2**16 words in which each word fills about its
    Zipf share of the slots (at least one), to draw words by 16-bit numbers. Fixed: independent of the seed."""
    rng = random.Random(20240611)
    words = list(dict.fromkeys(_COMMON_WORDS.split()))
    seen = set(words)
    while len(words) < VOCABULARY_SIZE:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.choice((1, 2, 2, 3))))
        if len(word) >= 2 and word not in seen:
            seen.add(word)
            words.append(word)
    weights = [1.0 / (rank + 2.0) ** 1.05 for rank in range(len(words))]
    total = sum(weights)
    slots = [max(1, round(weight / total * _TABLE)) for weight in weights]
    slots[0] += _TABLE - sum(slots)  # the rounding's remainder goes to the most frequent word
    table = [word for word, count in zip(words, slots) for _ in range(count)]
    assert len(table) == _TABLE
    return words, table


def _draw(rng: random.Random, table: list[str], k: int) -> list[str]:
    """`k` words drawn by frequency: one C call for the random numbers, then a table look-up each."""
    numbers = array("H", rng.randbytes(2 * k))
    if sys.byteorder == "big":
        numbers.byteswap()  # the same words on every machine
    return [table[j] for j in numbers]


def _sentence(rng: random.Random, sentence: list[str]) -> list[str]:
    k = len(sentence)
    if rng.random() < 0.3:
        sentence.insert(rng.randrange(1, k + 1), str(rng.randint(2, 2025)))
    if k > 8 and rng.random() < 0.4:
        at = rng.randrange(2, k - 2)
        sentence[at] += ","
    sentence[0] = sentence[0].capitalize()
    sentence[-1] += rng.choice(_ENDINGS)
    return sentence


def _paragraph(rng: random.Random, table: list[str]) -> str:
    target = rng.randint(40, 120)
    stream = _draw(rng, table, target + 16)  # the last sentence starts below the target, has at most 16 words
    out: list[str] = []
    at = 0
    while len(out) < target:
        k = 5 + int(rng.random() * 12)
        out += _sentence(rng, stream[at : at + k])
        at += k
    return " ".join(out)


def _tiny(rng: random.Random, words: list[str], table: list[str]) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return ""
    if kind == 1:
        return rng.choice((" ", "\n", "  \t "))
    if kind == 2:
        return rng.choice(words[:200]).capitalize() + rng.choice(("", "."))
    return " ".join(_draw(rng, table, (2, 4, 5, 6)[kind - 2]))


def _surface(rng: random.Random, text: str) -> str:
    """The same text up to case, whitespace, punctuation and digits."""
    kinds = rng.sample(_SURFACE, rng.randint(1, 3))
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
    if "digit" in kinds:
        text = re.sub(r"\d", lambda _: str(rng.randrange(10)), text) if re.search(r"\d", text) else text + " 7"
    return text


def _boundary(rng: random.Random, text: str, words: list[str]) -> str:
    """One word added, dropped or replaced at the start or the end."""
    tokens = text.split(" ")
    if len(tokens) < 3:
        return text + " " + rng.choice(words)
    edit = rng.randrange(6)
    if edit == 0:
        tokens.append(rng.choice(words) + ".")
    elif edit == 1:
        tokens.insert(0, rng.choice(words).capitalize())
    elif edit == 2:
        tokens.pop()
    elif edit == 3:
        tokens.pop(0)
    elif edit == 4:
        tokens[-1] = rng.choice(words) + "."
    else:
        tokens[0] = rng.choice(words).capitalize()
    return " ".join(tokens)


def _near(rng: random.Random, text: str, table: list[str]) -> str:
    """One to three words replaced, inserted or deleted anywhere."""
    tokens = text.split(" ")
    for _ in range(rng.randint(1, 3)):
        edit = rng.randrange(3)
        at = rng.randrange(len(tokens) + (edit == 1))
        if edit == 0 and tokens:
            tokens[at] = _draw(rng, table, 1)[0]
        elif edit == 1:
            tokens.insert(at, _draw(rng, table, 1)[0])
        elif len(tokens) > 1:
            del tokens[at]
    return " ".join(tokens)


class Planted(NamedTuple):
    """How a row was made: `kind` is one of KINDS; `source` the row it copies (-1 for an original or a tiny text)."""

    kind: str
    source: int


def prose_corpus(n: int, seed: int, dup_fraction: float = 0.1) -> tuple[list[dict], list[Planted]]:
    """`prose_rows(n, seed, dup_fraction)` and, for each row, how it was made."""
    if n < 0 or not 0.0 <= dup_fraction < 1.0:
        raise ValueError(f"bad corpus arguments: n={n} dup_fraction={dup_fraction}")
    rng = random.Random(seed)
    words, table = _vocabulary()
    texts: list[str] = []
    plan: list[Planted] = []
    near: list[int] = []  # rows that are boundary or near copies: sources of chains
    for i in range(n):
        draw = rng.random()
        if i and draw < dup_fraction:
            kind = rng.random()
            if kind < 0.2:
                source = rng.randrange(i)
                planted, text = Planted("exact", source), texts[source]
            elif kind < 0.45:
                source = rng.randrange(i)
                planted, text = Planted("surface", source), _surface(rng, texts[source])
            else:
                source = rng.choice(near) if near and rng.random() < 0.35 else rng.randrange(i)
                if kind < 0.7:
                    planted, text = Planted("boundary", source), _boundary(rng, texts[source], words)
                else:
                    planted, text = Planted("near", source), _near(rng, texts[source], table)
                near.append(i)
        elif dup_fraction <= draw < dup_fraction + TINY_FRACTION:
            planted, text = Planted("tiny", -1), _tiny(rng, words, table)
        else:
            planted, text = Planted("original", -1), _paragraph(rng, table)
        texts.append(text)
        plan.append(planted)
    return [{"id": i, "text": text} for i, text in enumerate(texts)], plan


def prose_rows(n: int, seed: int, dup_fraction: float = 0.1) -> list[dict]:
    """`n` rows `{"id": i, "text": ...}` of prose with planted duplicates (module docstring); same arguments, same rows."""
    return prose_corpus(n, seed, dup_fraction)[0]
