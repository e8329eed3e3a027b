"""Where edgepress keeps what it fetches and builds once: `$EDGEPRESS_CACHE`, else the user cache dir. Builds into
it hold a lock, so two runs starting at once on a fresh machine build each thing once and never see half of it."""

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


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
