"""Labelled text examples and the train / validation / test splits every stage reads."""

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgepress.data.config import SplitConfig


@dataclass(frozen=True)
class EpochDraw:
    """How a training epoch draws from a transfer set (the train split's `labelled` examples, then transfer texts):
    every labelled example, and `per_epoch` of the transfer texts (all of them when None) drawn afresh each epoch
    (seeded by the training's seed and the epoch); batched with texts of similar lengths, so that a short sentence
    is not padded to a long one."""

    labelled: int
    per_epoch: int | None = None


@dataclass(frozen=True)
class TextSet:
    """Examples of one split: parallel tuples of ids and texts, labels as an int64 array (n,); `draw`, how training
    draws from it (None: every example once an epoch, shuffled)."""

    ids: tuple[str, ...]
    texts: tuple[str, ...]
    labels: np.ndarray
    draw: EpochDraw | None = field(default=None, kw_only=True)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, n: int) -> "TextSet":
        """The first `n` examples."""
        return TextSet(self.ids[:n], self.texts[:n], self.labels[:n])

    @classmethod
    def joined(cls, parts: Sequence["TextSet"]) -> "TextSet":
        """The examples of `parts`, one after another."""
        return TextSet(tuple(i for p in parts for i in p.ids), tuple(t for p in parts for t in p.texts),
                       np.concatenate([p.labels for p in parts]))

    def select(self, indices: list[int] | np.ndarray) -> "TextSet":
        return TextSet(
            tuple(self.ids[i] for i in indices), tuple(self.texts[i] for i in indices),
            self.labels[np.asarray(indices, dtype=np.int64)],
        )

    def with_texts(self, texts: Sequence[str]) -> "TextSet":
        """The same examples with their texts changed word by word (a typo never splits a word)."""
        return TextSet(self.ids, tuple(texts), self.labels)

    def training_rows(self, tokenizer, max_length: int) -> list[dict]:
        """One row per example, what training batches: the tokenizer's outputs, `index` (its position here) and
        `labels`, its label id."""
        encoded = tokenizer(list(self.texts), truncation=True, max_length=max_length)
        return [{**{key: encoded[key][i] for key in encoded}, "index": i, "labels": int(self.labels[i])}
                for i in range(len(self))]

    def label_ids(self) -> np.ndarray:
        """The label ids a split's class counts count: one a text."""
        return self.labels

    def content_lines(self, name: str) -> Iterator[bytes]:
        """What a digest of the examples reads (`DataSplits.content_sha256`): each example's split `name`, id,
        text and label, a line each."""
        for row in zip(self.ids, self.texts, self.labels.tolist(), strict=True):
            yield json.dumps([name, *row], ensure_ascii=False).encode() + b"\n"


@dataclass(frozen=True)
class PairSet(TextSet):
    """Scored sentence pairs (data.pairs) as one set of texts: every pair's first sentence, then every pair's second
    (texts i and n + i are pair i), labels -1, and each pair's score (n,), how alike people judged the two."""

    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def halves(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first sentences', second sentences') rows of `vectors` made for `texts`."""
        n = len(self.scores)
        return vectors[:n], vectors[n:]

    def content_lines(self, name: str) -> Iterator[bytes]:
        """The texts' lines, then the pairs' scores."""
        yield from super().content_lines(name)
        yield json.dumps([name, "scores", self.scores.tolist()]).encode() + b"\n"


@dataclass(frozen=True)
class DataSplits:
    """The three splits, the label names (id -> name), where they came from and how they were made (`note`: ""
    when as the source gives them or as data.split divides it)."""

    train: TextSet
    validation: TextSet
    test: TextSet
    id2label: dict[int, str]
    source: str
    note: str = ""
    unlabeled: tuple[str, ...] = ()  # transfer texts (data.unlabeled): the teacher labels them
    fidelity: dict[str, TextSet] = field(default_factory=dict)  # data.fidelity_sets; label -1: none given
    pairs: PairSet | None = None  # data.pairs: scored sentence pairs (an embedder's labelled check)
    per_epoch: int | None = None  # data.unlabeled.per_epoch: transfer texts each training epoch draws (None: all)

    def scored(self) -> dict[str, TextSet]:
        """What every stage is measured on: the test split first (accuracy, gates), then the sets its fidelity is
        held on: `typos`, the test split with a seeded typo in about one word of six, and the user's own; and
        `pairs`, the scored sentence pairs, when data.pairs names some."""
        from edgepress.data.fidelity import with_typos

        typos = self.test.with_texts(with_typos(self.test.texts))
        return {"test": self.test, "typos": typos, **self.fidelity, **({"pairs": self.pairs} if self.pairs else {})}

    def everything(self) -> TextSet:
        """Every example of every split: train, validation, then test."""
        return type(self.test).joined((self.train, self.validation, self.test))

    def class_counts(self) -> dict[str, dict[str, int]]:
        """Per split, how many examples of each label it has, every label named (0 where it has none)."""
        counts = {name: np.bincount(part.label_ids(), minlength=max(self.id2label) + 1)
                  for name, part in (("train", self.train), ("validation", self.validation), ("test", self.test))}
        return {split: {name: int(n[i]) for i, name in sorted(self.id2label.items())} for split, n in counts.items()}

    def content_sha256(self, splits: tuple[str, ...] = ("train", "validation", "test")) -> str:
        """A digest of every example (split, id, text, label) of `splits` and of the label names."""
        content = hashlib.sha256(json.dumps(sorted(self.id2label.items())).encode())
        if self.unlabeled:  # trained on: part of what every training stage's result depends on
            content.update(json.dumps(["unlabeled", *self.unlabeled], ensure_ascii=False).encode() + b"\n")
        if self.per_epoch is not None:
            content.update(json.dumps(["per_epoch", self.per_epoch]).encode() + b"\n")
        parts = [(name, getattr(self, name)) for name in splits]
        if "test" in splits:  # measured on beside the test split: part of every stage's metrics
            parts += [(f"fidelity:{name}", part) for name, part in sorted(self.fidelity.items())]
            parts += [("pairs", self.pairs)] if self.pairs else []
        for name, part in parts:
            for line in part.content_lines(name):
                content.update(line)
        return content.hexdigest()

    def manifest(self) -> dict:
        """The example ids of every split, recorded in each run so that a split can be checked and reproduced:
        `sha256` digests the ids of every split, `content_sha256` every example's split, id, text and label and the
        label names (what a stage's result depends on: the same ids with an edited text or label differ);
        `class_counts` each split's examples per label."""
        splits = {"train": self.train, "validation": self.validation, "test": self.test}
        ids = {name: list(part.ids) for name, part in splits.items()}
        digest = hashlib.sha256(repr(sorted(ids.items())).encode()).hexdigest()
        return {
            "source": self.source,
            "id2label": {str(k): v for k, v in self.id2label.items()},
            "sizes": {name: len(part) for name, part in splits.items()} | (
                {"unlabeled": len(self.unlabeled)} if self.unlabeled else {}) | {
                f"fidelity:{name}": len(part) for name, part in self.fidelity.items()} | (
                {"pairs": len(self.pairs.scores)} if self.pairs else {}),
            "sha256": digest,
            "content_sha256": self.content_sha256(),
            "class_counts": self.class_counts(),
            **({"note": self.note} if self.note else {}),
            "ids": ids,
        }


def text_key(text: str) -> str:
    """What two texts must share to be one input for an uncased model: case folded, white space collapsed (how
    texts judged on are kept out of what is trained on)."""
    return " ".join(text.casefold().split())


def _rank(seed: int, example_id: str) -> str:
    # A hash, not a PRNG stream: the same on every machine and every numpy version.
    return hashlib.sha256(f"{seed}:{example_id}".encode()).hexdigest()


def _order(examples: TextSet, seed: int) -> list[int]:
    return sorted(range(len(examples)), key=lambda i: _rank(seed, examples.ids[i]))


def _parts(examples: TextSet, fractions: tuple[float, ...], seed: int, stratify: bool) -> list[list[int]]:
    """Indices of `examples` for each of `fractions` (in order) and the rest last, each part in hash order. Stratified,
    each class is divided on its own: round(fraction × its count) of it, and at least one where it has three or more
    examples, so that no split lacks a class the data has enough of."""
    order = _order(examples, seed)
    groups = [[i for i in order if examples.labels[i] == c] for c in np.unique(examples.labels)] if stratify \
        else [order]
    parts = [[] for _ in range(len(fractions) + 1)]
    for group in groups:
        start = 0
        for k, fraction in enumerate(fractions):
            n = round(len(group) * fraction)
            n = max(n, 1) if stratify and len(group) >= 3 else n
            parts[k] += group[start : start + n]
            start += n
        parts[-1] += group[start:]
    rank = {i: r for r, i in enumerate(order)}
    return [sorted(part, key=rank.__getitem__) for part in parts]


def split_examples(examples: TextSet, cfg: SplitConfig, stratify: bool = True) -> tuple[TextSet, TextSet, TextSet]:
    """Seeded train / validation / test split of `examples`, ordered by a hash of (seed, id), by label when
    `stratify`."""
    test, val, train = _parts(examples, (cfg.test, cfg.validation), cfg.seed, stratify)
    return examples.select(train), examples.select(val), examples.select(test)


def hold_out(examples: TextSet, fraction: float, seed: int, stratify: bool = True) -> tuple[TextSet, TextSet]:
    """(rest, held out): a seeded `fraction` of `examples` held out (by label when `stratify`), e.g. validation
    carved from train."""
    held, rest = _parts(examples, (fraction,), seed, stratify)
    return examples.select(rest), examples.select(held)


def missing_classes(class_counts: dict[str, dict[str, int]]) -> list[str]:
    """'the test split has no example of negative' for each split that lacks a label the data has (from a
    manifest's `class_counts`): its accuracy says nothing about that class."""
    present = {name for counts in class_counts.values() for name, n in counts.items() if n}
    return [f"the {split} split has no example of {', '.join(missing)}" for split, counts in class_counts.items()
            if (missing := [name for name, n in counts.items() if n == 0 and name in present])]
