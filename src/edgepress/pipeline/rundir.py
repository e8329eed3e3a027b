"""The run directory: one folder per stage holding its artifact, exact config and metrics; the report is built
only from these files.

Every record names the run that wrote (or reused) it (`run_id`), so a report lists this run's stages and nothing of
an earlier one, whatever an interrupted run left behind."""

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepress.data import DataSplits
from edgepress.device.bundle import json_object
from edgepress.errors import ModelError
from edgepress.files import read_arrays, remove_dir, remove_leftovers, tree_sha256, write_arrays, write_json

# the report first: while a new attempt replaces an old one, no report may describe a mix of the two. run.json
# stays (the mark of a run dir) until the new run overwrites it, right after `prepare`.
REPORT_FILES = ("report.json", "report.md", "report.html")
RUN_FILES = (*REPORT_FILES, "run.json", "run.log", "data_split.json")  # every file of a run dir's top level
STAGE_FOLDER = re.compile(r"^\d{2}-[A-Za-z0-9][A-Za-z0-9_.-]*$")  # what stage_dir names; anything else is not ours


VECTORS = "predictions.npz"  # beside predictions.json: an embedder's sentence vectors, per scored set


def stored_predictions(predictions: dict[str, np.ndarray], folder: Path) -> dict:
    """How `predictions` ({set: array}) are kept in a JSON record in `folder`: labels as lists under
    "predictions" (the test split's) and "sets"; sentence vectors (floats) in folder/VECTORS, the record naming it."""
    if not predictions:  # a stage cache's record of a model alone, measured by each run that takes it
        return {}
    if any(np.asarray(p).dtype.kind == "f" for p in predictions.values()):
        write_arrays(folder / VECTORS, {name: np.asarray(p, np.float32) for name, p in predictions.items()})
        return {"vectors": VECTORS}
    return {"predictions": np.asarray(predictions["test"]).tolist(),
            "sets": {name: np.asarray(p).tolist() for name, p in predictions.items() if name != "test"}}


def loaded_predictions(record: dict, folder: Path) -> dict[str, np.ndarray]:
    """{set: array} of a record `stored_predictions` made."""
    if "vectors" in record:
        return read_arrays(folder / VECTORS)
    if "predictions" not in record:
        return {}
    return {"test": np.asarray(record["predictions"]),
            **{name: np.asarray(p) for name, p in record.get("sets", {}).items()}}


def _without_gates(key) -> object:
    """A reuse key with its stage's gates left out: what a stage made does not depend on them (a reused record's
    gates are evaluated again, with the config of the run that reuses it), and a new gate field must not make a
    finished stage train again."""
    if not isinstance(key, dict) or not isinstance(key.get("stage"), dict):
        return key
    return {**key, "stage": {k: v for k, v in key["stage"].items() if k != "gates"}}


@dataclass(frozen=True)
class RunDir:
    root: Path

    def prepare(self, stage_names: list[str], resume: bool) -> None:
        """Make room for a new attempt; called only once its inputs are known to be good. The earlier run's report,
        log and bundle go; its stage folders stay only with `resume`, and only those named as this config names its
        stages (each is checked before it is reused). Folders that edgepress did not name are left alone."""
        for name in REPORT_FILES:
            (self.root / name).unlink(missing_ok=True)
        remove_dir(self.root / "final")
        keep = {self.stage_dir(i, n).name for i, n in enumerate(["baseline", *stage_names])} if resume else set()
        for folder in self._stage_folders():
            if folder.name not in keep:
                remove_dir(folder)
        for folder in (self.root, self.root / "stages"):  # what a killed run's atomic writes left
            if folder.is_dir():
                remove_leftovers(folder)
        if not resume:
            (self.root / "data_split.json").unlink(missing_ok=True)
        (self.root / "run.log").unlink(missing_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)

    def _stage_folders(self) -> list[Path]:
        stages = self.root / "stages"
        return sorted(p for p in stages.iterdir() if p.is_dir() and STAGE_FOLDER.match(p.name)) \
            if stages.is_dir() else []

    def recorded_data(self) -> str | None:
        """The content digest of the data the earlier run in this dir used (every split's ids, texts and labels),
        if it recorded one."""
        try:
            return json_object(self.root / "data_split.json")["content_sha256"]
        except (ModelError, KeyError, TypeError):
            return None

    def reusable(self, index: int, name: str, key: dict, artifact: Path) -> dict | None:
        """An earlier run's passed record of this stage, when it ran with exactly `key` (its config, the config
        of the runtime and data, the split, and the sha256 of its input artifact) and its artifact, where this run
        expects it (a run dir may have been moved or copied), is unchanged; None otherwise (a damaged or partial
        record is simply run again)."""
        folder = self.stage_dir(index, name)
        try:
            record = self.read_stage(folder)
            config = json_object(folder / "config.json")
            predictions = loaded_predictions(json_object(folder / "predictions.json"), folder)
        except (ModelError, KeyError, TypeError):
            return None
        if record.get("status") != "passed" or _without_gates(config.get("reuse")) != _without_gates(key):
            return None
        if not artifact.exists() or tree_sha256(artifact) != record.get("artifact_sha256"):
            return None
        return {**record, "artifact": str(artifact), "config": config, "predictions": predictions}

    def clear_stage(self, index: int, name: str) -> Path:
        """An empty folder for a stage about to run (whatever an earlier or interrupted attempt left goes)."""
        folder = self.stage_dir(index, name)
        remove_dir(folder)
        folder.mkdir(parents=True)
        return folder

    def stage_dir(self, index: int, name: str) -> Path:
        return self.root / "stages" / f"{index:02d}-{name}"

    def write_split(self, data: DataSplits) -> None:
        """Record the example ids of every split (data_split.json)."""
        write_json(self.root / "data_split.json", data.manifest())

    def write_stage(self, index: int, name: str, record: dict, config: dict | None = None,
                    metrics: dict | None = None, predictions: dict | None = None) -> Path:
        """Write one stage's files; config, metrics and test predictions first, stage.json (which marks it done)
        last. `record` holds name, method, status, artifact (+ its sha256), gates, details and the run id."""
        folder = self.stage_dir(index, name)
        if config is not None:
            write_json(folder / "config.json", config)
        if metrics is not None:
            write_json(folder / "metrics.json", metrics)
        if predictions is not None:  # {"ids", "labels", "predictions": the test split's, "sets": {set: array}}
            arrays = {"test": predictions["predictions"], **predictions["sets"]}
            write_json(folder / "predictions.json", {"ids": predictions["ids"], "labels": predictions["labels"],
                                                     **stored_predictions(arrays, folder)})
        write_json(folder / "stage.json", record)
        return folder

    def read_stage(self, folder: Path) -> dict:
        return {**json_object(folder / "stage.json"), "metrics": json_object(folder / "metrics.json")}

    def stage_of_run(self, index: int, name: str, run_id: str) -> dict | None:
        """The record of stage `index` if the run `run_id` wrote or reused it, else None."""
        folder = self.stage_dir(index, name)
        try:
            record = self.read_stage(folder)
        except (ModelError, KeyError, TypeError):
            return None
        return record if record.get("run_id") == run_id else None


@contextmanager
def run_log(root: Path) -> Iterator[logging.Handler]:
    """Inside, edgepress's log records (INFO and up) also go to RUN_DIR/run.log; on leaving, the handler is removed
    and the "edgepress" logger's level is as it was (a library call leaves logging as it found it)."""
    root.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(root / "run.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("edgepress")
    level = logger.level
    logger.setLevel(logging.INFO if level == logging.NOTSET or level > logging.INFO else level)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(level)
