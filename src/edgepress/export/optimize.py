"""Graph fusion with ONNX Runtime's transformer optimizer (Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization, ...), and fp16 conversion for CUDA. Each result is parity-checked against its input."""

import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edgepress.export.parity import ONNX_FILE, ParityConfig, check_graph_change, copy_side_files
from edgepress.files import atomic_dir
from edgepress.runtime.session import SessionConfig

log = logging.getLogger(__name__)

# FusionOptions switches, by the names a config uses.
Fusion = Literal["attention", "skip_layer_norm", "bias_skip_layer_norm", "embed_layer_norm", "bias_gelu", "gelu",
                 "layer_norm"]
FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization",
             "LayerNormalization", "BiasGelu", "FastGelu", "Gelu")


class OptimizeConfig(BaseModel):
    """The `optimize` method: which fusions to leave out, and the parity tolerance of the fused graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    disable: tuple[Fusion, ...] = Field((), description="fusions to switch off, e.g. [skip_layer_norm]")
    max_length: int = Field(128, ge=8)
    parity: ParityConfig = ParityConfig(max_abs_diff=1e-3)


class Fp16Config(BaseModel):
    """The `fp16` method (for CUDA): float16 weights and compute; inputs stay int64 and logits float32."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_length: int = Field(128, ge=8)
    parity: ParityConfig = ParityConfig(max_abs_diff=5e-2, min_agreement=0.99)
    providers: tuple[Literal["cpu", "cuda"], ...] = Field(("cuda",), description="where the fp16 graph is checked")


def _fusion_options(disable: tuple[str, ...]):
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    for name in disable:
        setattr(options, f"enable_{name}", False)
    return options


def optimize_onnx(src_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: OptimizeConfig = OptimizeConfig()) -> dict:
    """Fuse `src_dir`/model.onnx into `out_dir`; returns {"fused_ops": {op: count}, "disabled": [...], "parity"}."""
    from onnxruntime.transformers.optimizer import optimize_model

    with atomic_dir(Path(out_dir)) as tmp:
        fused = optimize_model(str(Path(src_dir) / ONNX_FILE), model_type="bert",
                               optimization_options=_fusion_options(cfg.disable), opt_level=0)
        fused.save_model_to_file(str(tmp / ONNX_FILE))
        copy_side_files(Path(src_dir), tmp)
        ops = {op: n for op, n in fused.get_fused_operator_statistics().items() if n and op in FUSED_OPS}
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the fused graph",
                          SessionConfig(optimization="disable"))
    log.info("optimize: fused %s (disabled: %s), parity %s", ops, list(cfg.disable), parity)
    return {"fused_ops": ops, "disabled": list(cfg.disable), "parity": parity}


def fp16_onnx(src_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: Fp16Config = Fp16Config()) -> dict:
    """Convert `src_dir`/model.onnx to float16 (int64 inputs, float32 logits), checked on `cfg.providers`."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    with atomic_dir(Path(out_dir)) as tmp:
        model = OnnxModel(onnx.load(str(Path(src_dir) / ONNX_FILE)))
        model.convert_float_to_float16(keep_io_types=True)
        model.save_model_to_file(str(tmp / ONNX_FILE))
        copy_side_files(Path(src_dir), tmp)
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the fp16 graph",
                          SessionConfig(providers=cfg.providers))
    log.info("fp16: %s -> %s, parity %s", src_dir, out_dir, parity)
    return {"parity": parity}
