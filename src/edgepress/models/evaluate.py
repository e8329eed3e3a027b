"""Torch-side inference: logits for a list of texts, length-sorted batches with dynamic padding."""

import inspect

import numpy as np

from edgepress.data.dataset import TextSet
from edgepress.data.metrics import classification_metrics


def forward_inputs(model, batch) -> dict:
    """The tokenizer's outputs the model's forward takes (a BERT tokenizer gives token_type_ids, which DistilBERT
    does not accept)."""
    accepted = inspect.signature(model.forward).parameters
    return {k: v for k, v in batch.items() if k in accepted}


def predict_logits(model, tokenizer, texts: tuple[str, ...] | list[str], max_length: int, batch_size: int = 64):
    """Logits (n, num_labels) as float32, in the order of `texts`."""
    import torch

    order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths together: little padding
    logits = np.zeros((len(texts), model.config.num_labels), dtype=np.float32)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            chunk = order[start : start + batch_size]
            batch = tokenizer([texts[i] for i in chunk], truncation=True, max_length=max_length,
                              padding=True, return_tensors="pt").to(device)
            logits[chunk] = model(**forward_inputs(model, batch)).logits.float().cpu().numpy()
    model.train(was_training)
    return logits


def evaluate_classifier(model, tokenizer, examples: TextSet, max_length: int) -> tuple[dict, np.ndarray]:
    """(classification metrics, predicted ids) of `model` on `examples`."""
    preds = predict_logits(model, tokenizer, examples.texts, max_length).argmax(axis=1)
    return classification_metrics(examples.labels, preds), preds
