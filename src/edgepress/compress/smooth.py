"""SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language
Models", §4) for ONNX graphs, ahead of dynamic int8.

Dynamic int8 quantizes each activation tensor with one scale per call, so a few channels of large magnitude (the
residual stream of a transformer has them) leave the other channels a handful of levels. Smoothing divides each
input channel j of a weighted product by s_j and multiplies row j of its weight by s_j: x W = (x / s)(s W), the same
function in float, with the range moved from the activation (quantized per call, per tensor) to the weight
(quantized ahead of time, per channel). s_j = max|x_j|^α / max|W_j|^(1−α) (eq. 4), α the migration strength.

In a post-LayerNorm encoder the tensor a product reads is also read by the residual Add, so the division cannot be
folded into the LayerNorm before it: a `Mul(x, 1/s)` goes in front of the products alone (the readers of one tensor
share one Mul and one s, taken over all their weights), and the residual keeps reading x. The one place it folds: the
output of a fused `Attention` that only the products read (the attention's context, softmax(QK) V, is linear in V):
V's weight columns and bias are divided by s instead, one Mul fewer a layer. Only where the weights are quantized per
output channel (`fold_attention`): a column scaled by 1/s then keeps its relative precision.
"""

from pathlib import Path

import numpy as np

from edgepress.device.feeds import load_tokenizer, natural_feeds
from edgepress.export.parity import parity_feeds
from edgepress.files import read_onnx

SMOOTH_TEXTS = 128  # validation sentences the activation maxima are measured on
SMOOTH_BATCH = 8  # ... alone and in padded batches of this size: padding positions carry outliers of their own
READERS = ("MatMul", "Attention")  # ops whose input 0 is the activation and input 1 a weight of (in, out) rows


def _uses(graph) -> dict[str, int]:
    """Tensor name -> how many times a node reads it, or the graph gives it as an output."""
    uses = {output.name: 1 for output in graph.output}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    return uses


def smoothable(graph) -> dict[str, list]:
    """Activation tensor -> the weighted MatMul / Attention nodes reading it as their input 0, for the tensors
    whose readers' weights are 2-D, read by no other node, and agree on the channel count."""
    weights = {t.name: t for t in graph.initializer}
    uses = _uses(graph)
    readers: dict[str, list] = {}
    for node in graph.node:
        if node.op_type in READERS and len(node.input) > 1 and node.input[0] not in weights \
                and node.input[1] in weights:
            readers.setdefault(node.input[0], []).append(node)

    def fits(nodes) -> bool:
        dims = [tuple(weights[n.input[1]].dims) for n in nodes]
        return all(len(d) == 2 and d[0] == dims[0][0] and uses[n.input[1]] == 1
                   for d, n in zip(dims, nodes, strict=True))

    return {tensor: nodes for tensor, nodes in readers.items() if fits(nodes)}


def activations(model, tensors: list[str], feeds: list[dict]):
    """For each feed, the values of `tensors` (float tensors inside the graph `model`): the graph run with them as
    its outputs."""
    import onnx
    import onnxruntime

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in tensors)
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        yield session.run(tensors, feed)


def channel_maxima(model, tensors: list[str], feeds: list[dict]) -> dict[str, np.ndarray]:
    """max |x_j| over every token of every feed, for each channel j (the last axis) of each of `tensors`, from the
    float graph `model` run with those tensors as its outputs."""
    maxima = {t: np.zeros(0, np.float32) for t in tensors}
    for values in activations(model, tensors, feeds):
        for tensor, value in zip(tensors, values, strict=True):
            channels = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[tensor] = channels if not maxima[tensor].size else np.maximum(maxima[tensor], channels)
    return maxima


def smoothing_scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|x_j|^α / max|W_j|^(1−α); 1 for a channel that is zero on either side (nothing to move)."""
    live = (x_max > 0) & (w_max > 0)
    s = np.ones_like(x_max, dtype=np.float64)
    s[live] = x_max[live].astype(np.float64) ** alpha / w_max[live].astype(np.float64) ** (1 - alpha)
    return s


def text_feeds(model, tokenizer_dir: Path, texts: tuple[str, ...], max_length: int,
               batch: int | None = None) -> list[dict]:
    """The first SMOOTH_TEXTS of `texts` (validation sentences) as feeds of the graph `model`, tokenized as
    `tokenizer_dir`'s model: each alone at its own length, and with `batch`, in padded batches of it as well."""
    weights = {t.name for t in model.graph.initializer}
    names = tuple(i.name for i in model.graph.input if i.name not in weights)
    tokenizer, picked = load_tokenizer(tokenizer_dir, max_length), list(texts[:SMOOTH_TEXTS])
    return parity_feeds(tokenizer, picked, names, batch) if batch else natural_feeds(tokenizer, picked, names)


def smooth_activations(src: Path, dst: Path, texts: tuple[str, ...], alpha: float, max_length: int,
                       fold_attention: bool = False) -> dict:
    """The graph at `src` smoothed (`smooth_graph`) into `dst`, the channel maxima measured on the first
    SMOOTH_TEXTS of `texts`, alone and in padded batches; returns what `smooth_graph` did, and the texts."""
    import onnx

    model = read_onnx(src)
    done = smooth_graph(model, text_feeds(model, Path(src).parent, texts, max_length, SMOOTH_BATCH), alpha,
                        fold_attention)
    onnx.save(model, str(dst))
    return {**done, "texts": min(len(texts), SMOOTH_TEXTS)}


def _value_columns(node, tensor: str, weights: dict, uses: dict, width: int) -> list[str]:
    """The weight and bias of the fused Attention `node` making `tensor` (its context), whose V columns (the last
    `width`) can take a division; [] where they cannot (not an Attention's context, Q, K and V of other widths, a
    weight or bias shared)."""
    if node is None or node.op_type != "Attention" or node.domain != "com.microsoft" or node.output[0] != tensor:
        return []
    names = [name for name in node.input[1:3] if name]
    sizes = next((list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"), None)
    total = weights[node.input[1]].dims[-1] if node.input[1] in weights else 0
    if not all(name in weights and uses[name] == 1 for name in names) or (sizes and sizes[-1] != width) or \
            (not sizes and total != 3 * width):
        return []
    return names


def _divide_columns(weights: dict, names: list[str], s: np.ndarray) -> None:
    """Divide the last len(s) columns of each of the initializers `names` by s."""
    from onnx import numpy_helper

    for name in names:
        array = numpy_helper.to_array(weights[name]).copy()
        array[..., -len(s):] = array[..., -len(s):] / s
        weights[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))


def smooth_graph(model, feeds: list[dict], alpha: float, fold_attention: bool = False) -> dict:
    """Smooth the float graph `model` in place (module docstring), the channel maxima measured on `feeds`;
    returns α, the number of tensors smoothed, how many of them were folded into their Attention's V, and the
    range of the scales."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    readers = smoothable(graph)
    maxima = channel_maxima(model, list(readers), feeds)
    uses, producers = _uses(graph), {name: node for node in graph.node for name in node.output}
    first = {}  # tensor -> the position of its first reader in the graph's (topological) node order
    for position, node in enumerate(graph.node):
        if node.input and node.input[0] in readers:
            first.setdefault(node.input[0], position)
    muls, scales, folded = {}, [], 0
    for i, (tensor, nodes) in enumerate(readers.items()):
        arrays = [numpy_helper.to_array(weights[n.input[1]]) for n in nodes]
        s = smoothing_scales(maxima[tensor], np.max([np.abs(a).max(axis=1) for a in arrays], axis=0), alpha)
        for node, array in zip(nodes, arrays, strict=True):
            weights[node.input[1]].CopyFrom(numpy_helper.from_array((array * s[:, None]).astype(array.dtype),
                                                                    node.input[1]))
        scales.append(s)
        value = _value_columns(producers.get(tensor), tensor, weights, uses, len(s)) \
            if fold_attention and uses.get(tensor) == len(nodes) else []
        if value:  # the context divided by s at its source: no Mul
            _divide_columns(weights, value, s)
            folded += 1
            continue
        smoothed, inverse = f"{tensor}_smoothed", f"edgepress_smooth_{i}_inverse_scale"
        graph.initializer.append(numpy_helper.from_array((1 / s).astype(np.float32), inverse))
        for node in nodes:
            node.input[0] = smoothed
        muls[first[tensor]] = helper.make_node("Mul", [tensor, inverse], [smoothed], name=f"edgepress_smooth_{i}")
    ordered = []
    for position, node in enumerate(graph.node):  # each Mul right before its first reader: still topological
        if position in muls:
            ordered.append(muls[position])
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
    every = np.concatenate(scales) if scales else np.ones(1)
    return {"alpha": alpha, "tensors": len(readers), "folded": folded, "scale_min": float(every.min()),
            "scale_max": float(every.max())}
