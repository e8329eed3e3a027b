from collections import Counter

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from edgepress.compress.int4 import Int4Config, int4
from edgepress.device.predictor import Predictor
from edgepress.errors import ConfigError, ModelError
from edgepress.export.optimize import OptimizeConfig, optimize_onnx


def graph_of(path):
    return onnx.load(str(path / "model.onnx")).graph


def attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_rtn_turns_every_weighted_matmul_into_4_bit_blocks(tiny_onnx_dir, tmp_path, movie_data):
    result = int4(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts)
    graph = graph_of(tmp_path / "q")
    ops = Counter(n.op_type for n in graph.node)
    # per layer Q, K, V, attention out, FFN in, FFN out; the attention products and the Gemm head stay float
    assert result["quantized_ops"] == {"MatMulNBits": 2 * 6} and ops["MatMul"] == 2 * 2 and ops["Gemm"] == 2
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert {(a["bits"], a["block_size"]) for a in map(attrs, nbits)} == {(4, 32)}
    assert all(len(n.input) == 3 and "accuracy_level" not in attrs(n) for n in nbits)  # symmetric: no zero points
    assert result["symmetric"] is True and result["kept_float"] == [] and result["sensitivity"] == []
    texts = list(movie_data.test.texts[:64])
    quantized, float_ = Predictor(tmp_path / "q").logits(texts), Predictor(tiny_onnx_dir).logits(texts)
    assert np.abs(quantized - float_).max() < 0.5 and not np.array_equal(quantized, float_)


def test_embeddings_and_accuracy_level_4(tiny_onnx_dir, tmp_path, movie_data):
    cfg = Int4Config(embeddings=True, accuracy_level=4, symmetric=False)
    result = int4(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts, cfg)
    graph = graph_of(tmp_path / "q")
    assert result["quantized_ops"] == {"MatMulNBits": 12, "GatherBlockQuantized": 1}
    assert result["ort_kernels"] == {"GatherBlockQuantized": 1, "MatMulNBits": 12}  # what the session runs
    gathered = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    assert gathered.input[1] == "input_ids"  # the word table; position and token-type tables stay float
    tables = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    float_lookups = {n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in tables}
    assert float_lookups == {f"bert.embeddings.{t}_embeddings.weight" for t in ("position", "token_type")}
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert all(attrs(n)["accuracy_level"] == 4 and len(n.input) == 4 for n in nbits)  # with zero points
    # the word table (30522 x 32 floats) dominates the tiny model: 4 bits + a scale per 32 take it below a third
    size = {d: (d / "model.onnx").stat().st_size for d in (tmp_path / "q", tiny_onnx_dir)}
    assert size[tmp_path / "q"] < 0.3 * size[tiny_onnx_dir]
    texts = list(movie_data.test.texts[:64])
    assert np.abs(Predictor(tmp_path / "q").logits(texts) - Predictor(tiny_onnx_dir).logits(texts)).max() < 0.5


def test_hqq_with_embeddings(tiny_onnx_dir, tmp_path, movie_data):
    result = int4(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts,
                  Int4Config(algorithm="hqq", embeddings=True, accuracy_level=4))
    assert result["quantized_ops"] == {"MatMulNBits": 12, "GatherBlockQuantized": 1} and result["symmetric"] is False
    nbits = [n for n in graph_of(tmp_path / "q").node if n.op_type == "MatMulNBits"]
    assert all(attrs(n)["accuracy_level"] == 4 for n in nbits)


def test_keep_float_keeps_the_most_sensitive_nodes_float(tiny_onnx_dir, tmp_path, movie_data):
    result = int4(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts,
                  Int4Config(embeddings=True, keep_float=2))
    ranked = [r["node"] for r in result["sensitivity"]]
    assert len(ranked) == 12 + 1 and result["kept_float"] == ranked[:2]
    graph = graph_of(tmp_path / "q")
    kept = {n.name: n.op_type for n in graph.node if n.name in result["kept_float"]}
    assert sorted(kept.values()) in (["MatMul", "MatMul"], ["Gather", "MatMul"])
    ops = Counter(n.op_type for n in graph.node)
    assert ops["MatMulNBits"] + ops["GatherBlockQuantized"] == 13 - 2


def test_int4_refuses_a_fused_graph(tiny_onnx_dir, tmp_path, movie_data):
    optimize_onnx(tiny_onnx_dir, tmp_path / "fused", movie_data.validation.texts, OptimizeConfig(fusions="all"))
    with pytest.raises(ConfigError, match=r"int4 needs the unfused graph of an export stage; .* has fused ops "
                                          r"\(Attention, .*\)\. Fix: put int4 right after export"):
        int4(tmp_path / "fused", tmp_path / "q", movie_data.validation.texts)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("params, message", [
    ({"block_size": 24}, "block_size must be a power of 2 of at least 16 (16, 32, 64, 128)"),
    ({"block_size": 8}, "block_size must be a power of 2 of at least 16"),
    ({"algorithm": "hqq", "symmetric": True}, "hqq fits a zero point per block: it is asymmetric. Fix: remove "
                                              "symmetric, or use algorithm: rtn"),
    ({"accuracy_level": 2}, "accuracy_level"),
    ({"keep_float": -1}, "keep_float takes a number of nodes (0, 1, 2, ...; 0 keeps none) or a non-empty list"),
    ({"keep_float": []}, "keep_float takes a number of nodes"),
    ({"calibration_size": 64}, "calibration_size serve(s) gptq and awq only; remove it or set algorithm: gptq or awq"),
    ({"algorithm": "hqq", "torch_model": "/m"}, "torch_model serve(s) gptq and awq only"),
    ({"keep_float": [1, 2]}, "keep_float takes a number of nodes"),
    ({"keep_float": True}, "keep_float takes a number of nodes"),
])
def test_int4_config_refuses(params, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Int4Config(**params)


@pytest.mark.parametrize("algorithm, symmetric", [("gptq", True), ("awq", False)])
def test_gptq_awq_carry_neural_compressors_integers_into_the_graph(tiny_model_dir, tiny_onnx_dir, tmp_path,
                                                                   movie_data, algorithm, symmetric):
    import torch

    from edgepress.compress.gptq import calibration_batches, inc_quantize
    from edgepress.models.loading import load_classifier

    texts = movie_data.validation.texts
    cfg = Int4Config(algorithm=algorithm, symmetric=symmetric, calibration_size=32, torch_model=tiny_model_dir)
    result = int4(tiny_onnx_dir, tmp_path / "q", texts, cfg)
    graph = graph_of(tmp_path / "q")
    assert result["quantized_ops"] == {"MatMulNBits": 12}
    assert sum(n.op_type == "Mul" and n.name.endswith("_awq_scale") for n in graph.node) == (12 if algorithm == "awq"
                                                                                             else 0)
    # neural-compressor's own quantized torch model, from the same calibration sentences
    _, quantized = inc_quantize(tiny_model_dir, algorithm, 32, symmetric, calibration_batches(tiny_model_dir, texts,
                                                                                              32, 128))
    sample = list(movie_data.test.texts[:64])
    tokenizer = load_classifier(tiny_model_dir)[1]
    with torch.no_grad():
        inc = quantized(**tokenizer(sample, padding=True, return_tensors="pt")).logits.numpy()
    ort = Predictor(tmp_path / "q").logits(sample)
    float_ = Predictor(tiny_onnx_dir).logits(sample)
    assert np.abs(ort - inc).max() < 1e-3
    # the graph holds neural-compressor's integers, not a re-rounding: far closer to it than 4 bits are to float
    assert np.abs(ort - inc).max() < 0.1 * np.abs(inc - float_).max()


def test_gptq_needs_the_torch_model(tiny_onnx_dir, tmp_path, movie_data):
    with pytest.raises(ConfigError, match=r"int4 gptq quantizes the torch model the graph was exported from; "
                                          r"torch_model is not set\. Fix: set torch_model"):
        int4(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts, Int4Config(algorithm="gptq"))


def test_gptq_refuses_a_torch_model_the_graph_was_not_exported_from(tokenizer, tiny_onnx_dir, tmp_path, movie_data):
    from tests.conftest import tiny_bert

    other = tmp_path / "other"
    tiny_bert(tokenizer, seed=1).save_pretrained(other)
    tokenizer.save_pretrained(other)
    with pytest.raises(ModelError, match=r"12 MatMul\(s\) of the graph have no quantized Linear of the same weights"):
        int4(tiny_onnx_dir, tmp_path / "q", movie_data.validation.texts,
             Int4Config(algorithm="gptq", calibration_size=8, torch_model=other))
    assert not (tmp_path / "q").exists()
