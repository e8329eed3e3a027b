"""The search YAML (`edgepress search SEARCH.yaml`): what a pipeline config holds but its stages (model, data,
runtime), plus the user's constraints, the objective and the space. Every point of the space is an ordinary
pipeline of the existing methods (`pipeline_for`): the search adds no method of its own."""

import itertools
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from edgepress.compress.cascade import USER_PARAMS, CascadeConfig
from edgepress.compress.kd import TARGETS_PRECISION
from edgepress.compress.structured import BASELINE
from edgepress.configs import Epochs, Layers, Megabytes, Milliseconds, PathText, Seed, Share, build
from edgepress.data.augment import AugmentConfig
from edgepress.data.config import DataConfig
from edgepress.errors import ConfigError
from edgepress.models.train import TRAIN_PRECISION
from edgepress.pipeline.config import (
    MODEL,
    AccuracyGate,
    Gates,
    PipelineConfig,
    RuntimeConfig,
    SizeGate,
    StageConfig,
    Strict,
    read_yaml,
)
from edgepress.search.shapes import CUTS, Shape

# What each quantization choice ships, after the trained torch model: the stages that make it
QUANTIZATIONS: dict[str, list[dict]] = {
    "none": [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize"}],
    "int8-dynamic": [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize"},
                     {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": False}}],
    "int8-dynamic-per-channel": [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize"},
                                 {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True}}],
    # SmoothQuant before per-channel int8 (what `edgepress init` gives a sentence encoder: all-MiniLM-L6-v2's
    # neighbour overlap 0.84 -> 0.91 on a VNNI CPU, benchmarks/embeddings.py)
    "int8-dynamic-smooth": [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize"},
                            {"name": "int8", "method": "int8-dynamic",
                             "params": {"per_channel": True, "smooth": 0.85}}],
    "int8-static": [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-static"}],
    "qat": [{"name": "qat", "method": "qat", "params": {"epochs": 1, "learning_rate": 2.0e-5}},
            {"name": "export", "method": "export"}],
    "int4": [{"name": "export", "method": "export"}, {"name": "int4", "method": "int4",
                                                      "params": {"embeddings": False}}],
    "int4-words": [{"name": "export", "method": "export"}, {"name": "int4", "method": "int4",
                                                            "params": {"embeddings": True, "accuracy_level": 4}}],
}
Quantization = Literal[tuple(QUANTIZATIONS)]
# The demo's distillation recipe (pipeline/demo.yaml), the one the search trains every student with
DISTILL = {"style": "hinton", "learning_rate": 1.0e-4, "temperature": 2.0, "alpha": 0.5}


class AccuracyConstraint(BaseModel):
    """The accuracy (the task's primary metric) a trial must keep against the teacher."""

    model_config = Strict
    max_drop: float = Field(0.01, ge=0, le=1, description="vs the teacher, on the validation split")
    strict: bool = Field(False, description="max_drop against the upper end of the drop's paired 95% CI")


class FidelityConstraint(BaseModel):
    """How closely a trial must agree with the teacher: the task's agreement (a classifier's share of labels the
    teacher's, a token classifier's entity F1 against the teacher's tags, a sentence encoder's neighbour overlap)."""

    model_config = Strict
    min_agreement: float = Field(ge=0, le=1, description="agreement with the teacher on the validation split: the "
                                 "share of labels the teacher's (a token classifier: entity F1 against its tags; a "
                                 "sentence encoder: neighbour overlap)")


class LatencyConstraint(BaseModel):
    """The latency a trial must meet (shapes that cannot are never trained)."""

    model_config = Strict
    max_p50_ms: Milliseconds = Field(description="largest median latency at runtime.latency's shape, in ms")


class SizeConstraint(BaseModel):
    """The size a trial's model must meet."""

    model_config = Strict
    max_mb: Megabytes = Field(description="largest size of the weight files, in MB (10^6 bytes)")


class Pruning(BaseModel):
    """Epoch-level pruning: from a training stage's second epoch on, a trial stops when the stage's best validation
    accuracy so far plus its pace (the larger of its last epoch's gain and its mean gain per epoch so far) for every
    epoch left falls more than `margin` short of what `accuracy.max_drop` requires (the teacher's validation
    accuracy minus it). A later trial that would train the same stages on the same input is stopped before it
    starts."""

    model_config = Strict
    margin: float = Field(0.01, ge=0, le=1, description="how far short of the required accuracy a stage's projected "
                                                        "accuracy may fall before its trial stops (later stages may "
                                                        "win some back)")


class Constraints(BaseModel):
    """What a trial must meet to pass; judged on the validation split, each trial's last stage gated by them."""

    model_config = Strict
    accuracy: AccuracyConstraint = Field(AccuracyConstraint(), description="against the teacher")
    fidelity: FidelityConstraint | None = Field(None, description="agreement with the teacher")
    latency: LatencyConstraint | None = Field(None, description="on runtime.providers' first provider")
    size: SizeConstraint | None = Field(None, description="of the model that ships")


Draw = Annotated[int, Field(ge=0, le=10**9)]  # transfer texts an epoch draws; 0: none


def _choices(kind):
    return Field(None, min_length=1, description=f"the {kind} to try")


LAYERS = "layers"  # space.student's choice of a student cut from the teacher's own layers


class Space(BaseModel):
    """The choices a trial draws from; unset: `defaults(depth)`."""

    model_config = Strict
    student: list[PathText] | None = Field(None, min_length=1, description="the students to try: `layers` (the "
                                           "teacher's own layers, cut to each of space.layers) and pretrained "
                                           "encoders (model dirs, or demo:minilm), each distilled from the teacher's "
                                           "logits reading the texts with its own tokenizer (distill's `student`), at "
                                           "its own depth; every student is then pruned and quantized as the other "
                                           "choices say. Unset: [layers]")
    layers: list[Layers] | None = _choices("student depths (the teacher's own depth: no distillation)")
    heads_keep: list[Share] | None = _choices("shares of attention heads kept (1: no head pruning)")
    ffn_keep: list[Share] | None = _choices("shares of FFN neurons kept (1: no FFN pruning)")
    width_keep: list[Share] | None = _choices("shares of the hidden state's dimensions kept (`width`; 1: the full "
                                              "width, the default)")
    rank_keep: list[Share] | None = _choices("shares of the rank of every layer's FFN Linears kept (`lowrank`, "
                                             "factored at every share chosen: the shape table times each shape "
                                             "whole; 1: not factored, the default)")
    vocab: list[bool] | None = _choices("vocabulary pruning off (false) and on (true)")
    quantization: list[Quantization] | None = _choices("quantizations")
    epochs: list[Epochs] | None = _choices("epochs of every training stage (distill, heads, ffn)")
    transfer: list[Draw] | None = Field(None, min_length=1, description="transfer texts each epoch of every training "
                                        "stage draws from data.unlabeled (its per_epoch), 0: none; unset: every trial "
                                        "trains on data.unlabeled as the data config says")
    cascade: list[Literal["off"] | dict[str, Any]] | None = Field(
        None, min_length=1, description="whether a trial ends with a cascade stage: off, or the cascade's params "
        "(fallback, min_agreement or max_drop, confidence, fallback_precision: the cascade method's), e.g. [off, "
        "{min_agreement: 0.97}]. Set: the latency objective is the mean at natural lengths (a cascade's deferred "
        "texts cost both models), and a cascade's trials are not stopped by their students' epochs")

    @field_validator("layers", "epochs")
    @classmethod
    def _positive(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and min(values) < 1:
            raise ValueError("every choice must be 1 or more")
        return None if values is None else sorted(set(values))

    @field_validator("student", "vocab", "quantization")
    @classmethod
    def _once_each(cls, values: list | None) -> list | None:
        return None if values is None else list(dict.fromkeys(values))

    @model_validator(mode="after")
    def _layers_cut_the_teacher(self) -> "Space":
        if self.layers is not None and self.student is not None and LAYERS not in self.student:
            raise ValueError("space.layers are depths of students cut from the teacher's layers, and space.student "
                             "has no `layers`: add `layers` to space.student, or leave space.layers out")
        return self

    @field_validator("cascade")
    @classmethod
    def _cascades(cls, values: list | None) -> list | None:
        """Each cascade choice is a cascade stage's params (the method's own config checks them), named once."""
        if values is None:
            return None
        for value in values:
            if isinstance(value, dict):
                unknown = sorted(set(value) - set(USER_PARAMS))
                if unknown:
                    raise ValueError(f"a cascade choice takes {', '.join(USER_PARAMS)}; not {', '.join(unknown)}")
                build(CascadeConfig, value, where="space.cascade")
        return list({cascade_name(v): v for v in values}.values())

    def cascades(self) -> list[dict]:
        """The cascade choices as points take them (by name, `cascade_name`): [{}] when the space does not choose."""
        return [{"cascade": cascade_name(c)} for c in self.cascade] if self.cascade else [{}]

    @field_validator("transfer")
    @classmethod
    def _counts(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and min(values) < 0:
            raise ValueError("every choice must be 0 (no transfer texts) or more")
        return None if values is None else sorted(set(values))

    @field_validator("heads_keep", "ffn_keep", "width_keep", "rank_keep")
    @classmethod
    def _shares(cls, values: list[float] | None) -> list[float] | None:
        """Each share as a shape's name shows it (6 significant digits): 0.5 and 0.50000001 are one choice."""
        if values is not None and not all(0 < v <= 1 for v in values):
            raise ValueError("every choice must be a share in (0, 1]")
        return None if values is None else sorted({float(f"{v:g}") for v in values}, reverse=True)

    def filled(self, depth: int) -> "Space":
        """Every unset choice at its default for a teacher of `depth` layers: students of 2 to depth/2 + 1 layers
        and the teacher's own depth, heads 1 and 0.5, FFN 1, 0.5 and 0.25, the full width and rank, vocab off and
        on, the int8 choices, 2 or 4 epochs."""
        defaults = {"student": [LAYERS], "layers": sorted({d for d in range(2, depth // 2 + 2) if d < depth} | {depth}),
                    "heads_keep": [1.0, 0.5], "ffn_keep": [1.0, 0.5, 0.25], "width_keep": [1.0], "rank_keep": [1.0],
                    "vocab": [False, True],
                    "quantization": ["int8-dynamic", "int8-dynamic-per-channel", "int8-static"], "epochs": [2, 4]}
        return self.model_copy(update={k: v for k, v in defaults.items() if getattr(self, k) is None})

    def shapes(self) -> list[Shape]:
        """Each student's shapes: the teacher's layers at each depth, a pretrained student at its own; each with
        every share of heads, FFN neurons, hidden width and FFN rank."""
        return [Shape(layers, heads, ffn, None if student == LAYERS else student, width, rank)
                for student in self.student for layers in (self.layers if student == LAYERS else [None])
                for heads in self.heads_keep for ffn in self.ffn_keep for width in self.width_keep
                for rank in self.rank_keep]

    def points(self) -> list[dict]:
        """Every point of a filled space: its shape's fields (`Shape.point`), vocab, quantization, epochs, and
        transfer when the space chooses it."""
        return [{**s.point(), "vocab": v, "quantization": q, "epochs": e, **transfer, **cascade}
                for s, v, q, e, transfer, cascade in itertools.product(self.shapes(), self.vocab, self.quantization,
                                                                       self.epochs, self.transfers(),
                                                                       self.cascades())]

    def transfers(self) -> list[dict]:
        """The transfer choices as points take them: [{}] when the space does not choose (no `transfer` param)."""
        return [{"transfer": n} for n in self.transfer] if self.transfer else [{}]


def cascade_name(choice) -> str:
    """A cascade choice as a trial's param names it: off, or its params as sorted JSON."""
    return choice if isinstance(choice, str) else json.dumps(choice, sort_keys=True)


def cascade_params(point: dict) -> dict | None:
    """The cascade stage's params of a point, None where it ends without one."""
    name = point.get("cascade", "off")
    return None if name == "off" else json.loads(name)


def point_text(point: dict) -> str:
    """A search point as messages name it: each field it sets, `field value`."""
    return ", ".join(f"{key} {value}" for key, value in point.items() if value is not None)


class SearchConfig(BaseModel):
    """A search: `edgepress search SEARCH.yaml --out SEARCH_DIR`."""

    model_config = Strict
    model: PathText = Field("demo:minilm-movie", description=MODEL)
    data: DataConfig = Field(DataConfig(), description="the examples, their columns and splits")
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="where latency is measured (runtime.target: where "
                                   "the winner will run)")
    constraints: Constraints = Field(Constraints(), description="what a trial must meet to pass")
    objective: Literal["latency", "size"] = Field("latency", description="what the winner is best at among the "
                                                  "passing trials (latencies within 5% of the best "
                                                  "tie: the more accurate wins)")
    space: Space = Field(Space(), description="the choices trials draw from")
    augment: AugmentConfig | None = Field(None, description="transfer data for every training stage of every trial "
                                          "(distill, heads, ffn, qat): perturbed copies of the train texts that the "
                                          "stage's teacher labels; each epoch is then (1 + factor) times as long")
    targets_precision: Literal["fp32", "bf16"] = Field("fp32", description="every training stage of every trial: "
                                                       + TARGETS_PRECISION)
    train_precision: Literal["fp32", "bf16"] = Field("fp32", description="every training stage of every trial: "
                                                     + TRAIN_PRECISION)
    pruning: Pruning | None = Field(Pruning(), description="null: every trial trains all its epochs")
    seed: Seed = Field(13, description="the sampler's seed")

    @model_validator(mode="after")
    def _transfer_has_texts(self) -> "SearchConfig":
        if self.space.transfer and max(self.space.transfer) > 0 and self.data.unlabeled is None:
            raise ValueError("space.transfer draws transfer texts from data.unlabeled, which is not set. Fix: "
                             "data.unlabeled: demo:imdb-sentences (or a file of your texts), or remove space.transfer")
        return self


def load_search(path: str | Path) -> SearchConfig:
    return search_config(read_yaml(Path(path)), Path(path))


def search_config(data: Any, path: Path) -> SearchConfig:
    """Check what `read_yaml(path)` read as a search config; every problem is listed in one ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping with model, data, runtime, constraints, objective and space "
                          f"(it holds {'nothing' if data is None else f'a {type(data).__name__}'}). Fix: write it as "
                          f"`key: value` lines (see examples/search-demo.yaml)")
    if "stages" in data:
        raise ConfigError(f"{path} is a pipeline config (it has stages): a search writes the stages itself. Fix: "
                          f"`edgepress run {path}`, or a search config with constraints and a space instead of "
                          f"stages (see examples/search-demo.yaml)")
    return build(SearchConfig, data, where=str(path))


def final_gates(constraints: Constraints, provider: str) -> Gates:
    """The constraints a run can gate on, as the last stage's gates (agreement with the teacher is the search's
    own check: no gate compares with the baseline's labels)."""
    latency = constraints.latency
    return Gates(accuracy=AccuracyGate(max_drop=constraints.accuracy.max_drop, strict=constraints.accuracy.strict),
                 size=SizeGate(max_mb=constraints.size.max_mb) if constraints.size else None,
                 latency={"provider": provider, "max_p50_ms": latency.max_p50_ms} if latency else None)


def pipeline_for(cfg: SearchConfig, depth: int, point: dict, task) -> PipelineConfig:
    """The pipeline of one point ({layers, heads_keep, ffn_keep, vocab, quantization, epochs}; student: a pretrained
    student's dir; width_keep, rank_keep; transfer: the texts each epoch draws from data.unlabeled) of a teacher of
    `depth` layers and of `task`: distill (into a cut of the teacher's layers, or into the pretrained student), heads,
    ffn, width (with the task's `width_params`), lowrank, vocab (those the point asks for), then the quantization's
    stages; the constraints gate the last stage only (a trial is judged by what ships)."""
    epochs, data = point["epochs"], cfg.data
    if "transfer" in point:  # the point's own draw from data.unlabeled (0: none)
        drawn = data.transfer.model_copy(update={"per_epoch": point["transfer"]}) if point["transfer"] else None
        data = data.model_copy(update={"unlabeled": drawn})
    training = {"epochs": epochs, **({"augment": cfg.augment.model_dump(mode="json")} if cfg.augment else {}),
                # fp32 left unsaid: a trial's stages (its cache key) stay what they were before the field
                **{k: v for k, v in (("targets_precision", cfg.targets_precision),
                                     ("train_precision", cfg.train_precision)) if v != "fp32"}}
    stages = []
    if point.get("student"):
        stages.append({"name": "distill", "method": "distill",
                       "params": {"student": point["student"], **training, **DISTILL}})
    elif point["layers"] < depth:
        stages.append({"name": "distill", "method": "distill",
                       "params": {"student_layers": point["layers"], **training, **DISTILL}})
    for key, method in CUTS.items():
        if point.get(key, 1.0) < 1:  # recovered from the teacher: its labels are kept better
            stages.append({"name": method, "method": method, "params": {
                "keep": point[key], "teacher": BASELINE, **training,
                **({"only_where_faster": False} if method == "lowrank" else {}),  # as the shape table timed it
                **(dict(task.width_params) if method == "width" else {})}})
    if point["vocab"]:
        stages.append({"name": "vocab", "method": "vocab"})
    stages += [dict(s) for s in QUANTIZATIONS[point["quantization"]]]
    if point["quantization"] == "qat":
        stages[-2] = {**stages[-2], "params": {**stages[-2]["params"], **training, "epochs": max(1, epochs // 2)}}
    if (cascade := cascade_params(point)) is not None:  # what ships is the cascade: the constraints gate it
        stages.append({"name": "cascade", "method": "cascade", "params": cascade})
    gates = final_gates(cfg.constraints, cfg.runtime.providers[0])
    stages[-1] = {**stages[-1], "gates": gates.model_dump(exclude_none=True)}
    return build(PipelineConfig, {"model": cfg.model, "data": data.model_dump(mode="json"),
                                  "runtime": cfg.runtime.model_dump(mode="json", exclude_none=True),
                                  "stages": [StageConfig.model_validate(s).model_dump(mode="json") for s in stages]},
                 where=f"the pipeline of search point ({point_text(point)})")
