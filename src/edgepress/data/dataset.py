"""Labelled text examples and the train / validation / test splits every stage reads."""

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from edgepress.data.config import SplitConfig


@dataclass(frozen=True)
class TextSet:
    """Examples of one split: parallel tuples of ids and texts, labels as an int64 array (n,)."""

    ids: tuple[str, ...]
    texts: tuple[str, ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, n: int) -> "TextSet":
        """The first `n` examples."""
        return TextSet(self.ids[:n], self.texts[:n], self.labels[:n])

    def select(self, indices: list[int] | np.ndarray) -> "TextSet":
        return TextSet(
            tuple(self.ids[i] for i in indices), tuple(self.texts[i] for i in indices),
            self.labels[np.asarray(indices, dtype=np.int64)],
        )


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

    def everything(self) -> TextSet:
        """Every example of every split: train, validation, then test."""
        parts = (self.train, self.validation, self.test)
        return TextSet(tuple(i for p in parts for i in p.ids), tuple(t for p in parts for t in p.texts),
                       np.concatenate([p.labels for p in parts]))

    def manifest(self) -> dict:
        """The example ids of every split, recorded in each run so that a split can be checked and reproduced:
        `sha256` digests the ids of every split, `content_sha256` every example's split, id, text and label and the
        label names (what a stage's result depends on: the same ids with an edited text or label differ)."""
        splits = {"train": self.train, "validation": self.validation, "test": self.test}
        ids = {name: list(part.ids) for name, part in splits.items()}
        digest = hashlib.sha256(repr(sorted(ids.items())).encode()).hexdigest()
        content = hashlib.sha256(json.dumps(sorted(self.id2label.items())).encode())
        for name, part in splits.items():
            for row in zip(part.ids, part.texts, part.labels.tolist(), strict=True):
                content.update(json.dumps([name, *row], ensure_ascii=False).encode() + b"\n")
        return {
            "source": self.source,
            "id2label": {str(k): v for k, v in self.id2label.items()},
            "sizes": {name: len(part) for name, part in splits.items()},
            "sha256": digest,
            "content_sha256": content.hexdigest(),
            **({"note": self.note} if self.note else {}),
            "ids": ids,
        }


def _rank(seed: int, example_id: str) -> str:
    # A hash, not a PRNG stream: the same on every machine and every numpy version.
    return hashlib.sha256(f"{seed}:{example_id}".encode()).hexdigest()


def _order(examples: TextSet, seed: int) -> list[int]:
    return sorted(range(len(examples)), key=lambda i: _rank(seed, examples.ids[i]))


def split_examples(examples: TextSet, cfg: SplitConfig) -> tuple[TextSet, TextSet, TextSet]:
    """Seeded train / validation / test split of `examples`, ordered by a hash of (seed, id)."""
    order = _order(examples, cfg.seed)
    n_test = round(len(order) * cfg.test)
    n_val = round(len(order) * cfg.validation)
    test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    return examples.select(train), examples.select(val), examples.select(test)


def hold_out(examples: TextSet, fraction: float, seed: int) -> tuple[TextSet, TextSet]:
    """(rest, held out): a seeded `fraction` of `examples` held out, e.g. validation carved from train."""
    order = _order(examples, seed)
    n = round(len(order) * fraction)
    return examples.select(order[n:]), examples.select(order[:n])
