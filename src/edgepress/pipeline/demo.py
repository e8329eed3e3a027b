"""`edgepress demo`: the embedded default end to end (demo.yaml beside this file) on the movie snippets and the
MiniLM teacher, which is built and cached on first use."""

from importlib import resources
from pathlib import Path

from edgepress.pipeline.config import PipelineConfig, load_config
from edgepress.pipeline.runner import run_pipeline


def demo_config() -> PipelineConfig:
    """The shipped demo pipeline."""
    with resources.as_file(resources.files("edgepress.pipeline") / "demo.yaml") as path:
        return load_config(path)


def run_demo(out: Path, quick: bool = False) -> dict:
    """Run the demo pipeline into `out`; returns the report.

    `quick` never changes the teacher or the test split: it only shortens the training of later stages (the demo
    has no training stage yet, so today it changes nothing).
    """
    return run_pipeline(demo_config(), Path(out))
