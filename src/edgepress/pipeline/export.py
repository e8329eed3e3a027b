"""`edgepress export`: a model (dir or demo name) -> a checked, optionally fused, ONNX model dir."""

import tempfile
from pathlib import Path

from edgepress.data import DataConfig, load_data
from edgepress.errors import ConfigError
from edgepress.export.onnx import ExportConfig, export_onnx
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.models.fakequant import QAT_FILE
from edgepress.models.loading import label2id_of
from edgepress.models.teacher import resolve_model


def export_model(model: str, out: Path, optimize: OptimizeConfig | None, data_cfg: DataConfig = DataConfig()) -> dict:
    """Export `model` to `out` (model.onnx + config + tokenizer), fused when `optimize` is given; parity is checked
    on the validation sentences of `data_cfg` after each step. Returns what each step recorded."""
    model_dir = resolve_model(model)
    if optimize is not None and (model_dir / QAT_FILE).is_file():
        raise ConfigError(f"{model_dir} is a qat model: it exports straight to its int8 graph, which the float "
                          f"fusions would not fit. Fix: add --no-optimize (ONNX Runtime fuses the int8 graph itself "
                          f"when a session starts)")
    texts = load_data(data_cfg, label2id_of(model_dir)).validation.texts
    if optimize is None:
        return {"export": export_onnx(model_dir, out, texts, ExportConfig(max_length=data_cfg.max_length))}
    with tempfile.TemporaryDirectory(dir=Path(out).parent if Path(out).parent.exists() else None) as tmp:
        exported = export_onnx(model_dir, Path(tmp) / "onnx", texts, ExportConfig(max_length=data_cfg.max_length))
        fused = optimize_onnx(Path(tmp) / "onnx", out, texts, optimize)
    return {"export": exported, "optimize": fused}


def bench_texts(data_cfg: DataConfig = DataConfig()) -> tuple[str, ...]:
    """Real sentences to time with: the test split of `data_cfg` (labels are not needed)."""
    return load_data(data_cfg).test.texts
