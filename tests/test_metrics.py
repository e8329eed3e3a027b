import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgepress.data.metrics import accuracy_drop_ci95, classification_metrics


def noisy_predictions(labels: np.ndarray, accuracy: float, seed: int) -> np.ndarray:
    flip = np.random.default_rng(seed).random(len(labels)) > accuracy
    return np.where(flip, 1 - labels, labels)


def test_accuracy_ci_brackets_the_accuracy_and_narrows_with_n():
    labels = np.random.default_rng(0).integers(0, 2, 4000)
    small = classification_metrics(labels[:400], noisy_predictions(labels[:400], 0.85, 1))
    large = classification_metrics(labels, noisy_predictions(labels, 0.85, 1))
    for m in (small, large):
        lo, hi = m["accuracy_ci95"]
        assert lo < m["accuracy"] < hi
    assert np.diff(large["accuracy_ci95"])[0] < 0.6 * np.diff(small["accuracy_ci95"])[0]
    assert large["n_test"] == 4000


def test_macro_f1_averages_the_per_class_f1():
    labels = np.array([0, 0, 0, 0, 1, 1])
    preds = np.array([0, 0, 0, 1, 1, 0])
    # class 0: p=3/4 r=3/4 f1=0.75; class 1: p=1/2 r=1/2 f1=0.5
    assert classification_metrics(labels, preds)["macro_f1"] == 0.625


def test_paired_drop_ci_is_zero_for_identical_predictions_and_covers_a_real_drop():
    labels = np.random.default_rng(2).integers(0, 2, 1000)
    base = noisy_predictions(labels, 0.85, 3)
    assert accuracy_drop_ci95(labels, base, base) == [0.0, 0.0]
    worse = np.where(np.random.default_rng(4).random(1000) < 0.05, labels ^ 1, base)  # break ~5% more
    lo, hi = accuracy_drop_ci95(labels, base, worse)
    drop = np.mean(base == labels) - np.mean(worse == labels)
    assert 0 < lo < drop < hi


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=2, max_size=60))
def test_accuracy_ci_is_a_valid_interval(pairs):
    labels, preds = (np.array(x) for x in zip(*pairs, strict=True))
    m = classification_metrics(labels, preds)
    lo, hi = m["accuracy_ci95"]
    assert 0.0 <= lo <= hi <= 1.0


def test_an_interval_without_spread_is_the_exact_binomial_one():
    from edgepress.data.metrics import accuracy_ci95

    same = np.ones(1057, dtype=np.int64)
    lo, hi = accuracy_ci95(same, same)  # every label agrees: not [1, 1], which a strict gate could never miss
    assert hi == 1.0 and lo == pytest.approx(0.99652, abs=1e-5)
    lo, hi = accuracy_ci95(np.zeros(50), np.ones(50))
    assert lo == 0.0 and hi == pytest.approx(0.07112, abs=1e-5)
