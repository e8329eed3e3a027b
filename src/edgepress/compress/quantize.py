"""Post-training int8 quantization of an ONNX graph with `onnxruntime.quantization`.

`int8-dynamic`: weights int8 ahead of time, activations quantized per call (DynamicQuantizeLinear + MatMulInteger,
QAttention on fused graphs). Weights stay signed: u8 activations x s8 weights take the fast integer kernels
(u8 x u8 runs ~10x slower on this class of CPU, ARCHITECTURE.md). On a fused graph ORT's quantizer cannot infer the
types of contrib ops, so `DefaultTensorType` says they are float.
"""

import logging
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgepress.export.parity import ONNX_FILE, ParityConfig, check_graph_change, copy_side_files
from edgepress.files import atomic_dir
from edgepress.runtime.session import SessionConfig

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
