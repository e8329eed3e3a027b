from collections import Counter

import numpy as np
import onnx
import pytest

from edgepress.compress.quantize import Int8DynamicConfig, Int8StaticConfig, int8_dynamic, int8_static
from edgepress.device.predictor import Predictor
from edgepress.errors import ConfigError
from edgepress.export.optimize import OptimizeConfig, optimize_onnx


def op_counts(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path / "model.onnx")).graph.node)


@pytest.fixture(scope="module")
def fused_dir(tmp_path_factory, tiny_onnx_dir, movie_data):
    path = tmp_path_factory.mktemp("fused") / "f"
    optimize_onnx(tiny_onnx_dir, path, movie_data.validation.texts, OptimizeConfig(fusions="all"))
    return path


def test_dynamic_int8_on_the_fused_graph_uses_integer_kernels(fused_dir, tmp_path, movie_data):
    result = int8_dynamic(fused_dir, tmp_path / "q", movie_data.validation.texts)
    ops = op_counts(tmp_path / "q")
    # per layer: attention output, FFN in, FFN out; then pooler and classifier
    assert ops["QAttention"] == 2 and ops["MatMulInteger"] == 2 * 3 + 2 and ops["DynamicQuantizeLinear"] > 0
    # what ONNX Runtime runs: the attentions, and the 8 other MatMuls fused with their activation quantization
    assert result["ort_kernels"] == {"DynamicQuantizeMatMul": 8, "QAttention": 2}
    assert "Attention" not in ops  # every attention became QAttention
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    types = {t.name: t.data_type for t in graph.initializer}
    matmul_weights = [n.input[1] for n in graph.node if n.op_type in ("MatMulInteger", "QAttention")]
    assert {types[w] for w in matmul_weights} == {onnx.TensorProto.INT8}  # u8 x s8: the fast integer kernels
    assert result["parity"]["agreement"] >= 0.9
    assert (tmp_path / "q" / "model.onnx").stat().st_size < 0.5 * (fused_dir / "model.onnx").stat().st_size


def test_dynamic_int8_per_channel(tiny_onnx_dir, tmp_path, movie_data):
    int8_dynamic(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts, Int8DynamicConfig(per_channel=True))
    scales = [t for t in onnx.load(str(tmp_path / "q" / "model.onnx")).graph.initializer if t.name.endswith("_scale")]
    assert any(len(t.dims) == 1 and t.dims[0] > 1 for t in scales)  # one scale per output channel


@pytest.mark.parametrize("calibration", ["percentile", "entropy"])
def test_histogram_calibration_takes_sentences_of_every_length(tiny_onnx_dir, tmp_path, movie_data, calibration):
    # ONNX Runtime stacks a histogram calibrator's activations: one sentence a feed at its own length crashed it
    result = int8_static(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts,
                         Int8StaticConfig(calibration_size=64, calibration=calibration, max_length=32))
    assert result["quantized_ops"]["QuantizeLinear"] > 0


def test_static_int8_keeps_activation_products_and_the_head_float(tiny_onnx_dir, tmp_path, movie_data):
    result = int8_static(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts,
                         Int8StaticConfig(calibration_size=32))
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    weights = {t.name for t in graph.initializer}
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    for node in graph.node:
        if node.op_type == "MatMul":
            fed_by_weights = any(i in weights or i in dequantized for i in node.input)
            if node.name in result["float_matmuls"]:
                assert not any(i in dequantized for i in node.input), node.name
            else:
                assert fed_by_weights and all(i in dequantized for i in node.input), node.name
    assert len([n for n in result["float_matmuls"] if "attention" in n]) == 4  # 2 layers x (scores, context)
    assert result["float_matmuls"][-1] == "/classifier/Gemm"
    assert result["quantized_ops"]["QuantizeLinear"] > 0
    assert result["ort_kernels"] == {"QLinearMatMul": 2 * 6}  # ONNX Runtime turned every QDQ MatMul integer
    texts = list(movie_data.test.texts[:64])
    quantized, float_ = Predictor(tmp_path / "q").logits(texts), Predictor(tiny_onnx_dir).logits(texts)
    assert np.abs(quantized - float_).max() < 1.5 and not np.array_equal(quantized, float_)  # int8, and close


def test_static_int8_refuses_a_fused_graph(fused_dir, tmp_path, movie_data):
    with pytest.raises(ConfigError, match=r"int8-static needs the unfused graph of an export stage; .* has fused ops "
                                          r"\(Attention, .*\)\. Fix: put int8-static right after export"):
        int8_static(fused_dir, tmp_path / "q", movie_data.validation.texts)
    assert not (tmp_path / "q").exists()


def _float_weight(graph, name: str) -> bool:
    """The node `name` is still a float op on its float weight (its activation input may be the shared, quantized
    output of a neighbour: static QDQ quantizes a tensor once for all its readers)."""
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    node = next(n for n in graph.node if n.name == name)
    return node.op_type in ("MatMul", "Gather") and any(i in floats for i in node.input)


def test_dynamic_keep_float_keeps_the_most_sensitive_nodes_float(tiny_onnx_dir, tmp_path, movie_data):
    texts = movie_data.validation.texts
    result = int8_dynamic(tiny_onnx_dir, tmp_path / "kept", texts, Int8DynamicConfig(keep_float=2))
    ranking = result["sensitivity"]
    # per layer Q, K, V, attention out, FFN in, FFN out; pooler and classifier; the 3 embedding Gathers
    assert len(ranking) == 2 * 6 + 2 + 3
    changes = [r["mean_abs_diff"] for r in ranking]
    assert changes == sorted(changes, reverse=True) and changes[0] > 0
    assert result["kept_float"] == [r["node"] for r in ranking[:2]]
    graph = onnx.load(str(tmp_path / "kept" / "model.onnx")).graph
    assert all(_float_weight(graph, name) for name in result["kept_float"])
    kept_matmuls = sum("MatMul" in name for name in result["kept_float"])
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) == 2 * 6 + 2 - kept_matmuls
    # the same two named: the same graph, no ranking measured
    named = int8_dynamic(tiny_onnx_dir, tmp_path / "named", texts,
                         Int8DynamicConfig(keep_float=tuple(result["kept_float"])))
    assert named["sensitivity"] == [] and named["kept_float"] == result["kept_float"]
    # keeping the most sensitive nodes float brings the logits closer to the float graph than quantizing them
    all_int8 = int8_dynamic(tiny_onnx_dir, tmp_path / "all", texts)
    sample = list(movie_data.test.texts[:64])
    reference = Predictor(tiny_onnx_dir).logits(sample)
    error = {d: np.abs(Predictor(tmp_path / d).logits(sample) - reference).mean() for d in ("kept", "all")}
    assert all_int8["kept_float"] == [] and error["kept"] < error["all"]


def test_static_keep_float_measures_each_matmul_on_one_calibration(tiny_onnx_dir, tmp_path, movie_data):
    result = int8_static(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts,
                         Int8StaticConfig(calibration_size=32, keep_float=1))
    ranked = [r["node"] for r in result["sensitivity"]]
    assert len(ranked) == 2 * 6 and not set(ranked) & set(result["float_matmuls"])
    assert result["kept_float"] == ranked[:1]
    assert _float_weight(onnx.load(str(tmp_path / "q" / "model.onnx")).graph, ranked[0])


@pytest.mark.parametrize("keep, message", [
    (99, r"keep_float 99 would keep all 17 nodes this method quantizes float\. Fix: keep_float of at most 16"),
    (17, r"keep_float 17 would keep all 17 nodes"),
    (("/no/such/MatMul",), r"keep_float names nodes this method does not quantize, or all of them: /no/such/MatMul\. "
                           r"Fix: name some of the nodes of the graph among: /bert/"),
])
def test_keep_float_refuses_what_it_cannot_keep(tiny_onnx_dir, tmp_path, movie_data, keep, message):
    with pytest.raises(ConfigError, match=message):
        int8_dynamic(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts, Int8DynamicConfig(keep_float=keep))
    assert not (tmp_path / "q").exists()


def outlier_graph(weight: np.ndarray):
    """x (1, T, K) -> MatMul by `weight` (K, N) -> y: the smallest graph a weighted product makes."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="product")], "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, weight.shape[1]])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_smoothing_moves_an_activation_outlier_into_the_weights(tmp_path):
    """One channel 100x the others (what a transformer's residual stream has): dynamic int8 gives the other channels
    a few levels of one per-tensor scale; smoothed (SmoothQuant), the same product in float, int8 keeps them."""
    import onnxruntime
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgepress.compress.smooth import smooth_graph

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(8, 4)).astype(np.float32)
    feeds = [{"x": (rng.normal(size=(1, 16, 8)) * ([100] + [1] * 7)).astype(np.float32)} for _ in range(8)]
    plain, smoothed = outlier_graph(weight), outlier_graph(weight)
    done = smooth_graph(smoothed, feeds, alpha=0.85)
    assert done["tensors"] == 1 and [n.op_type for n in smoothed.graph.node] == ["Mul", "MatMul"]
    rows = numpy_helper.to_array(next(t for t in smoothed.graph.initializer if t.name == "w")) / weight
    assert rows[0, 0] > 10 * rows[1:, 0].max()  # the outlier channel's weight row took the scale

    def outputs(model, quantized: bool) -> list[np.ndarray]:
        onnx.save(model, tmp_path / "f.onnx")
        path = tmp_path / "f.onnx"
        if quantized:
            quantize_dynamic(path, tmp_path / "q.onnx", weight_type=QuantType.QInt8, per_channel=True)
            path = tmp_path / "q.onnx"
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return [session.run(None, f)[0] for f in feeds]

    reference = outputs(plain, False)
    same = max(np.abs(a - b).max() for a, b in zip(reference, outputs(smoothed, False), strict=True))
    assert same < 1e-3  # the same function in float
    error = {name: np.mean([np.abs(a - b).mean() for a, b in zip(reference, outputs(model, True), strict=True)])
             for name, model in (("plain", plain), ("smoothed", smoothed))}
    assert error["smoothed"] < 0.5 * error["plain"], error


def test_smoothed_int8_keeps_the_integer_kernels_and_matches_the_float_graph(fused_dir, tmp_path, movie_data):
    result = int8_dynamic(fused_dir, tmp_path / "q", movie_data.validation.texts,
                          Int8DynamicConfig(per_channel=True, smooth=0.5))
    # per layer: the attention's input, the attention output's (folded into V: per-channel weights), the FFN's in
    # and out
    assert result["smooth"]["tensors"] == 2 * 4 and result["smooth"]["alpha"] == 0.5
    assert result["smooth"]["folded"] == 2
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    assert sum(n.op_type == "Mul" and n.name.startswith("edgepress_smooth_") for n in graph.node) == 2 * 3
    assert result["ort_kernels"] == {"DynamicQuantizeMatMul": 8, "QAttention": 2}
    assert result["parity"]["agreement"] >= 0.9  # against the unsmoothed float graph


def test_gptq_moves_int8_integers_on_the_same_grid_and_keeps_the_kernels(fused_dir, tmp_path, movie_data):
    """GPTQ changes integers only: the scales, the range (7-bit here) and the kernels are quantize_dynamic's."""
    from onnx import numpy_helper

    texts = movie_data.validation.texts
    results = {name: int8_dynamic(fused_dir, tmp_path / name, texts,
                                  Int8DynamicConfig(per_channel=True, reduce_range=True, gptq=name == "gptq"))
               for name in ("nearest", "gptq")}
    assert results["gptq"]["gptq"]["weights"] == 2 * 4  # per layer: the attention's, its output's, the FFN's two
    assert 0 < results["gptq"]["gptq"]["moved"] < 0.5 and "gptq" not in results["nearest"]
    assert results["gptq"]["ort_kernels"] == results["nearest"]["ort_kernels"]
    assert results["gptq"]["parity"]["agreement"] >= 0.9
    arrays = {name: {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / name / "model.onnx"))
                     .graph.initializer} for name in results}
    scales = [name for name in arrays["nearest"] if name.endswith("_scale")]
    assert scales and all(np.array_equal(arrays["gptq"][s], arrays["nearest"][s]) for s in scales)
    moved = [name for name, a in arrays["gptq"].items() if not np.array_equal(a, arrays["nearest"][name])]
    assert len(moved) == 2 * 4 and all(name.endswith("_quantized") and np.abs(arrays["gptq"][name]).max() <= 64
                                       for name in moved)


def test_gptq_rounding_compensates_the_error_where_the_inputs_are_correlated(tmp_path):
    """Inputs of 64 channels that move together (rank 4 plus noise, as a transformer's hidden states largely do):
    rounding each weight to nearest ignores that; GPTQ pushes each row's error into the rows not yet rounded, so on
    inputs it was not calibrated on the int8 product is closer to the float one."""
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgepress.compress.gptq import gptq_rounding

    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(4, 64))

    def feeds(n: int) -> list[dict]:
        return [{"x": (rng.normal(size=(1, 32, 4)) @ mixing + 0.05 * rng.normal(size=(1, 32, 64))).astype(np.float32)}
                for _ in range(n)]

    onnx.save(outlier_graph(rng.normal(size=(64, 16)).astype(np.float32)), tmp_path / "f.onnx")
    for name in ("nearest", "gptq"):
        quantize_dynamic(tmp_path / "f.onnx", tmp_path / f"{name}.onnx", weight_type=QuantType.QInt8,
                         per_channel=True, reduce_range=True)
    done = gptq_rounding(tmp_path / "f.onnx", tmp_path / "gptq.onnx", feeds(16), reduce_range=True)
    assert done["weights"] == 1 and done["moved"] > 0
    held_out = feeds(8)
    runs = {name: onnxruntime.InferenceSession(str(tmp_path / f"{name}.onnx"), providers=["CPUExecutionProvider"])
            for name in ("f", "nearest", "gptq")}
    out = {name: np.concatenate([run.run(None, f)[0] for f in held_out]) for name, run in runs.items()}
    error = {name: np.abs(out[name] - out["f"]).mean() for name in ("nearest", "gptq")}
    assert error["gptq"] < 0.8 * error["nearest"], error  # measured: 0.131 against 0.196


def test_smoothing_folded_into_the_attentions_values_is_the_same_function(fused_dir, movie_data):
    """The attention output's smoothing divides V's weight columns and bias instead of adding a Mul: the context is
    linear in V, so in float the graph computes what it did."""
    import onnxruntime

    from edgepress.compress.smooth import smooth_graph
    from edgepress.device.feeds import encode, load_tokenizer

    model = onnx.load(str(fused_dir / "model.onnx"))
    names = tuple(i.name for i in model.graph.input)
    tokenizer = load_tokenizer(fused_dir, 64)
    feeds = [encode(tokenizer, list(movie_data.validation.texts[i : i + 8]), names) for i in range(0, 64, 8)]

    def logits(graph) -> np.ndarray:
        session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.concatenate([session.run(None, f)[0] for f in feeds])

    before = logits(model)
    done = smooth_graph(model, feeds, alpha=0.85, fold_attention=True)
    assert done["folded"] == 2 and done["scale_max"] > 1.5  # the values took real scales, not ones
    assert sum(n.op_type == "Mul" and n.name.startswith("edgepress_smooth_") for n in model.graph.node) == 2 * 3
    assert np.abs(logits(model) - before).max() < 1e-4
