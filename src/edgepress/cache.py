"""Where edgepress keeps what it fetches and builds once: `$EDGEPRESS_CACHE`, else the user cache dir."""

import os
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
