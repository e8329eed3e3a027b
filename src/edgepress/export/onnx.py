"""HF model dir -> ONNX dir (model.onnx + config + tokenizer) through optimum-onnx's exporter, then the hard
parity check against the torch model on real sentences. The graph it writes is the one ONNX Runtime's BERT
optimizer fuses fully (the legacy TorchScript path: measured in ARCHITECTURE.md)."""

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgepress.export.parity import (
    ONNX_FILE,
    ParityConfig,
    check_onnx_file,
    check_parity,
    input_names,
    ort_runner,
    parity_feeds,
    spread_by_length,
)
from edgepress.files import atomic_dir
from edgepress.runtime.session import SessionConfig, open_session
from edgepress.runtime.tokenize import load_tokenizer

log = logging.getLogger(__name__)


class ExportConfig(BaseModel):
    """The `export` method: opset, the length parity sentences are cut to, and the parity tolerances."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    opset: int = Field(18, ge=14, le=21)
    max_length: int = Field(128, ge=8)
    parity: ParityConfig = ParityConfig()


def torch_runner(model):
    """A parity/latency runner over a torch model: numpy feeds in, numpy logits out."""
    import torch

    def run(feeds):
        with torch.inference_mode():
            return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.float().numpy()

    return run


def export_model_object(model, tokenizer, out_dir: Path, texts: tuple[str, ...], cfg: ExportConfig, what: str) -> dict:
    """Export an in-memory classifier (any per-layer shape) to `out_dir` and check it against torch on `texts`."""
    from optimum.exporters.onnx import onnx_export_from_model

    with atomic_dir(Path(out_dir)) as tmp:
        onnx_export_from_model(model, tmp, opset=cfg.opset, task="text-classification", do_validation=False,
                               preprocessors=[tokenizer])
        tokenizer.save_pretrained(tmp)  # optimum copies tokenizer files only from config._name_or_path
        check_onnx_file(tmp / ONNX_FILE)
        session = open_session(tmp / ONNX_FILE, SessionConfig(providers=("cpu",), optimization="disable"))
        feeds = parity_feeds(load_tokenizer(tmp, cfg.max_length), spread_by_length(texts, cfg.parity.n_texts),
                             input_names(session), cfg.parity.batch_size)
        parity = check_parity(torch_runner(model), ort_runner(session), feeds, cfg.parity, what)
    log.info("export: %s -> %s, parity %s", what, out_dir, parity)
    return {"parity": parity}


def export_onnx(model_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: ExportConfig = ExportConfig()) -> dict:
    """Export `model_dir` to `out_dir`/model.onnx (+ config.json, tokenizer) and check it against torch on real
    `texts`; returns {"parity": numbers}. Nothing is left in `out_dir` when a check fails."""
    from edgepress.models.loading import load_classifier

    model, tokenizer = load_classifier(model_dir)
    return export_model_object(model, tokenizer, out_dir, texts, cfg, f"ONNX export of {model_dir}")
