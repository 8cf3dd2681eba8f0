"""Stand-ins, built offline from a test corpus, for the models and the asset that Data-Juicer's
text filters download on first use: `build_offline_models(texts, root)` writes them and returns
the environment that points Data-Juicer at them.

Why stand-ins: the published recipes' filters load files that Data-Juicer fetches from the
internet the first time (`data_juicer/utils/model_utils.py`, `check_model`: into
`DATA_JUICER_MODELS_CACHE`; `data_juicer/utils/asset_utils.py`, `load_words_asset`: into
`DATA_JUICER_ASSETS_CACHE`), and the machines that run this suite reach only package registries.
Data-Juicer looks for each file in those directories by name before it downloads anything, so the
tests put files of the same names and formats there, made deterministically from the corpus the
test runs on. Nothing else changes: the recipe, Data-Juicer and its loading code are untouched, and
with network access (or the real files in the caches) the real models would be used unchanged.

| file (as Data-Juicer names it) | real one | stand-in |
| --- | --- | --- |
| `en.sp.model` | sentencepiece model of English Wikipedia | trained by sentencepiece's own trainer on the corpus |
| `lid.176.bin` | fastText language identification, 176 languages | a fastText supervised model file (format 12) with naive Bayes weights: English (the corpus) against two made-up languages (its words reversed, its vowels rotated) |
| `en.arpa.bin` | KenLM model of English Wikipedia (binary) | an ARPA text file (KenLM reads ARPA whatever the name): a trigram model over the corpus's sentencepiece pieces, interpolated absolute discounting |
| `flagged_words.json` | Data-Juicer's flagged word lists per language | a short English list |

The fastText model is written directly instead of trained by `fasttext.train_supervised`: the
package Data-Juicer imports as `fasttext` is `fasttext-predict`, which only loads and predicts
(the full `fasttext` package would replace the same module and needs a C++ build). Its
weights are a closed form (multinomial naive Bayes over words, averaged as fastText's hidden layer
averages word vectors), so the file is the same bytes on every machine.
"""

from __future__ import annotations

import io
import json
import math
import re
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

# What Data-Juicer's filters ask for with `lang: en` (model_utils.py: prepare_fasttext_model,
# prepare_sentencepiece_for_lang, prepare_kenlm_model) and load_words_asset's file-name rule.
FASTTEXT_NAME = "lid.176.bin"
SENTENCEPIECE_NAME = "en.sp.model"
KENLM_NAME = "en.arpa.bin"
FLAGGED_WORDS_NAME = "flagged_words.json"

SP_VOCAB_SIZE = 2000
LM_ORDER = 3
LM_DISCOUNT = 0.75
STAND_IN_FLAGGED_WORDS = ["damn", "hell", "crap", "bloody", "idiot", "stupid"]

# fastText's model file (src/fasttext.cc saveModel, args.cc, dictionary.cc, densematrix.cc)
_FASTTEXT_MAGIC, _FASTTEXT_VERSION = 793712314, 12
_LOSS_SOFTMAX, _MODEL_SUPERVISED = 3, 3
_EOS = "</s>"
_VOWELS = str.maketrans("aeiouAEIOU", "eiouaEIOUA")


def offline_env(root: Path) -> dict[str, str]:
    """The environment that makes Data-Juicer find the stand-ins under `root` (and download nothing)."""
    return {"DATA_JUICER_MODELS_CACHE": str(root / "models"), "DATA_JUICER_ASSETS_CACHE": str(root / "assets")}


def build_offline_models(texts: list[str], root: Path) -> dict[str, str]:
    """Write every stand-in under `root` from `texts` (the corpus); the environment for Data-Juicer."""
    models, assets = root / "models", root / "assets"
    models.mkdir(parents=True, exist_ok=True)
    assets.mkdir(parents=True, exist_ok=True)
    sp_model = train_sentencepiece(texts)
    (models / SENTENCEPIECE_NAME).write_bytes(sp_model)
    (models / FASTTEXT_NAME).write_bytes(language_id_model(texts))
    (models / KENLM_NAME).write_text(arpa_model(piece_lines(sp_model, texts)))
    (assets / FLAGGED_WORDS_NAME).write_text(json.dumps({"en": STAND_IN_FLAGGED_WORDS}))
    return offline_env(root)


# --- sentencepiece ---------------------------------------------------------------------------


def train_sentencepiece(texts: list[str], vocab_size: int = SP_VOCAB_SIZE) -> bytes:
    """A unigram sentencepiece model trained on the texts' lines, by sentencepiece itself (one thread: deterministic)."""
    import sentencepiece

    lines = [line for text in texts for line in text.split("\n") if line.strip()]
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return out.getvalue()


def piece_lines(sp_model: bytes, texts: list[str]) -> list[list[str]]:
    """The token lines perplexity_filter scores: each text's pieces, joined by spaces, split into lines."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
    return [line.split() for text in texts for line in " ".join(processor.encode_as_pieces(text)).splitlines()]


# --- KenLM (ARPA) ----------------------------------------------------------------------------


def arpa_model(lines: Iterable[list[str]], order: int = LM_ORDER, discount: float = LM_DISCOUNT) -> str:
    """An ARPA back-off language model of `lines`: add-one unigrams, then interpolated absolute
    discounting (every probability of a seen n-gram includes the lower order's share, and the
    back-off weight of a context is exactly the mass its discounts set aside)."""
    counts: list[Counter] = [Counter() for _ in range(order + 1)]  # counts[n][ngram tuple]
    for tokens in lines:
        seq = ["<s>", *tokens, "</s>"]
        for n in range(1, order + 1):
            for i in range(len(seq) - n + 1):
                counts[n][tuple(seq[i : i + n])] += 1
    del counts[1][("<s>",)]  # a context only, never predicted: written with probability 10**-99 below
    vocabulary = sorted(w for (w,) in counts[1]) + ["<unk>"]
    total = sum(counts[1].values())
    prob: list[dict[tuple, float]] = [{} for _ in range(order + 1)]
    prob[1] = {(w,): (counts[1][(w,)] + 1) / (total + len(vocabulary)) for w in vocabulary}
    backoff: list[dict[tuple, float]] = [{} for _ in range(order + 1)]
    for n in range(2, order + 1):
        context_total: Counter = Counter()
        context_types: Counter = Counter()
        for ngram, count in counts[n].items():
            context_total[ngram[:-1]] += count
            context_types[ngram[:-1]] += 1
        gamma = {h: discount * context_types[h] / context_total[h] for h in context_total}
        backoff[n - 1] = gamma
        for ngram, count in counts[n].items():
            h = ngram[:-1]
            prob[n][ngram] = (count - discount) / context_total[h] + gamma[h] * prob[n - 1][ngram[1:]]
    out = ["\\data\\"]
    out += [f"ngram {n}={len(prob[n]) + (n == 1)}" for n in range(1, order + 1)]
    for n in range(1, order + 1):
        out += ["", f"\\{n}-grams:"]
        if n == 1:
            out.append(f"-99.000000\t<s>\t{math.log10(backoff[1].get(('<s>',), 1.0)):.6f}")
        for ngram in sorted(prob[n]):
            line = f"{math.log10(prob[n][ngram]):.6f}\t{' '.join(ngram)}"
            if n < order:
                line += f"\t{math.log10(backoff[n].get(ngram, 1.0)):.6f}"
            out.append(line)
    out += ["", "\\end\\", ""]
    return "\n".join(out)


# --- fastText language identification --------------------------------------------------------


def made_up_languages(text: str) -> dict[str, str]:
    """`text` in English and in two made-up languages of the same shape (labels as fastText writes them)."""
    return {
        "__label__en": text,
        "__label__xr": " ".join(word[::-1] for word in text.split(" ")),  # every word reversed
        "__label__xv": text.translate(_VOWELS),  # every vowel rotated
    }


def language_id_model(texts: list[str], smoothing: float = 0.5) -> bytes:
    """A fastText supervised model file that tells English from the made-up languages.

    What language_id_score_filter does with it: `predict(text.lower().replace("\\n", " "))`, i.e.
    the average of the input rows of the known words of the line (and `</s>`), times the output
    matrix, softmax. With input row = centered log P(word | label) (add-`smoothing`), dim = the
    number of labels and the identity as output matrix, that is naive Bayes on the average log
    likelihood per word."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for text in texts:
        for label, version in made_up_languages(text.lower().replace("\n", " ")).items():
            counts[label].update(re.split(r"[ \t\v\f\r\0]+", version.strip()))
            counts[label][_EOS] += 1
    labels = sorted(counts)
    words = [_EOS] + sorted({w for c in counts.values() for w in c if w and w != _EOS})
    table = np.array([[counts[label][w] for w in words] for label in labels], dtype=np.float64)
    log_p = np.log((table + smoothing) / (table.sum(axis=1, keepdims=True) + smoothing * len(words)))
    rows = (log_p - log_p.mean(axis=0, keepdims=True)).T.astype("<f4")  # words x labels
    dim = len(labels)
    out = io.BytesIO()
    out.write(struct.pack("<ii", _FASTTEXT_MAGIC, _FASTTEXT_VERSION))
    # args: dim ws epoch minCount neg wordNgrams loss model bucket minn maxn lrUpdateRate t
    out.write(struct.pack("<12id", dim, 5, 5, 1, 5, 1, _LOSS_SOFTMAX, _MODEL_SUPERVISED, 0, 0, 0, 100, 1e-4))
    entries = [(w, sum(c[w] for c in counts.values()), 0) for w in words] + [(label, len(texts), 1) for label in labels]
    ntokens = sum(count for _w, count, kind in entries if kind == 0)
    out.write(struct.pack("<iiiqq", len(entries), len(words), len(labels), ntokens, -1))  # -1: not pruned
    for word, count, kind in entries:
        out.write(word.encode() + b"\0" + struct.pack("<qb", count, kind))
    out.write(b"\0")  # input matrix not quantized
    out.write(struct.pack("<qq", len(words), dim) + rows.tobytes())
    out.write(b"\0")  # output matrix not quantized
    out.write(struct.pack("<qq", len(labels), dim) + np.eye(len(labels), dim, dtype="<f4").tobytes())
    return out.getvalue()
