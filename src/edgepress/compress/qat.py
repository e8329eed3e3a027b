"""`qat`: quantization-aware training, Q8BERT-style (Zafrir et al. 2019): the encoder's Linears run int8 fake
quantization (`models/fakequant.py`: weights per channel, inputs per tensor over ranges an EMA learns) through a
fine-tune distilled from the stage's input model, so the weights settle where int8 rounding costs least.

The artifact is the fine-tuned float model plus the learned input ranges (`edgepress-qat.json`); `export` turns it
into the QDQ graph those ranges describe (ONNX Runtime runs it with integer kernels), so only `export` may follow.
The pooler and classifier stay float, as in `int8-static`.
"""

import logging
import tempfile
from pathlib import Path

import numpy as np
from pydantic import Field

from edgepress.compress.kd import KdLoss
from edgepress.configs import Epochs
from edgepress.data import DataSplits
from edgepress.errors import ModelError
from edgepress.export.onnx import ExportConfig
from edgepress.export.parity import (
    ONNX_FILE,
    ParityConfig,
    check_onnx_file,
    copy_side_files,
    input_names,
    ort_runner,
)
from edgepress.files import atomic_dir, read_json, read_onnx, write_json
from edgepress.logs import parity_text, readable
from edgepress.models.train import EPOCHS, TrainConfig
from edgepress.runtime.session import SessionConfig, open_session

log = logging.getLogger(__name__)


class QatConfig(TrainConfig, KdLoss):
    """The `qat` method: the fine-tune's fields (`TrainConfig`, distilled from the input model with `KdLoss`) and
    how fast the input ranges follow the batches."""

    epochs: Epochs = Field(1, description=EPOCHS)
    learning_rate: float = Field(2e-5, gt=0, lt=1, description="AdamW's peak learning rate")
    momentum: float = Field(0.01, gt=0, le=1, description="EMA weight of each batch's input min / max")
    reduce_range: bool = Field(False, description="7-bit weights ([-64, 64]), for CPUs without VNNI that saturate "
                               "otherwise: trained as they will run")


def quantized_linears(model) -> list[str]:
    """Module names of the encoder's Linears: what `qat` quantizes."""
    from edgepress.models.arch import prunable_weights

    return [name.removesuffix(".weight") for name in prunable_weights(model)]


def qat(src: Path, out: Path, data: DataSplits, cfg: QatConfig = QatConfig(), task=None) -> dict:
    """Fine-tune the classifier in `src` under int8 fake quantization; the weights and learned ranges go to `out`.
    `task`: the run's (None: the model dir's own, `task_of`)."""
    from edgepress.compress.kd import load_with_kd_targets
    from edgepress.files import artifact_dir
    from edgepress.models.fakequant import QAT_FILE, attach, detach
    from edgepress.models.train import train_classifier
    from edgepress.tasks import task_of

    model, tokenizer, data, loss, scoring = load_with_kd_targets(src, data, cfg, task or task_of(src))
    names = quantized_linears(model)
    qmax = 64 if cfg.reduce_range else 127  # onnxruntime.quantization's symmetric int8 range, reduced or not
    attach(model, names, momentum=cfg.momentum, weight_qmax=qmax)
    with tempfile.TemporaryDirectory(prefix="edgepress-qat-") as scratch:  # the loop saves the best epoch there
        result = train_classifier(model, tokenizer, data.train, cfg, Path(scratch), loss_fn=loss,
                                  score=scoring["score"])
    ranges = detach(model, names)  # the best epoch's weights and ranges: the loop restored its state
    with artifact_dir(Path(out)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / QAT_FILE, {"format": 1, "momentum": cfg.momentum, "weight_qmax": qmax,
                                    "input_ranges": ranges})
    log.info("qat: %d Linears fake-quantized, validation %s %.4f", len(names), result.score,
             result.best_val_accuracy)
    return {"quantized_linears": len(names), **result.details()}


# The same int8 arithmetic, two implementations: where a float sum lands on the other side of an activation's
# rounding boundary the next layer sees one step more or less. On the demo's 3-layer student (7-bit weights) that
# gave max |Δlogit| 0.0997 on the 128 parity sentences, and 0.071 on 64 test sentences with ORT's integer kernels and
# with its float ones alike; full-range weights on AVX2 without VNNI, where the integer kernel saturates, 0.45-0.69.
QDQ_PARITY = ParityConfig(max_abs_diff=0.25, min_agreement=0.99)


def _activation_ranges(onnx_file: Path, model, ranges: dict) -> dict:
    """ONNX input tensor of each fake-quantized Linear's MatMul -> its learned [lo, hi]; the MatMuls are found by
    weight content (the export writes Linear.weight.T bit for bit)."""
    from onnx import numpy_helper

    from edgepress.compress.gptq import weight_key

    by_weight = {weight_key(model.get_submodule(name).weight.detach().numpy().T): bounds
                 for name, bounds in ranges.items()}
    graph = read_onnx(onnx_file).graph
    weights = {t.name: t for t in graph.initializer}
    tensors, matched = {}, set()
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            key = weight_key(numpy_helper.to_array(weights[node.input[1]]))
            if key in by_weight:
                tensors[node.input[0]] = by_weight[key]  # Q, K and V share an input, and so its range
                matched.add(key)
    if len(matched) != len(by_weight):
        raise ModelError(f"{onnx_file}: {len(by_weight) - len(matched)} of the {len(by_weight)} quantized Linears "
                         f"have no MatMul of their weights in the exported graph. Fix: export the QAT artifact as "
                         f"qat wrote it (its weights and {len(ranges)} input ranges belong together)")
    return tensors


def unlearned_matmuls(graph, tensors: dict) -> list[str]:
    """The MatMuls whose input has no learned range (`tensors`): activation products, the classifier, and Linears
    that qat left float (ELECTRA's embedding projection, ModernBERT's head dense). They stay float in the graph, as in
    training: the graph quantizes exactly the Linears qat fake-quantized."""
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[0] not in tensors]


def _float_beside_matmuls(path: Path) -> None:
    """Give every reader of a quantized activation but the MatMuls the float tensor back, as in training. ONNX
    Runtime's quantizer hands its dequantized copy to every reader (with `DedicatedQDQPair`, only where several
    quantized nodes share it): the residual Add after each FFN would then add a rounded tensor."""
    import onnx

    model = read_onnx(path)
    nodes = model.graph.node
    quantized = {n.output[0]: n.input[0] for n in nodes if n.op_type == "QuantizeLinear"}
    original = {n.output[0]: quantized[n.input[0]] for n in nodes
                if n.op_type == "DequantizeLinear" and n.input[0] in quantized}
    for node in nodes:
        if node.op_type != "MatMul":
            node.input[:] = [original.get(name, name) for name in node.input]
    onnx.save(model, str(path))


def export_qat(model_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: ExportConfig = ExportConfig(),
               task=None) -> dict:
    """The QDQ int8 graph of a QAT artifact: the float model exported (hard parity against torch), then quantized by
    onnxruntime.quantization with the learned input ranges as its calibration (nothing is re-calibrated), inputs
    only (`OpTypesToExcludeOutputQuantization`), checked against the fake-quantized torch model. `task`: the run's
    (None: the model dir's own, `task_of`)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    from edgepress.compress.quantize import low_bit_kernels
    from edgepress.export.onnx import export_model_object, torch_runner
    from edgepress.export.parity import check_parity, real_feeds
    from edgepress.models.fakequant import QAT_FILE, load_for_inference
    from edgepress.tasks import task_of

    task = task or task_of(model_dir)
    model, tokenizer = task.load_model(model_dir)  # the float model
    recorded = read_json(Path(model_dir) / QAT_FILE)
    ranges = recorded["input_ranges"]
    with tempfile.TemporaryDirectory(prefix="edgepress-qat-export-") as scratch:
        float_dir = Path(scratch) / "float"
        exported = export_model_object(model, tokenizer, float_dir, texts, cfg, f"ONNX export of {model_dir}",
                                       task=task)
        tensors = _activation_ranges(float_dir / ONNX_FILE, model, ranges)
        cache = Path(scratch) / "ranges.json"
        save_tensors_data(TensorsData(CalibrationMethod.MinMax, {
            name: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for name, (lo, hi) in tensors.items()
        }), cache)
        graph = read_onnx(float_dir / ONNX_FILE).graph
        with atomic_dir(Path(out_dir)) as tmp:
            quantize_static(float_dir / ONNX_FILE, tmp / ONNX_FILE, None, quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=["MatMul"], per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, reduce_range=recorded.get("weight_qmax", 127) == 64,
                            nodes_to_exclude=unlearned_matmuls(graph, tensors),
                            calibrate_method=CalibrationMethod.MinMax, calibration_cache_path=cache,
                            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT,
                                           "OpTypesToExcludeOutputQuantization": ["MatMul"],
                                           # each MatMul its own Q/DQ: the residual Adds beside it read the float
                                           # tensor, as in training (shared pairs would quantize them too)
                                           "DedicatedQDQPair": True})
            _float_beside_matmuls(tmp / ONNX_FILE)
            copy_side_files(float_dir, tmp)
            check_onnx_file(tmp / ONNX_FILE)
            session = open_session(tmp / ONNX_FILE, SessionConfig())
            feeds = real_feeds(tmp, texts, cfg.max_length, input_names(session), QDQ_PARITY)
            quantized = load_for_inference(model_dir, task)[0]
            parity = check_parity(torch_runner(quantized), ort_runner(session), feeds, QDQ_PARITY,
                                  "the QDQ graph of the QAT model")
            kernels = low_bit_kernels(tmp / ONNX_FILE)
    log.info("export (qat): %d activation ranges carried; ONNX Runtime runs %s; parity vs fake quant: %s",
             len(tensors), readable(kernels), parity_text(parity))
    # `parity` is the shipped graph's (a stage's parity gate judges it); the float export's passed the hard check
    return {"parity": parity, "float_parity": exported["parity"], "ort_kernels": kernels,
            "carried_ranges": len(tensors)}
