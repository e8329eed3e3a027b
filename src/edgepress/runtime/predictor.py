"""The torch-free predictor: a bundle dir (model.onnx, tokenizer.json, config.json with id2label) classified with
onnxruntime, tokenizers and numpy alone."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepress.errors import ConfigError, DataError, ModelError
from edgepress.runtime.session import SessionConfig, open_session
from edgepress.runtime.tokenize import load_tokenizer, position_limit

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


def _json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path} is not valid JSON ({e}). Fix: export or bundle the model again") from None
    if not isinstance(value, dict):
        raise ModelError(f"{path} holds a JSON {type(value).__name__}, not an object. Fix: export the model again")
    return value


def _check_texts(texts: list[str] | tuple[str, ...]) -> None:
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


def _read_bundle(bundle: Path) -> tuple[dict, dict]:
    missing = [name for name in BUNDLE_FILES if not (bundle / name).is_file()]
    if missing:
        raise ModelError(f"{bundle} is not a model bundle: missing {', '.join(missing)}. Fix: point at the final/ "
                         f"dir of a run, or a dir written by `edgepress export`")
    config = _json_object(bundle / "config.json")
    manifest_path = bundle / MANIFEST
    manifest = _json_object(manifest_path) if manifest_path.is_file() else {}
    if "id2label" not in config:
        raise ModelError(f"{bundle}/config.json has no id2label. Fix: save the model with its label names")
    return config, manifest


class Predictor:
    """Classify texts with a bundle. Texts longer than `max_length` tokens are truncated to it."""

    def __init__(self, bundle_dir: str | Path, providers: tuple[str, ...] = ("cpu",), threads: int | None = None,
                 max_length: int | None = None):
        self.bundle = Path(bundle_dir)
        config, manifest = _read_bundle(self.bundle)
        limit = position_limit(config)
        self.max_length = max_length or int(manifest.get("max_length", limit))
        if self.max_length > limit:
            raise ConfigError(f"max_length {self.max_length} is longer than the model's position limit {limit}. "
                              f"Fix: use at most {limit}")
        self.id2label = {int(k): v for k, v in config["id2label"].items()}
        self.session = open_session(self.bundle / "model.onnx", SessionConfig(providers=providers, threads=threads))
        self.tokenizer = load_tokenizer(self.bundle, self.max_length)
        self.input_names = tuple(i.name for i in self.session.get_inputs())

    def logits(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """(len(texts), num_labels) float32 logits, padded to the longest text of the call; empty text is refused."""
        from edgepress.runtime.tokenize import encode

        if not texts:
            return np.zeros((0, len(self.id2label)), dtype=np.float32)
        _check_texts(texts)
        return self.session.run(["logits"], encode(self.tokenizer, texts, self.input_names))[0]

    def predict(self, texts: list[str] | tuple[str, ...]) -> list[Prediction]:
        """The most probable label of each text, with the softmax probabilities."""
        probs = _softmax(self.logits(texts).astype(np.float64))
        return [
            Prediction(text, self.id2label[int(p.argmax())], float(p.max()),
                       {self.id2label[i]: float(v) for i, v in enumerate(p)})
            for text, p in zip(texts, probs, strict=True)
        ]
