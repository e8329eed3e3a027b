"""classification: a label id per text; accuracy against the labels, agreement with the baseline's labels."""

import math
from dataclasses import dataclass

import numpy as np

from edgepress.data.dataset import TextSet
from edgepress.device.bundle import CLASSIFICATION, TASK_OUTPUTS
from edgepress.logs import tracked

DISAGREEMENT = 0.1  # a compressed model's labels differ from its teacher's on about this share (the demo: 0.12)


def resolvable_drop(n_test: int) -> float:
    """The smallest `max_drop` (in steps of half a point, at least one point) outside the noise of `n_test` test
    examples: the half-width of the paired drop's 95% CI when `DISAGREEMENT` of the labels differ."""
    half_width = 1.96 * math.sqrt(DISAGREEMENT / n_test)
    return round(max(0.01, math.ceil(half_width / 0.005) * 0.005), 3)


def _labelled(part: TextSet) -> bool:
    """Every text of `part` has a label (a fidelity set may come without)."""
    return bool(len(part)) and bool((part.labels >= 0).all())


@dataclass(frozen=True)
class Classification:
    name: str = CLASSIFICATION
    # what a bundle's model card says of the task: the Hub's name for it, the graph's output a caller reads, a text
    # to show it on, and the optimum class that loads the bundle (None: none checked)
    pipeline_tag: str = "text-classification"
    graph_output: str = TASK_OUTPUTS[CLASSIFICATION]
    example_text: str = "A gripping, beautifully acted film."
    optimum_class: str | None = "ORTModelForSequenceClassification"
    output: str = "logits"
    predicts: str = "labels"  # what a run's progress says it is predicting
    primary: str = "accuracy"
    gated: tuple[str, ...] = ("accuracy",)  # what an accuracy gate's `metric` may name
    methods: tuple[str, ...] | None = None  # every method
    refused: tuple[tuple[str, str], ...] = ()  # (method, why): none
    int8_params: tuple[tuple[str, object], ...] = ()  # what `edgepress init` adds to its int8 stage
    # what a search adds to its width stage's recovery: TinyBERT's hidden-state loss (on the demo teacher, 4 layers,
    # heads 1/2, FFN 1/4, width 3/4: validation 0.8590, 0.8562, ... per epoch without it, 0.8628, 0.8609, 0.8685 with)
    width_params: tuple[tuple[str, object], ...] = (("hidden_weight", 1.0),)
    labelled: bool = True  # its predictions are label names (a bundle's manifest lists them)
    starter_leaves_out: tuple[tuple[str, str], ...] = ()  # (method, why) `edgepress init` leaves out for the task

    def starter_drop(self, n_test: int) -> float:
        """The drop the final gate `edgepress init` writes allows: the smallest `n_test` test texts resolve."""
        return resolvable_drop(n_test)

    def starter_gate_line(self, drop: float, n_test: int) -> str:
        """What `edgepress init` says of its final gate."""
        return (f"The final gate allows a drop of {drop * 100:g} points: on {n_test:,} test examples a smaller drop "
                f"is within the noise (the paired 95% CI when a tenth of the labels differ).")

    output_axes: tuple[tuple[int, str], ...] = ((0, "batch_size"),)  # the graph output's dynamic axes
    # what a student learns from its teacher (compress/kd.py): `logits` per text, `word-logits` per word (a token
    # classifier's), `vectors` (a sentence encoder's, by cosine + MSE)
    targets: str = "logits"

    def save_model(self, model, out) -> None:
        """`model` as a model dir in `out` (safetensors; the tokenizer is saved beside it by the caller)."""
        model.save_pretrained(out, safe_serialization=True)

    def traced(self, model):
        """(what the export traces, the graph outputs it gives beside `output`, dropped once traced): the model."""
        return model, ()

    def save_config(self, model, out) -> None:
        """config.json in `out` with the label names always written: transformers 5 leaves default ones (LABEL_0,
        ...) out, and an ONNX model's readers (predict.py, transformers.js) have no defaults to fall back on."""
        from edgepress.files import read_json, write_json

        config = model.config
        config.save_pretrained(out)
        names = {str(i): name for i, name in sorted(config.id2label.items())}
        saved = read_json(out / "config.json")
        write_json(out / "config.json", {**saved, "id2label": names, "label2id": {n: int(i) for i, n in names.items()}})

    def check_distill(self, cfg) -> None:
        """A ConfigError for a distill config (`DistillConfig`) not built for the task's students: none here."""

    def check_recovery(self, cfg) -> None:
        """A ConfigError for a recovery config (heads, ffn, width, lowrank: `structured.Recovery`) not built for the
        task's models: none here (the hidden-state loss reads each text with both tokenizers)."""

    def check_student_words(self, words) -> None:
        """A ConfigError for a pretrained student's tokenizer `words` that cannot read the task's texts: none here
        (any tokenizer reads a text)."""

    def check_teacher(self, model, teacher) -> None:
        """A recovery's `teacher` dir (heads, ffn) names the labels of `model` with the same ids: its logits are the
        recovery's targets, position by position."""
        from edgepress.errors import ConfigError
        from edgepress.models.loading import label2id_of

        labels = label2id_of(teacher)
        if labels != dict(model.config.label2id):
            raise ConfigError(f"teacher {teacher} names its labels {labels}, the model {dict(model.config.label2id)}:"
                              f" its logits would teach the wrong classes. Fix: a teacher with the model's labels, or "
                              f"teacher: baseline")

    def web_pipeline(self, model_dir) -> dict:
        """The transformers.js pipeline a web bundle of the model in `model_dir` runs, and its options."""
        return {"pipeline": "text-classification"}

    auto_class: str = "AutoModelForSequenceClassification"  # the transformers class its models load with

    def load_model(self, model_dir):
        """(model, tokenizer) of a transformers ...ForSequenceClassification (a token classifier's:
        ...ForTokenClassification) dir."""
        from edgepress.models.loading import load_classifier

        return load_classifier(model_dir, self.auto_class)

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
        """The metrics of `preds` by themselves: accuracy with its CI, macro-F1 (and the task and its primary
        metric: what every reader of a record asks, `recorded_task`)."""
        from edgepress.data.metrics import classification_metrics

        return {"task": self.name, "primary_metric": self.primary, **classification_metrics(part.labels, preds)}

    def baseline(self, part: TextSet, preds: np.ndarray) -> dict:
        """What the baseline's own metrics add: nothing (its accuracy is its own)."""
        return {}

    def training_score(self, tokenizer, part: TextSet, max_length: int):
        """(name, fn(model) -> float): what a training run keeps its best epoch by, the primary metric on `part`."""
        return self.primary, lambda model: self.scores(part, self.torch_predictions(
            model, tokenizer, part.texts, max_length))[self.primary]

    def agreement_of(self, base: np.ndarray, preds: np.ndarray) -> float:
        """`versus`'s agreement alone, without its CI (what a cascade's calibration reads at every point of its
        grid): the share of texts labelled as the baseline labels them."""
        return float(np.mean(np.asarray(preds) == np.asarray(base)))

    def score_of(self, part: TextSet, preds: np.ndarray) -> float:
        """The primary metric alone, without its CI: accuracy."""
        return float(np.mean(np.asarray(preds) == part.labels))

    def set_scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """A fidelity set's own figures: its accuracy where the set has labels."""
        return {"accuracy": float(np.mean(preds == part.labels))} if _labelled(part) else {}

    def versus(self, part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """Against the baseline's predictions on the same texts: agreement with its labels (and its CI), and where
        the texts are labelled, the paired CI of the accuracy drop."""
        from edgepress.data.metrics import accuracy_ci95, accuracy_drop_ci95

        return {"agreement": float(np.mean(preds == base)), "agreement_ci95": accuracy_ci95(base, preds),
                **({"accuracy_drop_ci95": accuracy_drop_ci95(part.labels, base, preds)} if _labelled(part) else {})}
