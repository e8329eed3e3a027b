"""The one method registry: the name a pipeline stage writes -> its frozen config and its function.

Every function is `fn(src: Path, out: Path, inputs, cfg) -> dict` (details to record): `src` is the previous
stage's artifact, `out` the directory this stage writes, and `inputs` either the validation sentences (`texts`:
parity checks, calibration) or the whole `DataSplits` (`splits`: methods that train); a method whose work differs
per task (`takes_task`) is also given the run's task (`task=`, edgepress.tasks); `Method.call` calls it. The CLI
and the YAML validator read their choices from `METHODS`. A method that takes more than one kind may run another
function for one of them (`runs_from`: export runs qat's own export on a qat model); the runner asks `Method.call`
with the kind it holds.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from edgepress.compress.cascade import CascadeConfig, cascade, check_cascade, fill_cascade
from edgepress.compress.distill import DistillConfig, check_student, distill
from edgepress.compress.int4 import Int4Config, fill_int4, int4
from edgepress.compress.lowrank import (
    LowRankConfig,
    check_lowrank,
    factored_parts,
    fill_lowrank,
    later_int8,
    lowrank,
)
from edgepress.compress.magnitude import LotteryConfig, MagnitudeConfig, check_sparse, lottery, magnitude
from edgepress.compress.qat import QatConfig, export_qat, qat
from edgepress.compress.quantize import (
    Int8DynamicConfig,
    Int8StaticConfig,
    int8_dynamic,
    int8_dynamic_as_shipped,
    int8_static,
)
from edgepress.compress.structured import (
    BASELINE,
    CUT_PARTS,
    FfnConfig,
    HeadsConfig,
    WidthConfig,
    check_structured,
    check_width,
    ffn,
    fill_teacher,
    heads,
    width,
)
from edgepress.compress.vocab import VocabConfig, check_vocab, vocab_prune
from edgepress.export.onnx import ExportConfig, export_onnx
from edgepress.export.optimize import (
    Fp16Config,
    OptimizeConfig,
    check_fp16,
    check_optimize,
    fill_optimize,
    fp16_onnx,
    later_params,
    optimize_onnx,
)
from edgepress.files import tree_sha256
from edgepress.models.fakequant import QAT_FILE

# What an artifact is: each method declares the kinds it takes and the kind it gives; the pipeline validator
# chains them, so an impossible order is refused before anything runs.
Kind = Literal["torch", "torch-qat", "onnx", "onnx-fused", "onnx-fp16", "onnx-int8", "onnx-int4", "onnx-cascade"]
KIND_WORDS: dict[str, str] = {
    "torch": "a torch model dir",
    "torch-qat": "a quantization-aware-trained torch model (what qat gives)",
    "onnx": "an unfused ONNX graph (what export gives)",
    "onnx-fused": "a fused ONNX graph (what optimize gives)",
    "onnx-fp16": "a float16 ONNX graph",
    "onnx-int8": "an int8 ONNX graph",
    "onnx-int4": "a 4-bit ONNX graph",
    "onnx-cascade": "a cascade (a student and its fallback: what a cascade stage gives, the last of a pipeline)",
}
FLOAT_ONNX: tuple[Kind, ...] = ("onnx", "onnx-fused")
TORCH: tuple[Kind, ...] = ("torch", "torch-qat")  # torch model dirs: measured (and timed) with torch, on cpu


@dataclass(frozen=True)
class RunContext:
    """What a method may take from the run it is a stage of, where the stage leaves a param unset (`Method.fill`):
    the runner builds one per stage and knows no method by name."""

    torch_source: Path | None = None  # the last torch model dir of the chain (what an ONNX graph was exported from)
    baseline: Path | None = None  # the run's baseline model (`teacher: baseline`)
    threads: int | None = None  # runtime.threads
    latency: dict = field(default_factory=dict)  # runtime.latency, as a dict
    later: tuple[tuple[str, dict], ...] = ()  # (method, params with the target's defaults) of each later stage
    natural_later: bool = False  # a later stage's speed gate judges natural lengths (min_natural_speedup)


@dataclass(frozen=True)
class Method:
    config: type[BaseModel]
    run: Callable[..., dict]
    takes: tuple[Kind, ...]
    gives: Kind
    summary: str
    inputs: Literal["texts", "splits"] = "texts"
    gives_from: tuple[tuple[Kind, Kind], ...] = ()  # (kind taken, kind given) where it is not `gives`
    # what can be known before a run: `check(model, tokenizer, cfg, task)` raises the ConfigError the method would
    # raise (run on the model the config names and the run's task, by `validate` and before `run` touches anything)
    check: Callable[..., None] | None = None
    reads_test: bool = False  # its details are computed on the test split, not only its metrics
    runs_from: tuple[tuple[Kind, Callable[..., dict]], ...] = ()  # (kind taken, the function for it) where not `run`
    # `fill(params, run)`: the params with what the method takes from the run (`RunContext`) where they are unset
    fill: Callable[[dict, RunContext], dict] | None = None
    # `reads_later(params, run)`: what it takes from the stages after it, part of the stage's reuse key
    reads_later: Callable[[dict, RunContext], dict] | None = None
    takes_task: bool = False  # its functions take the run's task (`task=`, edgepress.tasks): what differs per task
    # `factors(params)`: the parts of every layer it stores as factors (lowrank's `parts`); a method that `cuts` one
    # of them cannot follow it, nor can another stage factor those parts again
    factors: Callable[[dict], tuple[str, ...]] | None = None
    cuts: tuple[str, ...] = ()  # the parts lowrank may factor that it reshapes (CUT_PARTS): they must be whole
    once: bool = False  # a model it cut cannot be cut by it again (heads, width): one stage of it per pipeline

    def call(self, taken: str, src: Path, out: Path, inputs, cfg, task) -> dict:
        """Run this method on `src` (an artifact of kind `taken`) into `out`: the function for that kind, given the
        run's `task` where it takes one."""
        return self.function(taken)(src, out, inputs, cfg, **({"task": task} if self.takes_task else {}))

    def output(self, taken: str) -> str:
        """The kind of artifact this method makes from one of kind `taken`."""
        return dict(self.gives_from).get(taken, self.gives)

    def function(self, taken: str) -> Callable[..., dict]:
        """What runs this method on an artifact of kind `taken` (export's of a qat model: `export_qat`)."""
        return dict(self.runs_from).get(taken, self.run)

    def factored(self, params: dict) -> tuple[str, ...]:
        """The parts of every layer this method, given `params`, stores as factors (none for most)."""
        return () if self.factors is None else self.factors(params)

    def filled(self, params: dict, run: RunContext) -> dict:
        """`params` with what this method takes from the run."""
        return params if self.fill is None else self.fill(params, run)

    def later(self, params: dict, run: RunContext) -> dict:
        """What this method's params take from the stages after it ({} for most)."""
        return {} if self.reads_later is None else self.reads_later(params, run)

    def files_read(self, params: dict) -> dict[str, str]:
        """{param: sha256} of the files or dirs its params name (a path field, e.g. int4's `torch_model`): what they
        hold can change under the same name. (`teacher: baseline` names the run's baseline, not a file.)"""
        return {name: tree_sha256(Path(value)) if Path(value).exists() else "missing"
                for name, value in self._paths(params).items()}

    def model_dirs(self, params: dict) -> dict[str, Path]:
        """{param: model dir} of the model dirs its params name (a pretrained student, a recovery's teacher), demo
        encoders resolved; a demo teacher (built on first use) and what does not exist yet are left to the run."""
        from edgepress.teacher import DEMO_TEACHERS, resolve_model

        dirs = {name: resolve_model(value) if value.startswith("demo:") else Path(value).expanduser()
                for name, value in self._paths(params).items() if value not in DEMO_TEACHERS}
        return {name: path for name, path in dirs.items() if (path / "config.json").is_file()}

    def _paths(self, params: dict) -> dict[str, str]:
        """{param: value} of its params that name a file or dir (a path field set to something other than
        `baseline`)."""
        fields = self.config.model_fields
        return {name: value for name, value in params.items() if name in fields and isinstance(value, str)
                and value != BASELINE and _names_a_path(fields[name].annotation)
                and value not in _words_of(fields[name].annotation)}

    @property
    def trains(self) -> bool:
        """It fine-tunes (its config has the shared training fields)."""
        return "epochs" in self.config.model_fields


def _words_of(annotation) -> set:
    """The Literal values a field's type allows beside a path (`fallback: teacher`): names, not files."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return set().union(*(_words_of(arg) for arg in get_args(annotation)))


def _names_a_path(annotation) -> bool:
    """The type is a Path, or holds one (`PathName | None`: a Path inside Annotated inside Optional)."""
    return annotation is Path or any(_names_a_path(arg) for arg in get_args(annotation))


METHODS: dict[str, Method] = {
    "distill": Method(DistillConfig, distill, ("torch",), "torch",
                      "a shallower student trained on the teacher's outputs (hinton, distilbert, tinybert)",
                      inputs="splits", check=check_student, takes_task=True),
    "heads": Method(HeadsConfig, heads, ("torch",), "torch",
                    "remove the least important attention heads of every layer, then recover by distillation",
                    inputs="splits", check=check_structured, fill=fill_teacher, takes_task=True,
                    cuts=CUT_PARTS["heads"], once=True),
    "ffn": Method(FfnConfig, ffn, ("torch",), "torch",
                  "remove the least important FFN neurons of every layer, then recover by distillation",
                  inputs="splits", check=check_structured, fill=fill_teacher, takes_task=True,
                  cuts=CUT_PARTS["ffn"]),
    "width": Method(WidthConfig, width, ("torch",), "torch",
                    "narrow the hidden state to its most important dimensions in every layer, then recover by "
                    "distillation", inputs="splits", check=check_width, fill=fill_teacher, takes_task=True,
                    cuts=CUT_PARTS["width"], once=True),
    "lowrank": Method(LowRankConfig, lowrank, ("torch",), "torch",
                      "replace chosen Linears of every layer by the two thin factors of their truncated SVD where "
                      "that runs faster, then recover by distillation", inputs="splits", check=check_lowrank,
                      fill=fill_lowrank, reads_later=later_int8, takes_task=True,
                      factors=factored_parts),
    "vocab": Method(VocabConfig, vocab_prune, ("torch",), "torch",
                    "drop the word-embedding rows of tokens the train split never uses and the unlabeled texts use "
                    "rarely (no training)",
                    inputs="splits", check=check_vocab, reads_test=True, takes_task=True),
    "magnitude": Method(MagnitudeConfig, magnitude, ("torch",), "torch",
                        "zero the smallest weights (one shot or a cubic ramp), fine-tune with the zeros held",
                        inputs="splits", check=check_sparse, takes_task=True),
    "lottery": Method(LotteryConfig, lottery, ("torch",), "torch",
                      "lottery ticket: iterative magnitude pruning, survivors rewound, optional random control",
                      inputs="splits", check=check_sparse, reads_test=True, takes_task=True),
    "qat": Method(QatConfig, qat, ("torch",), "torch-qat",
                  "quantization-aware training (Q8BERT): int8 fake quantization through a distilled fine-tune; "
                  "export writes its int8 graph", inputs="splits", takes_task=True),
    "export": Method(ExportConfig, export_onnx, TORCH, "onnx",
                     "torch -> ONNX (torch.onnx), parity-checked against torch on real sentences (a qat model: its "
                     "int8 QDQ graph)", gives_from=(("torch-qat", "onnx-int8"),),
                     runs_from=(("torch-qat", export_qat),), takes_task=True),
    # `fusions: auto` times each candidate as the int8-dynamic stage that follows would ship it
    "optimize": Method(OptimizeConfig, partial(optimize_onnx, as_shipped=int8_dynamic_as_shipped), ("onnx",),
                       "onnx-fused",
                       "ONNX Runtime transformer fusions (Attention, SkipLayerNorm, BiasGelu, EmbedLayerNorm)",
                       fill=fill_optimize, reads_later=later_params,
                       check=partial(check_optimize, as_shipped=int8_dynamic_as_shipped)),
    "fp16": Method(Fp16Config, fp16_onnx, FLOAT_ONNX, "onnx-fp16",
                   "float16 weights and compute for CUDA; int64 inputs and float32 logits kept", check=check_fp16),
    "int8-dynamic": Method(Int8DynamicConfig, int8_dynamic, FLOAT_ONNX, "onnx-int8",
                           "int8 weights, activations quantized per call (onnxruntime.quantization)"),
    "int8-static": Method(Int8StaticConfig, int8_static, ("onnx",), "onnx-int8",
                          "int8 weights and activations, ranges calibrated on real sentences (QDQ)"),
    "int4": Method(Int4Config, int4, ("onnx",), "onnx-int4",
                   "4-bit weights (MatMulNBits; the word embeddings too with embeddings: true): rtn, hqq, gptq or awq",
                   fill=fill_int4),
    "cascade": Method(CascadeConfig, cascade, ("onnx", "onnx-fused", "onnx-int8", "onnx-int4"), "onnx-cascade",
                      "the model answers the texts it is sure of and hands the others to a faithful fallback (the "
                      "teacher, int8 per channel), the threshold calibrated on validation",
                      inputs="splits", check=check_cascade, fill=fill_cascade, takes_task=True),
}


def torch_kind(model_dir: Path) -> Kind:
    """The kind of a torch model dir met outside a run (`edgepress export`'s model): torch-qat where qat wrote its
    record, else torch. (A run knows each stage's kind from the method that made it.)"""
    return "torch-qat" if (Path(model_dir) / QAT_FILE).is_file() else "torch"
