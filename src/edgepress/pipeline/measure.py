"""Metrics of any artifact (a torch model dir or an ONNX dir): its task's scores on the test split (a classifier's
accuracy with CIs), parameters, size, latency on every runtime provider, and its predictions (labels, or sentence
vectors) on the sets its fidelity is held on (the runner compares them with the baseline's)."""

from pathlib import Path

import numpy as np

from edgepress.data import DataSplits
from edgepress.data.dataset import TextSet
from edgepress.device.sessions import SPINNING
from edgepress.errors import ModelError
from edgepress.files import read_onnx
from edgepress.logs import words
from edgepress.models.introspect import param_counts, size_metrics
from edgepress.pipeline.latency import latency_metrics, onnx_path
from edgepress.runtime.latency import LatencyConfig
from edgepress.tasks import CLASSIFICATION

# How ONNX artifacts are evaluated and timed, part of their stages' resume key: records made another way are not
# reused
ONNX_EVALUATION = f"one text per call; timed with workers spinning {SPINNING}"


def measure_model_dir(model_dir: Path, data: DataSplits, max_length: int, task=CLASSIFICATION
                      ) -> tuple[dict, np.ndarray]:
    """(metrics, test predictions) of an HF model dir: its task's scores (a classifier's accuracy with CI,
    macro-F1), params, size."""
    from edgepress.models.fakequant import load_for_inference

    model, tokenizer = load_for_inference(model_dir, task)  # a qat artifact runs as it was trained: fake-quantized
    preds = task.torch_predictions(model, tokenizer, data.test.texts, max_length)
    return {**task.scores(data.test, preds), **param_counts(model), **size_metrics(model_dir)}, preds


def onnx_predictions(model_dir: Path, texts: tuple[str, ...], max_length: int, threads: int | None,
                     task=CLASSIFICATION, routes: list | None = None) -> np.ndarray:
    """Predictions of an ONNX dir on `texts` (CPU; ids of a classifier, vectors of an embedder), each text alone,
    as a device makes them and as the bundle's predict.py does: in a padded batch an int8 graph's dynamic activation
    ranges would depend on the other texts (the demo's int8 student: 12 of 1,057 labels changed between two
    batchings). A cascade's texts are each answered by the model it gives them to; `routes` (a list) gets the
    (model, confidence) of each."""
    from edgepress.device.cascade import Cascade, open_predictor

    predictor = open_predictor(model_dir, threads=threads, max_length=max_length)
    if predictor.task != task.name:  # the run's task, chosen once: what the device will read its artifact as
        raise ModelError(f"{model_dir} reads as a {predictor.task} model on a device, but this is a {task.name} "
                         f"run. Fix: give the run a {task.name} model, or export this one again")
    if isinstance(predictor, Cascade):
        predictor.log = routes if routes is not None else []
    return task.onnx_predictions(predictor, texts, words(task.primary))


def deferred_share(routes: list) -> dict:
    """{"deferred": the share of texts a cascade gave its fallback} of `onnx_predictions`' routes; {} for a single
    model (no routes)."""
    from edgepress.device.cascade import FALLBACK

    return {"deferred": float(np.mean([model == FALLBACK for model, _ in routes]))} if routes else {}


def onnx_param_counts(path: Path) -> dict:
    """params and nonzero_params over the graph's initializers (weights, biases, quantization scales)."""
    from onnx import numpy_helper

    arrays = [numpy_helper.to_array(t) for t in read_onnx(path).graph.initializer]
    total = sum(a.size for a in arrays)
    nonzero = sum(int(np.count_nonzero(a)) for a in arrays)
    return {"params": total, "nonzero_params": nonzero, "sparsity": 1 - nonzero / total}


def onnx_graph_metrics(artifact: Path) -> dict:
    """params, sparsity and size of an ONNX artifact's graph; a cascade's: of both its graphs together (what a
    device downloads and holds), each one's size beside (`cascade`)."""
    from edgepress.device.cascade import is_cascade, read_cascade

    graphs = [onnx_path(artifact)]
    if is_cascade(artifact):
        graphs.append(onnx_path(Path(artifact) / read_cascade(artifact)["fallback"]))
    parts = [{**onnx_param_counts(g), **size_metrics(g)} for g in graphs]
    total = {key: sum(part[key] for part in parts) for key in ("params", "nonzero_params", "size_bytes",
                                                              "size_gzip_bytes")}
    total["sparsity"] = 1 - total["nonzero_params"] / total["params"]
    if len(parts) > 1:
        total["cascade"] = {"student_size_bytes": parts[0]["size_bytes"], "fallback_size_bytes": parts[1]["size_bytes"]}
    return total


def measure_artifact(artifact: Path, data: DataSplits, max_length: int, providers: tuple[str, ...],
                     threads: int | None, latency: LatencyConfig, task=CLASSIFICATION) -> tuple[dict, np.ndarray]:
    """(metrics, test predictions) of a torch model dir or ONNX dir."""
    path = onnx_path(artifact)
    if path is None:
        metrics, preds = measure_model_dir(artifact, data, max_length, task)
        providers = tuple(p for p in providers if p == "cpu")  # torch models are timed on CPU
    else:
        routes: list = []
        preds = onnx_predictions(artifact, data.test.texts, max_length, threads, task, routes)
        metrics = {**task.scores(data.test, preds), **onnx_graph_metrics(artifact), **deferred_share(routes)}
    metrics["latency"] = {p: latency_metrics(artifact, data.test.texts, p, threads, latency, max_length)
                          for p in providers}
    return metrics, preds


def set_predictions(artifact: Path, sets: dict[str, TextSet], max_length: int, threads: int | None,
                    task=CLASSIFICATION, routes: dict[str, list] | None = None) -> dict[str, np.ndarray]:
    """Predictions of a torch model dir (batched) or an ONNX dir (one text per call) on each of `sets`; a
    cascade's routes of each set's texts into `routes` (`onnx_predictions`)."""
    if onnx_path(artifact) is not None:
        routes = {} if routes is None else routes
        return {name: onnx_predictions(artifact, part.texts, max_length, threads, task, routes.setdefault(name, []))
                for name, part in sets.items()}
    from edgepress.models.fakequant import load_for_inference

    model, tokenizer = load_for_inference(artifact, task)
    return {name: task.torch_predictions(model, tokenizer, part.texts, max_length) for name, part in sets.items()}


def measure_scored(artifact: Path, data: DataSplits, max_length: int, providers: tuple[str, ...],
                   threads: int | None, latency: LatencyConfig, task=CLASSIFICATION
                   ) -> tuple[dict, dict[str, np.ndarray]]:
    """(metrics, {set: predictions}) of an artifact on everything a run scores (`DataSplits.scored`): the test
    split's metrics, and `sets`, each fidelity set's size and, for a classifier where the set has labels,
    accuracy."""
    metrics, test = measure_artifact(artifact, data, max_length, providers, threads, latency, task)
    others = {name: part for name, part in data.scored().items() if name != "test"}
    routes: dict[str, list] = {}
    preds = {"test": test, **set_predictions(artifact, others, max_length, threads, task, routes)}
    metrics["sets"] = {name: {"n": len(part), **task.set_scores(part, preds[name]),
                              **deferred_share(routes.get(name, []))} for name, part in others.items()}
    return metrics, preds
