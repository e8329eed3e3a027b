import json

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from edgepress.compress.qat import QatConfig, qat
from edgepress.device.predictor import Predictor
from edgepress.models.fakequant import QAT_FILE, attach, detach, input_qparams, load_for_inference
from edgepress.models.loading import load_classifier
from edgepress.pipeline.config import PipelineConfig
from edgepress.registry import METHODS, torch_kind
from edgepress.tasks import CLASSIFICATION


@pytest.fixture(scope="module")
def qat_dir(tmp_path_factory, tiny_model_dir, small_data):
    path = tmp_path_factory.mktemp("qat") / "model"
    qat(tiny_model_dir, path, small_data, QatConfig(epochs=1, learning_rate=1e-4, max_length=64))
    return path


def test_input_qparams_are_onnxruntimes():
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    rng = np.random.default_rng(0)
    for lo, hi in [(-3.2, 5.1), (0.5, 2.0), (-7.0, -1.0), *rng.normal(0, 4, (20, 2)).tolist()]:
        lo, hi = min(lo, hi), max(lo, hi)
        zero, scale = compute_scale_zp(np.float32(lo), np.float32(hi), np.uint8(0), np.uint8(255))
        assert input_qparams(np.float32(lo), np.float32(hi)) == (float(scale), int(zero))


def test_the_input_range_follows_an_exponential_moving_average():
    linear = torch.nn.Linear(4, 3)
    attach(linear_holder := torch.nn.Sequential(linear), ["0"], momentum=0.25)
    linear_holder.train()
    linear_holder(torch.tensor([[-1.0, 0.0, 2.0, 1.0]]))  # the first batch sets the range
    linear_holder(torch.tensor([[-3.0, 0.0, 6.0, 1.0]]))
    assert detach(linear_holder, ["0"]) == {"0": [-1.0 + 0.25 * (-3.0 + 1.0), 2.0 + 0.25 * (6.0 - 2.0)]}
    assert "forward" not in vars(linear) and "qat_input_range" not in dict(linear.named_buffers())


def test_qat_saves_a_plain_model_and_its_learned_ranges(qat_dir, tiny_model_dir, small_data):
    record = json.loads((qat_dir / QAT_FILE).read_text())
    ranges = record["input_ranges"]
    assert len(ranges) == 2 * 6 and all(lo < 0 < hi for lo, hi in ranges.values())
    plain, _ = load_classifier(qat_dir)  # no extra keys: loads like any HF model
    assert set(plain.state_dict()) == set(load_classifier(tiny_model_dir)[0].state_dict())
    quantized, tokenizer = load_for_inference(qat_dir, CLASSIFICATION)
    batch = tokenizer(list(small_data.test.texts[:16]), padding=True, return_tensors="pt")
    with torch.no_grad():
        fake, float_ = quantized(**batch).logits, plain(**batch).logits
    assert 0 < (fake - float_).abs().max() < 0.5  # int8 moves the logits a little


def test_export_of_a_qat_model_is_the_int8_graph_of_its_learned_ranges(qat_dir, tmp_path, small_data):
    details = METHODS["export"].function(torch_kind(qat_dir))(qat_dir, tmp_path / "onnx", small_data.validation.texts)
    assert details["carried_ranges"] == 2 * 4  # Q/K/V share their input: 4 distinct inputs per layer
    assert details["parity"]["agreement"] >= 0.99 and details["float_parity"]["max_abs_diff"] <= 1e-4
    assert details["ort_kernels"] == {"MatMulIntegerToFloat": 2 * 6}  # integer kernels, float outputs
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    ranges = json.loads((qat_dir / QAT_FILE).read_text())["input_ranges"]
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    readers = {n.op_type for n in graph.node if set(n.input) & dequantized}
    assert readers == {"MatMul"}  # as in training: residual Adds and LayerNorms read the float tensors
    activations = {(float(consts[n.input[1]]), int(consts[n.input[2]])) for n in graph.node
                   if n.op_type == "QuantizeLinear" and n.input[0] not in consts}
    # the learned scales and zero points, carried exactly (Q, K and V share theirs)
    assert activations == {input_qparams(*bounds) for bounds in ranges.values()}
    texts = list(small_data.test.texts[:32])
    assert Predictor(tmp_path / "onnx").logits(texts).shape == (32, 2)


def test_reduce_range_trains_and_exports_7_bit_weights(tiny_model_dir, small_data, tmp_path):
    """For x86 without VNNI (the target's default): weights in [-64, 64] in training and in the QDQ graph."""
    from edgepress.deploy.targets import int8_weight_ranges

    trained = tmp_path / "qat"
    qat(tiny_model_dir, trained, small_data, QatConfig(epochs=1, learning_rate=1e-4, max_length=64,
                                                       reduce_range=True))
    assert json.loads((trained / QAT_FILE).read_text())["weight_qmax"] == 64
    assert load_for_inference(trained, CLASSIFICATION)[0].bert.encoder.layer[0].intermediate.dense.qat_weight_qmax == 64
    details = METHODS["export"].function(torch_kind(trained))(trained, tmp_path / "onnx", small_data.validation.texts)
    assert set(int8_weight_ranges(tmp_path / "onnx" / "model.onnx").values()) == {64}
    assert details["parity"]["agreement"] >= 0.99


def test_only_export_may_follow_qat():
    stages = [{"name": "q", "method": "qat"}, {"name": "p", "method": "magnitude"}]
    with pytest.raises(ValueError, match=r"stage 'p' \(magnitude\) needs a torch model dir but gets a quantization-"
                                         r"aware-trained torch model \(what qat gives\)"):
        PipelineConfig.model_validate({"stages": stages})
    stages = [{"name": "q", "method": "qat"}, {"name": "e", "method": "export"}, {"name": "f", "method": "optimize"}]
    with pytest.raises(ValueError, match=r"stage 'f' \(optimize\) needs an unfused ONNX graph .* but gets an int8 "
                                         r"ONNX graph from stage 'e'\. Fix: only export may follow qat \(stage 'q', "
                                         r"as its method or a fallback\), and its export is the int8 graph already: "
                                         r"remove optimize or the qat"):
        PipelineConfig.model_validate({"stages": stages})


def test_qat_trains_in_bf16(tiny_model_dir, small_data, tmp_path):
    """train_precision bf16: the fake-quantized forward runs under bf16 autocast and the ranges it learns stay
    finite."""
    qat(tiny_model_dir, tmp_path / "qat", small_data, QatConfig(epochs=1, learning_rate=1e-4, max_length=64,
                                                                train_precision="bf16"))
    ranges = json.loads((tmp_path / "qat" / QAT_FILE).read_text())["input_ranges"]
    assert len(ranges) == 2 * 6 and all(np.isfinite([lo, hi]).all() and lo < 0 < hi for lo, hi in ranges.values())
