"""Post-training int8 quantization of an ONNX graph with `onnxruntime.quantization`.

`int8-static`: weights and activations int8, activation ranges calibrated on real sentences, written as QDQ.
MatMuls whose two inputs are both activations (attention scores, context) and the classification head (pooler and
classifier Gemms, or a MatMul classifier) stay float: quantizing them collapses accuracy (ARCHITECTURE.md), and the
head is a (batch, hidden) product whose cost is negligible.

`int8-dynamic`: weights int8 ahead of time, activations quantized per call (DynamicQuantizeLinear + MatMulInteger,
QAttention on fused graphs). Weights stay signed: u8 activations x s8 weights take the fast integer kernels
(u8 x u8 runs ~10x slower on this class of CPU, ARCHITECTURE.md). On a fused graph ORT's quantizer cannot infer the
types of contrib ops, so `DefaultTensorType` says they are float.
"""

import logging
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.errors import ConfigError
from edgepress.export.parity import ONNX_FILE, ParityConfig, check_graph_change, copy_side_files
from edgepress.files import atomic_dir
from edgepress.runtime.session import SessionConfig
from edgepress.runtime.tokenize import encode, load_tokenizer

log = logging.getLogger(__name__)
INT8_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "QAttention", "DynamicQuantizeMatMul", "QGemm")


class Int8DynamicConfig(BaseModel):
    """The `int8-dynamic` method. The parity check is loose on purpose: int8 moves logits; the accuracy gate
    decides whether the move costs predictions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_channel: bool = Field(False, description="one scale per output channel of each weight")
    reduce_range: bool = Field(False, description="7-bit weights, for CPUs without VNNI that saturate otherwise")
    max_length: int = Field(128, ge=8)
    parity: ParityConfig = ParityConfig(max_abs_diff=1.5, min_agreement=0.9)  # a broken graph, not a close call


def int8_dynamic(src_dir: Path, out_dir: Path, texts: tuple[str, ...],
                 cfg: Int8DynamicConfig = Int8DynamicConfig()) -> dict:
    """Quantize `src_dir`/model.onnx dynamically to int8 into `out_dir`; returns the quantized op counts and parity."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with atomic_dir(Path(out_dir)) as tmp:
        quantize_dynamic(Path(src_dir) / ONNX_FILE, tmp / ONNX_FILE, weight_type=QuantType.QInt8,
                         per_channel=cfg.per_channel, reduce_range=cfg.reduce_range,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        copy_side_files(Path(src_dir), tmp)
        counts = Counter(node.op_type for node in onnx.load(str(tmp / ONNX_FILE)).graph.node)
        ops = {op: counts[op] for op in INT8_OPS if counts[op]}
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the int8 graph",
                                    SessionConfig())
    log.info("int8-dynamic: %s, parity %s", ops, parity)
    return {"quantized_ops": ops, "parity": parity}


class Int8StaticConfig(BaseModel):
    """The `int8-static` method: calibrated QDQ int8 for the encoder's weighted MatMuls (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_channel: bool = True
    calibration: Literal["minmax", "percentile", "entropy"] = "minmax"
    calibration_size: int = Field(128, ge=8, description="real sentences the activation ranges come from")
    max_length: int = Field(128, ge=8)
    parity: ParityConfig = ParityConfig(max_abs_diff=1.5, min_agreement=0.9)


class _Sentences:
    """An onnxruntime.quantization CalibrationDataReader over real sentences, one at a time (natural lengths)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _float_matmuls(graph) -> list[str]:
    """MatMul nodes to keep in float: activation x activation products, and a MatMul classifier (Gemm nodes are
    never quantized: `op_types_to_quantize` names MatMul only)."""
    weights = {t.name for t in graph.initializer}
    matmuls = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    keep = [n.name for n in matmuls if not any(i in weights for i in n.input)]
    producers = {o: n for n in graph.node for o in n.output}
    frontier, seen = ["logits"], set()
    while frontier:  # walk back from the logits to the first weighted MatMul/Gemm: the classifier
        node = producers.get(frontier.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node in matmuls:
            keep.append(node.name)
            continue
        frontier.extend(node.input)
    return keep


def int8_static(src_dir: Path, out_dir: Path, texts: tuple[str, ...],
                cfg: Int8StaticConfig = Int8StaticConfig()) -> dict:
    """Calibrated QDQ int8 of `src_dir`/model.onnx into `out_dir`; calibrated on the first `calibration_size`
    `texts` (validation sentences in a pipeline, never the test split)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    src = Path(src_dir) / ONNX_FILE
    graph = onnx.load(str(src)).graph
    fused = sorted({n.op_type for n in graph.node if n.domain == "com.microsoft"})
    if fused:
        raise ConfigError(f"int8-static needs the unfused graph of an export stage; {src} has fused ops "
                          f"({', '.join(fused)}). Fix: put int8-static right after export (ONNX Runtime fuses the "
                          f"QDQ graph itself when the session starts)")
    initializers = {t.name for t in graph.initializer}
    names = tuple(i.name for i in graph.input if i.name not in initializers)
    tokenizer = load_tokenizer(src_dir, cfg.max_length)
    feeds = [encode(tokenizer, [t], names) for t in texts[: cfg.calibration_size]]
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[cfg.calibration]
    excluded = _float_matmuls(graph)
    with atomic_dir(Path(out_dir)) as tmp:
        quantize_static(src, tmp / ONNX_FILE, _Sentences(feeds), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["MatMul"], per_channel=cfg.per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=excluded,
                        calibrate_method=method, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        copy_side_files(Path(src_dir), tmp)
        counts = Counter(node.op_type for node in onnx.load(str(tmp / ONNX_FILE)).graph.node)
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the static int8 graph",
                                    SessionConfig())
    ops = {"QuantizeLinear": counts["QuantizeLinear"], "DequantizeLinear": counts["DequantizeLinear"]}
    log.info("int8-static: %s, %d MatMul/Gemm kept float, parity %s", ops, len(excluded), parity)
    return {"quantized_ops": ops, "float_matmuls": excluded, "parity": parity}
