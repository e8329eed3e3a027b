"""`edgepress demo`: the embedded default end to end (demo.yaml beside this file) on the movie snippets and the
MiniLM teacher, which is built and cached on first use."""

from importlib import resources
from pathlib import Path

from edgepress.pipeline.config import PipelineConfig, load_config
from edgepress.pipeline.runner import run_pipeline
from edgepress.registry import METHODS


def demo_config() -> PipelineConfig:
    """The shipped demo pipeline."""
    with resources.as_file(resources.files("edgepress.pipeline") / "demo.yaml") as path:
        return load_config(path)


QUICK_EPOCHS = 1


def shortened(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` with every training stage cut to QUICK_EPOCHS epochs; nothing else changes."""
    stages = []
    for stage in cfg.stages:
        if METHODS[stage.method].trains:
            stage = stage.model_copy(update={"params": {**stage.params, "epochs": QUICK_EPOCHS}})
        stages.append(stage)
    return cfg.model_copy(update={"stages": stages})


def run_demo(out: Path, quick: bool = False, resume: bool = False) -> dict:
    """Run the demo pipeline into `out` (reusing what an earlier demo there built with the same inputs when
    `resume`); returns the report.

    `quick` never changes the teacher or the test split: it only shortens the training of later stages.
    """
    cfg = demo_config()
    return run_pipeline(shortened(cfg) if quick else cfg, Path(out), resume=resume)
