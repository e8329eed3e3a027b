"""Deploy targets: where a bundle will run, and what that changes. A target fills stage params a config leaves
unset (an explicit param always wins; the report says what was filled and why), refuses stages whose output its
runtime cannot run fast, and refuses to bundle a graph whose quantization does not suit it.

    x86-vnni   x86-64 with AVX-512 VNNI or AVX-VNNI: int8 weights in their full signed range
    x86-avx2   x86-64 without VNNI: int8 weights in 7 bits (`reduce_range`), else u8 x s8 products saturate
    arm64      64-bit ARM (servers, Apple silicon, phones under Linux)
    cuda       an NVIDIA GPU: fp16; integer MatMuls have no CUDA kernels
    mobile     ONNX Runtime on Android / iOS
    web        onnxruntime-web (WASM) under transformers.js
"""

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepress.device.timing import cpu_flags
from edgepress.errors import ConfigError
from edgepress.files import read_onnx

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# Integer-MatMul kernels ONNX Runtime has for CPU only: on CUDA each would run on the CPU, with copies around it
CPU_INTEGER_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
                   "QAttention", "QEmbedLayerNormalization", "QLinearMatMul", "DynamicQuantizeLSTM")
INT8_METHODS = ("int8-dynamic", "int8-static", "qat")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")  # int8-static's and qat's graphs


@dataclass(frozen=True)
class Target:
    """What a target fills in (method -> param -> (value, why)) and which methods it refuses (method -> why)."""

    name: str
    summary: str
    defaults: dict[str, dict[str, tuple[Any, str]]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


_SIGNED = ("VNNI's int8 dot product (vpdpbusd) multiplies u8 activations by s8 weights and accumulates in int32: "
           "full-range signed int8 weights cannot saturate")
_REDUCED = ("without VNNI, ONNX Runtime's u8 x s8 kernel sums pairs of products in int16 (vpmaddubsw), which "
            "saturates with full-range weights; 7-bit weights keep every sum exact (onnxruntime quantization docs: "
            "reduce_range on x86 without VNNI)")
_ARM = ("ARM64's int8 dot products (sdot/udot, i8mm) accumulate in int32: full-range weights cannot saturate")
_CUDA = ("the CUDA execution provider has no fast kernels for integer MatMuls (MatMulInteger, "
         "DynamicQuantizeLinear: they would run on the CPU) and runs QDQ graphs as float MatMuls between "
         "quantize/dequantize pairs. Fix: end the pipeline with the fp16 stage, or choose a CPU target")

TARGETS = {
    "x86-vnni": Target("x86-vnni", "x86-64 with VNNI", {m: {"reduce_range": (False, _SIGNED)} for m in INT8_METHODS}),
    "x86-avx2": Target("x86-avx2", "x86-64 with AVX2, no VNNI",
                       {m: {"reduce_range": (True, _REDUCED)} for m in INT8_METHODS}),
    "arm64": Target("arm64", "64-bit ARM", {m: {"reduce_range": (False, _ARM)} for m in INT8_METHODS}),
    "cuda": Target("cuda", "NVIDIA GPU (CUDA execution provider)", refused={m: _CUDA for m in INT8_METHODS}),
    "mobile": Target("mobile", "ONNX Runtime Mobile (Android, iOS)"),
    "web": Target("web", "onnxruntime-web (WASM) under transformers.js"),
}


def detect_target() -> str:
    """The build machine's own target: arm64, x86-vnni or x86-avx2."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    return "x86-vnni" if cpu_flags() & set(VNNI_FLAGS) else "x86-avx2"


def resolve_target(name: str | None) -> dict:
    """{"name", "detected"}: the target asked for, else the build machine's."""
    if name is None:
        return {"name": detect_target(), "detected": True}
    if name not in TARGETS:
        raise ConfigError(f"unknown target {name!r}. Fix: choose one of {', '.join(TARGETS)}")
    return {"name": name, "detected": False}


def target_params(target: str, method: str, params: dict, per_channel_default: bool = True) -> tuple[dict, dict]:
    """(params with the target's defaults for `method` filled where unset, {param: {value, why}} of what was
    filled). 7-bit weights are filled in only for per-channel scales (`per_channel`, else the method's default):
    with one scale per tensor they cost too much (the demo student's fused graph: argmax agreement 0.88 with
    float), and ONNX Runtime's docs tie reduce_range to per-channel on CPUs without VNNI."""
    filled = {k: {"value": v, "why": why} for k, (v, why) in TARGETS[target].defaults.get(method, {}).items()
              if k not in params}
    if not params.get("per_channel", per_channel_default):
        filled.pop("reduce_range", None)
    return {**params, **{k: f["value"] for k, f in filled.items()}}, filled


def refusals(target: str, methods: list[tuple[str, str]]) -> list[str]:
    """A line per (stage name, method) pair whose method `target` refuses."""
    refused = TARGETS[target].refused
    return [f"stage {name}: {method} is refused by target {target}: {refused[method]}"
            for name, method in methods if method in refused]


def int8_weight_ranges(path: Path) -> dict[str, int]:
    """{initializer: max |q|} of the int8 weights the graph's integer MatMuls read (MatMulInteger's B,
    DequantizeLinear's int8 input, QAttention's weight): 64 or less when quantized with reduce_range (two
    products of a u8 activation and such a weight sum to at most 2 x 255 x 64 = 32,640, inside int16)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = read_onnx(path).graph
    weights = {t.name: t for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    readers = {"MatMulInteger": 1, "DynamicQuantizeMatMul": 1, "QAttention": 1, "DequantizeLinear": 0}
    found = {}
    for node in graph.node:
        slot = readers.get(node.op_type)
        name = node.input[slot] if slot is not None and len(node.input) > slot else None
        if name in weights:
            found[name] = int(np.abs(numpy_helper.to_array(weights[name]).astype(np.int16)).max())
    return found


def _blame(ops: set[str], origins: dict[str, str]) -> str:
    return ", ".join(f"{op} (from stage {origins[op]})" if op in origins else op for op in sorted(ops))


def check_artifact(target: str, path: Path, operators: list[dict], measured_on: str | None,
                   origins: dict[str, str]) -> None:
    """ConfigError when the graph at `path` (its `operators`; `origins`: the stage that put each there) does not
    suit `target`: integer MatMuls for cuda; full-range int8 weights for x86-avx2, unless they were measured on an
    x86-avx2 machine (`measured_on`, the build machine's target), where any saturation is already in the accuracy
    the gates passed."""
    types = {o["op_type"] for o in operators}
    if target == "cuda" and types & {*CPU_INTEGER_OPS, *QDQ_OPS}:
        raise ConfigError(f"{path} is quantized for a CPU (it runs "
                          f"{_blame(types & {*CPU_INTEGER_OPS, *QDQ_OPS}, origins)}); target cuda: {_CUDA}")
    if target == "mobile" and "GatherBlockQuantized" in types:
        raise ConfigError(f"{path} keeps its word table in 4 bits ({_blame({'GatherBlockQuantized'}, origins)}), "
                          f"which ONNX Runtime's mobile format (.ort) cannot hold. Fix: int4 with embeddings: false "
                          f"for target mobile, or bundle for arm64")
    if target == "x86-avx2" and measured_on != "x86-avx2":
        full = sorted(name for name, peak in int8_weight_ranges(path).items() if peak > 64)
        if full:
            raise ConfigError(
                f"{path} has full-range int8 weights ({len(full)} tensors, e.g. {full[0]}), quantized for "
                f"{measured_on or 'a CPU with VNNI'} and never measured without VNNI; target x86-avx2: {_REDUCED}. "
                f"Fix: quantize again with reduce_range: true (the x86-avx2 default), or bundle for x86-vnni")
