"""The run directory: one folder per stage holding its artifact, exact config and metrics; the report is built
only from these files."""

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from edgepress.data import DataSplits
from edgepress.files import read_json, write_json

STAGE_FILES = ("stage.json", "config.json", "metrics.json")


@dataclass(frozen=True)
class RunDir:
    root: Path

    def clear(self, keep_stages: bool = False) -> None:
        """Remove what an earlier run left here (edgepress' own files only), so a report never mixes two runs;
        `keep_stages` keeps the stage folders for --resume (stale ones go with `drop_stages_from`)."""
        for name in ("final",) if keep_stages else ("stages", "final"):
            if (self.root / name).is_dir():
                shutil.rmtree(self.root / name)
        files = ["report.json", "report.md", "report.html", "run.json", "run.log"]
        for name in files if keep_stages else [*files, "data_split.json"]:
            (self.root / name).unlink(missing_ok=True)

    def drop_stages_from(self, index: int) -> None:
        """Remove the stage folders numbered `index` and above."""
        stages = self.root / "stages"
        for folder in sorted(stages.iterdir()) if stages.is_dir() else []:
            if int(folder.name.split("-", 1)[0]) >= index:
                shutil.rmtree(folder)

    def reusable(self, index: int, name: str, same_config, test_ids: list[str]) -> tuple[dict, list[int]] | None:
        """(metrics, test predictions) of a stage an earlier run finished and passed with a config for which
        `same_config(config)` holds, on the same test examples; None otherwise."""
        folder = self.stage_dir(index, name)
        if not all((folder / f).is_file() for f in (*STAGE_FILES, "predictions.json")):
            return None
        record, predictions = read_json(folder / "stage.json"), read_json(folder / "predictions.json")
        if record["status"] != "passed" or predictions["ids"] != test_ids:
            return None
        if not same_config(read_json(folder / "config.json")):
            return None
        return read_json(folder / "metrics.json"), predictions["predictions"]

    def stage_dir(self, index: int, name: str) -> Path:
        return self.root / "stages" / f"{index:02d}-{name}"

    def stage_dirs(self) -> list[Path]:
        stages = self.root / "stages"
        return sorted(p for p in stages.iterdir() if (p / "stage.json").is_file()) if stages.is_dir() else []

    def write_split(self, data: DataSplits) -> None:
        """Record the example ids of every split (data_split.json)."""
        write_json(self.root / "data_split.json", data.manifest())

    def write_stage(self, index: int, name: str, *, method: str, artifact: str, config: dict, metrics: dict,
                    status: str = "passed", gates: list[dict] | None = None, details: dict | None = None,
                    predictions: dict | None = None) -> Path:
        """Write one stage's record; config, metrics and test predictions first, stage.json (which marks it done)
        last. `details` is what the method recorded (parity numbers, fused ops, attempts)."""
        folder = self.stage_dir(index, name)
        write_json(folder / "config.json", config)
        write_json(folder / "metrics.json", metrics)
        if predictions is not None:
            write_json(folder / "predictions.json", predictions)
        record = {"name": name, "method": method, "status": status, "artifact": artifact, "gates": gates or [],
                  "details": details or {}}
        write_json(folder / "stage.json", record)
        return folder

    def read_stage(self, folder: Path) -> dict:
        return {**read_json(folder / "stage.json"), "metrics": read_json(folder / "metrics.json")}


def attach_log(root: Path) -> logging.Handler:
    """Send edgepress's log records to RUN_DIR/run.log; returns the handler to remove when the run ends."""
    root.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(root / "run.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("edgepress")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return handler
