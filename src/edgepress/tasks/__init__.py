"""What differs per task, in one object chosen once per run (`task_of`): what a model gives for a text, how those
predictions are scored alone and against the baseline's, the metric the `accuracy` gate judges (`primary`), the
graph's output, and the methods built for the task.

- classification: a label id per text; accuracy against the labels, agreement with the baseline's labels.
- embedding (a sentence-transformers dir): a sentence vector per text; against the baseline's vectors, each text's
  cosine to its baseline vector and the overlap of its top-10 neighbours among the test texts with the baseline's
  (`neighbour_overlap`, the primary metric: the baseline's own is 1, so `accuracy.max_drop: 0.1` allows 90%).
- token-classification (a ...ForTokenClassification dir: NER, PII): a tag per word; entity-level micro F1 against
  the true tags (seqeval's strict spans, the primary metric), and against the baseline's tags (agreement).

Predictions of an ONNX graph are made one text per call (as a device makes them, and as `predict.py` does): with
dynamic int8, a padded batch would make each text's result depend on the others.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepress.data.dataset import PairSet, TextSet
from edgepress.errors import ConfigError
from edgepress.logs import tracked

NEIGHBOURS = 10  # the k of neighbour_overlap
ONLY_TAGGED_WORDS = ("augment makes perturbed copies of texts, whose words would no longer carry their tags: it is "
                     "not built for token classifiers. Fix: remove augment (a token classifier distils on the train "
                     "split's tagged sentences and data.unlabeled's texts, which the teacher tags)")


def _labelled(part: TextSet) -> bool:
    """Every text of `part` has a label (a fidelity set may come without)."""
    return bool(len(part)) and bool((part.labels >= 0).all())


@dataclass(frozen=True)
class Classification:
    name: str = "classification"
    output: str = "logits"
    predicts: str = "labels"  # what a run's progress says it is predicting
    primary: str = "accuracy"
    gated: tuple[str, ...] = ("accuracy",)  # what an accuracy gate's `metric` may name
    methods: tuple[str, ...] | None = None  # every method
    int8_params: tuple[tuple[str, object], ...] = ()  # what `edgepress init` adds to its int8 stage

    def load(self, data, label2id: dict[str, int] | None):
        """The run's splits of `data` (a DataConfig or a source), labels mapped by `label2id` (None: an embedder's
        texts, whose labels are their own)."""
        from edgepress.data.load import load_data

        return load_data(data, label2id)

    def torch_predictions(self, model, tokenizer, texts: tuple[str, ...], max_length: int) -> np.ndarray:
        from edgepress.models.evaluate import predict_logits

        return predict_logits(model, tokenizer, texts, max_length).argmax(axis=1)

    def onnx_predictions(self, predictor, texts: tuple[str, ...], what: str) -> np.ndarray:
        return np.array([int(predictor.logits([text])[0].argmax()) for text in tracked(texts, len(texts), what)],
                        dtype=np.int64)

    def scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """The metrics of `preds` by themselves: accuracy with its CI, macro-F1."""
        from edgepress.data.metrics import classification_metrics

        return classification_metrics(part.labels, preds)

    def baseline(self, part: TextSet, preds: np.ndarray) -> dict:
        """What the baseline's own metrics add: nothing (its accuracy is its own)."""
        return {}

    def training_score(self, tokenizer, part: TextSet, max_length: int):
        """(name, fn(model) -> float): what a training run keeps its best epoch by, the primary metric on `part`."""
        return self.primary, lambda model: self.scores(part, self.torch_predictions(
            model, tokenizer, part.texts, max_length))[self.primary]

    def set_scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """A fidelity set's own figures: its accuracy where the set has labels."""
        return {"accuracy": float(np.mean(preds == part.labels))} if _labelled(part) else {}

    def versus(self, part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """Against the baseline's predictions on the same texts: agreement with its labels (and its CI), and where
        the texts are labelled, the paired CI of the accuracy drop."""
        from edgepress.data.metrics import accuracy_ci95, accuracy_drop_ci95

        return {"agreement": float(np.mean(preds == base)), "agreement_ci95": accuracy_ci95(base, preds),
                **({"accuracy_drop_ci95": accuracy_drop_ci95(part.labels, base, preds)} if _labelled(part) else {})}


@dataclass(frozen=True)
class Embedding:
    name: str = "embedding"
    output: str = "sentence_embedding"
    predicts: str = "vectors"
    primary: str = "neighbour_overlap"
    gated: tuple[str, ...] = ("neighbour_overlap", "spearman")  # spearman: on data.pairs
    methods: tuple[str, ...] | None = ("distill", "heads", "ffn", "vocab", "magnitude", "export", "optimize", "fp16",
                                       "int8-dynamic", "int8-static", "int4")
    # smoothing: all-MiniLM-L6-v2's int8 neighbours 0.84 -> 0.91 on a VNNI CPU (benchmarks/embeddings.py)
    int8_params: tuple[tuple[str, object], ...] = (("smooth", 0.85),)

    load = Classification.load

    def torch_predictions(self, model, tokenizer, texts: tuple[str, ...], max_length: int) -> np.ndarray:
        from edgepress.models.evaluate import predict_outputs

        return predict_outputs(model, tokenizer, texts, max_length)

    def onnx_predictions(self, predictor, texts: tuple[str, ...], what: str) -> np.ndarray:
        return np.stack([predictor.embed([text])[0] for text in tracked(texts, len(texts), what)]) if texts else \
            np.zeros((0, 0), np.float32)

    def scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """Sentence vectors have no score of their own: their primary metric is measured against the baseline's."""
        return {"primary_metric": self.primary, "n_test": len(part),
                "dimension": int(preds.shape[1]) if preds.ndim == 2 else 0}

    def baseline(self, part: TextSet, preds: np.ndarray) -> dict:
        """The baseline against itself: cosine and neighbour overlap 1 (what a stage's drop is measured from)."""
        return self.versus(part, preds, preds)

    def set_scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """A set's own figures: the scored pairs' Spearman correlation with its CI (`sts_metrics`); none for a
        fidelity set (its vectors are scored against the baseline's, in `versus`)."""
        from edgepress.data.metrics import sts_metrics

        return sts_metrics(part.scores, *part.halves(preds)) if isinstance(part, PairSet) else {}

    def versus(self, part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """Against the baseline's vectors of the same texts: cosine and neighbour overlap with their CIs; the drop
        of the overlap from the baseline's own (1) with its CI; `agreement` (what fidelity gates judge) is the
        neighbour overlap."""
        from edgepress.data.metrics import embedding_metrics

        if len(part) < 2:
            return {}
        figures = embedding_metrics(base, preds, k=min(NEIGHBOURS, len(part) - 1))
        lo, hi = figures["neighbour_overlap_ci95"]
        return {**{k: v for k, v in figures.items() if k != "n_test"},
                "neighbour_overlap_drop_ci95": [1 - hi, 1 - lo],
                "agreement": figures["neighbour_overlap"], "agreement_ci95": [lo, hi],
                **self._pairs_drop(part, base, preds)}

    @staticmethod
    def _pairs_drop(part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """On scored pairs: the paired 95% CI of the Spearman drop from the baseline's."""
        from edgepress.data.metrics import spearman_drop_ci95

        if not isinstance(part, PairSet):
            return {}
        return {"spearman_drop_ci95": spearman_drop_ci95(part.scores, part.halves(base), part.halves(preds))}


WORDS_NOT_LABELLED = -1  # a word of a prediction array that is padding: (texts, most words), one tag id a word


@dataclass(frozen=True)
class TokenClassification:
    """A tag per word: predictions (texts, most words) of tag ids, -1 past each text's words; `tags` the model's tag
    names by id, in one scheme (BIO, BIOES or IO: `scheme_of`)."""

    tags: tuple[str, ...] = ()
    name: str = "token-classification"
    output: str = "logits"
    predicts: str = "tags"
    primary: str = "f1"
    gated: tuple[str, ...] = ("f1",)
    methods: tuple[str, ...] | None = None  # every method: the training ones learn each word's tag
    int8_params: tuple[tuple[str, object], ...] = ()

    @property
    def scheme(self) -> str:
        from edgepress.data.tagged import scheme_of

        return scheme_of(self.tags)

    def _ids(self, word_logits: list[np.ndarray]) -> np.ndarray:
        """(texts, most words) tag ids: each word's most likely tag, O for a word cut off (its logits NaN)."""
        outside = self.tags.index("O") if "O" in self.tags else 0
        out = np.full((len(word_logits), max((len(w) for w in word_logits), default=0)), WORDS_NOT_LABELLED,
                      np.int64)
        for i, logits in enumerate(word_logits):
            out[i, :len(logits)] = np.where(np.isnan(logits).any(axis=1), outside, logits.argmax(axis=1))
        return out

    def load(self, data, label2id: dict[str, int] | None):
        """The run's tagged sentences (`load_tagged`), each tag mapped by the model's `label2id`."""
        from edgepress.data.tagged import load_tagged

        return load_tagged(data, label2id)

    def torch_predictions(self, model, tokenizer, texts: tuple[str, ...], max_length: int) -> np.ndarray:
        from edgepress.models.evaluate import predict_word_logits

        return self._ids(predict_word_logits(model, tokenizer, texts, max_length))

    def onnx_predictions(self, predictor, texts: tuple[str, ...], what: str) -> np.ndarray:
        return self._ids([predictor.word_logits(text.split()) for text in tracked(texts, len(texts), what)])

    def names(self, preds: np.ndarray) -> list[list[str]]:
        """Each text's predicted tag names, its padding left out."""
        return [[self.tags[t] for t in row if t != WORDS_NOT_LABELLED] for row in np.asarray(preds)]

    def true_names(self, part: TextSet) -> list[list[str]] | None:
        """Each sentence's true tag names, where `part` has them (a tagged split, its typos), else None."""
        from edgepress.data.tagged import TaggedSet

        return [[self.tags[t] for t in tags] for tags in part.tags] if isinstance(part, TaggedSet) and part.tags \
            else None

    def scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """Entity-level micro F1 with its CI, precision, recall and per-type figures (`entity_metrics`)."""
        from edgepress.data.metrics import entity_metrics

        figures = entity_metrics(self.true_names(part), self.names(preds), self.scheme)
        return {"primary_metric": self.primary, **figures, "n_test": len(part)}

    def baseline(self, part: TextSet, preds: np.ndarray) -> dict:
        """What the baseline's own metrics add: nothing (its F1 is its own)."""
        return {}

    training_score = Classification.training_score

    def set_scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """A set's own entity F1 where it has true tags (the test split with typos has the test split's)."""
        from edgepress.data.metrics import entity_metrics

        true = self.true_names(part)
        return {"f1": entity_metrics(true, self.names(preds), self.scheme)["f1"]} if true is not None else {}

    def versus(self, part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """Against the baseline's tags of the same texts: `agreement`, the entity F1 of these tags with the
        baseline's taken as the truth (and its CI); where the texts have true tags, the paired CI of the F1 drop."""
        from edgepress.data.metrics import entity_f1_drop_ci95, entity_metrics

        theirs, ours, true = self.names(base), self.names(preds), self.true_names(part)
        agreement = entity_metrics(theirs, ours, self.scheme)
        return {"agreement": agreement["f1"], "agreement_ci95": agreement["f1_ci95"],
                **({"f1_drop_ci95": entity_f1_drop_ci95(true, theirs, ours, self.scheme)} if true is not None
                   else {})}


CLASSIFICATION, EMBEDDING = Classification(), Embedding()
TASKS = {task.name: task for task in (CLASSIFICATION, EMBEDDING, TokenClassification())}


def task_of(model_dir: Path | None, asked: str | None = None):
    """The task of the model in `model_dir` (None: the demo teacher, a classifier): embedding for a
    sentence-transformers dir, token-classification for a token classifier's (its tags read from config.json),
    else classification; `asked` (the config's `task`) must agree."""
    from edgepress.models.loading import is_token_classifier_dir
    from edgepress.models.sentence import is_sentence_dir

    found = EMBEDDING if model_dir is not None and is_sentence_dir(model_dir) else CLASSIFICATION
    if found is CLASSIFICATION and model_dir is not None and is_token_classifier_dir(model_dir):
        found = token_task(model_dir)
    if asked is not None and asked != found.name:
        why = {"embedding": "a sentence-transformers dir (it has modules.json)",
               "token-classification": "a token classifier (its config.json names a ...ForTokenClassification)"
               }.get(found.name, "a sequence classifier (no modules.json, no ...ForTokenClassification)")
        raise ConfigError(f"task: {asked}, but the model {model_dir} is {why}, so its task is {found.name}. Fix: "
                          f"task: {found.name}, or leave task out (it is read from the model dir)")
    return found


def token_task(model_dir: Path) -> TokenClassification:
    """The token-classification task of the model in `model_dir`: its tags (id2label), checked to be entity tags."""
    from edgepress.data.tagged import check_tag_names
    from edgepress.models.loading import label2id_of

    label2id = label2id_of(model_dir, torch_weights=False)
    tags = tuple(sorted(label2id, key=label2id.__getitem__))
    check_tag_names(tags, f"{model_dir}/config.json id2label")
    return TokenClassification(tags=tags)


def scored_task(model, part: TextSet):
    """The task a loaded model is scored by on `part` in training: a token classifier's (its tags from its config's
    id2label) on tagged sentences, else classification."""
    from edgepress.data.tagged import TaggedSet

    if not isinstance(part, TaggedSet):
        return CLASSIFICATION
    return TokenClassification(tags=tuple(model.config.id2label[i] for i in range(model.config.num_labels)))


def check_methods_for(task, stages) -> None:
    """Every stage method built for `task`; the ConfigError lists each that is not."""
    if isinstance(task, TokenClassification):
        augmented = [f"stage '{stage.name}' ({method})" for stage in stages for method, params in stage.attempts
                     if params.get("augment") is not None]
        if augmented:
            raise ConfigError(f"{', '.join(augmented)}: {ONLY_TAGGED_WORDS}")
    if task.methods is None:
        return
    wrong = [f"stage '{stage.name}': {method}" for stage in stages for method, _ in stage.attempts
             if method not in task.methods]
    if wrong:
        lines = "\n".join(f"  ✗ {w}" for w in wrong)
        raise ConfigError(f"these methods are not built for {task.name} models yet:\n{lines}\nFix: use "
                          f"{', '.join(task.methods)} on a {task.name} model")


def check_metrics_for(task, pairs: str | None, stages) -> None:
    """data.pairs only for an embedder, and every accuracy gate's `metric` one the task measures (spearman: where
    data.pairs names the pairs it is measured on); a ConfigError with its fix for the first that is not."""
    if pairs and task is not EMBEDDING:
        raise ConfigError(f"data.pairs ({pairs}) scores sentence vectors, and this is a {task.name} model. Fix: "
                          f"remove data.pairs, or give a sentence-transformers model")
    for stage in stages:
        metric = stage.gates.accuracy.metric if stage.gates.accuracy is not None else None
        if metric == "spearman" and task is EMBEDDING and not pairs:
            raise ConfigError(f"stage '{stage.name}': accuracy.metric spearman is measured on scored sentence pairs, "
                              f"and data.pairs names none. Fix: set data.pairs (demo:stsb, or a .csv / .jsonl file "
                              f"with sentence1, sentence2 and score columns), or metric: neighbour_overlap")
        if metric is not None and metric not in task.gated:
            raise ConfigError(f"stage '{stage.name}': accuracy.metric {metric} is not measured on {task.name} models. "
                              f"Fix: metric: {' or '.join(task.gated)}, or leave metric out ({task.primary})")
