"""The Python API: every command of the CLI as a function (`edgepress.run`, `edgepress.load`, ...), which the CLI
itself calls, so the two cannot drift. Results are typed objects over what the call wrote (edgepress/results.py);
errors are the exceptions of edgepress.errors (ConfigError, DataError, ModelError: bad input, exit 2 on the CLI;
GateFailed: a stage missed a gate, exit 3). A call logs through the `logging` module (logger "edgepress") and
prints nothing.

A config is a path to a YAML file, a dict of the same shape, or a config object (`PipelineConfig`,
`SearchConfig`); a dict is checked as the YAML is, each problem listed in one ConfigError."""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgepress.errors import ConfigError, GateFailed
from edgepress.results import Metrics, RunResult, SearchResult, Stage

if TYPE_CHECKING:
    from edgepress.device.cascade import Cascade
    from edgepress.device.predictor import Predictor
    from edgepress.models.train import TrainResult
    from edgepress.pipeline.config import PipelineConfig
    from edgepress.search.config import SearchConfig

DEMO_DATA = "demo:movie-snippets"
IN_CODE = Path("the config given")  # what a message calls a config passed as a dict


def library_function(transformers: bool = True) -> Callable:
    """A function of the API, run inside `logs.library_call`: the libraries under it print nothing of their own,
    and every logging setting it changed is as it was when it returns."""
    def wrap(call: Callable) -> Callable:
        @functools.wraps(call)
        def quietly(*args: Any, **kwargs: Any) -> Any:
            from edgepress.logs import library_call

            with library_call(transformers):
                return call(*args, **kwargs)
        return quietly
    return wrap


def _read(config: Any) -> tuple[Any, Path | None]:
    """(the parsed config, the file it came from): a path is read as YAML, a dict or config object taken as is (a
    dict's paths as the text a YAML would hold)."""
    from pydantic import BaseModel

    from edgepress.pipeline.config import read_yaml

    if isinstance(config, str | Path):
        return read_yaml(Path(config)), Path(config)
    if isinstance(config, dict):
        return _texts(config), None
    if isinstance(config, BaseModel):
        return config, None
    raise ConfigError(f"a config is a YAML file's path, a dict or a config object, not a {type(config).__name__}. "
                      f"Fix: pass the path of a pipeline or search YAML, a dict of the same shape, or "
                      f"edgepress.PipelineConfig(...) / edgepress.SearchConfig(...)")


def _texts(value: Any) -> Any:
    """`value` with every Path in it as its text (what a YAML holds)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _texts(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_texts(v) for v in value]
    return value


def _path(value: Any, what: str) -> Path:
    """`value` (a str or Path) as a Path; a ConfigError naming `what` for anything else."""
    if isinstance(value, str | Path) and str(value).strip():
        return Path(value)
    raise ConfigError(f"{what} is a path (a str or pathlib.Path), not {value!r}. Fix: pass the directory's path")


def _one_of(value: Any, what: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{what} {value!r} is not one of {', '.join(choices)}. Fix: one of them")
    return value


def pipeline_config(config: "str | Path | dict | PipelineConfig") -> "PipelineConfig":
    """The checked pipeline config of `config` (every problem listed in one ConfigError)."""
    from edgepress.pipeline.config import PipelineConfig
    from edgepress.pipeline.config import pipeline_config as checked

    data, path = _read(config)
    return data if isinstance(data, PipelineConfig) else checked(data, path or IN_CODE)


def search_config(config: "str | Path | dict | SearchConfig") -> "SearchConfig":
    """The checked search config of `config` (every problem listed in one ConfigError)."""
    from edgepress.search.config import SearchConfig
    from edgepress.search.config import search_config as checked

    data, path = _read(config)
    return data if isinstance(data, SearchConfig) else checked(data, path or IN_CODE)


@dataclass(frozen=True)
class Validated:
    """What `validate` found: the checked config, the data's split sizes, and its notes (the parts of a valid
    config left unused, gates tighter than the test split resolves). A search's: its points and shapes, and the
    teacher's depth and task."""

    config: Any
    sizes: dict[str, int]
    notes: tuple[str, ...]
    points: int | None = None
    shapes: int | None = None
    depth: int | None = None
    task: str | None = None

    @property
    def is_search(self) -> bool:
        """Whether the config was a search's."""
        return self.points is not None


@library_function()
def validate(config: "str | Path | dict | PipelineConfig | SearchConfig") -> Validated:
    """Check a pipeline or search config without running it: the config, then that the model loads, the data loads
    and fits the model's labels, and each provider asked for runs here (a search: for every point of its space).
    Raises the first problem's error."""
    from edgepress.pipeline.config import PipelineConfig, is_search
    from edgepress.search.config import SearchConfig

    data, _ = _read(config)
    if isinstance(data, SearchConfig) or (not isinstance(data, PipelineConfig) and is_search(data)):
        from edgepress.search.prepare import check_search, search_noise

        cfg = search_config(config)
        _, _, depth, space, splits, task = check_search(cfg, build_teacher=False)
        note = search_noise(cfg, len(splits.validation))
        return Validated(cfg, splits.manifest()["sizes"], (note,) if note else (), len(space.points()),
                         len(space.shapes()), depth, task.name)
    from edgepress.pipeline.inputs import check_inputs, config_notes

    cfg = pipeline_config(config)
    _, splits = check_inputs(cfg, build_teacher=False)
    return Validated(cfg, splits.manifest()["sizes"], tuple(config_notes(cfg, len(splits.test))))


def _with_result(call: Callable[[], Any], out: Path) -> RunResult:
    """`call()` (a run into `out`), its result read from what it wrote; a GateFailed carries that result too."""
    try:
        call()
    except GateFailed as e:
        if (out / "report.json").is_file():
            e.result = RunResult.read(out)
        raise
    return RunResult.read(out)


@library_function()
def run(config: "str | Path | dict | PipelineConfig", out: str | Path, *, resume: bool = False,
        target: str | None = None, device: str | None = None, cache: str | Path | None = None,
        progress: "Callable[[Stage], None] | None" = None) -> RunResult:
    """Run a pipeline into the run dir `out`: the baseline, then every stage with its gates, the report and the
    final bundle. `resume` reuses the stages an earlier run there passed with the same config and data; `target`
    (and `device`: cpu or cuda) replace runtime.target (runtime.providers); `cache`, a stage cache dir shared with
    other runs; `progress(stage)` is called with each Stage as it passes. Raises GateFailed (its `stage`, missed
    `gates` and the run's `result`) when a stage missed a gate; Ctrl-C raises KeyboardInterrupt, the run dir left
    as `resume` takes it."""
    from edgepress.pipeline.config import with_runtime
    from edgepress.pipeline.runner import run_pipeline

    cfg, config_file = pipeline_config(config), Path(config) if isinstance(config, str | Path) else None
    if device is not None:
        cfg = with_runtime(cfg, f"--device {device}", providers=[device])
    if target is not None:
        cfg = with_runtime(cfg, f"--target {target}", target=target)
    out = _path(out, "out")
    told = (lambda name: progress(RunResult.read(out).stage(name))) if progress is not None else None
    return _with_result(lambda: run_pipeline(cfg, out, resume=resume, config_file=config_file,
                                             cache=_path(cache, "cache") if cache is not None else None,
                                             progress=told), out)


@library_function()
def demo(out: str | Path, *, quick: bool = False, resume: bool = False, task: str = "classification") -> RunResult:
    """Run the embedded demo pipeline of `task` (classification or embedding) into `out`."""
    from edgepress.pipeline.demo import DEMOS, run_demo

    out, task = _path(out, "out"), _one_of(task, "task", tuple(DEMOS))
    return _with_result(lambda: run_demo(out, quick=quick, resume=resume, task=task), out)


def seconds(budget: str | float) -> float:
    """A search budget as seconds: a number of seconds, or '2h', '90m', '45s', '1h30m'."""
    import re

    if isinstance(budget, int | float) and not isinstance(budget, bool):
        total = float(budget)
    else:
        parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*",
                             str(budget))
        if not str(budget).strip() or parts is None:
            raise ConfigError(f"--budget {budget!r} is not a duration. Fix: e.g. 2h, 90m, 1h30m or 600s")
        hours, minutes, secs = (float(p) if p else 0.0 for p in parts.groups())
        total = hours * 3600 + minutes * 60 + secs
    if not total > 0:
        raise ConfigError(f"--budget {budget!r} is no time at all. Fix: e.g. 2h")
    return total


@library_function()
def search(config: "str | Path | dict | SearchConfig", out: str | Path, budget: str | float | None = None, *,
           trials: int | None = None, resume: bool = False, storage: str | None = None,
           progress: Callable[[int, dict, Any], None] | None = None) -> SearchResult:
    """Search the config's space into `out` for at most `budget` (seconds, or '2h') or `trials` trials: shapes
    timed first, trials selected on validation, the winner written as best.yaml and run on the test split.
    `progress(number, trial, best)` is called as each trial ends. Raises SearchExhausted (a GateFailed) when no
    trial passed."""
    from edgepress.search.study import run_search

    cfg, out = search_config(config), _path(out, "out")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise ConfigError(f"trials {trials!r} is not a number of trials. Fix: a whole number, 1 or more")
    config_file = Path(config) if isinstance(config, str | Path) else None
    try:
        run_search(cfg, out, budget_s=seconds(budget) if budget is not None else None, trials=trials,
                   resume=resume, storage=storage, config_file=config_file, progress=progress)
    except GateFailed as e:  # SearchExhausted: no trial passed; the report says what each found
        if (out / "report.json").is_file():
            e.result = SearchResult.read(out)
        raise
    return SearchResult.read(out)


def _data(data: "str | Path | Any", **options: Any):
    """A DataConfig of `data`: a source (a file, a dir, a demo name) with `options`, or a DataConfig as it is."""
    from edgepress.configs import build
    from edgepress.data import DataConfig

    if isinstance(data, DataConfig):
        return data
    return build(DataConfig, where="data options", source=str(data),
                 **{k: v for k, v in options.items() if v is not None})


@library_function()
def evaluate(model: str | Path, data: "str | Path | Any" = DEMO_DATA, *, split: str = "test",
             max_length: int | None = None, text_column: str = "text", label_column: str = "label") -> Metrics:
    """The metrics of a model (a torch model dir, an ONNX model dir or a bundle) on one split of `data` (test,
    validation, train or all): accuracy (with its 95% CI) and macro-F1; a token classifier's entity F1. `max_length`
    defaults to a bundle's own, else 128."""
    from edgepress.pipeline.evaluate import evaluate_model, recorded_max_length

    model, split = _path(model, "model"), _one_of(split, "split", ("test", "validation", "train", "all"))
    if max_length is None:
        max_length = recorded_max_length(str(model)) or 128
    return Metrics.of(evaluate_model(str(model), _data(data, text_column=text_column, label_column=label_column,
                                                       max_length=max_length), split))


@dataclass(frozen=True)
class Exported:
    """An exported model dir and its parity with the torch model on the texts checked (`fused`: the fused graph's
    ops, where it was fused)."""

    out: Path
    max_abs_diff: float
    agreement: float
    n_examples: int
    fused: dict[str, int] | None
    steps: dict


@library_function()
def export(model: str | Path, out: str | Path, *, optimize: bool = True, disable_fusion: tuple[str, ...] = (),
           data: str = DEMO_DATA, text_column: str = "text", max_length: int = 128) -> Exported:
    """Export a model to ONNX in `out` (model.onnx, config, tokenizer), checked against torch on the texts of
    `data` and, when `optimize`, fused with ONNX Runtime's transformer fusions and checked again."""
    from edgepress.configs import build
    from edgepress.deploy.bundle import EXPORTED
    from edgepress.export.onnx import ExportConfig
    from edgepress.export.optimize import OptimizeConfig
    from edgepress.pipeline.export import export_model
    from edgepress.pipeline.inputs import check_artifact_out, local_inputs

    model, out = _path(model, "model"), _path(out, "out")
    cfg = build(ExportConfig, where="export options", max_length=max_length)
    check_artifact_out(out, EXPORTED, "export", local_inputs(str(model), data))
    fusion = build(OptimizeConfig, where="fusion options", fusions="all", disable=list(disable_fusion)) \
        if optimize else None
    steps = export_model(str(model), out, fusion, cfg, data, text_column)
    parity = steps["export"]["parity"]
    fused = steps["optimize"]["fused_ops"] if "optimize" in steps else None
    return Exported(out, parity["max_abs_diff"], parity["agreement"], parity["n_examples"], fused, steps)


@library_function(transformers=False)
def bundle(source: str | Path, out: str | Path, target: str | None = None, *, overwrite: bool = False,
           cascade: bool = True) -> Path:
    """Write the device bundle of `source` (a run dir, its final/, an ONNX model dir or a bundle) for `target`
    (default: this machine) into `out`; returns its dir. `cascade=False`: a cascade's student alone."""
    from edgepress.deploy.bundle import bundle_model

    return bundle_model(_path(source, "source"), _path(out, "out"), target, overwrite=overwrite,
                        no_cascade=not cascade)


@library_function()
def init(model: str | Path, data: str | Path, *, text_column: str = "text", label_column: str = "label",
         out: str | Path | None = None) -> str:
    """A commented starting pipeline that fits `model` and `data`, validated; also written to the new file `out`."""
    from edgepress.pipeline.init import write_starter

    return write_starter(str(_path(model, "model")), _data(data, text_column=text_column, label_column=label_column),
                         _path(out, "out") if out is not None else None)


@library_function(transformers=False)
def load(bundle_dir: str | Path, *, provider: str = "cpu", threads: int | None = None) -> "Predictor | Cascade":
    """The device's predictor of a bundle (or an exported model dir), as predict.py runs it: `predict_each(texts)`
    (labels and probabilities; a cascade's also say which model answered), `embed(texts)` (vectors) or
    `entities(text)` (a token classifier's)."""
    from edgepress.device.cascade import open_predictor

    return open_predictor(_path(bundle_dir, "bundle_dir"), providers=(provider,), threads=threads)


@library_function()
def demo_teacher(out: str | Path) -> "TrainResult":
    """Build the demo teacher (MiniLM-L6 fine-tuned on the movie snippets) into `out`; returns its training
    result (best_val_accuracy, best_epoch, seconds)."""
    from edgepress.pipeline.inputs import check_artifact_out
    from edgepress.teacher import MANIFEST, build_teacher

    out = _path(out, "out")
    check_artifact_out(out, MANIFEST, "teacher")
    return build_teacher(out)
