"""Where edgepress keeps what it fetches and builds once: `$EDGEPRESS_CACHE`, else the user cache dir. Builds into
it hold a lock, so two runs starting at once on a fresh machine build each thing once and never see half of it."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


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
