"""`int4` with `algorithm: gptq | awq`: neural-compressor 3.x quantizes the torch model the graph was exported from
(GPTQ, Frantar et al. 2023: each layer's rounding error compensated on calibration activations; AWQ, Lin et al.
2024: per-input-channel scales chosen on them), and its integer weights, scales and zero points are written into
`MatMulNBits` nodes as they are: re-deriving them from min/max would throw the GPTQ solution away.

The graph's MatMuls are matched to the torch Linears by weight content (the export writes Linear.weight.T as the
MatMul's initializer, bit for bit), not by name, so any exporter's naming serves. AWQ on a post-LayerNorm BERT finds
no layer to fold its input scales into (every LayerNorm output also feeds a residual), so each quantized Linear
computes linear(x * input_scale): the graph gets that Mul in front of the MatMulNBits.

Layout (onnxruntime's MatMulNBits, bits 4): B uint8 [N, K/bs, bs/2], two weights a byte along K, low nibble first;
scales [N, K/bs]; zero points uint8 [N, ceil(K/bs / 2)], two blocks a byte; W[k, n] = (q - zp) * scale.
"""

import hashlib
import tempfile
from pathlib import Path

import numpy as np

from edgepress.errors import ConfigError, ModelError
from edgepress.files import read_onnx
from edgepress.logs import collected


def _pack(values: np.ndarray) -> np.ndarray:
    """Pairs along the last axis (even length) into one byte each, the first in the low nibble."""
    return ((values[..., 0::2] & 0xF) | ((values[..., 1::2] & 0xF) << 4)).astype(np.uint8)


def weight_key(weight: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(weight, dtype=np.float32).tobytes()).hexdigest()


def calibration_batches(model_dir: Path, texts: tuple[str, ...], size: int, max_length: int) -> list[dict]:
    """Batches of 8 validation sentences, padded to their longest, as torch tensors."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    picked = list(texts[:size])
    return [{k: torch.as_tensor(v) for k, v in tokenizer(picked[i : i + 8], padding=True, truncation=True,
                                                          max_length=max_length, return_tensors="np").items()}
            for i in range(0, len(picked), 8)]


def inc_quantize(model_dir: Path, algorithm: str, block_size: int, symmetric: bool, batches: list[dict]):
    """The classifier in `model_dir` quantized by neural-compressor (the encoder's Linears; pooler and classifier,
    Gemm nodes in the graph, stay float)."""
    import torch

    try:
        from neural_compressor.common.utils.logger import Logger

        Logger()  # set up on first use, replacing the logger's handlers: before `collected` takes it over
        with collected("neural_compressor"):  # its torch half logs the accelerator it finds on import
            from neural_compressor.common.utils.utility import set_workspace
            from neural_compressor.torch.quantization import AWQConfig, GPTQConfig, convert, prepare
    except ImportError as e:
        raise ConfigError("int4 gptq/awq needs neural-compressor's torch half. Fix: pip install "
                          "'edgepress[int4]' (neural-compressor-pt)") from e
    from edgepress.models.loading import load_classifier

    model, _ = load_classifier(model_dir)
    head = [".*pooler.*", ".*classifier.*"]
    # layer-wise mode off: it unpickles checkpoints (neural-compressor#2461); model_path, a local dir, is then only
    # looked at, never loaded (an empty one would be looked up on the Hub)
    common = {"bits": 4, "group_size": block_size, "use_sym": symmetric, "use_layer_wise": False,
              "model_path": str(model_dir)}
    with tempfile.TemporaryDirectory(prefix="edgepress-inc-") as workspace, collected("neural_compressor"):
        set_workspace(workspace)  # not ./nc_workspace in the user's directory
        if algorithm == "gptq":  # act_order off: its channel permutation has no place in MatMulNBits
            cfg = GPTQConfig(**common, act_order=False)
            cfg.set_local(head, GPTQConfig(dtype="fp32", model_path=str(model_dir)))
            model = prepare(model, cfg)
        else:
            cfg = AWQConfig(**common)
            cfg.set_local(head, AWQConfig(dtype="fp32", model_path=str(model_dir)))
            model = prepare(model, cfg, example_inputs=batches[0]["input_ids"])
        with torch.no_grad():
            for batch in batches:
                model(**batch)
        return load_classifier(model_dir)[0], convert(model)


def quantized_linears(original, quantized) -> dict[str, dict]:
    """{weight sha1 of the float Linear.weight.T: q [K, N], scale [K/bs, N], zp [K/bs, N], input scale or None}."""
    from neural_compressor.torch.algorithms.weight_only.modules import INCWeightOnlyLinear, MulLinear

    floats = dict(original.named_modules())
    out, inside = {}, set()
    for name, module in quantized.named_modules():
        pre = None
        if isinstance(module, MulLinear):  # AWQ: linear(x * input_scale); its `.linear` child is handled here
            pre, module = module.input_scale.float().numpy(), module.linear
            inside.add(f"{name}.linear")
        if not isinstance(module, INCWeightOnlyLinear) or name in inside:
            continue
        unpacked = module.unpack()  # int_weight [N, K] 0..15, scales and zp [N, K/bs]
        out[weight_key(floats[name].weight.detach().numpy().T)] = {
            "q": unpacked["int_weight"].numpy().astype(np.uint8).T, "scale": unpacked["scales"].float().numpy().T,
            "zp": unpacked["zp"].numpy().astype(np.uint8).T, "input_scale": pre, "block_size": module.group_size}
    return out


def _nbits_node(graph, node, weight: str, found: dict, accuracy_level: int, symmetric: bool) -> list:
    """The MatMulNBits (after AWQ's Mul) replacing `node`, its initializers added to `graph`."""
    from onnx import helper, numpy_helper

    q, scale, zp, bs = found["q"], found["scale"], found["zp"], found["block_size"]
    (k, n), blocks = q.shape, scale.shape[0]
    padded = np.zeros((blocks * bs, n), np.uint8)
    padded[:k] = q
    graph.initializer.extend([numpy_helper.from_array(_pack(padded.T.reshape(n, blocks, bs)), f"{weight}_q4"),
                              numpy_helper.from_array(np.ascontiguousarray(scale.T, np.float32), f"{weight}_scales")])
    inputs, nodes = [node.input[0], f"{weight}_q4", f"{weight}_scales"], []
    if not (symmetric and (zp == 8).all()):  # MatMulNBits takes 8 when no zero points are given
        zeros = np.zeros((n, blocks + blocks % 2), np.uint8)
        zeros[:, :blocks] = zp.T
        graph.initializer.append(numpy_helper.from_array(_pack(zeros), f"{weight}_zp"))
        inputs.append(f"{weight}_zp")
    if found["input_scale"] is not None:  # AWQ: linear(x * input_scale)
        graph.initializer.append(numpy_helper.from_array(found["input_scale"].astype(np.float32), f"{weight}_awq"))
        nodes.append(helper.make_node("Mul", [node.input[0], f"{weight}_awq"], [f"{weight}_awq_x"],
                                      name=f"{node.name}_awq_scale"))
        inputs[0] = f"{weight}_awq_x"
    levels = {"accuracy_level": accuracy_level} if accuracy_level else {}
    nodes.append(helper.make_node("MatMulNBits", inputs, list(node.output), name=f"{node.name}_Q4NBits",
                                  domain="com.microsoft", K=k, N=n, bits=4, block_size=bs, **levels))
    return nodes


def write_nbits(model, linears: dict, exclude: list[str], accuracy_level: int, symmetric: bool):
    """`model` (ModelProto) with every weighted MatMul not in `exclude` replaced by the MatMulNBits of its quantized
    Linear; a MatMul with no quantized Linear is an error (the graph is not of this model)."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, missing, replaced = [], [], set()
    for node in graph.node:
        weight = next((i for i in node.input[1:] if i in weights), None) if node.op_type == "MatMul" else None
        if weight is None or node.name in exclude:
            nodes.append(node)
            continue
        found = linears.get(weight_key(numpy_helper.to_array(weights[weight])))
        if found is None:
            missing.append(node.name)
            nodes.append(node)
            continue
        nodes.extend(_nbits_node(graph, node, weight, found, accuracy_level, symmetric))
        replaced.add(weight)
    if missing:
        raise ModelError(f"{len(missing)} MatMul(s) of the graph have no quantized Linear of the same weights in the "
                         f"torch model: {', '.join(missing[:4])}. Fix: torch_model must be the model the graph was "
                         f"exported from")
    graph.ClearField("node")
    graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in graph.initializer if t.name not in replaced or t.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _inc_gptq():
    """neural-compressor's GPTQ solver (the class its torch GPTQ runs on each Linear), imported quietly."""
    try:
        from neural_compressor.common.utils.logger import Logger

        Logger()
        with collected("neural_compressor"):
            from neural_compressor.torch.algorithms.weight_only.gptq import GPTQ
    except ImportError as e:
        raise ConfigError("int8-dynamic gptq needs neural-compressor's torch half. Fix: pip install "
                          "'edgepress[int4]' (neural-compressor-pt)") from e
    return GPTQ


def gptq_rounding(float_path: Path, int8_path: Path, feeds: list[dict], reduce_range: bool) -> dict:
    """Re-round the int8 weights of the dynamically quantized graph at `int8_path` (in place) by GPTQ on the
    activations of its float graph `float_path` for `feeds`, on the grid quantize_dynamic chose: each weight's own
    per-channel scales, zero points 0, the same integer range. Returns how many weights, and the share of their
    integers GPTQ moved off nearest rounding."""
    import onnx
    import torch
    from onnx import numpy_helper
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    from edgepress.compress.smooth import READERS, activations

    model, quantized = read_onnx(float_path), read_onnx(int8_path)
    floats = {t.name: t for t in model.graph.initializer}
    ints = {t.name: t for t in quantized.graph.initializer}
    targets = [n for n in model.graph.node if n.op_type in READERS and len(n.input) > 1 and n.input[1] in floats
               and len(floats[n.input[1]].dims) == 2 and f"{n.input[1]}_quantized" in ints
               and ints[f"{n.input[1]}_quantized"].data_type == onnx.TensorProto.INT8
               and f"{n.input[1]}_zero_point" in ints and f"{n.input[1]}_scale" in ints
               and not numpy_helper.to_array(ints[f"{n.input[1]}_zero_point"]).any()]
    tensors = sorted({n.input[0] for n in targets})
    solver, qmax = _inc_gptq(), int(get_qmin_qmax_for_qType(onnx.TensorProto.INT8, reduce_range, True)[1])
    solvers = {}
    for n in targets:
        weight = numpy_helper.to_array(floats[n.input[1]])  # (in, out): a torch Linear's weight transposed
        solvers[n.input[1]] = solver(torch.nn.Linear(*weight.shape, bias=False), torch.as_tensor(weight.T.copy()))
    readers = {t: [n.input[1] for n in targets if n.input[0] == t] for t in tensors}
    for values in activations(model, tensors, feeds):
        for tensor, value in zip(tensors, values, strict=True):
            x = torch.as_tensor(value.reshape(1, -1, value.shape[-1]))
            for name in readers[tensor]:
                solvers[name].add_batch(x, None)
    moved = total = 0
    with collected("neural_compressor"):
        for name, gptq in solvers.items():
            scale = numpy_helper.to_array(ints[f"{name}_scale"]).astype(np.float32)
            gptq.quantizer.dtype, gptq.quantizer.maxq = "int", 2 * qmax  # integers q - qmax in [-qmax, qmax]
            gptq.quantizer.scale = torch.as_tensor(scale).reshape(-1, 1)
            gptq.quantizer.zero = torch.full_like(gptq.quantizer.scale, qmax)
            weight = torch.as_tensor(numpy_helper.to_array(floats[name]).T.copy())
            rounded = gptq.fasterquant(weight, blocksize=128, percdamp=0.01, act_order=True)[3].numpy().T
            new = np.clip(np.round(rounded / scale), -qmax, qmax).astype(np.int8)
            old = numpy_helper.to_array(ints[f"{name}_quantized"])
            moved, total = moved + int((new != old).sum()), total + old.size
            ints[f"{name}_quantized"].CopyFrom(numpy_helper.from_array(new, f"{name}_quantized"))
    onnx.save(quantized, str(int8_path))
    return {"weights": len(solvers), "moved": moved / max(total, 1)}
