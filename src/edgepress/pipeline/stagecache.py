"""A cache of stage attempts addressed by their content, shared by runs (`edgepress run --cache DIR`): an attempt
whose result depends on exactly what an earlier one's did takes that result (artifact, details, metrics, predictions
on every scored set) instead of running again, whatever run, stage name or gates it belongs to. What a result depends
on: the method and its full params (a file a param names by its content), the input artifact's content, the data
config and every split's content, the runtime section, and the machine and versions that measured it. Gates are
not part of it: a run judges a cached result by its own gates, against its own baseline.

Layout: DIR/<key sha256>/entry.json (the key, the artifact's sha256, the result) and DIR/<key sha256>/model/ (none
for the baseline's measurement, whose artifact is the user's model); DIR/<key sha256>.lock, held while the entry is
looked up and built, so that processes sharing the cache (a search's workers) compute each result once: the second
waits for the first and takes its entry.
Each entry appears whole (written beside, then renamed) and is never changed; an entry whose artifact no longer
matches its sha256 is ignored."""

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepress.errors import ConfigError, refused_by_system
from edgepress.files import atomic_dir, read_json, resolved, tree_sha256, write_json
from edgepress.pipeline.rundir import loaded_predictions, stored_predictions
from edgepress.version import __version__

ENTRY = "entry.json"

log = logging.getLogger(__name__)


@functools.cache  # the same for the whole process; asked for at every attempt
def machine_key() -> dict:
    """What a cached latency was measured with: this CPU and the versions of what ran it."""
    import onnxruntime
    import torch

    from edgepress.device.sessions import SPINNING
    from edgepress.device.timing import cpu_model
    from edgepress.pipeline.latency import NATURAL_CUT

    return {"cpu": cpu_model(), "machine": platform.machine(), "cores": os.cpu_count(), "edgepress": __version__,
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "spinning": SPINNING,
            "natural_cut": NATURAL_CUT}


@dataclass(frozen=True)
class StageCache:
    root: Path

    def _entry(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        return self.root / digest

    @contextlib.contextmanager
    def building(self, key: dict) -> Iterator[None]:
        """Hold `key`'s lock (a file lock, released if the process dies) while looking it up and computing it."""
        from filelock import FileLock

        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self._entry(key).with_suffix(".lock"))):
            yield

    def get(self, key: dict, dst: Path | None) -> dict | None:
        """The entry for `key` ({"details", "metrics", "predictions": {set: ids}}), its artifact copied to `dst`
        (None: a measurement without an artifact, the baseline's); None when there is none, or it is unreadable or
        its artifact changed."""
        entry = self._entry(key)
        try:
            record = read_json(entry / ENTRY)
            predictions = loaded_predictions(record["predictions"], entry)
            intact = record["key"] == key and (dst is None or tree_sha256(entry / "model") == record["artifact_sha256"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if not intact:
            log.warning("cache entry %s does not match what it recorded: not used", entry)
            return None
        if dst is not None:
            with atomic_dir(dst) as tmp:
                shutil.copytree(entry / "model", tmp, dirs_exist_ok=True)
        return {**record, "predictions": predictions, "entry": str(entry)}

    def put(self, key: dict, artifact: Path | None, details: dict, metrics: dict,
            predictions: dict[str, np.ndarray]) -> None:
        """Store a result under `key` (with a copy of `artifact`, when there is one), unless an entry for it exists
        (another run wrote the same)."""
        entry = self._entry(key)
        if (entry / ENTRY).is_file():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{entry.name}.", suffix=".tmp"))
        try:
            if artifact is not None:
                shutil.copytree(artifact, tmp / "model")
            write_json(tmp / ENTRY, {"key": key, "artifact_sha256": tree_sha256(tmp / "model") if artifact else None,
                                     "details": details, "metrics": metrics,
                                     "predictions": stored_predictions(predictions, tmp)})
            try:
                os.rename(tmp, entry)
            except OSError:
                if not (entry / ENTRY).is_file():  # not another writer's entry (the same result) got there first
                    raise
        except OSError as e:  # the machine refused: a full disk is a full disk, in the cache too
            raise refused_by_system(e, entry) or e from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def open_cache(root: Path, apart_from: dict[str, Path]) -> StageCache:
    """The cache in `root` (made when missing), which must lie apart from the run dir and every input: a run
    replaces what is in its dir, and a cache inside the model or data would change what it reads."""
    root = resolved(Path(root), "--cache")
    for what, path in apart_from.items():
        path = resolved(Path(path), what)
        if root == path or root.is_relative_to(path) or path.is_relative_to(root):
            raise ConfigError(f"--cache {root} and {what} ({path}) overlap. Fix: keep the cache in a directory of "
                              f"its own, outside the run dir and the inputs")
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--cache {root} is a file. Fix: give a directory")
    return StageCache(root)
