"""Everything about a run that can be known before it runs: the model loads, the data loads and fits the model's
labels, every provider asked for really runs, the run directory can be written. `edgepress validate` and
`edgepress run` share these checks; `run` touches nothing of an earlier run until they pass."""

import os
from pathlib import Path

from edgepress.data import DataSplits, load_data
from edgepress.errors import ConfigError
from edgepress.models.loading import label2id_of, load_classifier, read_model_config
from edgepress.models.teacher import TEACHER, encoder_dir, resolve_model
from edgepress.pipeline.config import PipelineConfig
from edgepress.runtime.predictor import position_limit
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


def _holds_others(out: Path, marker: str) -> bool:
    """`out` is a non-empty directory without `marker`: not something edgepress wrote there."""
    return out.is_dir() and any(out.iterdir()) and not (out / marker).is_file()


def check_run_dir(out: Path) -> None:
    """`out` can hold a run: new, empty, or an earlier run (its run.json), never a folder of other files, whose
    report, stages/ and final/ a run would replace."""
    check_out_dir(out)
    if _holds_others(out, "run.json"):
        raise ConfigError(f"--out {out} holds files that are not an edgepress run; a run writes report.*, run.*, "
                          f"stages/ and final/ there and would replace any of yours. Fix: give a new or empty "
                          f"directory, or the directory of an earlier run")


def check_lengths(model_dir: Path, cfg: PipelineConfig) -> None:
    """Every token length the run will use fits the model's position table (longer inputs crash inside torch)."""
    asked = {"data.max_length": cfg.data.max_length,
             "runtime.latency.sequence_length": cfg.runtime.latency.sequence_length}
    for stage in cfg.stages:
        for i, params in enumerate([stage.params, *(a.params for a in stage.on_fail.fallback)]):
            if "max_length" in params:
                where = "params" if i == 0 else f"on_fail.fallback[{i - 1}].params"
                asked[f"stage '{stage.name}' {where}.max_length"] = params["max_length"]
    check_within_positions(model_dir, asked)


def check_within_positions(model_dir: Path, asked: dict[str, int]) -> None:
    """Each named token length in `asked` fits the model's position table."""
    limit = position_limit(read_model_config(model_dir))
    over = [f"{name} {value}" for name, value in asked.items() if value > limit]
    if over:
        raise ConfigError(f"longer than the model's {limit} positions: {', '.join(over)}. Fix: at most {limit}")


def check_artifact_out(out: Path, marker: str) -> None:
    """`out` may be replaced whole by an artifact: it must be new, empty, or an earlier artifact (holding
    `marker`), never a directory of the user's that would be deleted."""
    check_out_dir(out)
    if _holds_others(out, marker):
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
        check_run_dir(out)
    check_providers(cfg.runtime.providers)
    model_dir = check_model(cfg.model, build_teacher)
    if model_dir is not None:
        check_lengths(model_dir, cfg)
    label2id = label2id_of(model_dir) if model_dir else None
    return model_dir, load_data(cfg.data, label2id)
