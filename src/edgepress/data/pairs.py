"""Scored sentence pairs (`data.pairs`): an embedding model's labelled check. Each pair's cosine is ranked against
how alike people judged the two sentences (Spearman), at every stage; demo:stsb is the STS Benchmark's test split,
and a user's own pairs are a .csv or .jsonl file with `sentence1`, `sentence2` and `score` columns (the names the
STS Benchmark and sentence-transformers' datasets use)."""

import math

import numpy as np

from edgepress.data.config import DEMO_PAIRS
from edgepress.data.dataset import PairSet
from edgepress.errors import DataError

COLUMNS = ("sentence1", "sentence2", "score")
MIN_PAIRS = 20  # a Spearman over fewer pairs, and its CI, say little


def _score(value: object) -> float | None:
    """A finite number from a cell (a JSON number, or text that reads as one), else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _file_rows(source: str) -> list[tuple[str, str, float]]:
    from edgepress.data.sources import column_texts, named_file, read_file, row_numbers

    where, fix = f"data.pairs {source}", f"a .csv or .jsonl file with {', '.join(COLUMNS)} columns, or {DEMO_PAIRS}"
    rows = read_file(named_file(source, "data.pairs", (".csv", ".jsonl"), f"the path of {fix}", fix))
    if not rows:
        raise DataError(f"{where} holds no pairs (no row below a header). Fix: a row a pair, with "
                        f"{', '.join(COLUMNS)} columns, at least {MIN_PAIRS} of them")
    absent = [c for c in COLUMNS if c not in rows[0]]
    if absent:
        raise DataError(f"{where} has no {', '.join(absent)} column; its columns are: {', '.join(rows[0])}. Fix: "
                        f"name the columns {', '.join(COLUMNS)}")
    first, second = column_texts(rows, "sentence1", where), column_texts(rows, "sentence2", where)
    scores = [_score(row.get("score")) for row in rows]
    bad = [i for i, s in enumerate(scores) if s is None]
    if bad:
        raise DataError(f"{where}: column 'score' must hold a number; {row_numbers(bad)} (first: "
                        f"{rows[bad[0]].get('score')!r}). Fix: drop or fill those rows")
    return list(zip(first, second, scores, strict=True))


def read_pairs(source: str) -> PairSet:
    """The pairs `source` names (demo:stsb, or a file), checked: at least MIN_PAIRS, scores that differ."""
    if source == DEMO_PAIRS:
        from edgepress.data.sts import sts_pairs

        rows = sts_pairs("test")
    else:
        rows = _file_rows(source)
    if len(rows) < MIN_PAIRS:
        raise DataError(f"data.pairs {source} has too few pairs ({len(rows)}): a Spearman correlation over so few, and "
                        f"its CI, say little. Fix: give at least {MIN_PAIRS} scored pairs")
    scores = np.array([r[2] for r in rows], dtype=np.float64)
    if np.all(scores == scores[0]):
        raise DataError(f"data.pairs {source}: every pair has the score {scores[0]:g}, so no ranking can agree with "
                        f"them. Fix: scores that say which pairs are more alike")
    n = len(rows)
    texts = tuple(r[0] for r in rows) + tuple(r[1] for r in rows)
    ids = tuple(f"pairs:{i}:{side}" for side in ("a", "b") for i in range(n))
    return PairSet(ids, texts, np.full(2 * n, -1, np.int64), scores)
