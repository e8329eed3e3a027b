"""The one method registry: the name a pipeline stage writes -> its frozen config and its function.

Every function is `fn(src: Path, out: Path, inputs, cfg) -> dict` (details to record): `src` is the previous
stage's artifact, `out` the directory this stage writes, and `inputs` either the validation sentences (`texts`:
parity checks, calibration) or the whole `DataSplits` (`splits`: methods that train). The CLI and the YAML validator
read their choices from `METHODS`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from edgepress.compress.distill import DistillConfig, check_student, distill
from edgepress.compress.int4 import Int4Config, int4
from edgepress.compress.magnitude import LotteryConfig, MagnitudeConfig, check_sparse, lottery, magnitude
from edgepress.compress.qat import QatConfig, qat
from edgepress.compress.quantize import Int8DynamicConfig, Int8StaticConfig, int8_dynamic, int8_static
from edgepress.compress.structured import FfnConfig, HeadsConfig, check_structured, ffn, heads
from edgepress.compress.vocab import VocabConfig, check_vocab, vocab_prune
from edgepress.export.onnx import ExportConfig, export_onnx
from edgepress.export.optimize import Fp16Config, OptimizeConfig, check_fp16, fp16_onnx, optimize_onnx

# What an artifact is: each method declares the kinds it takes and the kind it gives; the pipeline validator
# chains them, so an impossible order is refused before anything runs.
Kind = Literal["torch", "torch-qat", "onnx", "onnx-fused", "onnx-fp16", "onnx-int8", "onnx-int4"]
KIND_WORDS: dict[str, str] = {
    "torch": "a torch model dir",
    "torch-qat": "a quantization-aware-trained torch model (what qat gives)",
    "onnx": "an unfused ONNX graph (what export gives)",
    "onnx-fused": "a fused ONNX graph (what optimize gives)",
    "onnx-fp16": "a float16 ONNX graph",
    "onnx-int8": "an int8 ONNX graph",
    "onnx-int4": "a 4-bit ONNX graph",
}
FLOAT_ONNX: tuple[Kind, ...] = ("onnx", "onnx-fused")
TORCH: tuple[Kind, ...] = ("torch", "torch-qat")  # torch model dirs: measured (and timed) with torch, on cpu


@dataclass(frozen=True)
class Method:
    config: type[BaseModel]
    run: Callable[..., dict]
    takes: tuple[Kind, ...]
    gives: Kind
    summary: str
    inputs: Literal["texts", "splits"] = "texts"
    gives_from: tuple[tuple[Kind, Kind], ...] = ()  # (kind taken, kind given) where it is not `gives`
    # what can be known before a run: `check(model, tokenizer, cfg)` raises the ConfigError the method would raise
    # (run on the model the config names, by `validate` and before `run` touches anything)
    check: Callable[..., None] | None = None
    reads_test: bool = False  # its details are computed on the test split, not only its metrics

    def output(self, taken: str) -> str:
        """The kind of artifact this method makes from one of kind `taken`."""
        return dict(self.gives_from).get(taken, self.gives)

    @property
    def trains(self) -> bool:
        """It fine-tunes (its config has the shared training fields)."""
        return "epochs" in self.config.model_fields


METHODS: dict[str, Method] = {
    "distill": Method(DistillConfig, distill, ("torch",), "torch",
                      "a shallower student trained on the teacher's outputs (hinton, distilbert, tinybert)",
                      inputs="splits", check=check_student),
    "heads": Method(HeadsConfig, heads, ("torch",), "torch",
                    "remove the least important attention heads of every layer, then recover by distillation",
                    inputs="splits", check=check_structured),
    "ffn": Method(FfnConfig, ffn, ("torch",), "torch",
                  "remove the least important FFN neurons of every layer, then recover by distillation",
                  inputs="splits", check=check_structured),
    "vocab": Method(VocabConfig, vocab_prune, ("torch",), "torch",
                    "drop the word-embedding rows of tokens the train split never uses (no training)",
                    inputs="splits", check=check_vocab, reads_test=True),
    "magnitude": Method(MagnitudeConfig, magnitude, ("torch",), "torch",
                        "zero the smallest weights (one shot or a cubic ramp), fine-tune with the zeros held",
                        inputs="splits", check=check_sparse),
    "lottery": Method(LotteryConfig, lottery, ("torch",), "torch",
                      "lottery ticket: iterative magnitude pruning, survivors rewound, optional random control",
                      inputs="splits", check=check_sparse, reads_test=True),
    "qat": Method(QatConfig, qat, ("torch",), "torch-qat",
                  "quantization-aware training (Q8BERT): int8 fake quantization through a distilled fine-tune; "
                  "export writes its int8 graph", inputs="splits"),
    "export": Method(ExportConfig, export_onnx, TORCH, "onnx",
                     "torch -> ONNX (torch.onnx), parity-checked against torch on real sentences (a qat model: its "
                     "int8 QDQ graph)", gives_from=(("torch-qat", "onnx-int8"),)),
    "optimize": Method(OptimizeConfig, optimize_onnx, ("onnx",), "onnx-fused",
                       "ONNX Runtime transformer fusions (Attention, SkipLayerNorm, BiasGelu, EmbedLayerNorm)"),
    "fp16": Method(Fp16Config, fp16_onnx, FLOAT_ONNX, "onnx-fp16",
                   "float16 weights and compute for CUDA; int64 inputs and float32 logits kept", check=check_fp16),
    "int8-dynamic": Method(Int8DynamicConfig, int8_dynamic, FLOAT_ONNX, "onnx-int8",
                           "int8 weights, activations quantized per call (onnxruntime.quantization)"),
    "int8-static": Method(Int8StaticConfig, int8_static, ("onnx",), "onnx-int8",
                          "int8 weights and activations, ranges calibrated on real sentences (QDQ)"),
    "int4": Method(Int4Config, int4, ("onnx",), "onnx-int4",
                   "4-bit weights (MatMulNBits; the word embeddings too with embeddings: true): rtn, hqq, gptq or awq"),
}
