"""A deterministic corpus for the whole-dataset operators: `global_rows(n, seed)`.

Each row is several lines of prose (tests/support/dedup_corpus.py's words) in which boilerplate
lines (a navigation bar, a copyright notice, a cookie banner, ...) are planted at random in about a
third of the documents, so each is frequent across shards; a few are planted in just a handful of
documents (below any threshold), and some lines Data-Juicer's line deduplicator skips (headers,
brackets, tags, short ones) are frequent too. Fields to select and group on: `meta.score`
(a float with many ties), `meta.tags.lang` (one of a few strings, or null), `rank` (an integer
with ties), `topic` (a string with a Zipf-like frequency, for grouping).
"""

from __future__ import annotations

import random

from support.dedup_corpus import prose_rows

BOILERPLATE = [
    "Home | About us | Contact | Privacy policy",
    "Copyright 2024 Example Media Group. All rights reserved.",
    "We use cookies to improve your experience on our site.",
    "Subscribe to our newsletter for weekly updates",
    "Share this article on social media",
]
RARE = ["This line appears in only a few documents.", "Another rare repeated line here."]
SKIPPED = ["# Chapter", "{ }", "<div>", "ok", "\\begin{itemize}"]
LANGS = ["en", "zh", "fr", "de", None]
TOPICS = ["sports", "politics", "science", "art", "travel", "food", "music", "cars"]


def global_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    prose = prose_rows(n * 3, seed=seed)
    rows = []
    for i in range(n):
        lines = [prose[3 * i + k]["text"][:200] for k in range(rng.randint(1, 3))]
        for line in BOILERPLATE:
            if rng.random() < 0.3:
                lines.insert(rng.randint(0, len(lines)), line)
        if rng.random() < 0.02:
            lines.insert(rng.randint(0, len(lines)), rng.choice(RARE))
        if rng.random() < 0.3:
            lines.insert(rng.randint(0, len(lines)), rng.choice(SKIPPED))
        if rng.random() < 0.03:
            lines = [rng.choice(BOILERPLATE)]  # a document that is nothing but boilerplate
        topic = TOPICS[min(int(rng.paretovariate(1.2)) - 1, len(TOPICS) - 1)]
        rows.append(
            {
                "text": "\n".join(lines),
                "meta": {"score": round(rng.random() * 10) / 2, "tags": {"lang": rng.choice(LANGS)}},
                "rank": rng.randint(0, 20),
                "topic": topic,
                "id": i,
            }
        )
    return rows
