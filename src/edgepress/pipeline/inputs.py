"""Everything about a run that can be known before it runs: the model loads, the data loads and fits the model's
labels, every provider asked for really runs, the run directory can be written. `edgepress validate` and
`edgepress run` share these checks; `run` touches nothing of an earlier run until they pass."""

import os
from pathlib import Path

from edgepress.data import DataSplits, load_data
from edgepress.errors import ConfigError
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.models.teacher import TEACHER, encoder_dir, resolve_model
from edgepress.pipeline.config import PipelineConfig
from edgepress.runtime.session import check_providers


def check_out_dir(out: Path) -> None:
    """`out` is, or can become, a directory this process may write."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file. Fix: give the path of a directory (it is created if missing)")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"--out {out} cannot be created: {ancestor} is a file. Fix: give a directory path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out} cannot be written: {ancestor} is not writable by this user. "
                          f"Fix: choose a directory you can write, or change its permissions")


def check_artifact_out(out: Path, marker: str) -> None:
    """`out` may be replaced whole by an artifact: it must be new, empty, or an earlier artifact (holding
    `marker`), never a directory of the user's that would be deleted."""
    check_out_dir(out)
    if out.is_dir() and any(out.iterdir()) and not (out / marker).is_file():
        raise ConfigError(f"--out {out} is a directory that holds other files, and it would be replaced whole. "
                          f"Fix: give a new or empty directory")


def check_model(spec: str, build_teacher: bool) -> Path | None:
    """The model dir of `spec`, loaded once to prove it loads (weights, config, tokenizer). The demo teacher is
    built first when `build_teacher` (a run); `validate` only checks that it can be built (returns None)."""
    if spec == TEACHER and not build_teacher:
        encoder_dir()
        return None
    model_dir = resolve_model(spec)
    load_classifier(model_dir)
    return model_dir


def check_inputs(cfg: PipelineConfig, out: Path | None = None, build_teacher: bool = True
                 ) -> tuple[Path | None, DataSplits]:
    """(model dir, data splits) of `cfg` after every check that needs no run; raises the first EdgepressError."""
    if out is not None:
        check_out_dir(out)
    check_providers(cfg.runtime.providers)
    model_dir = check_model(cfg.model, build_teacher)
    label2id = label2id_of(model_dir) if model_dir else None
    return model_dir, load_data(cfg.data, label2id)
