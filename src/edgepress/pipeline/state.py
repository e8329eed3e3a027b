"""What the stages of one run share (`RunState`): its config, data, baseline, the artifact the next stage takes, and
the keys a stage's result is reused and cached by (`reuse_key`, `attempt_key`, `measured_key`): everything it
depends on. `stage_context` is what a stage's methods may take from the run (`registry.RunContext`)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgepress.data import DataSplits
from edgepress.logs import step, words
from edgepress.pipeline.config import PipelineConfig, RuntimeConfig, StageConfig, with_target
from edgepress.pipeline.latency import onnx_path
from edgepress.pipeline.measure import measure_scored
from edgepress.pipeline.rundir import RunDir
from edgepress.pipeline.stagecache import StageCache, machine_key
from edgepress.registry import METHODS, RunContext
from edgepress.tasks import CLASSIFICATION


def with_defaults(method: str, params: dict) -> dict:
    """`params` of `method` as its config reads them, every field it leaves unset at its default (JSON)."""
    return METHODS[method].config.model_validate(params).model_dump(mode="json")


@dataclass
class RunState:
    """What the stages of one run share; `source` is the artifact the next stage takes."""

    cfg: PipelineConfig
    run: RunDir
    run_id: str
    data: DataSplits
    data_sha256: str
    resume: bool
    fit_sha256: str = ""  # the train and validation splits' content: what a method's artifact depends on
    baseline: dict = field(default_factory=dict)
    baseline_artifact: Path | None = None  # what a speedup gate times side by side with a stage
    baseline_preds: dict[str, np.ndarray] = field(default_factory=dict)  # on every scored set
    previous: dict = field(default_factory=dict)
    source: Path | None = None
    source_sha256: str = ""
    torch_source: Path | None = None  # the last torch model dir of the chain (what an ONNX graph was exported from)
    kind: str = "torch"  # what `source` is (registry kinds)
    target: dict = field(default_factory=dict)  # {"name", "detected"}: where the bundle will run
    meta: dict = field(default_factory=dict)  # run.json: id, start time, config, environment
    cache: StageCache | None = None  # --cache: attempts shared with other runs
    task: object = CLASSIFICATION  # what the model does (edgepress.tasks): how its predictions are scored
    progress: Callable[[str], None] | None = None  # called with a stage's name once the report holds it, passed

    def measure(self, artifact: Path, who: str) -> tuple[dict, dict[str, np.ndarray]]:
        runtime, sets = self.cfg.runtime, [name for name in self.scored if name != "test"]
        score, made = words(self.task.primary), self.task.predicts
        with step(f"{who}: measuring {score} on {len(self.data.test):,} texts, {made} on "
                  f"{', '.join(sets) or 'no other set'}, latency on {', '.join(runtime.providers)}"):
            return measure_scored(artifact, self.data, self.cfg.data.max_length, runtime.providers,
                                  runtime.threads, runtime.latency, self.task)

    @property
    def scored(self) -> list[str]:
        """The sets every stage is measured on (test first): part of what a measurement is reused by."""
        return list(self.data.scored())

    def reuse_key(self, stage: dict) -> dict:
        """Everything a stage's result depends on: a stage is reused only when all of it matches (the target's
        defaults for its methods too, when it has any)."""
        if "method" in stage:  # what the target fills into each attempt's own params, and the files they name
            fallbacks = stage["on_fail"]["fallback"]
            tries = [(stage["method"], stage["params"]), *((a["method"], a["params"]) for a in fallbacks)]
            filled = [{k: f["value"] for k, f in with_target(self.target["name"], m, p)[1].items()} for m, p in tries]
            read = [METHODS[m].files_read(p) for m, p in tries]
            # each attempt's params with the defaults its method fills in: a run made before a default changed
            # (vocab's unlabeled_min_count) is not reused as if it had been made with the new one
            defaults = [with_defaults(m, p) for m, p in tries]
            stage = {**stage, "attempt_params": defaults, **({"target_defaults": filled} if any(filled) else {}),
                     **({"files_sha256": read} if any(read) else {})}
        return {"stage": stage, "data": self.cfg.data.model_dump(mode="json"),
                "runtime": runtime_key(self.cfg.runtime), "data_sha256": self.data_sha256,
                "input_sha256": self.source_sha256}

    def attempt_key(self, method: str, cfg) -> dict:
        """What one attempt's result depends on, for the stage cache: the method's full params (a path param by
        the content it names), the input's and the data's content, the runtime, and the machine that measures."""
        params = cfg.model_dump(mode="json")
        read = METHODS[method].files_read(params)
        return self.measured_key(method=method, params={k: v for k, v in params.items() if k not in read},
                                 files_sha256=read)

    def measured_key(self, **what) -> dict:
        """`what` was computed from the current input, and measured on this run's data, runtime and machine."""
        return {**what, "input_sha256": self.source_sha256, "data": self.cfg.data.model_dump(mode="json"),
                "data_sha256": self.data_sha256, "runtime": runtime_key(self.cfg.runtime), "machine": machine_key()}

    def versus_baseline(self, metrics: dict, preds: dict[str, np.ndarray]) -> dict:
        """A stage's predictions against the baseline's (`Task.versus`): on the test split (a classifier's: the
        paired 95% CI of the accuracy drop) and on every fidelity set (`metrics["sets"]`), fidelity: `agreement`,
        with its 95% CI (a classifier's: the share of texts labelled as the baseline labels them)."""
        scored, base = self.data.scored(), self.baseline_preds
        sets = {name: {**figures, **self.task.versus(scored[name], base[name], preds[name])}
                for name, figures in metrics["sets"].items()}
        return {**self.task.versus(self.data.test, base["test"], preds["test"]), "sets": sets}

    def predictions(self, preds: dict[str, np.ndarray] | None) -> dict | None:
        """predictions.json: the test split's ids, labels and predictions, and the predictions on each fidelity set
        (sentence vectors go to predictions.npz beside it: `RunDir.write_stage`)."""
        if preds is None:
            return None
        return {"ids": list(self.data.test.ids), "labels": self.data.test.labels.tolist(),
                "predictions": preds["test"], "sets": {name: p for name, p in preds.items() if name != "test"}}

    def context(self, stage: StageConfig) -> RunContext:
        """What `stage`'s methods may take from this run as it stands (`stage_context`)."""
        return stage_context(self.cfg, stage, self.target["name"], self.torch_source, self.baseline_artifact)

    def advance(self, artifact: Path, sha256: str, metrics: dict) -> None:
        self.source, self.source_sha256, self.previous = artifact, sha256, metrics
        if onnx_path(artifact) is None:
            self.torch_source = artifact


def runtime_key(runtime: RuntimeConfig) -> dict:
    """The runtime section as stages are reused by: without `launch` when it is not set, so that the stages of runs
    recorded before the field existed are still reused (a stage trained under a launcher is not reused by a run
    without one, nor the other way round)."""
    return runtime.model_dump(mode="json", exclude={"launch"} if runtime.launch is None else None)


def stage_context(cfg: PipelineConfig, stage: StageConfig, target: str, torch_source: Path | None = None,
                  baseline: Path | None = None) -> RunContext:
    """What the methods of `stage` may take from the run (`Method.fill`): the run's torch model so far and its
    baseline, its runtime, and the stages after this one with `target`'s defaults."""
    later = cfg.stages[cfg.stages.index(stage) + 1:]
    return RunContext(torch_source=torch_source, baseline=baseline, threads=cfg.runtime.threads,
                      latency=cfg.runtime.latency.model_dump(),
                      later=tuple((s.method, with_target(target, s.method, s.params)[0]) for s in later),
                      natural_later=any(s.gates.latency is not None and s.gates.latency.min_natural_speedup is not None
                                        for s in later))
