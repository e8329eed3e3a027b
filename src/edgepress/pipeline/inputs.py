"""Everything about a run that can be known before it runs: the model loads, the data loads and fits the model's
labels, every provider asked for really runs, the run directory can be written. `edgepress validate` and
`edgepress run` share these checks; `run` touches nothing of an earlier run until they pass."""

from pathlib import Path

from edgepress.data import DataConfig, DataSplits
from edgepress.data.augment import check_augment
from edgepress.data.config import DEMO_PAIRS
from edgepress.data.movie import ID2LABEL as DEMO_LABELS
from edgepress.deploy.web import web_modules
from edgepress.device.bundle import MANIFEST
from edgepress.device.feeds import fixed_shape_feeds, load_tokenizer, position_limit
from edgepress.device.locks import SUFFIX
from edgepress.errors import ConfigError, EdgepressError
from edgepress.files import LEFTOVER, check_apart, check_owned, check_writable
from edgepress.models.loading import label2id_of, read_model_config
from edgepress.pipeline.config import PipelineConfig
from edgepress.pipeline.gates import noisy_gates
from edgepress.pipeline.rundir import RUN_FILES
from edgepress.registry import METHODS
from edgepress.runtime.session import check_providers
from edgepress.tasks import (
    CLASSIFICATION,
    check_methods_for,
    check_metrics_for,
    task_of,
)
from edgepress.teacher import DEMO_TEACHERS, resolve_model


def check_run_dir(out: Path, inputs: dict[str, Path] | None = None) -> None:
    """`out` can hold a run: new, empty, or an earlier run (its run.json), never a folder of other files, whose
    report, stages/ and final/ a run would replace; no input lies in what a run replaces there, and its final/ holds
    only the bundle's own files."""
    check_writable(out)
    check_apart(out, inputs or {}, (*(out / name for name in RUN_FILES), out / "stages", out / "final"))
    if out.is_dir() and not (out / "run.json").is_file() and any(not _of_a_run(p.name) for p in out.iterdir()):
        raise ConfigError(f"--out {out} holds files that are not an edgepress run; a run writes report.*, run.*, "
                          f"stages/ and final/ there and would replace any of yours. Fix: give a new or empty "
                          f"directory, or the directory of an earlier run")
    if (out / "final").exists():
        check_owned(out / "final", MANIFEST, "bundle")


def _of_a_run(name: str) -> bool:
    """`name` in a dir without run.json is what a run stopped before it wrote one left: its log, a temp file of an
    atomic write, a writer's lock."""
    return name == "run.log" or bool(LEFTOVER.match(name)) or name.endswith(SUFFIX)


def check_lengths(model_dir: Path, cfg: PipelineConfig) -> None:
    """Every token length the run will use fits the position table of the model and of every model dir a stage
    names (a pretrained student, a recovery's teacher): longer inputs crash inside torch."""
    asked = {"data.max_length": cfg.data.max_length,
             "runtime.latency.sequence_length": cfg.runtime.latency.sequence_length}
    for stage in cfg.stages:
        for i, (_, params) in enumerate(stage.attempts):
            if "max_length" in params:
                where = "params" if i == 0 else f"on_fail.fallback[{i - 1}].params"
                asked[f"stage '{stage.name}' {where}.max_length"] = params["max_length"]
    check_within_positions(model_dir, asked)
    for stage in cfg.stages:
        for method, params in stage.attempts:
            for name, path in METHODS[method].model_dirs(params).items():
                try:
                    check_within_positions(path, asked)
                except ConfigError as e:
                    raise ConfigError(f"stage '{stage.name}' ({method}) {name} {path}: {e}") from None


def check_latency_shape(model_dir: Path, cfg: PipelineConfig, data: DataSplits) -> None:
    """The test split holds the real tokens every stage is timed on: batch_size x sequence_length of them."""
    latency = cfg.runtime.latency
    limit = position_limit(read_model_config(model_dir))
    try:
        fixed_shape_feeds(load_tokenizer(model_dir, limit), data.test.texts, latency.batch_size,
                          latency.sequence_length, ("input_ids",), limit,
                          "the test split's sentences (every stage is timed on them)")
    except ConfigError as e:
        raise ConfigError(f"runtime.latency: {e}") from None


def check_within_positions(model_dir: Path, asked: dict[str, int]) -> None:
    """Each named token length in `asked` fits the model's position table."""
    limit = position_limit(read_model_config(model_dir))
    over = [f"{name} {value}" for name, value in asked.items() if value > limit]
    if over:
        raise ConfigError(f"longer than the model's {limit} positions: {', '.join(over)}. Fix: at most {limit}")


def check_artifact_out(out: Path, marker: str, what: str, inputs: dict[str, Path] | None = None) -> None:
    """`out` may be replaced whole by an artifact: it must be new, empty, or an earlier `what` (holding `marker`
    and only the files it wrote), never a directory of the user's that would be deleted, nor one holding or inside
    an input."""
    check_writable(out)
    check_apart(out, inputs or {})
    check_owned(out, marker, what)


def check_model(spec: str, build_teacher: bool, task=CLASSIFICATION) -> tuple[Path | None, tuple | None]:
    """(the model dir of `spec`, (model, tokenizer)), loaded once to prove it loads (weights, config, tokenizer) as
    a model of `task`. A demo teacher is built first when `build_teacher` (a run); `validate` does not build it:
    (None, its encoder with a fresh head), the teacher's architecture and tokenizer, which every method's own
    check reads as it would read the teacher's."""
    if spec in DEMO_TEACHERS and not build_teacher:
        from edgepress.models.loading import with_new_head

        encoder = DEMO_TEACHERS[spec].encoder()  # installed: the teacher can be built
        return None, with_new_head(encoder, task.auto_class, DEMO_LABELS, seed=0)
    model_dir = resolve_model(spec)
    return model_dir, task.load_model(model_dir)


def run_task(cfg: PipelineConfig):
    """The task of the run's model (edgepress.tasks): the config's `task`, checked against the model dir."""
    return task_of(None if cfg.model in DEMO_TEACHERS else resolve_model(cfg.model), cfg.task)


def check_methods(cfg: PipelineConfig, model, tokenizer, task) -> None:
    """Each method's own pre-run check (registry `check`) on the model the config names: every refusal a stage
    would meet after the baseline, listed at once. A distill stage changes the depth, so distills after it are
    left to the run's own check."""
    problems, depth_known = [], True
    for stage in cfg.stages:
        for method, params in stage.attempts:
            spec, config = METHODS[method], METHODS[method].config.model_validate(params)
            try:
                if spec.check is not None and (method != "distill" or depth_known):
                    spec.check(model, tokenizer, config, task)
                if getattr(config, "augment", None) is not None:  # the transfer data of a distilling method
                    check_augment(tokenizer, config.augment)
            except EdgepressError as e:
                problems.append(f"stage '{stage.name}' ({method}): {e}")
        depth_known = depth_known and all(method != "distill" for method, _ in stage.attempts)
    if problems:
        lines = "\n".join(f"  ✗ {p}" for p in problems)
        raise ConfigError(f"the run would refuse {len(problems)} stage(s):\n{lines}")


def config_notes(cfg: PipelineConfig, n_test: int) -> list[str]:
    """What `validate` notes and `run` warns of in a valid config: the parts it leaves unused (`_idle`), and every
    accuracy gate tighter than `n_test` test texts can resolve (`noisy_gates`)."""
    return [*_idle(cfg), *noisy_gates(cfg, n_test)]


def _idle(cfg: PipelineConfig) -> list[str]:
    """A line for each part of `cfg` the run would not use: no stages at all, or data.unlabeled with no stage that
    trains (training stages alone read its texts: they learn the teacher's outputs on them)."""
    if not cfg.stages:
        return ["the config has no stages: the run measures the model as it is (its baseline) and makes no bundle. "
                "Fix: add stages (`edgepress init` writes a pipeline for your model)"]
    if cfg.data.unlabeled is None or any(METHODS[m].trains for stage in cfg.stages for m, _ in stage.attempts):
        return []
    trainers = ", ".join(name for name, method in METHODS.items() if method.trains)
    return [f"data.unlabeled is read only by stages that train ({trainers}); no stage here trains, so its texts are "
            f"not used. Fix: remove data.unlabeled, or add a training stage"]


def local_inputs(model: str, data: str | DataConfig, config: Path | None = None) -> dict[str, Path]:
    """{what: path} of the inputs that are files or dirs here (not demo names): what --out must keep apart from;
    a data config names its unlabeled texts and fidelity sets too."""
    source = data.source if isinstance(data, DataConfig) else data
    found = {"the model": None if model.startswith("demo:") else Path(model).expanduser(),
             "the data": None if source.startswith("demo:") else Path(source).expanduser(), "the config": config}
    if isinstance(data, DataConfig):
        unlabeled = data.transfer.source if data.transfer else "demo:"  # a demo source is no file here
        found["data.unlabeled"] = None if unlabeled.startswith("demo:") else Path(unlabeled).expanduser()
        found |= {f"data.fidelity_sets.{name}": Path(path).expanduser() for name, path in data.fidelity_sets.items()}
        found["data.pairs"] = Path(data.pairs).expanduser() if data.pairs not in (None, DEMO_PAIRS) else None
    return {what: path for what, path in found.items() if path is not None}


def check_cascade_runtime(cfg: PipelineConfig) -> None:
    """A pipeline that makes a cascade (a method that gives `onnx-cascade`) runs it on a CPU, with predict.py: its
    bundle's target one that runs it, its providers cpu alone."""
    from edgepress.deploy.bundle import CASCADE_TARGETS
    from edgepress.deploy.targets import resolve_target

    makers = [stage.name for stage in cfg.stages for method, _ in stage.attempts
              if METHODS[method].gives == "onnx-cascade"]
    if not makers:
        return
    target = resolve_target(cfg.runtime.target)["name"]
    if target not in CASCADE_TARGETS:
        raise ConfigError(f"stage '{makers[0]}' makes a cascade, which runs on a CPU or in a web page "
                          f"({', '.join(CASCADE_TARGETS)}); runtime.target {target} is not built for one yet. Fix: "
                          f"runtime.target {' or '.join(CASCADE_TARGETS)}, or remove the cascade stage")
    if tuple(cfg.runtime.providers) != ("cpu",):
        raise ConfigError(f"stage '{makers[0]}' makes a cascade, which edgepress measures on the CPU alone; "
                          f"runtime.providers is {list(cfg.runtime.providers)}. Fix: runtime.providers: [cpu]")


def check_inputs(cfg: PipelineConfig, out: Path | None = None, build_teacher: bool = True,
                 config_file: Path | None = None, model: tuple | None = None) -> tuple[Path | None, DataSplits]:
    """(model dir, data splits) of `cfg` after every check that needs no run; raises the first EdgepressError.
    `model`: what `check_model` gave a caller that has loaded the model already (a search), not loaded again."""
    if out is not None:
        check_run_dir(out, local_inputs(cfg.model, cfg.data, config_file))
    check_providers(cfg.runtime.providers)
    check_cascade_runtime(cfg)
    task = run_task(cfg)
    check_methods_for(task, cfg.stages)
    check_metrics_for(task, cfg.data.pairs, cfg.stages)
    if cfg.runtime.target == "web":  # a sentence encoder's pooling, which transformers.js computes in a web bundle
        task.web_pipeline(None if cfg.model in DEMO_TEACHERS else resolve_model(cfg.model))
        web_modules()
    model_dir, loaded = model or check_model(cfg.model, build_teacher, task)
    check_methods(cfg, *loaded, task)
    if model_dir is not None:
        check_lengths(model_dir, cfg)
    if not task.labelled:
        label2id = None  # the data's labels (if any) are the data's own: an embedder has none
    else:
        label2id = label2id_of(model_dir) if model_dir else {name: i for i, name in DEMO_LABELS.items()}
    data = task.load(cfg.data, label2id)
    if model_dir is not None:
        check_latency_shape(model_dir, cfg, data)
    return model_dir, data
