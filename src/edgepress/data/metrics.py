"""Accuracy, macro-F1, entity-level F1 and bootstrap confidence intervals (scipy.stats.bootstrap, BCa, 95%)."""

import numpy as np
from scipy.stats import bootstrap, spearmanr
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


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """(n, dim) rows scaled to unit length, in float64 (a zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, dim) arrays, in float64 (0 for a zero row)."""
    return np.sum(unit_rows(a) * unit_rows(b), axis=1)


def _bca_ci95(data: tuple, statistic, **options) -> list[float]:
    """BCa 95% bootstrap interval of `statistic` over `data`; the percentile interval where the data leave BCa's
    jackknife degenerate (a few distinct values; two nearly equal rankings)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns before it returns NaN bounds, which are handled here
        interval = _interval(bootstrap(data, statistic, rng=SEED, **options))
        if not np.all(np.isfinite(interval)):
            interval = _interval(bootstrap(data, statistic, rng=SEED, method="percentile", **options))
    return interval


def _mean_ci95(values: np.ndarray) -> list[float]:
    """BCa 95% bootstrap interval of the mean of `values` ([v, v] when they are all equal)."""
    if np.all(values == values[0]):
        return [float(values[0]), float(values[0])]
    return _bca_ci95((values,), _mean, n_resamples=RESAMPLES, vectorized=True)


def top_neighbours(vectors: np.ndarray, k: int) -> np.ndarray:
    """(n, k) indices of each row's k most cosine-similar other rows, most similar first (ties by index)."""
    unit = unit_rows(vectors)
    similar = unit @ unit.T  # (n, n)
    np.fill_diagonal(similar, -np.inf)  # a text is not its own neighbour
    return np.argsort(-similar, axis=1, kind="stable")[:, :k]


def embedding_metrics(reference: np.ndarray, vectors: np.ndarray, k: int = 10) -> dict:
    """How closely `vectors` (n, dim) stand in for `reference`'s (a teacher's on the same n texts), with BCa 95%
    CIs over the texts: `cosine`, each text's cosine to its reference vector, averaged; `neighbour_overlap`, the
    share of each text's top-`k` neighbours among the n (by cosine, itself excluded) that the reference's top-`k`
    holds too, averaged: what a nearest-neighbour search over these texts would find alike."""
    reference, vectors = np.asarray(reference), np.asarray(vectors)
    if reference.shape[0] != vectors.shape[0] or reference.shape[0] <= k:
        raise ValueError(f"embedding_metrics needs the same n > k={k} texts on both sides: got {reference.shape[0]} "
                         f"and {vectors.shape[0]}")
    # vectors of another dimension (another model's) have no cosine to the reference's: their overlap alone
    cosine = row_cosines(reference, vectors) if reference.shape[1] == vectors.shape[1] else None
    ours, theirs = top_neighbours(vectors, k), top_neighbours(reference, k)
    overlap = np.array([len(np.intersect1d(a, b)) / k for a, b in zip(ours, theirs, strict=True)])
    return {"cosine": None if cosine is None else float(cosine.mean()),
            "cosine_ci95": None if cosine is None else _mean_ci95(cosine),
            "neighbour_overlap": float(overlap.mean()), "neighbour_overlap_ci95": _mean_ci95(overlap),
            "neighbours_k": k, "n_test": int(len(overlap))}


def _spearman(scores: np.ndarray, cosines: np.ndarray) -> float:
    return float(spearmanr(scores, cosines).statistic)


def sts_metrics(scores: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict:
    """How well the vectors `a` and `b` (n, dim) of n sentence pairs rank the pairs as people scored them
    (`scores`): the Spearman correlation of each pair's cosine with its score, and its BCa 95% CI over the pairs."""
    scores, cosines = np.asarray(scores, np.float64), row_cosines(np.asarray(a), np.asarray(b))
    interval = _bca_ci95((scores, cosines), _spearman, paired=True, vectorized=False, n_resamples=1000)
    return {"spearman": _spearman(scores, cosines), "spearman_ci95": interval,
            "n_pairs": int(len(scores))}


def _spearman_drop(scores: np.ndarray, base: np.ndarray, now: np.ndarray) -> float:
    return _spearman(scores, base) - _spearman(scores, now)


def spearman_drop_ci95(scores: np.ndarray, base: tuple[np.ndarray, np.ndarray],
                       now: tuple[np.ndarray, np.ndarray]) -> list[float]:
    """Paired BCa 95% interval of Spearman(base) - Spearman(now) (positive = a drop): the same pairs resampled for
    both, `base` and `now` each the (first sentences', second sentences') vectors of the pairs."""
    scores = np.asarray(scores, np.float64)
    base_cos, now_cos = row_cosines(*base), row_cosines(*now)
    if np.array_equal(base_cos, now_cos):
        return [0.0, 0.0]
    return _bca_ci95((scores, base_cos, now_cos), _spearman_drop, paired=True, vectorized=False, n_resamples=1000)


# --- entities (token classification)

def _as_iob2(tags: list[str]) -> list[str]:
    """IO tags as IOB2: an I- that does not continue an entity of its type begins one."""
    out, previous = [], "O"
    for tag in tags:
        continues = tag.startswith("I-") and previous[2:] == tag[2:] and previous != "O"
        out.append(tag if tag == "O" or continues else "B-" + tag[2:])
        previous = tag
    return out


def entity_spans(sentences: list[list[str]], scheme: str) -> list[set[tuple[str, int, int]]]:
    """Per sentence, its entities as (type, start, end) word spans, read strictly (seqeval's `mode="strict"`: an
    entity counts only where its tags follow the scheme; IO runs of one type are entities)."""
    from seqeval.scheme import IOB2, IOBES, Entities

    if scheme == "IO":
        sentences, scheme = [_as_iob2(s) for s in sentences], "IOB2"
    entities = Entities(sentences, {"IOB2": IOB2, "IOBES": IOBES}[scheme]).entities
    return [{(e.tag, e.start, e.end) for e in sentence} for sentence in entities]


def _entity_counts(true: list[set], pred: list[set], types: list[str]) -> np.ndarray:
    """(sentences, types, 3): per sentence and type, entities found right, predicted, and in the truth."""
    counts = np.zeros((len(true), len(types), 3), np.float64)
    index = {t: i for i, t in enumerate(types)}
    for s, (gold, found) in enumerate(zip(true, pred, strict=True)):
        for entity in gold & found:
            counts[s, index[entity[0]], 0] += 1
        for entity in found:
            counts[s, index[entity[0]], 1] += 1
        for entity in gold:
            counts[s, index[entity[0]], 2] += 1
    return counts


def _micro_f1(right: np.ndarray, predicted: np.ndarray, true: np.ndarray, axis: int = -1) -> np.ndarray:
    """Entity-level micro F1 = 2 right / (predicted + true), summed over the sentences (axis); 0 with neither."""
    right, total = np.sum(right, axis=axis), np.sum(predicted, axis=axis) + np.sum(true, axis=axis)
    return np.divide(2 * right, total, out=np.zeros_like(total, dtype=np.float64), where=total > 0)


def _f1_drop(right_a, predicted_a, right_b, predicted_b, true, axis: int = -1) -> np.ndarray:
    return _micro_f1(right_a, predicted_a, true, axis) - _micro_f1(right_b, predicted_b, true, axis)


def _sentence_totals(true: list[set], pred: list[set]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(right, predicted, true) entity counts per sentence, every type together."""
    counts = np.array([(len(g & p), len(p), len(g)) for g, p in zip(true, pred, strict=True)], np.float64)
    return tuple(counts.reshape(-1, 3).T)


def entity_metrics(true_tags: list[list[str]], pred_tags: list[list[str]], scheme: str) -> dict:
    """Entity-level scores of predicted word tags against the true ones (seqeval's strict span match): micro F1
    with its BCa 95% CI over sentences (resampled whole), precision, recall, and per entity type precision, recall,
    F1 and support (true entities of the type)."""
    true, pred = entity_spans(true_tags, scheme), entity_spans(pred_tags, scheme)
    types = sorted({e[0] for s in true + pred for e in s})
    counts = _entity_counts(true, pred, types)  # (sentences, types, 3)
    right, predicted, gold = counts.sum(axis=(0, 1))
    per_type = {}
    for i, name in enumerate(types):
        r, p, g = counts[:, i].sum(axis=0)
        per_type[name] = {"precision": float(r / p) if p else 0.0, "recall": float(r / g) if g else 0.0,
                          "f1": float(2 * r / (p + g)) if p + g else 0.0, "support": int(g)}
    totals = _sentence_totals(true, pred)
    return {"f1": float(_micro_f1(*totals)), "f1_ci95": _ci95_of(totals, _micro_f1),
            "precision": float(right / predicted) if predicted else 0.0,
            "recall": float(right / gold) if gold else 0.0, "per_type": per_type,
            "n_sentences": len(true_tags), "n_entities": int(gold)}


def entity_f1(true_tags: list[list[str]], pred_tags: list[list[str]], scheme: str) -> float:
    """`entity_metrics`' micro F1 alone, without its CI."""
    return float(_micro_f1(*_sentence_totals(entity_spans(true_tags, scheme), entity_spans(pred_tags, scheme))))


def _ci95_of(data: tuple[np.ndarray, ...], statistic) -> list[float]:
    """BCa 95% CI of `statistic` over sentences resampled whole (every array of `data` with the same ones); [v, v]
    when no resample can differ."""
    value = float(statistic(*data))
    if len(data[0]) < 2 or all(np.all(d == d[0]) for d in data):
        return [value, value]
    return _bca_ci95(data, statistic, paired=True, vectorized=True, n_resamples=RESAMPLES)


def entity_f1_drop_ci95(true_tags: list[list[str]], base_tags: list[list[str]], pred_tags: list[list[str]],
                        scheme: str) -> list[float]:
    """Paired BCa 95% interval of F1(base) - F1(pred) (positive = a drop), the same sentences resampled for both."""
    true = entity_spans(true_tags, scheme)
    base_right, base_predicted, gold = _sentence_totals(true, entity_spans(base_tags, scheme))
    right, predicted, _ = _sentence_totals(true, entity_spans(pred_tags, scheme))
    if np.array_equal(base_right, right) and np.array_equal(base_predicted, predicted):
        return [0.0, 0.0]
    return _ci95_of((base_right, base_predicted, right, predicted, gold), _f1_drop)
