"""What every trial of a search shares, made before the first: the inputs and every point of the space checked
(`check_search`), the shape table timed and filtered (`shape_table`, `allowed_shapes`), the teacher's validation
score and what the accuracy constraint requires (`prepare`), each trial's point and its distributions."""

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from edgepress.data import DataSplits
from edgepress.errors import ConfigError, EdgepressError
from edgepress.files import check_apart, check_owned, check_writable, read_json, write_json
from edgepress.models.teacher import demo_depth
from edgepress.pipeline.gates import drop_noise
from edgepress.search.config import SearchConfig, Space, pipeline_for
from edgepress.search.shapes import Shape, dominated, time_shapes

log = logging.getLogger(__name__)


MARKER = "search.json"  # what makes a directory a search dir


@dataclass
class Prepared:
    """What the trials share: the teacher's dir and depth, the filled space, its shape table, the data splits, and
    the validation accuracy the accuracy constraint requires (the teacher's minus max_drop)."""

    model_dir: Path
    depth: int
    space: Space
    shapes: list[Shape]
    table: dict
    data: DataSplits
    required: float


def check_space(cfg: SearchConfig, loaded: tuple | None, depth: int, space) -> None:
    """Every point's pipeline is valid and every method's pre-run check accepts it on the teacher `loaded`
    ((model, tokenizer); None: the demo teacher, not built yet, is taken on trust); else one ConfigError naming
    each point refused (exit 2, before anything is trained)."""
    from edgepress.pipeline.inputs import check_methods

    if max(space.layers) > depth:
        raise ConfigError(f"space.layers asks for {max(space.layers)} layers; the teacher has {depth}. Fix: choose "
                          f"depths from 1 to {depth}")
    problems, checked = [], set()
    for point in space.points():
        try:
            pipeline = pipeline_for(cfg, depth, point)
            training = json.dumps([[s.method, s.params] for s in pipeline.stages], sort_keys=True)
            if loaded is not None and training not in checked:
                checked.add(training)
                check_methods(pipeline, *loaded)
        except EdgepressError as e:
            problems.append(f"point {point}: {e}")
    if problems:
        shown = "\n".join(f"  ✗ {p}" for p in problems[:5])
        raise ConfigError(f"{len(problems)} point(s) of the space cannot run:\n{shown}\nFix: narrow the space "
                          f"(space.layers, heads_keep, ffn_keep, quantization) to what this model takes")


def shape_table(prepared_dir: Path, model_dir: Path, shapes: list[Shape], cfg: SearchConfig, texts) -> dict:
    """The timed shapes (shapes.json in SEARCH_DIR, made once: a resumed search keeps its table)."""
    from edgepress.files import tree_sha256
    from edgepress.pipeline.stagecache import machine_key

    key = {"model_sha256": tree_sha256(model_dir), "shapes": [s.name for s in shapes],
           "runtime": cfg.runtime.model_dump(mode="json"), "max_length": cfg.data.max_length, "machine": machine_key()}
    path = prepared_dir / "shapes.json"
    if path.is_file() and read_json(path).get("key") == key:
        return read_json(path)["table"]
    latency = cfg.runtime.latency.model_copy(update={"warmup": min(cfg.runtime.latency.warmup, 10),
                                                     "runs": min(cfg.runtime.latency.runs, 50)})
    log.info("timing %d shapes as they would ship (export, fusion, int8), side by side", len(shapes))
    table = time_shapes(model_dir, shapes, texts, cfg.runtime.threads, latency, max_length=cfg.data.max_length)
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
                                                                       DataSplits]:
    """(model dir, (model, tokenizer), depth, the space filled for that depth, data splits) after every check a
    search makes before it writes anything: the model loads, every point of the space is a pipeline it takes, the
    data loads and fits it. `edgepress validate` runs it without building the demo teacher."""
    from edgepress.models.arch import depth as depth_of
    from edgepress.models.teacher import TEACHER, resolve_model
    from edgepress.pipeline.inputs import check_inputs, check_model
    from edgepress.tasks import CLASSIFICATION, task_of

    task = task_of(None if cfg.model == TEACHER else resolve_model(cfg.model))
    if task is not CLASSIFICATION:
        raise ConfigError(f"{cfg.model} is a model of task {task.name}; edgepress search covers classifiers so far. "
                          f"Fix: `edgepress init {cfg.model} DATA` writes a pipeline that fits it, for `edgepress run`")
    model_dir, loaded = check_model(cfg.model, build_teacher)
    depth = depth_of(loaded[0]) if loaded else demo_depth()
    space = cfg.space.filled(depth)
    check_space(cfg, loaded, depth, space)
    most = max(space.points(), key=lambda point: point.get("transfer", 0))  # the largest draw: it must fit the texts
    _, data = check_inputs(pipeline_for(cfg, depth, most), build_teacher=build_teacher)
    return model_dir, loaded, depth, space, data


def prepare(cfg: SearchConfig, out: Path, resume: bool, config_file: Path | None) -> Prepared:
    """Every check that needs no training, then the shape table and its filter; raises a ConfigError (exit 2) for
    bad input and for a space the constraints leave empty."""
    from edgepress.pipeline.inputs import local_inputs

    check_writable(out)
    check_apart(out, local_inputs(cfg.model, cfg.data, config_file))
    if (out / MARKER).is_file() and not resume:
        raise ConfigError(f"{out} holds a search. Fix: add --resume to continue it, or choose another --out")
    check_owned(out, MARKER, "search")
    if (out / MARKER).is_file() and not _same_config(read_json(out / MARKER)["config"], cfg):
        raise ConfigError(f"{out} holds a search of another config ({out / MARKER}): its trials would mix with "
                          f"this one's. Fix: choose another --out, or resume with the config it was started with")
    from edgepress.models.evaluate import evaluate_classifier

    model_dir, (model, tokenizer), depth, space, data = check_search(cfg)
    teacher, _ = evaluate_classifier(model, tokenizer, data.validation, cfg.data.max_length)  # as the trials do
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        write_json(out / MARKER, {"config": cfg.model_dump(mode="json"), "created": time.time()})
    table = shape_table(out, model_dir, space.shapes(), cfg, data.validation.texts)
    shapes, why = allowed_shapes(cfg, space, table)
    for name, reason in why.items():
        table[name]["excluded"] = reason
    if not shapes:
        reasons = sorted({reason.split(":")[0] for reason in why.values()})
        raise ConfigError(f"no shape of the space can meet the constraints ({', '.join(reasons)} excluded every "
                          f"one; the table: {out / 'shapes.json'}). Fix: loosen {' or '.join(reasons)}, or widen "
                          f"space.layers / heads_keep / ffn_keep toward smaller shapes")
    required = teacher["accuracy"] - cfg.constraints.accuracy.max_drop
    return Prepared(model_dir, depth, space, shapes, table, data, required)


def _same_config(recorded: dict, cfg: SearchConfig) -> bool:
    """`recorded` (search.json's) is `cfg`, fields added since it was written taking their defaults."""
    from pydantic import ValidationError

    try:
        return SearchConfig.model_validate(recorded) == cfg
    except ValidationError:
        return False


def distributions(prepared: Prepared) -> dict:
    from optuna.distributions import CategoricalDistribution as Choice

    space = prepared.space
    return {"shape": Choice([s.name for s in prepared.shapes]), "vocab": Choice(space.vocab),
            "quantization": Choice(space.quantization), "epochs": Choice(space.epochs),
            **({"transfer": Choice(space.transfer)} if space.transfer else {})}


def point_of(prepared: Prepared, params: dict) -> dict:
    shape = next(s for s in prepared.shapes if s.name == params["shape"])
    return {"layers": shape.layers, "heads_keep": shape.heads_keep, "ffn_keep": shape.ffn_keep,
            "vocab": params["vocab"], "quantization": params["quantization"], "epochs": params["epochs"],
            **({"transfer": params["transfer"]} if "transfer" in params else {})}
