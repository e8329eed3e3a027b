"""`Predictor`: a bundle's labels, sentence vectors, or a token classifier's tags and entities, with onnxruntime,
tokenizers and numpy alone."""

import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bundle import EMBEDDING, TOKEN_CLASSIFICATION, bundle_task, label_names, model_file, read_bundle
from .entities import AGGREGATIONS, find_entities
from .errors import ConfigError, DataError, ModelError
from .feeds import (
    Feeds,
    encode,
    encoding_feeds,
    first_subword_rows,
    fixed_shape_feeds,
    load_tokenizer,
    natural_feeds,
    position_limit,
)
from .sessions import load_session, session_options, task_output
from .timing import cpu_model, time_runner


@dataclass(frozen=True)
class Prediction:
    """One text's label, its probability, and the probability of every label; a cascade's (`cascade.Cascade`) also
    names the model that answered and the student's confidence."""

    text: str
    label: str
    score: float
    scores: dict[str, float]
    model: str | None = None
    confidence: float | None = None


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def check_texts(texts: list[str] | tuple[str, ...]) -> None:
    """Empty text is refused, as the data loader refuses it: a label for nothing would be a guess dressed as a
    prediction. Text that is not valid Unicode (bytes a shell could not decode) is refused too."""
    empty = [i + 1 for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if empty:
        raise DataError(f"text {', '.join(map(str, empty[:5]))} of {len(texts)} is empty. Fix: give non-empty "
                        f"text to classify")
    for i, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(f"text {i} of {len(texts)} is not valid UTF-8. Fix: pass text in the UTF-8 "
                            f"encoding") from None


def check_entities_asked(bundle: Path, tokens: bool, text: str, aggregation: str) -> None:
    """What asking a bundle for the entities in `text` refuses: a model that gives one result per text (`tokens`
    False), an unknown aggregation, empty text."""
    if not tokens:
        raise ModelError(f"{bundle} gives one result per text, not entities. Fix: find entities with a "
                         f"token-classification model's bundle")
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"unknown aggregation {aggregation!r}. Fix: one of {', '.join(AGGREGATIONS)}")
    check_texts([text])


class Predictor:
    """Classify texts with a bundle. Texts longer than `max_length` tokens are truncated to it. The texts of one
    call are padded to the longest: with an int8 graph, whose activations are quantized with ranges taken over the
    whole batch, a text's result then depends on its neighbours; classify one text per call where it must not
    (edgepress's evaluation and `predict.py` do)."""

    def __init__(self, bundle_dir: str | Path, providers: tuple[str, ...] = ("cpu",), threads: int | None = None,
                 max_length: int | None = None):
        self.bundle = Path(bundle_dir)
        config, manifest = read_bundle(self.bundle)
        self.limit = position_limit(config)
        self.max_length = max_length or int(manifest.get("max_length", self.limit))
        if self.max_length > self.limit:
            raise ConfigError(f"max_length {self.max_length} is longer than the model's position limit "
                              f"{self.limit}. Fix: use at most {self.limit}")
        self.task = bundle_task(self.bundle, manifest)  # what its reader reads: the graph must agree
        self.session = load_session(self.bundle / model_file(manifest), providers, session_options(threads))
        self.output = task_output(self.session, self.task, self.bundle)
        self.tokens = self.task == TOKEN_CLASSIFICATION
        if self.task != EMBEDDING and "id2label" not in config:
            raise ModelError(f"{self.bundle}/config.json has no id2label. Fix: export it again with `edgepress "
                             f"export` (which writes the names), or add id2label to config.json")
        self.id2label = label_names(config, self.bundle)
        self.tokenizer = load_tokenizer(self.bundle, self.max_length)
        self.input_names = tuple(i.name for i in self.session.get_inputs())

    def outputs(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), width) float32: the graph's output (logits, or sentence embeddings) for `texts` padded to
        the longest text of the call; empty text is refused."""
        if not texts:
            width = next(o.shape[-1] for o in self.session.get_outputs() if o.name == self.output)
            return np.zeros((0, width if isinstance(width, int) else 0), dtype=np.float32)
        check_texts(texts)
        return self.session.run([self.output], encode(self.tokenizer, texts, self.input_names))[0]

    def logits(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), num_labels) float32 logits of a classifier bundle (`outputs`)."""
        if self.task == EMBEDDING:
            raise ModelError(f"{self.bundle} is a sentence-embedding model: it gives vectors, not labels. Fix: "
                             f"ask it for embeddings (Predictor.embed)")
        if self.tokens:
            raise ModelError(f"{self.bundle} is a token classifier: it tags each word, it gives no label for a "
                             f"text. Fix: ask it for each word's tag (Predictor.word_logits)")
        return self.outputs(texts)

    def entities(self, text: str, aggregation: str = "simple") -> list[dict]:
        """The entities a token classifier finds in raw `text`, as transformers' token-classification pipeline gives
        them: {"entity_group", "score", "word", "start", "end"} (the text's characters start:end), its tags read per
        token (`simple`) or per word (`first`, `max`, `average`), adjacent tags of one type joined; `none`: each
        token's own tag but O, {"entity", "score", "index", "word", "start", "end"}."""
        check_entities_asked(self.bundle, self.tokens, text, aggregation)
        encoding = self.tokenizer.encode(text)
        logits = self.session.run([self.output], encoding_feeds([encoding], self.input_names))[0][0]
        return find_entities(self.tokenizer, encoding, text, softmax(logits.astype(np.float64)), aggregation,
                             self.id2label)

    def word_logits(self, words: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(words), num_labels) float32 logits of a token classifier for one sentence of pre-split `words`, each
        read at the word's first sub-word (`first_subword_rows`); a word cut off by max_length gets NaN."""
        if not self.tokens:
            raise ModelError(f"{self.bundle} gives one result per text, not a tag per word. Fix: tag words with a "
                             f"token-classification model's bundle")
        check_texts(words)
        encoding = self.tokenizer.encode(list(words), is_pretokenized=True)
        logits = self.session.run([self.output], encoding_feeds([encoding], self.input_names))[0][0]  # (seq, labels)
        return first_subword_rows(encoding.word_ids, logits, len(words), np.nan)

    def embed(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), dim) float32 sentence embeddings of an embedding bundle, one text per call: each vector
        independent of the other texts (an int8 graph's activation ranges would otherwise span the batch)."""
        if self.task != EMBEDDING:
            raise ModelError(f"{self.bundle} is a classifier: it gives labels, not sentence embeddings. Fix: bundle "
                             f"a sentence-transformers model to get embeddings")
        check_texts(texts)
        return np.concatenate([self.outputs([text]) for text in texts]) if texts else self.outputs(texts)

    def predict(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """The most probable label of each text, with the softmax probabilities."""
        probs = softmax(self.logits(texts).astype(np.float64))
        return [
            Prediction(text, self.id2label[int(p.argmax())], float(p.max()),
                       {self.id2label[i]: float(v) for i, v in enumerate(p)})
            for text, p in zip(texts, probs, strict=True)
        ]

    def predict_each(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """`predict`, one text per call: each result independent of the other texts (every text is checked first)."""
        check_texts(texts)
        return [self.predict([text])[0] for text in texts]

    def bench(self, texts: tuple[str, ...], runs: int = 100, warmup: int = 10, sequence_length: int = 128) -> dict:
        """Latency here: batch 1 × `sequence_length` real tokens (the texts' tokens end to end), and each text alone
        at its natural length; p50/p90/p99 in ms."""
        check_texts(texts)
        length = min(sequence_length, self.max_length)
        stream = texts * (1 + length // max(1, sum(len(self.tokenizer.encode(t).ids) for t in texts)))
        fixed = fixed_shape_feeds(self.tokenizer, stream, 1, length, self.input_names, self.limit)
        natural = natural_feeds(self.tokenizer, texts, self.input_names)

        def run(feeds: Feeds) -> object:
            return self.session.run([self.output], feeds)

        return {"fixed": {**time_runner(run, [fixed], warmup, runs), "batch_size": 1, "sequence_length": length},
                "natural": {**time_runner(run, natural, warmup, max(runs, len(natural))),
                            "mean_tokens": float(np.mean([f["input_ids"].shape[1] for f in natural]))},
                "providers_used": self.session.get_providers(), "cpu": cpu_model(), "machine": platform.machine()}
