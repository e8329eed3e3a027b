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
    """BCa 95% bootstrap interval of the accuracy (of agreement too: the labels are then another model's). With
    no spread (all right, or all wrong) every resample is the same and the bootstrap has no interval to give: the
    exact (Clopper-Pearson) binomial interval instead, so that 1,057 of 1,057 reads [0.9965, 1] and not [1, 1]
    (a strict gate would pass any limit on it)."""
    correct = (np.asarray(preds) == np.asarray(labels)).astype(float)
    if np.all(correct == correct[0]):
        from scipy.stats import binomtest

        ci = binomtest(int(correct.sum()), len(correct)).proportion_ci(0.95, method="exact")
        return [float(ci.low), float(ci.high)]
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
