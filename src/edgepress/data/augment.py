"""Transfer data for distillation: perturbed copies of the train texts, which the teacher labels (soft logits, never
the gold label), so that a student learns the teacher's function around the train set and not only its points.

Three perturbations, each seeded:
- `mask`: a word becomes the tokenizer's mask token (Tang et al. 2019, section 3.1: masking);
- `neighbours`: a word the tokenizer keeps as one piece becomes one of its nearest neighbours (cosine) among the
  whole-word tokens of the teacher's own input embeddings (Jiao et al. 2020, TinyBERT, section 3.2 and algorithm 1:
  single-piece words are replaced from the teacher's side);
- `ngram`: a copy is cut to a random n-gram of 1 to 5 of its words (Tang et al. 2019, section 3.1: n-gram
  sampling, p_ng = 0.25).
A word is perturbed with `probability`; with both word-level methods, each perturbed word takes one of them at
random. Copies equal to their text or to an earlier copy are dropped.
"""

import re
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.configs import Seed
from edgepress.errors import ConfigError

WORD = re.compile(r"\w+|[^\w\s]+")  # words and runs of punctuation: the units a perturbation acts on
NGRAM_P, NGRAM_MAX = 0.25, 5  # Tang et al. 2019's n-gram sampling: its probability per copy, the longest n
# Part of every cached transfer set's key: bump it when the same texts, model and settings would give other copies
# (2: neighbours in id order, nearest first, where 1 drew from a fast tokenizer's per-call vocabulary order)
VERSION = 2


class AugmentConfig(BaseModel):
    """Perturbed copies of the train texts, labelled by the teacher (the distilling methods' `augment`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    factor: int = Field(4, ge=1, le=64, description="perturbed copies made of each train text (before duplicates "
                                                    "are dropped)")
    methods: tuple[Literal["mask", "neighbours", "ngram"], ...] = Field(
        ("mask", "neighbours", "ngram"), min_length=1, description="mask: words become the mask token; neighbours: "
        "single-piece words become a neighbour in the teacher's embeddings; ngram: a copy is cut to 1-5 words")
    probability: float = Field(0.15, gt=0, le=1, description="each word's chance of being masked or replaced")
    neighbours: int = Field(15, ge=1, le=1000, description="how many nearest tokens a replaced word draws from")
    seed: Seed = Field(13, description="seeds every choice: the same texts and model give the same copies")


def _candidates(tokenizer) -> tuple[np.ndarray, list[str]]:
    """Token ids that are whole words (letters or digits, not a word piece or a special token), and their text, in
    id order (a fast tokenizer's `get_vocab()` comes in a different order on every call: the seed must fix the
    neighbours a word draws from)."""
    special = set(tokenizer.all_special_ids)
    ids, words = [], []
    for token, i in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        word = tokenizer.convert_tokens_to_string([token]).strip()
        if i not in special and re.fullmatch(r"[^\W_]+", word) and not token.startswith("##"):
            ids.append(i)
            words.append(word)
    return np.asarray(ids, dtype=np.int64), words


def neighbour_table(tokenizer, embeddings: np.ndarray, words: set[str], k: int) -> dict[str, list[str]]:
    """For each of `words` that the tokenizer keeps as one piece, its `k` nearest whole-word tokens by cosine in
    `embeddings` (vocab, hidden), itself left out."""
    ids, texts = _candidates(tokenizer)
    single = {}
    for word, pieces in zip(sorted(words), tokenizer(sorted(words), add_special_tokens=False)["input_ids"],
                            strict=True):
        if len(pieces) == 1 and pieces[0] != tokenizer.unk_token_id:
            single[word] = pieces[0]
    k = min(k, len(ids) - 1)  # a small vocabulary has fewer whole words than neighbours asked for
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    table, items = {}, list(single.items())
    for start in range(0, len(items), 1024):  # (chunk, candidates) similarities at a time
        chunk = items[start:start + 1024]
        sims = unit[[i for _, i in chunk]] @ unit[ids].T
        sims[np.asarray([i for _, i in chunk])[:, None] == ids[None, :]] = -np.inf  # not the word itself
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        for (word, _), row, sim in zip(chunk, top, sims, strict=True):
            table[word] = [texts[j] for j in row[np.argsort(-sim[row], kind="stable")]]  # nearest first
    return table


def _perturb(text: str, spans: list[tuple[int, int]], cfg: AugmentConfig, table: dict, mask: str | None,
             rng: np.random.Generator) -> str:
    """One perturbed copy of `text`, whose words and punctuation are at `spans`."""
    pieces = [text[a:b] for a, b in spans]
    word_methods = [m for m in cfg.methods if m in ("mask", "neighbours")]
    for i, piece in enumerate(pieces):
        if not word_methods or rng.random() >= cfg.probability or not piece[0].isalnum():
            continue
        method, options = word_methods[rng.integers(len(word_methods))], table.get(piece)
        if method == "neighbours" and options:
            pieces[i] = options[rng.integers(len(options))]
        elif "mask" in word_methods:  # masked, or a word without neighbours (several pieces) where masking may be
            pieces[i] = mask
    first, last = 0, len(pieces)
    if "ngram" in cfg.methods and len(pieces) > 1 and rng.random() < NGRAM_P:
        n = int(rng.integers(1, min(NGRAM_MAX, len(pieces)) + 1))
        first = int(rng.integers(0, len(pieces) - n + 1))
        last = first + n
    out = []  # the perturbed pieces with the text's own spacing between them
    for i in range(first, last):
        out.append(pieces[i])
        if i + 1 < last:
            out.append(text[spans[i][1]:spans[i + 1][0]])
    return "".join(out)


def check_augment(tokenizer, cfg: AugmentConfig) -> None:
    """What the tokenizer must have for `cfg`'s methods (also run before a pipeline runs)."""
    if "mask" in cfg.methods and tokenizer.mask_token is None:
        raise ConfigError("augment method mask needs a mask token, and this model's tokenizer has none. Fix: "
                          "augment.methods without mask")


def augment_texts(texts: tuple[str, ...], tokenizer, embeddings: np.ndarray, cfg: AugmentConfig) -> list[list[str]]:
    """For each text, its perturbed copies (up to `cfg.factor`, none equal to the text or to each other)."""
    check_augment(tokenizer, cfg)
    spans = [[m.span() for m in WORD.finditer(text)] for text in texts]
    words = {text[a:b] for text, s in zip(texts, spans, strict=True) for a, b in s if text[a].isalnum()}
    table = neighbour_table(tokenizer, embeddings, words, cfg.neighbours) if "neighbours" in cfg.methods else {}
    mask, rng = tokenizer.mask_token, np.random.default_rng(cfg.seed)
    copies = []
    for text, s in zip(texts, spans, strict=True):
        made = dict.fromkeys(_perturb(text, s, cfg, table, mask, rng) for _ in range(cfg.factor))
        copies.append([c for c in made if c != text and c.strip()])
    return copies
