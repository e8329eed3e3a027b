"""`edgepress demo`: the embedded default end to end, on the movie snippets and the MiniLM teacher."""

import logging
from pathlib import Path

from edgepress.data import DataConfig, load_data
from edgepress.files import write_json
from edgepress.models.loading import label2id_of
from edgepress.models.teacher import TEACHER, teacher_dir
from edgepress.pipeline.baseline import run_baseline
from edgepress.pipeline.environment import environment
from edgepress.pipeline.report import write_report
from edgepress.pipeline.rundir import RunDir, attach_log
from edgepress.runtime.latency import LatencyConfig

DEMO_THREADS = 2  # the contract's default `runtime.threads`; every latency is measured with it


def run_demo(out: Path, quick: bool = False) -> dict:
    """Build (or reuse) the teacher, measure it as the baseline, write the report; returns the report.

    `quick` never changes the teacher or the test split: it only shortens the training of later stages.
    """
    run = RunDir(Path(out))
    handler = attach_log(run.root)
    try:
        model_dir = teacher_dir()
        data = load_data(DataConfig(), label2id_of(model_dir))
        run.write_split(data)
        write_json(run.root / "run.json", {"config": {"demo": True, "quick": quick, "model": TEACHER,
                                                      "data": DataConfig().model_dump()},
                                           "environment": environment()})
        run_baseline(run, model_dir, data, DataConfig().max_length, DEMO_THREADS, LatencyConfig())
        return write_report(run)
    finally:
        logging.getLogger("edgepress").removeHandler(handler)
        handler.close()
