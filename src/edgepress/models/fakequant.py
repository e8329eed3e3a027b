"""Int8 fake quantization of a classifier's Linear layers, as `qat` trains it and ONNX Runtime will run it.

Each chosen Linear computes linear(fq_u8(x), fq_s8(W)) (Zafrir et al. 2019, "Q8BERT", section 3): weights symmetric
int8 per output channel (scale max|W_c| / 127; / 64 in [-64, 64] with `reduce_range`, for CPUs without VNNI, as
ONNX Runtime's quantizer computes them), inputs uint8 per tensor over the range [lo, hi] that an exponential
moving average of each training batch's min and max learns. The formulas are ONNX Runtime's (`compute_scale_zp`:
the range widened to hold 0, scale (hi - lo) / 255, zero point round(-lo / scale)), so that the QDQ graph an export
writes from these ranges (`OpTypesToExcludeOutputQuantization: MatMul`: inputs quantized, outputs float, as here)
computes what training saw. Q8BERT quantizes inputs symmetrically; uint8 with a zero point is the form ONNX Runtime's
fastest x86 kernels take (u8 activations x s8 weights).

The QAT artifact is a plain Hugging Face model dir (the fine-tuned float weights) plus `edgepress-qat.json`:
{"format": 1, "momentum": m, "weight_qmax": 127 or 64, "input_ranges": {"<Linear module name>": [lo, hi], ...}}
(JSON: no pickle; an artifact without `weight_qmax` has 127).
`load_for_inference` applies it; `load_classifier` alone gives the float model (what `export` starts from).
"""

import types
from pathlib import Path

import numpy as np

from edgepress.files import read_json

QAT_FILE = "edgepress-qat.json"
RANGE = "qat_input_range"  # the buffer each fake-quantized Linear keeps its [lo, hi] in (saved in state_dict)


def input_qparams(lo: float, hi: float) -> tuple[float, int]:
    """(scale, zero point) of uint8 over [lo, hi] exactly as onnxruntime.quantization computes them."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = np.float32((hi - lo) / 255.0)
    if scale < np.finfo(np.float32).tiny:
        return 1.0, 0
    return float(scale), int(np.clip(np.round(-lo / np.float64(scale)), 0, 255))


def _forward(self, x):
    import torch
    import torch.nn.functional as F

    bounds = getattr(self, RANGE)
    if self.training:
        with torch.no_grad():
            seen = torch.stack([x.min(), x.max()]).to(bounds.dtype)
            bounds.copy_(seen if torch.isnan(bounds).any() else bounds + self.qat_momentum * (seen - bounds))
    scale, zero = input_qparams(*bounds.tolist())
    x = torch.fake_quantize_per_tensor_affine(x, scale, zero, 0, 255)
    qmax = self.qat_weight_qmax
    weight_scale = (self.weight.detach().abs().amax(dim=1) / qmax).clamp(min=torch.finfo(torch.float32).tiny)
    zeros = torch.zeros(self.weight.shape[0], dtype=torch.int32, device=self.weight.device)
    weight = torch.fake_quantize_per_channel_affine(self.weight, weight_scale, zeros, 0, -qmax, qmax)
    return F.linear(x, weight, self.bias)


def attach(model, names: list[str], ranges: dict | None = None, momentum: float = 0.01,
           weight_qmax: int = 127) -> None:
    """Fake-quantize the Linears `names` of `model` (in place), weights in [-weight_qmax, weight_qmax]; `ranges`
    fixes their input ranges (else the first training batch sets them and later ones move them by `momentum`)."""
    import torch

    for name in names:
        module = model.get_submodule(name)
        start = ranges[name] if ranges else [float("nan"), float("nan")]
        module.register_buffer(RANGE, torch.tensor(start, dtype=torch.float32, device=module.weight.device))
        module.qat_momentum, module.qat_weight_qmax = momentum, weight_qmax
        module.forward = types.MethodType(_forward, module)


def detach(model, names: list[str]) -> dict[str, list[float]]:
    """Undo `attach`: the Linears compute in float again; returns their learned input ranges."""
    ranges = {}
    for name in names:
        module = model.get_submodule(name)
        ranges[name] = [float(v) for v in module._buffers.pop(RANGE).tolist()]
        del module.forward, module.qat_momentum, module.qat_weight_qmax
    return ranges


def load_for_inference(path: str | Path, task):
    """(model, tokenizer) as its task loads it (`task`, edgepress.tasks), with a QAT artifact's fake quantization
    applied."""
    model, tokenizer = task.load_model(path)
    qat = Path(path) / QAT_FILE
    if qat.is_file():
        recorded = read_json(qat)
        ranges = recorded["input_ranges"]
        attach(model, list(ranges), ranges, weight_qmax=recorded.get("weight_qmax", 127))
    return model, tokenizer
