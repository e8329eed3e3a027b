"""Torch-side inference: logits for a list of texts, length-sorted batches with dynamic padding."""

import contextlib
import inspect

import numpy as np

from edgepress.data.dataset import TextSet
from edgepress.data.metrics import classification_metrics


def accepted_inputs(model) -> list[str]:
    """The parameters of the model's forward; of a sentence encoder (models/sentence.py), those of its encoder,
    which are the inputs it passes on."""
    from edgepress.models.sentence import encoder_of

    return list(inspect.signature(encoder_of(model).forward).parameters)


def forward_inputs(model, batch) -> dict:
    """The tokenizer's outputs the model's forward takes (a BERT tokenizer gives token_type_ids, which DistilBERT
    does not accept)."""
    accepted = accepted_inputs(model)
    return {k: v for k, v in batch.items() if k in accepted}


def in_precision(device, precision: str):
    """A context in which torch computes in `precision` on `device`: bf16 under torch's autocast (matrix products
    in bf16, reductions and norms in float32), fp32 as it is."""
    import torch

    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")


@contextlib.contextmanager
def on_accelerator(model, precision: str = "fp32"):
    """Inside, `model` is on the device training would use (accelerate's: a GPU where there is one, this process's
    under a launcher), and back where it was after: how a teacher labels many transfer texts fast. `precision`
    bf16 runs it under torch's bf16 autocast there (`in_precision`)."""
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    where = next(model.parameters()).device
    # the process state the training's Accelerator will share: ACCELERATE_USE_CPU read as it reads it (a state made
    # without it would take launched CPU processes for one each, which training refuses)
    device = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).device
    model.to(device)
    try:
        with in_precision(device, precision):
            yield model
    finally:
        model.to(where)


def _batches(model, tokenizer, inputs: list, max_length: int, batch_size: int, progress=None, **tokenizing):
    """(indices into `inputs`, the tokenized batch, the model's output as float32 numpy) for `inputs` in batches of
    similar lengths (little padding), the model in eval mode under inference_mode (its mode restored after);
    `progress(done)`, if given, after each batch."""
    import torch

    order = np.argsort([len(x) for x in inputs], kind="stable")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            for start in range(0, len(inputs), batch_size):
                chunk = order[start : start + batch_size]
                batch = tokenizer([inputs[i] for i in chunk], truncation=True, max_length=max_length, padding=True,
                                  return_tensors="pt", **tokenizing)
                out = model(**forward_inputs(model, batch.to(device)))
                yield chunk, batch, getattr(out, "logits", out).float().cpu().numpy()
                if progress:
                    progress(start + len(chunk))
    finally:
        model.train(was_training)


def predict_outputs(model, tokenizer, texts: tuple[str, ...] | list[str], max_length: int, batch_size: int = 64,
                    progress=None):
    """The model's output per text as float32, in the order of `texts`: (n, num_labels) logits of a classifier,
    (n, dim) vectors of a sentence encoder; `progress(texts done)` after each batch, if given."""
    outputs = None
    for chunk, _, out in _batches(model, tokenizer, list(texts), max_length, batch_size, progress):
        outputs = np.empty((len(texts), out.shape[1]), dtype=np.float32) if outputs is None else outputs
        outputs[chunk] = out
    return np.zeros((0, model.config.num_labels), dtype=np.float32) if outputs is None else outputs


def predict_logits(model, tokenizer, texts: tuple[str, ...] | list[str], max_length: int, batch_size: int = 64):
    """Logits (n, num_labels) as float32, in the order of `texts`."""
    return predict_outputs(model, tokenizer, texts, max_length, batch_size)


def evaluate_classifier(model, tokenizer, examples: TextSet, max_length: int) -> tuple[dict, np.ndarray]:
    """(classification metrics, predicted ids) of `model` on `examples`."""
    preds = predict_logits(model, tokenizer, examples.texts, max_length).argmax(axis=1)
    return classification_metrics(examples.labels, preds), preds


def predict_word_logits(model, tokenizer, texts: tuple[str, ...] | list[str], max_length: int,
                        batch_size: int = 64, progress=None) -> list[np.ndarray]:
    """A token classifier's logits per word, (words, num_labels) float32 for each text, its words split on white
    space (a tagged sentence's words joined by spaces come back as they were), each word read at its first
    sub-word; a word cut off by `max_length` gets NaN; `progress(texts done)` after each batch, if given."""
    from edgepress.device.feeds import first_subword_rows

    words = [text.split() for text in texts]
    out: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * len(texts)
    for chunk, batch, logits in _batches(model, tokenizer, words, max_length, batch_size, progress,
                                         is_split_into_words=True):
        for row, i in enumerate(chunk):  # (batch, sequence, labels) -> (words, labels)
            out[i] = first_subword_rows(batch.word_ids(row), logits[row], len(words[i]), np.nan)
    return out
