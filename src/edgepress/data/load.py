"""`load_data`: any supported source -> checked, labelled train / validation / test splits."""

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping

import numpy as np

from edgepress.data.config import DEMO_SOURCE, DEMO_UNLABELED, DataConfig
from edgepress.data.dataset import DataSplits, TextSet, hold_out, split_examples, text_key
from edgepress.data.imdb import imdb_sentences
from edgepress.data.movie import ID2LABEL, load_movie_snippets
from edgepress.data.pairs import read_pairs
from edgepress.data.sources import SHOWN, RawSource, column_texts, read_source, read_text, row_numbers
from edgepress.device.lines import text_lines
from edgepress.errors import DataError

TEXT_FILES = (".txt", ".csv", ".jsonl")  # what data.unlabeled and a fidelity set may be


def _check_columns(raw: RawSource, cfg: DataConfig) -> None:
    for split, rows in raw.splits.items():
        where = cfg.source if split == "all" else f"{cfg.source} ({split})"
        if not rows:
            raise DataError(f"{where} has no examples. Fix: point data.source at a file with labelled rows")
        columns = list(rows[0])
        for role, column in (("text", cfg.text_column), ("label", cfg.label_column)):
            if column not in columns:
                raise DataError(
                    f"{where} has no {role} column '{column}'; its columns are: {', '.join(columns)}. "
                    f"Fix: set data.{role}_column to one of them"
                )


def _is_int_like(value: object) -> bool:
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    return isinstance(value, str) and value.strip().lstrip("-").isdigit()


def _label_key(value: object, names: tuple[str, ...] | None) -> str | None:
    """A label's name as a string: ClassLabel names win over ids; None for values that are no label."""
    if _is_int_like(value):
        number = int(float(value)) if not isinstance(value, str) else int(value)
        return names[number] if names and 0 <= number < len(names) else str(number)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _keys(raw: RawSource, cfg: DataConfig) -> dict[str, list[str]]:
    keys = {}
    for split, rows in raw.splits.items():
        split_keys = [_label_key(row.get(cfg.label_column), raw.label_names) for row in rows]
        bad = [i for i, k in enumerate(split_keys) if k is None]
        if bad:
            first = rows[bad[0]].get(cfg.label_column)
            raise DataError(
                f"{cfg.source} ({split}): column '{cfg.label_column}' must hold a class name or id; "
                f"{row_numbers(bad)} (first: {first!r}). Fix: drop or fill those rows"
            )
        keys[split] = split_keys
    return keys


def _label_ids(keys: list[str], label2id: Mapping[str, int] | None, where: str) -> tuple[dict[str, int],
                                                                                       dict[int, str]]:
    """Map every label key of the data `where` names to an id: the model's label2id when given, else ids as
    written or sorted names."""
    distinct = sorted(set(keys))
    if label2id is None:
        if all(_is_int_like(k) for k in distinct):
            mapping = {k: int(k) for k in distinct}
            return mapping, {i: str(i) for i in range(max(mapping.values()) + 1)}
        return {k: i for i, k in enumerate(distinct)}, dict(enumerate(distinct))
    id2label = {int(i): name for name, i in label2id.items()}
    mapping, unknown = {}, []
    for k in distinct:
        if k in label2id:
            mapping[k] = int(label2id[k])
        elif _is_int_like(k) and int(k) in id2label:
            mapping[k] = int(k)
        else:
            unknown.append(k)
    if unknown:
        known = ", ".join(f"{name} ({i})" for i, name in sorted(id2label.items()))
        raise DataError(
            f"{where}: labels the model does not know: {', '.join(map(repr, unknown))}. The model's labels are: "
            f"{known}. Fix: map your labels to these names or ids, or use a model trained on your labels"
        )
    return mapping, id2label


def _demo_source() -> RawSource:
    rows = [{"id": i, "text": t, "label": y} for i, t, y in load_movie_snippets()]
    return RawSource({"all": rows}, tuple(ID2LABEL[i] for i in sorted(ID2LABEL)))


def _text_sets(raw: RawSource, cfg: DataConfig, label2id) -> tuple[dict[str, TextSet], dict[int, str]]:
    keys = _keys(raw, cfg)
    mapping, id2label = _label_ids([k for split_keys in keys.values() for k in split_keys], label2id, cfg.source)
    if len(set(mapping.values())) < 2:
        raise DataError(
            f"{cfg.source} has a single class ({next(iter(mapping))!r}) in column '{cfg.label_column}'. "
            f"Fix: a classifier needs examples of at least two classes"
        )
    sets = {}
    for split, rows in raw.splits.items():
        prefix = "" if split == "all" else f"{split}:"
        ids = tuple(str(row["id"]) if "id" in row else f"{prefix}{i}" for i, row in enumerate(rows))
        duplicated = [i for i, n in Counter(ids).items() if n > 1]
        if duplicated:
            raise DataError(f"{cfg.source}: ids must be unique; repeated: {', '.join(duplicated[:SHOWN])}. "
                            f"Fix: make the id column unique, or drop it (rows are then numbered)")
        labels = np.array([mapping[k] for k in keys[split]], dtype=np.int64)
        sets[split] = TextSet(ids, column_texts(rows, cfg.text_column, f"{cfg.source} ({split})"), labels)
    return sets, id2label


def load_data(cfg: DataConfig, label2id: Mapping[str, int] | None = None) -> DataSplits:
    """Read, check and split the data of `cfg`; labels map through the model's `label2id` when one is given.

    A source without splits of its own is split by `cfg.split`. A source with its own splits keeps those it has:
    without a validation split, a `split.validation` fraction of train is held out; without a test split, its
    validation split is the test split (and validation is held out of train); with a train split alone, train is
    split as a source without splits. The splits' `note` says which of these happened.
    """
    raw = _demo_source() if cfg.source == DEMO_SOURCE else read_source(cfg.source, cfg.label_column)
    _check_columns(raw, cfg)
    sets, id2label = _text_sets(raw, cfg, label2id)
    (train, validation, test), note = resolve_splits(sets, cfg)
    ignored = f"splits not read: {', '.join(raw.ignored)}" if raw.ignored else ""
    check_sizes({"train": train, "validation": validation, "test": test}, cfg)
    fidelity = {name: _fidelity_set(name, path, cfg, id2label) for name, path in cfg.fidelity_sets.items()}
    pairs = read_pairs(cfg.pairs) if cfg.pairs else None
    data = DataSplits(train, validation, test, id2label, cfg.source, "; ".join(filter(None, [note, ignored])), (),
                      fidelity, pairs)
    return with_unlabeled(data, cfg, id2label)


def with_unlabeled(data: DataSplits, cfg: DataConfig, id2label: dict[int, str], read=None) -> DataSplits:
    """`data` with `cfg.unlabeled`'s texts (`read`: how a task reads them, by default `read_unlabeled`), those judged
    on (validation, and every set scored: test, typos, fidelity sets, pairs) left out, and its per-epoch draw."""
    if cfg.unlabeled is None:
        return data
    judged = {*data.validation.texts, *(t for part in data.scored().values() for t in part.texts)}
    unlabeled, held = (read or read_unlabeled)(cfg, id2label, judged)
    return dataclasses.replace(data, note="; ".join(filter(None, [data.note, held])), unlabeled=unlabeled,
                               per_epoch=cfg.transfer.per_epoch)


def _text_lines(path) -> tuple[str, ...]:
    """The lines of a .txt file of texts, one per line; an empty line is an error (a text lost its line break)."""
    lines = text_lines(read_text(path))
    empty = [i for i, line in enumerate(lines) if not line.strip()]
    if empty:
        raise DataError(f"{path}: {row_numbers(empty, 'line', ('are empty', 'is empty'))}. Fix: one text per line, "
                        f"no empty lines")
    return tuple(line.strip() for line in lines)


def read_unlabeled(cfg: DataConfig, id2label: dict[int, str], held: set[str]) -> tuple[tuple[str, ...], str]:
    """The texts of `cfg.unlabeled` (its `max_texts` sample when it has one) without those in `held` (the texts
    judged on: a student taught the teacher's label of a text it is judged on would be judged on its lesson), and a
    note of how many were left out."""
    transfer = cfg.transfer
    texts = imdb_sentences() if transfer.source == DEMO_UNLABELED else _unlabeled_file(cfg, transfer.source, id2label)
    if transfer.max_texts is not None and transfer.max_texts < len(texts):
        texts = sampled(texts, transfer.max_texts, transfer.seed)
    held = {text_key(t) for t in held}
    kept = tuple(t for t in texts if text_key(t) not in held)
    if transfer.per_epoch is not None and transfer.per_epoch > len(kept):
        raise DataError(f"data.unlabeled.per_epoch is {transfer.per_epoch:,}, more than the {len(kept):,} texts "
                        f"{transfer.source} gives{' under max_texts' if transfer.max_texts else ''}. Fix: per_epoch at "
                        f"most {len(kept)}, or remove it (every text every epoch)")
    left = len(texts) - len(kept)
    return kept, f"{left} unlabeled texts also in the validation or test split or a set judged on left out" if left \
        else ""


def sampled(texts: tuple[str, ...], n: int, seed: int) -> tuple[str, ...]:
    """A seeded sample of `n` of `texts`, in their order: those whose hash with `seed` ranks lowest (the same on every
    machine; a smaller sample's texts are among a larger one's)."""
    import hashlib

    rank = sorted(range(len(texts)), key=lambda i: hashlib.sha256(f"{seed}:{texts[i]}".encode()).digest())
    return tuple(texts[i] for i in sorted(rank[:n]))


def _unlabeled_file(cfg: DataConfig, source: str, id2label: dict[int, str]) -> tuple[str, ...]:
    """The texts of a data.unlabeled file, checked to be texts (not a column of labels)."""
    from edgepress.data.sources import named_file, read_file

    path = named_file(source, "data.unlabeled", TEXT_FILES, "the path of a .txt, .csv or .jsonl file of texts, or "
                      f"{DEMO_UNLABELED}", f"a .txt file with one text per line, or a .csv / .jsonl file with a "
                      f"'{cfg.text_column}' column")
    if path.suffix == ".txt":
        texts = _text_lines(path)
    else:
        rows = read_file(path)
        if rows and cfg.text_column not in rows[0]:
            raise DataError(f"data.unlabeled {path} has no text column '{cfg.text_column}'; its columns are: "
                            f"{', '.join(rows[0])}. Fix: set data.text_column, or give a .txt file")
        texts = column_texts(rows, cfg.text_column, f"data.unlabeled {path}")
    names = {str(k) for k in id2label} | {v.lower() for v in id2label.values()}
    if not texts or all(t.lower() in names for t in texts):
        what = "has no texts" if not texts else \
            f"holds labels, not texts (every line is one of: {', '.join(sorted(names))})"
        raise DataError(f"data.unlabeled {path} {what}. Fix: point data.unlabeled at texts to label, one per line")
    return texts


def _fidelity_set(name: str, path: str, cfg: DataConfig, id2label: dict[int, str]) -> TextSet:
    """One of `data.fidelity_sets`: its texts, and its labels (the model's ids) where it has a label column, else
    -1 for each."""
    from edgepress.data.sources import named_file, read_file

    where = f"data.fidelity_sets.{name} ({path})"
    file = named_file(path, f"data.fidelity_sets.{name}", TEXT_FILES,
                      "the path of a .txt, .csv or .jsonl file of texts", f"a .txt file with one text per line, or "
                      f"a .csv / .jsonl file with a '{cfg.text_column}' column (and '{cfg.label_column}' for labels)",
                      where)
    if file.suffix == ".txt":
        texts = _text_lines(file)
        if not texts:
            raise DataError(f"{where} has no texts. Fix: one text per line")
        return TextSet(tuple(f"{name}:{i}" for i in range(len(texts))), texts, np.full(len(texts), -1, np.int64))
    rows = read_file(file)
    if not rows or cfg.text_column not in rows[0]:
        columns = ", ".join(rows[0]) if rows else "none (no rows)"
        raise DataError(f"{where} has no text column '{cfg.text_column}'; its columns are: {columns}. Fix: set "
                        f"data.text_column, or give a .txt file")
    texts = column_texts(rows, cfg.text_column, where)
    labels = np.full(len(texts), -1, np.int64)
    if cfg.label_column in rows[0]:
        raw = RawSource({"all": rows}, None)
        keys = _keys(raw, cfg.model_copy(update={"source": where}))["all"]
        mapping, _ = _label_ids(keys, {label: i for i, label in id2label.items()}, where)
        labels = np.array([mapping[k] for k in keys], dtype=np.int64)
    return TextSet(tuple(f"{name}:{i}" for i in range(len(texts))), texts, labels)


def resolve_splits(sets: dict[str, TextSet], cfg: DataConfig) -> tuple[tuple[TextSet, TextSet, TextSet], str]:
    """(train, validation, test) from the splits a source has, and how they were made ("" when as given)."""
    held = f"a seeded {cfg.split.validation:g} of train{' (by label)' if cfg.stratified else ''} held out as " \
        f"validation"
    if "all" in sets:
        return split_examples(sets["all"], cfg.split, cfg.stratified), ""
    if "train" not in sets:
        raise DataError(f"{cfg.source} has no train split (splits: {', '.join(sets)}). Fix: name the split to train "
                        f"on train, or give one file to be split by data.split")
    if "test" in sets and "validation" in sets:
        return (sets["train"], sets["validation"], sets["test"]), ""
    train, validation = hold_out(sets["train"], cfg.split.validation, cfg.split.seed, cfg.stratified)
    if "test" in sets:
        return (train, validation, sets["test"]), held
    if "validation" in sets:
        return (train, validation, sets["validation"]), f"no test split: the validation split is the test split, {held}"
    return split_examples(sets["train"], cfg.split, cfg.stratified), "a train split alone: split by data.split"


def check_sizes(splits: dict[str, TextSet], cfg: DataConfig) -> None:
    """A DataError with its fix when a split is empty."""
    empty = [name for name, part in splits.items() if len(part) == 0]
    if empty:
        sizes = ", ".join(f"{name} {len(part)}" for name, part in splits.items())
        raise DataError(f"{cfg.source} leaves the {' and '.join(empty)} split empty ({sizes}). Fix: give more "
                        f"examples, or larger data.split fractions")


def load_texts(source: str, text_column: str = "text") -> tuple[str, ...]:
    """The texts of a source, labels unread (parity checks and timing need texts only): every split's, in order;
    for the demo source, its validation split (movie sentences, whatever labels the model has)."""
    if source == DEMO_SOURCE:
        return load_data(DataConfig()).validation.texts
    raw = read_source(source, label_column="")
    texts = []
    for split, rows in raw.splits.items():
        where = source if split == "all" else f"{source} ({split})"
        if not rows:
            continue
        if text_column not in rows[0]:
            raise DataError(f"{where} has no text column '{text_column}'; its columns are: {', '.join(rows[0])}. "
                            f"Fix: name the column that holds the text (--text-column)")
        texts += column_texts(rows, text_column, where)
    if not texts:
        raise DataError(f"{source} has no texts. Fix: point --data at a file with a text per row")
    return tuple(texts)
