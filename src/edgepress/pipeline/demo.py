"""`edgepress demo`: the embedded defaults end to end on the movie snippets. `--task classification` (demo.yaml beside
this file): the MiniLM teacher, built and cached on first use. `--task embedding` (demo-embedding.yaml): the MiniLM
sentence encoder itself (all-MiniLM-L6-v2), gated on the neighbours it finds among the test texts."""

from importlib import resources
from pathlib import Path

from edgepress.pipeline.config import PipelineConfig, load_config
from edgepress.pipeline.runner import run_pipeline
from edgepress.registry import METHODS

DEMOS = {"classification": "demo.yaml", "embedding": "demo-embedding.yaml"}  # task -> the pipeline beside this file


def demo_config(task: str = "classification") -> PipelineConfig:
    """The shipped demo pipeline of `task` (a key of DEMOS)."""
    with resources.as_file(resources.files("edgepress.pipeline") / DEMOS[task]) as path:
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


def run_demo(out: Path, quick: bool = False, resume: bool = False, task: str = "classification") -> dict:
    """Run the demo pipeline of `task` into `out` (reusing what an earlier demo there built with the same inputs
    when `resume`); returns the report.

    `quick` never changes the teacher or the test split: it only shortens the training of later stages.
    """
    cfg = demo_config(task)
    return run_pipeline(shortened(cfg) if quick else cfg, Path(out), resume=resume)
