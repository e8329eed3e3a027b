"""Stage 00: the model as the user handed it, measured on the test split."""

import logging
from pathlib import Path

from edgepress.data import DataConfig, DataSplits, load_data
from edgepress.files import write_json
from edgepress.models.evaluate import evaluate_classifier
from edgepress.models.introspect import param_counts, size_metrics
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.models.teacher import resolve_model
from edgepress.pipeline.latency import latency_metrics
from edgepress.pipeline.rundir import RunDir
from edgepress.runtime.latency import LatencyConfig

log = logging.getLogger(__name__)


def measure_model_dir(model_dir: Path, data: DataSplits, max_length: int) -> tuple[dict, list[int]]:
    """(metrics, test predictions) of an HF model dir: accuracy with CI, macro-F1, params, size."""
    model, tokenizer = load_classifier(model_dir)
    metrics, preds = evaluate_classifier(model, tokenizer, data.test, max_length)
    return {**metrics, **param_counts(model), **size_metrics(model_dir)}, preds.tolist()


def evaluate_model(model: str, data_cfg: DataConfig) -> dict:
    """Metrics of a model (dir or demo name) on the test split of `data_cfg`, labels mapped by the model's."""
    model_dir = resolve_model(model)
    data = load_data(data_cfg, label2id_of(model_dir))
    return measure_model_dir(model_dir, data, data_cfg.max_length)[0]


def run_baseline(run: RunDir, model_dir: Path, data: DataSplits, max_length: int, threads: int | None,
                 latency: LatencyConfig) -> dict:
    """Measure the baseline (accuracy, size, torch CPU latency) and write stages/00-baseline."""
    log.info("baseline: measuring %s on %d test examples", model_dir, len(data.test))
    metrics, preds = measure_model_dir(model_dir, data, max_length)
    metrics["latency"] = {"cpu": latency_metrics(model_dir, data.test.texts, "cpu", threads, latency)}
    folder = run.stage_dir(0, "baseline")
    write_json(folder / "predictions.json", {"ids": list(data.test.ids), "labels": data.test.labels.tolist(),
                                             "predictions": preds})
    config = {"model": str(model_dir), "max_length": max_length, "threads": threads, "latency": latency.model_dump()}
    run.write_stage(0, "baseline", method="baseline", artifact=str(model_dir), config=config, metrics=metrics)
    log.info("baseline: accuracy %.4f %s", metrics["accuracy"], metrics["accuracy_ci95"])
    return metrics
