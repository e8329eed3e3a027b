"""The torch-free predictor: a bundle dir (model.onnx, tokenizer.json, config.json with id2label) classified with
onnxruntime, tokenizers and numpy alone."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepress.errors import ConfigError, DataError, ModelError
from edgepress.runtime.session import SessionConfig, open_session
from edgepress.runtime.tokenize import load_tokenizer

BUNDLE_FILES = ("model.onnx", "tokenizer.json", "config.json")
MANIFEST = "edgepress.json"


@dataclass(frozen=True)
class Prediction:
    """One text's label, its probability, and the probability of every label."""

    text: str
    label: str
    score: float
    scores: dict[str, float]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _read_bundle(bundle: Path) -> tuple[dict, dict]:
    missing = [name for name in BUNDLE_FILES if not (bundle / name).is_file()]
    if missing:
        raise ModelError(f"{bundle} is not a model bundle: missing {', '.join(missing)}. "
                         f"Fix: point at a bundle written by `edgepress bundle` or an exported model dir")
    config = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
    manifest_path = bundle / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    if "id2label" not in config:
        raise ModelError(f"{bundle}/config.json has no id2label. Fix: save the model with its label names")
    return config, manifest


class Predictor:
    """Classify texts with a bundle. Texts longer than `max_length` tokens are truncated to it."""

    def __init__(self, bundle_dir: str | Path, providers: tuple[str, ...] = ("cpu",), threads: int | None = None,
                 max_length: int | None = None):
        self.bundle = Path(bundle_dir)
        config, manifest = _read_bundle(self.bundle)
        limit = int(config.get("max_position_embeddings", 512))
        self.max_length = max_length or int(manifest.get("max_length", limit))
        if self.max_length > limit:
            raise ConfigError(f"max_length {self.max_length} is longer than the model's position limit {limit}. "
                              f"Fix: use at most {limit}")
        self.id2label = {int(k): v for k, v in config["id2label"].items()}
        self.session = open_session(self.bundle / "model.onnx", SessionConfig(providers=providers, threads=threads))
        self.tokenizer = load_tokenizer(self.bundle, self.max_length)
        self.input_names = tuple(i.name for i in self.session.get_inputs())

    def logits(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), num_labels) float32 logits, padded to the longest text of the call. Empty text is refused,
        as the data loader refuses it: a label for nothing would be a guess dressed as a prediction."""
        from edgepress.runtime.tokenize import encode

        if not texts:
            return np.zeros((0, len(self.id2label)), dtype=np.float32)
        empty = [i + 1 for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
        if empty:
            raise DataError(f"text {', '.join(map(str, empty[:5]))} of {len(texts)} is empty. Fix: give non-empty "
                            f"text to classify")
        return self.session.run(["logits"], encode(self.tokenizer, texts, self.input_names))[0]

    def predict(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """The most probable label of each text, with the softmax probabilities."""
        probs = _softmax(self.logits(texts).astype(np.float64))
        return [
            Prediction(text, self.id2label[int(p.argmax())], float(p.max()),
                       {self.id2label[i]: float(v) for i, v in enumerate(p)})
            for text, p in zip(texts, probs, strict=True)
        ]
