"""`edgepress evaluate`: a model (a torch or ONNX dir, a bundle, a run dir, a demo name) measured on one split of the
user's data, through the run's own measure (`pipeline/measure.py`)."""

from dataclasses import replace

from edgepress.data import DataConfig
from edgepress.errors import ConfigError
from edgepress.models.loading import label2id_of
from edgepress.pipeline.measure import measure_artifact, measure_model_dir
from edgepress.runtime.latency import LatencyConfig
from edgepress.tasks import task_of
from edgepress.teacher import resolve_model


def recorded_max_length(model: str) -> int | None:
    """The max_length a bundle (or a run dir's final bundle) was measured at, from its manifest; None for a model
    without one (a model dir, a stage's model)."""
    from edgepress.deploy.bundle import final_of_run
    from edgepress.device.bundle import MANIFEST
    from edgepress.files import read_json

    model_dir = resolve_model(model)
    manifest = (final_of_run(model_dir, "evaluate") or model_dir) / MANIFEST
    try:
        value = read_json(manifest).get("max_length") if manifest.is_file() else None
    except (OSError, ValueError, AttributeError):  # unreadable: evaluate's own checks say what is wrong with it
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def evaluate_model(model: str, data_cfg: DataConfig, split: str = "test") -> dict:
    """Metrics of a model (a torch model dir, an ONNX model dir or any bundle, or a demo name) on one split of
    `data_cfg` (`all`: every example of the source), labels mapped by the model's; an ONNX graph is evaluated one
    text per call, as a run measures it. `splits_note` says how the splits were made when not as the source gave
    them (e.g. a validation split standing in for a missing test split)."""
    from edgepress.deploy.bundle import final_of_run
    from edgepress.pipeline.inputs import check_within_positions
    from edgepress.pipeline.latency import onnx_path

    model_dir = resolve_model(model)
    model_dir = final_of_run(model_dir, "evaluate") or model_dir
    task = task_of(model_dir)
    if not task.labelled:
        raise ConfigError(f"{model_dir} is a sentence-embedding model: its vectors are scored against another "
                          f"model's (a baseline), not against labels. Fix: run a pipeline on it (`edgepress run`), "
                          f"whose report scores every stage against the original model's neighbours")
    graph = onnx_path(model_dir)
    label2id = label2id_of(model_dir, torch_weights=graph is None)
    check_within_positions(model_dir, {"--max-length": data_cfg.max_length})
    data = task.load(data_cfg, label2id)
    data = replace(data, test=data.everything() if split == "all" else getattr(data, split))
    metrics = measure_model_dir(model_dir, data, data_cfg.max_length, task)[0] if graph is None else \
        measure_artifact(model_dir, data, data_cfg.max_length, (), None, LatencyConfig(), task)[0]
    return {**metrics, **({"splits_note": data.note} if data.note else {})}
