"""What every trial of a search shares, made before the first: the inputs and every point of the space checked
(`check_search`), the shape table timed and filtered (`shape_table`, `allowed_shapes`), the teacher's validation
score and what the accuracy constraint requires (`prepare`), each trial's point and its distributions.

The accuracy constraint judges the task's primary metric (`edgepress.tasks`): a classifier's accuracy, a token
classifier's entity F1, a sentence encoder's neighbour overlap with the teacher's vectors (the teacher's own is 1);
the search's records keep the key `accuracy` for it, and name it in `metric`."""

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from edgepress.configs import recorded_is
from edgepress.data import DataSplits
from edgepress.errors import ConfigError, EdgepressError
from edgepress.files import check_apart, check_owned, check_writable, read_json, write_json
from edgepress.logs import summarise_library_messages
from edgepress.pipeline.gates import drop_noise
from edgepress.search.config import LAYERS, SearchConfig, Space, pipeline_for, point_text
from edgepress.search.shapes import Shape, dominated, time_shapes

log = logging.getLogger(__name__)


MARKER = "search.json"  # what makes a directory a search dir


@dataclass
class Prepared:
    """What the trials share: the teacher's dir and depth, the filled space, its shape table, the data splits, the
    validation score (the task's primary metric) the accuracy constraint requires (the teacher's minus max_drop),
    and the task."""

    model_dir: Path
    depth: int
    space: Space
    shapes: list[Shape]
    table: dict
    data: DataSplits
    required: float
    task: object  # edgepress.tasks: what the trials' primary metric is

    @property
    def metric(self) -> str:
        """The primary metric the accuracy constraint judges (accuracy, f1, neighbour_overlap)."""
        return self.task.primary


def check_space(cfg: SearchConfig, loaded: tuple, depth: int, space, task) -> None:
    """Every point's pipeline is valid, built for `task`, and every method's pre-run check accepts it on the teacher
    `loaded` ((model, tokenizer); a demo teacher not built yet: its encoder with a fresh head); else one ConfigError
    naming each point refused (exit 2, before anything is trained)."""
    from edgepress.pipeline.inputs import check_methods
    from edgepress.tasks import check_methods_for

    if LAYERS in space.student and max(space.layers) > depth:
        raise ConfigError(f"space.layers asks for {max(space.layers)} layers; the teacher has {depth}. Fix: choose "
                          f"depths from 1 to {depth}")
    problems, checked = [], set()
    for point in space.points():
        try:
            pipeline = pipeline_for(cfg, depth, point, task)
            check_methods_for(task, pipeline.stages)
            training = json.dumps([[s.method, s.params] for s in pipeline.stages], sort_keys=True)
            if training not in checked:
                checked.add(training)
                check_methods(pipeline, *loaded, task)
        except EdgepressError as e:
            problems.append(f"point ({point_text(point)}): {e}")
    if problems:
        shown = "\n".join(f"  ✗ {p}" for p in problems[:5])
        raise ConfigError(f"{len(problems)} point(s) of the space cannot run:\n{shown}\nFix: narrow the space "
                          f"(space.student, layers, heads_keep, ffn_keep, width_keep, rank_keep, quantization) to "
                          f"what this model takes")


def shape_table(prepared_dir: Path, model_dir: Path, shapes: list[Shape], cfg: SearchConfig, texts, task) -> dict:
    """The timed shapes (shapes.json in SEARCH_DIR, made once: a resumed search keeps its table)."""
    from edgepress.compress.distill import student_dir
    from edgepress.files import tree_sha256
    from edgepress.pipeline.stagecache import machine_key

    students = {name: tree_sha256(student_dir(Path(name))) for name in sorted({s.student for s in shapes} - {None})}
    key = {"model_sha256": tree_sha256(model_dir), "shapes": [s.name for s in shapes],
           "runtime": cfg.runtime.model_dump(mode="json"), "max_length": cfg.data.max_length, "machine": machine_key(),
           "fusions": "timed on the first shape",  # an older table fused every shape with every fusion
           **({"students_sha256": students} if students else {})}
    path = prepared_dir / "shapes.json"
    if path.is_file() and read_json(path).get("key") == key:
        return read_json(path)["table"]
    latency = cfg.runtime.latency.model_copy(update={"warmup": min(cfg.runtime.latency.warmup, 10),
                                                     "runs": min(cfg.runtime.latency.runs, 50)})
    log.info("timing %d shapes as they would ship (export, fusion, int8), side by side", len(shapes))
    table = time_shapes(model_dir, shapes, texts, cfg.runtime.threads, latency, max_length=cfg.data.max_length,
                        task=task)
    summarise_library_messages("shape table")  # said here, not in the first trial's first stage
    write_json(path, {"key": key, "table": table})
    return table


def allowed_shapes(cfg: SearchConfig, space, table: dict) -> tuple[list[Shape], dict[str, str]]:
    """(the shapes worth training, {shape: why not} for the others). The size limit applies here only where no
    later choice can shrink the graph below the int8 shape timed (no vocabulary pruning, no int4)."""
    shapes, why = space.shapes(), {}
    limit = cfg.constraints.latency.max_p50_ms if cfg.constraints.latency else None
    size = cfg.constraints.size.max_mb if cfg.constraints.size else None
    size_known = space.vocab == [False] and not any(q.startswith("int4") for q in space.quantization)
    for shape in shapes:
        row = table[shape.name]
        if limit is not None and row["fixed_p50_ms"] > limit:
            why[shape.name] = f"latency.max_p50_ms: {row['fixed_p50_ms']:.2f} ms in int8 > {limit:g}"
        elif size is not None and size_known and row["size_mb"] > size:
            why[shape.name] = f"size.max_mb: {row['size_mb']:.1f} MB in int8 > {size:g}"
    open_shapes = [s for s in shapes if s.name not in why]
    for name, by in dominated(table, open_shapes).items():
        why[name] = f"beaten by {by} (as fast and as small, keeps as much of the teacher)"
    return [s for s in shapes if s.name not in why], why


def search_noise(cfg: SearchConfig, n_validation: int) -> str | None:
    """The search's accuracy constraint, where its trials are judged (the validation split), when `n_validation`
    texts cannot resolve it: what `noisy_gates` says of a pipeline's gate."""
    accuracy = cfg.constraints.accuracy
    if accuracy.strict:
        return None
    line = drop_noise(accuracy.max_drop, n_validation, "validation")
    return None if line is None else f"constraints.{line} (the trials are judged on the validation split)"


def check_search(cfg: SearchConfig, build_teacher: bool = True) -> tuple[Path | None, tuple | None, int, Space,
                                                                       DataSplits, object]:
    """(model dir, (model, tokenizer), depth, the space filled for that depth, data splits, task) after every check
    a search makes before it writes anything: the model loads as a model of its task, every point of the space is a
    pipeline it takes, the data loads and fits it. `edgepress validate` runs it without building the demo
    teacher."""
    from edgepress.models.arch import depth as depth_of
    from edgepress.models.sentence import encoder_of
    from edgepress.pipeline.inputs import check_inputs, check_model
    from edgepress.tasks import task_of
    from edgepress.teacher import DEMO_TEACHERS, resolve_model

    task = task_of(None if cfg.model in DEMO_TEACHERS else resolve_model(cfg.model))
    model_dir, loaded = check_model(cfg.model, build_teacher, task)
    depth = depth_of(encoder_of(loaded[0]))
    space = cfg.space.filled(depth)
    check_space(cfg, loaded, depth, space, task)
    most = max(space.points(), key=lambda point: point.get("transfer", 0))  # the largest draw: it must fit the texts
    drawn = most.get("transfer")  # the data config's own draw stands for it here: the texts are counted below
    _, data = check_inputs(pipeline_for(cfg, depth, {k: v for k, v in most.items() if k != "transfer"}, task),
                           build_teacher=build_teacher, model=(model_dir, loaded))
    if drawn and drawn > len(data.unlabeled):
        raise ConfigError(f"space.transfer draws up to {drawn:,} texts an epoch, more than the {len(data.unlabeled):,} "
                          f"data.unlabeled gives. Fix: space.transfer choices of at most {len(data.unlabeled)}, or "
                          f"more texts in data.unlabeled")
    return model_dir, loaded, depth, space, data, task


def prepare(cfg: SearchConfig, out: Path, resume: bool, config_file: Path | None) -> Prepared:
    """Every check that needs no training, then the shape table and its filter; raises a ConfigError (exit 2) for
    bad input and for a space the constraints leave empty."""
    from edgepress.pipeline.inputs import local_inputs

    check_writable(out)
    check_apart(out, local_inputs(cfg.model, cfg.data, config_file))
    if (out / MARKER).is_file() and not resume:
        raise ConfigError(f"{out} holds a search. Fix: add --resume to continue it, or choose another --out")
    check_owned(out, MARKER, "search")
    if (out / MARKER).is_file() and not recorded_is(read_json(out / MARKER)["config"], cfg):
        raise ConfigError(f"{out} holds a search of another config ({out / MARKER}): its trials would mix with "
                          f"this one's. Fix: choose another --out, or resume with the config it was started with")
    model_dir, (model, tokenizer), depth, space, data, task = check_search(cfg)
    teacher = validation_score(task, model, tokenizer, data, cfg.data.max_length)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        write_json(out / MARKER, {"config": cfg.model_dump(mode="json"), "created": time.time()})
    table = shape_table(out, model_dir, space.shapes(), cfg, data.validation.texts, task)
    shapes, why = allowed_shapes(cfg, space, table)
    for name, reason in why.items():
        table[name]["excluded"] = reason
    if not shapes:
        reasons = sorted({reason.split(":")[0] for reason in why.values()})
        raise ConfigError(f"no shape of the space can meet the constraints ({', '.join(reasons)} excluded every "
                          f"one; the table: {out / 'shapes.json'}). Fix: loosen {' or '.join(reasons)}, or widen "
                          f"space.layers / heads_keep / ffn_keep / width_keep / rank_keep toward smaller shapes")
    required = teacher - cfg.constraints.accuracy.max_drop
    return Prepared(model_dir, depth, space, shapes, table, data, required, task)


def validation_score(task, model, tokenizer, data: DataSplits, max_length: int) -> float:
    """The teacher's primary metric on the validation split, as a trial's baseline records it (its scores and
    what the baseline adds: a sentence encoder's neighbour overlap with itself, 1)."""
    preds = task.torch_predictions(model, tokenizer, data.validation.texts, max_length)
    return {**task.scores(data.validation, preds), **task.baseline(data.validation, preds)}[task.primary]


def distributions(prepared: Prepared) -> dict:
    from optuna.distributions import CategoricalDistribution as Choice

    space = prepared.space
    return {"shape": Choice([s.name for s in prepared.shapes]), "vocab": Choice(space.vocab),
            "quantization": Choice(space.quantization), "epochs": Choice(space.epochs),
            **({"transfer": Choice(space.transfer)} if space.transfer else {}),
            **({"cascade": Choice([c["cascade"] for c in space.cascades()])} if space.cascade else {})}


def point_of(prepared: Prepared, params: dict) -> dict:
    shape = next(s for s in prepared.shapes if s.name == params["shape"])
    return {**shape.point(), "vocab": params["vocab"], "quantization": params["quantization"],
            "epochs": params["epochs"], **{key: params[key] for key in ("transfer", "cascade") if key in params}}
