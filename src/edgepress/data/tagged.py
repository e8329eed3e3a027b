"""Token-classification data (NER, PII): sentences of words, a tag per word, read from CoNLL-style files (a word and
its tag per line, the tag last; a blank line between sentences; `-DOCSTART-` lines skipped) or JSON lines (`tokens`
and `tags`, or `text` and character `spans` as Prodigy and spaCy write them). Tags are the model's own (its
`id2label`), in its scheme: BIO (IOB2), BIOES or IO.

A model reads sub-words, and a word's tag goes to its first sub-word: the rest of the word, and the special tokens,
are ignored by the loss and by the metric (-100), as transformers' token-classification recipes do
(`first_subword_labels`)."""

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgepress.data.conll import conll2003, read_conll
from edgepress.data.dataset import TextSet
from edgepress.errors import DataError

IGNORED = -100  # a position no loss or metric reads (torch's CrossEntropyLoss ignore_index)
CONLL_SUFFIXES = (".conll", ".txt", ".iob", ".bio", ".tsv")
WORD = re.compile(r"\w+|[^\w\s]")  # how a text with character spans is split into words: BERT's pre-tokenizer's cut
SCHEMES = ("IOB2", "IOBES", "IO")


@dataclass(frozen=True)
class TaggedSet(TextSet):
    """Sentences of pre-split words with each word's tag id: `words` (n,) tuples of words, `tags` (n,) int64 arrays
    of one id per word; `texts` are the words joined by one space (what a fidelity check or a tokenizer without
    words reads), `labels` -1 (a sentence has no one label)."""

    words: tuple[tuple[str, ...], ...] = ()
    tags: tuple[np.ndarray, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, ids: Sequence[str], words: Sequence[Sequence[str]], tags: Sequence[Sequence[int]]) -> "TaggedSet":
        words = tuple(tuple(w) for w in words)
        return cls(tuple(ids), tuple(" ".join(w) for w in words), np.full(len(words), -1, np.int64), words,
                   tuple(np.asarray(t, np.int64) for t in tags))

    @classmethod
    def joined(cls, parts: Sequence["TaggedSet"]) -> "TaggedSet":
        return cls.of([i for p in parts for i in p.ids], [w for p in parts for w in p.words],
                      [t for p in parts for t in p.tags])

    def take(self, n: int) -> "TaggedSet":
        return self.select(list(range(min(n, len(self)))))

    def select(self, indices: list[int] | np.ndarray) -> "TaggedSet":
        return TaggedSet.of([self.ids[i] for i in indices], [self.words[i] for i in indices],
                            [self.tags[i] for i in indices])

    def with_texts(self, texts: Sequence[str]) -> "TaggedSet":
        """The same sentences with their words changed one by one: each keeps its words' count and tags."""
        return TaggedSet.of(self.ids, [text.split() for text in texts], self.tags)

    def training_rows(self, tokenizer, max_length: int) -> list[dict]:
        """One row per sentence: the tokenizer's outputs for its words, `index`, `labels` (each word's tag at its
        first sub-word, IGNORED elsewhere) and `word_index`, the number of the word each position starts (-1
        elsewhere)."""
        encoded = tokenizer([list(w) for w in self.words], truncation=True, max_length=max_length,
                            is_split_into_words=True)
        rows = []
        for i in range(len(self)):
            words = first_subword_words(encoded.word_ids(i))
            rows.append({**{key: encoded[key][i] for key in encoded}, "index": i, "word_index": words.tolist(),
                         "labels": tags_at(words, self.tags[i]).tolist()})
        return rows

    def label_ids(self) -> np.ndarray:
        """Each word's tag."""
        return np.concatenate(self.tags) if self.tags else self.labels

    def content_lines(self, name: str) -> Iterator[bytes]:
        """The sentences' lines, then each one's tags."""
        yield from super().content_lines(name)
        for example_id, tags in zip(self.ids, self.tags, strict=False):
            yield json.dumps([name, example_id, "tags", tags.tolist()]).encode() + b"\n"


def scheme_of(tag_names: Sequence[str]) -> str:
    """The tagging scheme of a model's tags: IOBES where any starts S- or E-, IOB2 (BIO) where any starts B-, else
    IO (an entity is a run of I- tags of one type)."""
    prefixes = {name.split("-", 1)[0] for name in tag_names if "-" in name}
    if prefixes & {"S", "E"}:
        return "IOBES"
    return "IOB2" if "B" in prefixes else "IO"


def check_tag_names(tag_names: Sequence[str], where: str) -> None:
    """Every tag `O` or PREFIX-TYPE with a prefix of B, I, E or S: what an entity-level metric can read."""
    bad = [name for name in tag_names if name != "O" and not re.fullmatch(r"[BIES]-\S+", name)]
    if bad:
        raise DataError(f"{where}: the tags {', '.join(map(repr, bad[:5]))} are not O or B-/I-/E-/S-TYPE, so no "
                        f"entity can be read from them. Fix: tag each word O, or B-TYPE / I-TYPE (BIO), with E- and "
                        f"S- for BIOES")


# --- reading files

def words_of(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) of each word of `text`: runs of letters and digits, and each other character alone."""
    return [(m.group(), m.start(), m.end()) for m in WORD.finditer(text)]


def _span_tags(text: str, spans: list, scheme: str, where: str) -> tuple[list[str], list[str]]:
    """The words of `text` and their tags in `scheme` from character `spans` ({start, end, label}); a span whose
    ends are not word boundaries is an error (the words it cuts cannot be tagged)."""
    words = words_of(text)
    tags = ["O"] * len(words)
    starts = {start: i for i, (_, start, _) in enumerate(words)}
    ends = {end: i for i, (_, _, end) in enumerate(words)}
    for span in spans:
        if not (isinstance(span, dict) and {"start", "end", "label"} <= span.keys()):
            raise DataError(f"{where}: a span is {span!r}. Fix: each span an object with start, end and label")
        first, last = starts.get(span["start"]), ends.get(span["end"])
        if first is None or last is None or last < first:
            raise DataError(f"{where}: the span {text[span['start']:span['end']]!r} ({span['start']}-{span['end']}) "
                            f"does not start and end on word boundaries (words: letters and digits, and each other "
                            f"character alone). Fix: move its start and end to the edges of the words it covers")
        if any(tags[i] != "O" for i in range(first, last + 1)):
            raise DataError(f"{where}: the span {text[span['start']:span['end']]!r} ({span['start']}-{span['end']}, "
                            f"{span['label']}) overlaps another span; a word has one tag. Fix: keep one of the "
                            f"overlapping spans")
        for i in range(first, last + 1):
            tags[i] = _prefixed(i - first, last - first + 1, scheme) + "-" + str(span["label"])
    return [w for w, _, _ in words], tags


def _prefixed(position: int, length: int, scheme: str) -> str:
    if scheme == "IO":
        return "I"
    if scheme == "IOBES":
        return "S" if length == 1 else "B" if position == 0 else "E" if position == length - 1 else "I"
    return "B" if position == 0 else "I"


def read_tagged_jsonl(path: Path, scheme: str) -> list[tuple[list[str], list[str]]]:
    """(words, tags) per line of a JSON-lines file: `tokens` and `tags` (tag names, as long as the tokens), or
    `text` and `spans` (character offsets and a label each: tags made in `scheme`)."""
    from edgepress.data.sources import read_jsonl

    sentences = []
    for number, row in enumerate(read_jsonl(path), start=1):
        where = f"{path}: line {number}"
        if "tokens" in row and "tags" in row:
            words, tags = row["tokens"], row["tags"]
            if not (isinstance(words, list) and isinstance(tags, list) and len(words) == len(tags)):
                raise DataError(f"{where}: tokens and tags must be lists of the same length (got "
                                f"{_length(words)} tokens, {_length(tags)} tags). Fix: one tag per token")
            if not words:
                raise DataError(f"{where}: the sentence has no token. Fix: remove the line (a sentence has at least "
                                f"one word)")
            sentences.append(([str(w) for w in words], [str(t) for t in tags]))
        elif "text" in row and "spans" in row:
            sentences.append(_span_tags(str(row["text"]), list(row["spans"] or []), scheme, where))
            if not sentences[-1][0]:
                raise DataError(f"{where}: the text {row['text']!r} has no word. Fix: remove the line, or give it "
                                f"its text")
        else:
            raise DataError(f"{where} has neither tokens and tags nor text and spans (its keys: "
                            f"{', '.join(row) or 'none'}). Fix: {{\"tokens\": [...], \"tags\": [...]}} or "
                            f"{{\"text\": ..., \"spans\": [{{\"start\": 0, \"end\": 5, \"label\": \"PER\"}}]}}")
    return sentences


def _length(value: object) -> str:
    return str(len(value)) if isinstance(value, list) else f"no list but {type(value).__name__}"


def read_tagged(path: Path, scheme: str) -> list[tuple[list[str], list[str]]]:
    """The sentences of a CoNLL-style file or a JSON-lines file, by its suffix; none is an error."""
    if path.suffix == ".jsonl":
        sentences = read_tagged_jsonl(path, scheme)
    elif path.suffix in CONLL_SUFFIXES:
        sentences = read_conll(path)
    else:
        raise DataError(f"{path} is no {', '.join(CONLL_SUFFIXES)} (CoNLL-style) or .jsonl file. Fix: a word and its "
                        f"tag per line (a blank line between sentences), or JSON lines with tokens and tags")
    if not sentences:
        raise DataError(f"{path} holds no sentence. Fix: a word and its tag per line, a blank line between sentences")
    return sentences


def tag_ids(sentences: list[tuple[list[str], list[str]]], label2id: Mapping[str, int], where: str) -> list[np.ndarray]:
    """Each sentence's tags as the model's ids; tags the model does not know are one error that lists them and the
    model's own."""
    unknown = sorted({t for _, tags in sentences for t in tags if t not in label2id})
    if unknown:
        raise DataError(f"{where}: the model has no tag {', '.join(map(repr, unknown[:10]))}"
                        f"{f' (and {len(unknown) - 10} more)' if len(unknown) > 10 else ''}; its tags are: "
                        f"{', '.join(label2id)}. Fix: tag the data with the model's tags (the scheme too: BIO, BIOES "
                        f"or IO), or give a model trained on these")
    used = {t for _, tags in sentences for t in tags if t != "O"}
    model_scheme, data_scheme = scheme_of(list(label2id)), scheme_of(sorted(used))
    if used and data_scheme != model_scheme:  # e.g. BIO data read by a BIOES model: its entities would vanish
        raise DataError(f"{where}: the data is tagged {data_scheme} (its tags: {', '.join(sorted(used)[:8])}), the "
                        f"model reads {model_scheme} (its tags: {', '.join(label2id)}): its entities would be read "
                        f"wrong. Fix: tag the data in {model_scheme}, or give a model trained on {data_scheme} tags")
    return [np.array([label2id[t] for t in tags], np.int64) for _, tags in sentences]


# --- words to sub-words

def first_subword_words(word_ids: Sequence[int | None]) -> np.ndarray:
    """Per sub-word position, the number of the word whose first sub-word it is, and -1 elsewhere (special tokens,
    the rest of a word); `word_ids` as a tokenizer's encoding gives them (None for a special token)."""
    words, seen = np.full(len(word_ids), -1, np.int64), set()
    for position, word in enumerate(word_ids):
        if word is not None and word not in seen:
            words[position] = word
            seen.add(word)
    return words


def tags_at(words: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """Per sub-word position, the tag of the word it starts (`words`, from `first_subword_words`), IGNORED where it
    starts none."""
    if not len(tags):
        return np.full(len(words), IGNORED, np.int64)
    return np.where(words >= 0, np.asarray(tags, np.int64)[np.maximum(words, 0)], IGNORED)


def first_subword_labels(word_ids: Sequence[int | None], tags: np.ndarray) -> np.ndarray:
    """Per sub-word position, its word's tag id at the word's first sub-word and IGNORED elsewhere (special tokens,
    the rest of a word)."""
    return tags_at(first_subword_words(word_ids), tags)


# --- a run's splits

DEMO_TAGGED = "demo:conll2003"
TAGGED_KINDS = (*CONLL_SUFFIXES, ".jsonl")
FIX_TAGGED = (f"Fix: give {DEMO_TAGGED}, a CoNLL-style ({', '.join(CONLL_SUFFIXES)}) or .jsonl file, or a directory "
              f"with train (validation, test) files of those kinds")


def _tagged_source(source: str, scheme: str) -> dict[str, list[tuple[list[str], list[str]]]]:
    """Sentences per split of `source` ({"all": ...} for a single file, to be split by data.split)."""
    from edgepress.data.sources import split_files
    from edgepress.errors import missing

    if source == DEMO_TAGGED:
        return {split: conll2003(split) for split in ("train", "validation", "test")}
    if source.startswith("demo:"):
        raise DataError(f"{source} is a classifier's data (texts with a label each); a token classifier reads "
                        f"sentences with a tag per word. {FIX_TAGGED}")
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"data source {missing(source)}. {FIX_TAGGED}")
    if path.is_file():
        return {"all": read_tagged(path, scheme)}
    files = split_files(path, TAGGED_KINDS)
    if "train" not in files:
        raise DataError(f"data directory {source} has no train file of a token classifier's data "
                        f"({', '.join(TAGGED_KINDS)}). {FIX_TAGGED}")
    return {split: read_tagged(file, scheme) for split, file in files.items()}


def _check_words(sentences: list[tuple[list[str], list[str]]], where: str) -> None:
    """Words hold no white space (a sentence's words are its text split on it) and are not empty."""
    bad = next(((i, w) for i, (words, _) in enumerate(sentences, 1) for w in words if not w or w != "".join(w.split())),
               None)
    if bad:
        raise DataError(f"{where}: sentence {bad[0]} has the word {bad[1]!r}, empty or holding white space. Fix: one "
                        f"word a token, split on white space (as CoNLL files are)")


def load_tagged(cfg, label2id: Mapping[str, int]):
    """The train / validation / test splits (`DataSplits` of `TaggedSet`s) of a token classifier's data `cfg`
    (a `DataConfig`), its tags mapped through the model's `label2id`; splits missing from the source are made as
    `load_data` makes them."""
    from edgepress.data.dataset import DataSplits
    from edgepress.data.load import check_sizes, resolve_splits

    extras = [name for name, value in (("data.fidelity_sets", cfg.fidelity_sets), ("data.pairs", cfg.pairs))
              if value]
    if extras:
        raise DataError(f"{', '.join(extras)} not built for token classifiers yet: their data are the tagged "
                        f"sentences of data.source. Fix: remove {', '.join(extras)}")
    sets = {}
    for split, sentences in _tagged_source(cfg.source, scheme_of(list(label2id))).items():
        where = f"{cfg.source} ({split})"
        _check_words(sentences, where)
        prefix = "" if split == "all" else f"{split}:"
        sets[split] = TaggedSet.of([f"{prefix}{i}" for i in range(len(sentences))], [w for w, _ in sentences],
                                   tag_ids(sentences, label2id, where))
    (train, validation, test), note = resolve_splits(sets, cfg)
    check_sizes({"train": train, "validation": validation, "test": test}, cfg)
    id2label = {i: name for name, i in label2id.items()}
    from edgepress.data.load import with_unlabeled

    data = DataSplits(train, validation, test, id2label, cfg.source, note)
    return with_unlabeled(data, cfg, id2label, read=_unlabeled_words)


def _unlabeled_words(cfg, id2label: dict[int, str], held: set[str]) -> tuple[tuple[str, ...], str]:
    """data.unlabeled's texts as a token classifier's transfer data: each text's words (`words_of`, BERT's
    pre-tokenizer's cut) joined by one space, as a tagged sentence's text is; the teacher tags them. Those that are a
    validation or test sentence are left out (and said)."""
    from edgepress.data.load import read_unlabeled

    texts, _ = read_unlabeled(cfg, id2label, set())
    joined = [" ".join(word for word, _, _ in words_of(text)) for text in texts]
    kept = tuple(text for text in joined if text and text not in held)
    left = len(joined) - len(kept)
    return kept, f"{left} unlabeled texts also in the validation or test split or a set judged on (or without words) " \
                 f"left out" if left else ""
