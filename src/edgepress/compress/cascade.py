"""The `cascade` method: the run's model answers first and hands each text it is unsure of to a faithful fallback
(device/cascade.py runs it). The fallback is the run's baseline made ready the way this machine runs it best
(`FALLBACK_RECIPE`), or a model the user names (a torch model dir, made ready the same way; an ONNX dir or bundle,
taken as it is). The threshold is chosen on the validation split alone: the smallest deferred share of a grid whose
answers meet the calibration target (`min_agreement` with the baseline, or `max_drop` of its primary metric). The
test split never chooses it."""

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgepress.configs import PathName, Threads, Tokens
from edgepress.device.bundle import MANIFEST, onnx_path
from edgepress.device.cascade import CASCADE, FALLBACK, Cascade
from edgepress.device.predictor import Predictor
from edgepress.errors import ConfigError, ModelError
from edgepress.files import atomic_dir, write_json
from edgepress.logs import words
from edgepress.runtime.latency import LatencyConfig

log = logging.getLogger(__name__)

TEACHER = "teacher"  # `fallback: teacher`: the run's baseline, made ready by FALLBACK_RECIPE
FALLBACK_RECIPE = ("export, optimize (fusions: auto, the candidates timed after int8), int8-dynamic per channel: "
                   "the recipe optimum's int8 uses (per channel) on the fused graph edgepress times fastest")
DEFAULT_AGREEMENT = 0.97
SHIPPED = (MANIFEST, "predict.py")  # what a bundle adds beside its model: not part of the fallback taken


# what a user sets (the rest the run fills in): what a search's space.cascade may choose
USER_PARAMS = ("fallback", "fallback_precision", "confidence", "min_agreement", "max_drop", "step")


class CascadeConfig(BaseModel):
    """The `cascade` method (the last stage of a pipeline): which fallback, which confidence, and what the
    threshold is calibrated for on validation (`min_agreement`, the default, or `max_drop`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fallback: Literal["teacher"] | PathName = Field(
        TEACHER, description="teacher: the run's baseline, exported, fused and quantized int8 per channel; or a "
        "model dir, ONNX dir or bundle of the same task and labels (its own tokenizer allowed)")
    fallback_precision: Literal["int8", "fp32"] = Field(
        "int8", description="a torch fallback (the teacher's too) made int8 per channel, or left fused fp32")
    confidence: Literal["top", "margin"] = Field(
        "top", description="the student's confidence: its top probability, or the top two's difference (a token "
        "classifier's: its least confident token's)")
    min_agreement: float | None = Field(None, gt=0, le=1, description="the threshold defers the fewest texts whose "
                                        f"validation answers agree this much with the baseline's (default "
                                        f"{DEFAULT_AGREEMENT} when max_drop is not set)")
    max_drop: float | None = Field(None, ge=0, le=1, description="the threshold defers the fewest texts whose "
                                   "validation score is at most this far under the baseline's")
    step: float = Field(0.005, gt=0, le=0.1, description="the calibration grid: deferred shares 0, step, 2 step, "
                        "... 1 of the validation texts, least confident first")
    max_length: Tokens = Field(128, description="tokens a text is cut to in calibration and the fallback's checks")
    baseline_model: PathName | None = Field(None, description="filled by the run: the baseline `teacher` names")
    threads: Threads | None = Field(None, description="filled by the run: the threads the fallback's fusions are "
                                    "timed on")
    latency: LatencyConfig = Field(LatencyConfig(), description="filled by the run: the shape its fusions are "
                                   "timed at")

    @model_validator(mode="after")
    def _one_target(self):
        if self.min_agreement is not None and self.max_drop is not None:
            raise ValueError("set min_agreement or max_drop, not both: the threshold is calibrated for one")
        return self

    @property
    def target(self) -> tuple[str, float]:
        """(what the threshold is calibrated for, its limit)."""
        if self.max_drop is not None:
            return "max_drop", self.max_drop
        return "min_agreement", self.min_agreement if self.min_agreement is not None else DEFAULT_AGREEMENT


def fill_cascade(params: dict, run) -> dict:
    """`fallback: teacher` is the run's baseline (`RunContext.baseline`); the fallback's fusions are timed on the
    run's threads and latency shape."""
    filled = {"threads": run.threads, "latency": run.latency, **params}
    if params.get("fallback", TEACHER) == TEACHER and run.baseline is not None:
        filled["baseline_model"] = str(run.baseline)
    return filled


def is_onnx_dir(path: Path) -> bool:
    return onnx_path(Path(path)) is not None


def check_cascade(model, tokenizer, cfg: CascadeConfig, task) -> None:
    """What `validate` can know (an embedder's task refuses the method before: tasks/embedding.py): a named fallback
    that exists,
    does the run's task with its labels, and multiplies a token by no more weights than the model (`model`, the
    run's baseline) does."""
    from edgepress.models.loading import label2id_of
    from edgepress.tasks import task_of

    if cfg.fallback == TEACHER:
        return
    path = Path(cfg.fallback).expanduser()
    if not path.is_dir():
        raise ConfigError(f"fallback {path} does not exist. Fix: name a model dir, ONNX dir or bundle, or "
                          f"fallback: teacher")
    theirs = task_of(path)
    if theirs.name != task.name:
        raise ConfigError(f"fallback {path} is a {theirs.name} model and the run's is {task.name}. Fix: a fallback "
                          f"of the run's task, or fallback: teacher")
    labels = label2id_of(path, torch_weights=not is_onnx_dir(path))
    if labels != dict(model.config.label2id):
        raise ConfigError(f"fallback {path} names its labels {labels}, the model {dict(model.config.label2id)}: "
                          f"its answers would be read as other classes. Fix: a fallback with the model's labels, "
                          f"or fallback: teacher")
    theirs, ours = (_graph_weights(onnx_path(path)) if is_onnx_dir(path) else _torch_weights(path)), \
        sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name)
    if theirs > ours * (1 + WEIGHT_SLACK):
        raise ConfigError(f"fallback {path} multiplies each token by {theirs / 1e6:.1f}M weights and the model by "
                          f"{ours / 1e6:.1f}M: every text it answers costs more than the model answering it, so the "
                          f"cascade cannot be faster than the model alone. Fix: fallback: teacher, or a fallback no "
                          f"larger than the model")


# the operators that multiply each token's activations by a weight (their second input, or through the
# DequantizeLinear, Transpose or Cast that feeds it): what a token costs a graph
MATMULS = ("MatMul", "Gemm", "MatMulInteger", "FusedMatMul", "DynamicQuantizeMatMul", "Attention", "QAttention")
WEIGHT_SLACK = 0.01  # a fallback this much heavier than the model is refused (its own export weighs the same)


def _graph_weights(path: Path) -> int:
    """The weights a token is multiplied by in the ONNX graph at `path` (MATMULS, MatMulNBits by its N x K); no
    embedding table (a lookup) counted."""
    from edgepress.files import read_onnx

    graph = read_onnx(path, external_data=False).graph
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer}
    made = {out: node for node in graph.node for out in node.output}
    total = 0
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            total += attrs["N"] * attrs["K"]
        elif node.op_type in MATMULS and len(node.input) > 1:
            name = node.input[1]
            while name not in sizes and name in made and made[name].op_type in ("DequantizeLinear", "Transpose",
                                                                                "Cast"):
                name = made[name].input[0]
            total += sizes.get(name, 0)
    return total


def _torch_weights(path: Path) -> int:
    """The weights a token is multiplied by in the torch model dir at `path`: its 2-D tensors but embedding tables,
    from the safetensors headers (nothing loaded)."""
    from edgepress.models.loading import safetensors_files, weight_shapes

    return sum(shape[0] * shape[1] for name, shape in weight_shapes(safetensors_files(Path(path))).items()
               if len(shape) == 2 and "embed" not in name)


def build_fallback(cfg: CascadeConfig, out: Path, texts: tuple[str, ...], task) -> dict:
    """The fallback's ONNX dir in `out`, and how it was made: a torch model (the baseline, or a model dir) through
    `FALLBACK_RECIPE`; an ONNX dir or bundle copied as it is."""
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic, int8_dynamic_as_shipped
    from edgepress.export.onnx import ExportConfig, export_onnx
    from edgepress.export.optimize import OptimizeConfig, optimize_onnx
    from edgepress.export.parity import copy_side_files

    source = Path(cfg.baseline_model if cfg.fallback == TEACHER else cfg.fallback).expanduser()
    if cfg.fallback == TEACHER and cfg.baseline_model is None:
        raise ConfigError("fallback: teacher names the run's baseline, and none was given. Fix: run the cascade "
                          "as a stage of a pipeline, or name the fallback's dir")
    if is_onnx_dir(source):
        with atomic_dir(out) as tmp:
            copy_side_files(source, tmp)
            for name in SHIPPED:
                (tmp / name).unlink(missing_ok=True)
            shutil.copy2(onnx_path(source), tmp / "model.onnx")
        return {"source": str(source), "recipe": "taken as it is (an ONNX graph)"}
    int8 = Int8DynamicConfig(per_channel=True)
    with tempfile.TemporaryDirectory(prefix="edgepress-fallback-", dir=out.parent) as scratch:
        onnx, fused = Path(scratch) / "onnx", Path(scratch) / "fused"
        log.info("cascade: making the fallback from %s (%s) ...", source, FALLBACK_RECIPE
                 if cfg.fallback_precision == "int8" else "export, optimize (fusions: auto), fp32")
        export_onnx(source, onnx, texts, ExportConfig(max_length=cfg.max_length), task=task)
        quantized = int8 if cfg.fallback_precision == "int8" else None
        fusing = optimize_onnx(onnx, fused if quantized else out, texts,
                               OptimizeConfig(threads=cfg.threads, latency=cfg.latency, max_length=cfg.max_length,
                                              quantized_with=quantized.model_dump() if quantized else None),
                               int8_dynamic_as_shipped)
        if quantized:
            int8_dynamic(fused, out, texts, int8.model_copy(update={"max_length": cfg.max_length}))
    return {"source": str(source), "recipe": FALLBACK_RECIPE if quantized else "export, optimize (fusions: auto), "
            "fp32", "fusions_left_out": fusing["disabled"]}


def front(confidences: np.ndarray, student: np.ndarray, fallback: np.ndarray, baseline: np.ndarray, part, task,
          step: float) -> list[dict]:
    """Per deferred share of the grid (0, step, ..., 1; the least confident texts first): the threshold that
    defers them, the share it defers (ties move it), and the answers' agreement with the baseline and primary
    score on `part` (the validation split)."""
    ordered = np.sort(confidences)
    rows, seen = [], set()
    for share in np.round(np.arange(0, 1 + step / 2, step), 6):
        k = int(round(share * len(ordered)))
        threshold = float(ordered[k]) if k < len(ordered) else float(ordered[-1]) + 1.0
        if threshold in seen:
            continue
        seen.add(threshold)
        deferred = confidences < threshold
        answers = np.where(deferred.reshape(-1, *[1] * (student.ndim - 1)), fallback, student)
        rows.append({"threshold": threshold, "deferred": float(deferred.mean()),
                     "agreement": task.agreement_of(baseline, answers),
                     task.primary: task.score_of(part, answers)})
    return rows


def chosen(rows: list[dict], cfg: CascadeConfig, baseline_score: float, primary: str) -> dict | None:
    """The row of the front that defers the fewest texts and meets the calibration target; None when none does."""
    rule, limit = cfg.target
    meets = [r for r in rows if (r["agreement"] >= limit if rule == "min_agreement"
                                 else baseline_score - r[primary] <= limit)]
    return min(meets, key=lambda r: r["deferred"]) if meets else None


def cascade(src: Path, out: Path, splits, cfg: CascadeConfig, task) -> dict:
    """`src` (the run's ONNX model) as the student of a cascade in `out`: the fallback made (`build_fallback`),
    the threshold calibrated on the validation split (`front`, `chosen`), `cascade.json` written."""
    from edgepress.export.parity import copy_side_files
    from edgepress.models.fakequant import load_for_inference

    if cfg.baseline_model is None:  # before anything is made: the calibration compares with it
        raise ConfigError("the cascade's calibration compares with the run's baseline, and none was given. Fix: run "
                          "the cascade as a stage of a pipeline")
    part = splits.validation
    with atomic_dir(Path(out)) as tmp:
        copy_side_files(Path(src), tmp)
        for graph in [onnx_path(Path(src)), *sorted(Path(src).glob("*.onnx.data"))]:
            shutil.copy2(graph, tmp / graph.name)
        made = build_fallback(cfg, tmp / FALLBACK, part.texts, task)
        spec = {"threshold": 0.0, "rule": cfg.confidence, "fallback": FALLBACK}
        write_json(tmp / CASCADE, spec)
        student = Cascade(tmp, threads=cfg.threads, max_length=cfg.max_length, threshold=-1.0)  # never defers
        student.log = []
        what = words(task.primary)
        student_preds = task.onnx_predictions(student, part.texts, f"{what} (the student, for calibration)")
        confidences = np.array([sure for _, sure in student.log])
        fallback_preds = task.onnx_predictions(Predictor(tmp / FALLBACK, threads=cfg.threads,
                                                         max_length=cfg.max_length),
                                               part.texts, f"{what} (the fallback, for calibration)")
        model, tokenizer = load_for_inference(Path(cfg.baseline_model), task)
        baseline_preds = task.torch_predictions(model, tokenizer, part.texts, cfg.max_length)
        baseline_score = task.score_of(part, baseline_preds)
        rows = front(confidences, student_preds, fallback_preds, baseline_preds, part, task, cfg.step)
        pick = chosen(rows, cfg, baseline_score, task.primary)
        rule, limit = cfg.target
        if pick is None:
            alone = rows[-1]
            raise ModelError(f"no threshold meets {rule} {limit:g} on the validation split: even the fallback alone "
                             f"agrees {alone['agreement']:.4f} with the baseline ({words(task.primary)} "
                             f"{alone[task.primary]:.4f}, the baseline's {baseline_score:.4f}). Fix: a more "
                             f"faithful fallback (fallback_precision: fp32, or the teacher's own dir), or a looser "
                             f"{rule}")
        write_json(tmp / CASCADE, {**spec, "threshold": pick["threshold"],
                                   "validation": {"deferred": pick["deferred"], "agreement": pick["agreement"],
                                                  task.primary: pick[task.primary]}})
    log.info("cascade: confidence %s under %.4g defers %.1f%% of the validation texts to the fallback: agreement "
             "%.4f with the baseline, %s %.4f (the baseline's %.4f); %s %g", cfg.confidence, pick["threshold"],
             100 * pick["deferred"], pick["agreement"], words(task.primary), pick[task.primary], baseline_score,
             rule, limit)
    return {"cascade": {"threshold": pick["threshold"], "rule": cfg.confidence, "calibrated_on": "validation",
                        "target": {rule: limit}, "validation": pick, "baseline_validation": baseline_score,
                        "fallback": made},
            "front": rows}
