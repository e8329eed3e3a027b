"""Accuracy, macro-F1 and bootstrap confidence intervals (scipy.stats.bootstrap, BCa, 95%)."""

import numpy as np
from scipy.stats import bootstrap
from sklearn.metrics import f1_score

RESAMPLES = 4000
SEED = 0


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def _interval(result) -> list[float]:
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def accuracy_ci95(labels: np.ndarray, preds: np.ndarray) -> list[float]:
    """BCa 95% bootstrap interval of the accuracy."""
    correct = (np.asarray(preds) == np.asarray(labels)).astype(float)
    if np.all(correct == correct[0]):  # no spread: every resample has the same accuracy
        return [float(correct[0]), float(correct[0])]
    return _interval(bootstrap((correct,), _mean, n_resamples=RESAMPLES, rng=SEED, vectorized=True))


def accuracy_drop_ci95(labels: np.ndarray, base_preds: np.ndarray, new_preds: np.ndarray) -> list[float]:
    """Paired BCa 95% interval of accuracy(base) - accuracy(new) on the same examples (positive = a drop)."""
    labels = np.asarray(labels)
    base = (np.asarray(base_preds) == labels).astype(float)
    new = (np.asarray(new_preds) == labels).astype(float)
    if np.all(base - new == 0):  # both models right and wrong on the same examples
        return [0.0, 0.0]
    result = bootstrap((base, new), _mean_difference, paired=True, n_resamples=RESAMPLES, rng=SEED, vectorized=True)
    return _interval(result)


def classification_metrics(labels: np.ndarray, preds: np.ndarray) -> dict:
    """accuracy with its 95% CI, macro-F1 and the number of examples."""
    labels, preds = np.asarray(labels), np.asarray(preds)
    return {
        "accuracy": float(np.mean(preds == labels)),
        "accuracy_ci95": accuracy_ci95(labels, preds),
        "macro_f1": float(f1_score(labels, preds, average="macro")),
        "n_test": int(len(labels)),
    }
