"""A cascade: a fast model (the student) answers each text it is sure of, and hands the others to a faithful one
(the fallback). A cascade dir is the student's ONNX dir with `cascade.json` (the threshold, the confidence rule,
the fallback's folder) and the fallback's ONNX dir inside it; `open_predictor` gives a `Cascade` for such a dir and
a `Predictor` for any other. One decision a text, whatever the task: the student's confidence is its top softmax
probability (`top`) or the top two's difference (`margin`), for a token classifier the least confident of its real
tokens (the first and last, [CLS] and [SEP], left out); a text whose confidence is under the threshold goes to the
fallback, which tokenizes it with its own tokenizer."""

import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bundle import EMBEDDING, json_object
from .entities import find_entities
from .errors import ModelError
from .feeds import Feeds, encoding_feeds, first_subword_rows, fixed_shape_feeds, natural_feeds
from .predictor import Prediction, Predictor, check_entities_asked, check_texts, softmax
from .timing import cpu_model, time_runner

CASCADE = "cascade.json"
RULES = ("top", "margin")
STUDENT, FALLBACK = "student", "fallback"
FIXED_WINDOWS = 8  # the fixed timing shape of a cascade: this many windows of real tokens, each decided alone
Pair = tuple[Feeds, Feeds]  # one text (or window) as the student and as the fallback read it


def is_cascade(directory: Path) -> bool:
    return (Path(directory) / CASCADE).is_file()


def read_cascade(directory: Path) -> dict:
    """cascade.json of a cascade dir, checked: threshold (a number), rule (`RULES`), fallback (a folder inside the
    dir holding a model)."""
    path = Path(directory) / CASCADE
    spec = json_object(path, "Fix: make the cascade again (a `cascade` stage), or bundle it with --no-cascade")
    threshold, rule, folder = spec.get("threshold"), spec.get("rule"), spec.get("fallback")
    fix = "Fix: make the cascade again with a `cascade` stage"
    if not isinstance(threshold, int | float) or isinstance(threshold, bool) or not np.isfinite(threshold):
        raise ModelError(f"{path}: threshold must be a number; got {threshold!r}. {fix}")
    if rule not in RULES:
        raise ModelError(f"{path}: rule must be one of {', '.join(RULES)}; got {rule!r}. {fix}")
    inside = Path(directory) / str(folder)
    if not isinstance(folder, str) or Path(folder).is_absolute() or ".." in Path(folder).parts \
            or not inside.is_dir():
        raise ModelError(f"{path}: fallback must name a folder inside {directory}; got {folder!r}. {fix}")
    return spec


def confidence(output: np.ndarray, attention_mask: np.ndarray, rule: str) -> float:
    """How sure a model is of one text, from its output for it (batch 1): logits (1, labels), or a token
    classifier's (1, seq, labels), whose least confident real token speaks for the text."""
    probs = softmax(np.asarray(output[0], dtype=np.float64))
    if probs.ndim == 2:
        real = np.flatnonzero(attention_mask[0])
        probs = probs[real[1:-1] if len(real) > 2 else real]
    ordered = np.sort(probs, axis=-1)
    value = ordered[..., -1] - (ordered[..., -2] if rule == "margin" and ordered.shape[-1] > 1 else 0.0)
    return float(np.min(value))


@dataclass(frozen=True)
class Answer:
    """Who answered one text (`STUDENT` or `FALLBACK`), the student's confidence, and the answer: the answering
    model's output row(s) for the text and the encoding it read."""

    model: str
    confidence: float
    output: np.ndarray
    encoding: object
    predictor: Predictor


class Cascade:
    """`Predictor`'s surface over a cascade dir: each text answered by the student, or by the fallback where the
    student's confidence is under the threshold. `log`, when set to a list, gets (model, confidence) of every text
    answered."""

    def __init__(self, bundle_dir: str | Path, providers: tuple[str, ...] = ("cpu",), threads: int | None = None,
                 max_length: int | None = None, threshold: float | None = None):
        self.bundle = Path(bundle_dir)
        self.spec = read_cascade(self.bundle)
        self.student = Predictor(self.bundle, providers, threads, max_length)
        self.fallback = Predictor(self.bundle / self.spec["fallback"], providers, threads,
                                  max_length or self.student.max_length)
        self.threshold = float(self.spec["threshold"] if threshold is None else threshold)
        self.rule = self.spec["rule"]
        self.log: list[tuple[str, float]] | None = None
        first, second = self.student, self.fallback
        if first.task != second.task or first.task == EMBEDDING:
            raise ModelError(f"{self.bundle}: the fallback in {second.bundle} does not do the student's task. Fix: "
                             f"make the cascade again with a fallback of the student's task")
        if first.id2label != second.id2label:
            raise ModelError(f"{self.bundle}: the fallback names its labels {second.id2label}, the student "
                             f"{first.id2label}. Fix: a fallback with the student's labels")
        self.task, self.output, self.tokens, self.id2label = first.task, first.output, first.tokens, first.id2label
        self.max_length, self.input_names = first.max_length, first.input_names

    def deferred(self, output: np.ndarray, feeds: Feeds) -> tuple[bool, float]:
        """(goes to the fallback, the student's confidence) of the student's `output` on `feeds` (one text)."""
        sure = confidence(output, feeds["attention_mask"], self.rule)
        return sure < self.threshold, sure

    def run_pair(self, pair: Pair) -> str:
        """One text (or window) through the cascade, as a device runs it: the student, then the fallback where it
        is unsure. Which model answered (what the timing loop calls)."""
        student, fallback = pair
        output = self.student.session.run([self.output], student)[0]
        if self.deferred(output, student)[0]:
            self.fallback.session.run([self.output], fallback)
            return FALLBACK
        return STUDENT

    def answer(self, text: str | list[str], pretokenized: bool = False) -> Answer:
        """One text (pre-split words with `pretokenized`) answered."""
        def read(predictor: Predictor) -> tuple[np.ndarray, object, Feeds]:
            encoding = predictor.tokenizer.encode(text, is_pretokenized=pretokenized)
            feeds = encoding_feeds([encoding], predictor.input_names)
            return predictor.session.run([self.output], feeds)[0], encoding, feeds

        output, encoding, feeds = read(self.student)
        defer, sure = self.deferred(output, feeds)
        model, predictor = (FALLBACK, self.fallback) if defer else (STUDENT, self.student)
        if defer:
            output, encoding, _ = read(self.fallback)
        if self.log is not None:
            self.log.append((model, sure))
        return Answer(model, sure, output[0], encoding, predictor)

    def logits(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), num_labels) logits, each text answered alone by the model the cascade gives it to."""
        if self.tokens:
            raise ModelError(f"{self.bundle} is a token classifier: it tags each word, it gives no label for a "
                             f"text. Fix: ask it for each word's tag (word_logits)")
        check_texts(texts)
        if not texts:
            return np.zeros((0, len(self.id2label)), dtype=np.float32)
        return np.stack([self.answer(text).output for text in texts])

    def word_logits(self, words: list[str] | tuple[str, ...]) -> np.ndarray:
        """A token classifier's (len(words), num_labels) logits of one sentence of pre-split words, from the model
        that answered it (`Predictor.word_logits`)."""
        if not self.tokens:
            raise ModelError(f"{self.bundle} gives one result per text, not a tag per word. Fix: tag words with a "
                             f"token-classification model's bundle")
        check_texts(words)
        found = self.answer(list(words), pretokenized=True)
        return first_subword_rows(found.encoding.word_ids, found.output, len(words), np.nan)

    def entities(self, text: str, aggregation: str = "simple") -> list[dict]:
        """`Predictor.entities`, from the model that answered the text."""
        check_entities_asked(self.bundle, self.tokens, text, aggregation)
        found = self.answer(text)
        return find_entities(found.predictor.tokenizer, found.encoding, text,
                             softmax(found.output.astype(np.float64)), aggregation, self.id2label)

    def embed(self, texts):
        raise ModelError(f"{self.bundle} is a cascade of classifiers: it gives labels, not sentence embeddings. Fix: "
                         f"bundle a sentence-transformers model to get embeddings")

    def predict_each(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """Each text's label and probabilities, from the model that answered it (named in `model`, with the
        student's `confidence`)."""
        if self.tokens:
            raise ModelError(f"{self.bundle} is a token classifier: it tags each word, it gives no label for a "
                             f"text. Fix: ask it for each text's entities")
        check_texts(texts)
        found = []
        for text in texts:
            answer = self.answer(text)
            probs = softmax(answer.output.astype(np.float64))
            found.append(Prediction(text, self.id2label[int(probs.argmax())], float(probs.max()),
                                    {self.id2label[i]: float(v) for i, v in enumerate(probs)}, answer.model,
                                    answer.confidence))
        return found

    predict = predict_each  # one text a call always: each text's route is its own

    def pairs(self, texts: tuple[str, ...]) -> list[Pair]:
        """Each text at its natural length, as the student and as the fallback read it."""
        return list(zip(natural_feeds(self.student.tokenizer, texts, self.student.input_names),
                        natural_feeds(self.fallback.tokenizer, texts, self.fallback.input_names), strict=True))

    def windows(self, texts: tuple[str, ...], batch_size: int, sequence_length: int) -> list[Pair]:
        """`FIXED_WINDOWS` fixed-shape windows of real tokens (each of every FIXED_WINDOWS-th text), as each model
        reads them: the cascade decides each window alone."""
        found = []
        for k in range(min(FIXED_WINDOWS, len(texts))):
            part = texts[k::FIXED_WINDOWS]
            found.append(tuple(fixed_shape_feeds(p.tokenizer, part * (1 + sequence_length * batch_size), batch_size,
                                                 sequence_length, p.input_names, p.limit)
                               for p in (self.student, self.fallback)))
        return found

    def bench(self, texts: tuple[str, ...], runs: int = 100, warmup: int = 10, sequence_length: int = 128) -> dict:
        """`Predictor.bench` of the cascade as a device meets it: mean, p50, p90, p99 in ms, each text (or window)
        through the student and, where it is unsure, the fallback; the share deferred."""
        check_texts(texts)
        length = min(sequence_length, self.max_length, self.fallback.max_length)
        fixed, natural = self.windows(texts, 1, length), self.pairs(texts)
        deferred = [self.run_pair(pair) == FALLBACK for pair in natural]
        return {"fixed": {**time_runner(self.run_pair, fixed, warmup, runs), "batch_size": 1,
                          "sequence_length": length},
                "natural": {**time_runner(self.run_pair, natural, warmup, max(runs, len(natural))),
                            "mean_tokens": float(np.mean([s["input_ids"].shape[1] for s, _ in natural]))},
                "deferred": float(np.mean(deferred)), "threshold": self.threshold, "rule": self.rule,
                "providers_used": self.student.session.get_providers(), "cpu": cpu_model(),
                "machine": platform.machine()}


def open_predictor(bundle_dir: str | Path, providers: tuple[str, ...] = ("cpu",), threads: int | None = None,
                   max_length: int | None = None) -> Predictor | Cascade:
    """What answers texts in `bundle_dir`: a `Cascade` where it holds one (`CASCADE`), else a `Predictor`."""
    kind = Cascade if is_cascade(Path(bundle_dir)) else Predictor
    return kind(bundle_dir, providers, threads, max_length)
