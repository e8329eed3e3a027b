"""`edgepress export`: a model (dir or demo name) -> a checked, optionally fused, ONNX model dir."""

import tempfile
from pathlib import Path

from edgepress.data import DEMO_SOURCE
from edgepress.data.load import load_texts
from edgepress.deploy.bundle import EXPORTED
from edgepress.device.locks import writing
from edgepress.errors import ConfigError
from edgepress.export.onnx import ExportConfig
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.files import listed_files, replace_dir, write_json
from edgepress.registry import METHODS, torch_kind
from edgepress.tasks import task_of
from edgepress.teacher import resolve_model


def export_model(model: str, out: Path, optimize: OptimizeConfig | None, cfg: ExportConfig = ExportConfig(),
                 data: str = DEMO_SOURCE, text_column: str = "text") -> dict:
    """Export `model` to `out` (model.onnx + config + tokenizer + EXPORTED, its record), fused when `optimize` is
    given; parity is checked after each step on the texts of `data` (labels are not read: any model, any labels).
    Returns what each step recorded; `out` appears whole or not at all."""
    model_dir = resolve_model(model)
    kind = torch_kind(model_dir)
    if optimize is not None and kind == "torch-qat":
        raise ConfigError(f"{model_dir} is a qat model: it exports straight to its int8 graph, which the float "
                          f"fusions would not fit. Fix: add --no-optimize (ONNX Runtime fuses the int8 graph itself "
                          f"when a session starts)")
    texts = load_texts(data, text_column)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with writing(out, "--out"), tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as scratch:
        result = Path(scratch) / "onnx"
        steps = {"export": METHODS["export"].call(kind, model_dir, result, texts, cfg, task_of(model_dir))}
        if optimize is not None:
            steps["optimize"] = optimize_onnx(result, Path(scratch) / "fused", texts, optimize)
            result = Path(scratch) / "fused"
        write_json(result / EXPORTED, {"model": model, "data": data, "steps": steps, "files": listed_files(result)})
        replace_dir(result, out)
    return steps
