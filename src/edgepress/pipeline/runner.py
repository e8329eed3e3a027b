"""`edgepress run`: baseline, then each stage in order; after every stage measure, then gate. A stage that misses a
gate, or whose method fails with an EdgepressError, tries its fallbacks; when none passes the run stops (GateFailed,
exit 3; or the method's error). The report is written either way.

What is on disk at every instant: nothing of an earlier run in RUN_DIR is touched until the new run's inputs have
been checked (`inputs.check_inputs`). Then the earlier report, log and bundle go, and every record written names
this run's id, so report.json, rewritten after the baseline and after each stage (status `running`) and once more at
the end (`passed`, `failed` or `error`), describes this attempt alone. A killed run leaves stage records that
`--resume` checks (config, input hash, split) before it reuses them."""

import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgepress.configs import build
from edgepress.data import DataSplits
from edgepress.data.dataset import missing_classes
from edgepress.deploy.bundle import bundle_model, run_manifest
from edgepress.deploy.targets import resolve_target
from edgepress.errors import ConfigError, EdgepressError, ExportParityError, GateFailed
from edgepress.files import tree_sha256, write_json
from edgepress.interrupt import check as check_interrupt
from edgepress.logs import duration, readable, step, summarise_library_messages
from edgepress.pipeline.config import Gates, ParityGate, PipelineConfig, RuntimeConfig, StageConfig, with_target
from edgepress.pipeline.environment import environment
from edgepress.pipeline.gates import evaluate_gates, gate_name, noisy_gates
from edgepress.pipeline.inputs import check_inputs, local_inputs, run_task
from edgepress.pipeline.latency import onnx_path, side_by_side_speedup
from edgepress.pipeline.launch import launched
from edgepress.pipeline.measure import ONNX_EVALUATION, measure_scored
from edgepress.pipeline.report import write_report
from edgepress.pipeline.rundir import RunDir, attach_log
from edgepress.pipeline.stagecache import StageCache, machine_key, open_cache
from edgepress.registry import METHODS, RunContext
from edgepress.tasks import CLASSIFICATION

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one attempt at a stage produced; `error` is the method's own failure, when it raised one."""

    method: str
    config: dict
    status: str
    metrics: dict
    preds: np.ndarray | None
    gates: list[dict]
    details: dict
    error: EdgepressError | None = None


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

    def measure(self, artifact: Path, who: str) -> tuple[dict, dict[str, np.ndarray]]:
        runtime, sets = self.cfg.runtime, [name for name in self.scored if name != "test"]
        score, made = self.task.primary.replace("_", " "), self.task.predicts
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
            stage = {**stage, **({"target_defaults": filled} if any(filled) else {}),
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

    def reusable(self, index: int, name: str, key: dict, artifact: Path) -> dict | None:
        """With --resume, the earlier run's passed record of this stage if `key` matches, its `artifact` is intact,
        and its gates still pass against this run's baseline and previous stage."""
        hit = self.run.reusable(index, name, key, artifact) if self.resume else None
        if hit is None or sorted(hit["predictions"]) != sorted(self.scored):  # an earlier run scored other sets
            return None
        hit = {**hit, "predictions": {k: np.asarray(v) for k, v in hit["predictions"].items()}}
        if index == 0:
            return hit
        stage = self.cfg.stages[index - 1]
        metrics = {**hit["metrics"], **self.versus_baseline(hit["metrics"], hit["predictions"])}
        _time_speedup(self, stage, metrics, artifact)  # a speed verdict is timed when given, a reused stage too
        gates = evaluate_gates(stage.gates, metrics, self.baseline, self.previous, hit["details"].get("parity"))
        return {**hit, "metrics": metrics, "gates": gates} if all(g["passed"] for g in gates) else None

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


def _with_parity_limits(params: dict, gate: ParityGate | None, config_type) -> dict:
    """A parity gate's limits become the method's own parity tolerance (the method checks parity itself)."""
    if gate is None or "parity" not in config_type.model_fields:
        return params
    limits = {k: v for k, v in gate.model_dump().items() if v is not None}
    return {**params, "parity": {**params.get("parity", {}), **limits}}


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


def _method_params(state: RunState, stage: StageConfig, method: str, params: dict) -> dict:
    """The params a method runs with: the stage's, `data.max_length` unless the stage sets its own, what the method
    takes from the run (`Method.fill`: int4's `torch_model`, `teacher: baseline`, optimize's timing), and the parity
    gate's limits. (The target's defaults are already in `params`: `_attempt`.)"""
    spec = METHODS[method]
    if "max_length" in spec.config.model_fields and "max_length" not in params:
        params = {**params, "max_length": state.cfg.data.max_length}
    return _with_parity_limits(spec.filled(params, state.context(stage)), stage.gates.parity, spec.config)


def _parity_gates(error: ExportParityError, cfg) -> list[dict]:
    gate = ParityGate(max_abs_diff=cfg.parity.max_abs_diff, min_agreement=cfg.parity.min_agreement)
    return evaluate_gates(Gates(parity=gate), {}, {}, {}, error.result)


def _call(state: RunState, method: str, cfg, dst: Path) -> dict:
    """The method's details: called here, or for a training method with `runtime.launch` set, in the processes the
    launcher starts."""
    spec, launch = METHODS[method], state.cfg.runtime.launch
    if launch is None or not spec.trains:
        return spec.function(state.kind)(state.source, dst, state.data if spec.inputs == "splits" else
                                         state.data.validation.texts, cfg)
    job = {"data": state.cfg.data.model_dump(mode="json"), "data_sha256": state.data_sha256,
           "label2id": {name: i for i, name in state.data.id2label.items()}}
    details = launched(launch, method, state.source, dst, cfg.model_dump(mode="json"), job,
                       dst.parent / f"launch-{method}.log")
    return {**details, "launch": launch}


def _attempt(state: RunState, stage: StageConfig, method: str, params: dict, dst: Path) -> Outcome:
    """Run one method on the stage's input, measure and gate what it gives; its EdgepressError is a failed
    attempt (a parity miss is recorded as the parity gate it is), never the end of the run."""
    spec = METHODS[method]
    params, filled = with_target(state.target["name"], method, params)
    log.info("stage %s: %s %s ...", stage.name, method, readable(params) if params else "(defaults)")
    started = time.perf_counter()
    for param, default in filled.items():
        log.info("stage %s: %s = %s for target %s: %s", stage.name, param, default["value"], state.target["name"],
                 default["why"])
    cfg = None
    try:
        cfg = build(spec.config, _method_params(state, stage, method, params), where=f"stage {stage.name}")
        details, metrics, preds = _computed(state, stage, method, cfg, dst)
        details = {**details, **({"target_defaults": filled} if filled else {})}
        _time_speedup(state, stage, metrics, dst)
    except EdgepressError as e:
        log.error("stage %s: %s failed: %s", stage.name, method, e)
        parity = isinstance(e, ExportParityError) and cfg is not None
        details = {"error": str(e), **({"parity": e.result} if parity else {})}
        return Outcome(method, cfg.model_dump(mode="json") if cfg else params, "failed", {}, None,
                       _parity_gates(e, cfg) if parity else [], details, None if parity else e)
    finally:
        summarise_library_messages(f"stage {stage.name}")
    metrics.update(state.versus_baseline(metrics, preds))
    gates = evaluate_gates(stage.gates, metrics, state.baseline, state.previous, details.get("parity"))
    status = "passed" if all(g["passed"] for g in gates) else "failed"
    log.info("stage %s: %s %s in %s: %s", stage.name, method, "passed its gates" if status == "passed" else
             "missed a gate", duration(time.perf_counter() - started), _measured(metrics))
    return Outcome(method, cfg.model_dump(mode="json"), status, metrics, preds, gates, details)


def _time_speedup(state: RunState, stage: StageConfig, metrics: dict, artifact: Path) -> None:
    """For a stage with a speedup gate: the baseline and the stage timed again, side by side, into the stage's cpu
    latency (`side_by_side`; at natural lengths for min_natural_speedup: `side_by_side_natural`), what the gate
    judges. Never cached: a verdict on speed is timed when it is given."""
    gate = stage.gates.latency
    cpu = metrics.get("latency", {}).get("cpu")
    if gate is None or cpu is None:
        return
    runtime = state.cfg.runtime
    for natural, key in ((False, "side_by_side"), (True, "side_by_side_natural")):
        if (gate.min_natural_speedup if natural else gate.min_speedup) is None:
            continue
        where = " at natural lengths" if natural else ""
        log.info("stage %s: timing it side by side with the baseline%s for its speedup gate ...", stage.name, where)
        cpu[key] = side_by_side_speedup(state.baseline_artifact, artifact, state.data.test.texts, runtime.threads,
                                        runtime.latency, natural=natural, max_length=state.cfg.data.max_length)
        log.info("stage %s: %.2fx the baseline side by side%s (%.2f ms vs %.2f ms)", stage.name, cpu[key]["speedup"],
                 where, cpu[key]["p50_ms"], cpu[key]["baseline_p50_ms"])


def _measured(metrics: dict) -> str:
    """'accuracy 0.8392, 7.8 MB, cpu p50 4.20 ms' for a log line (an embedder's: its neighbour overlap)."""
    latency = ", ".join(f"{p} p50 {m['p50_ms']:.2f} ms" for p, m in metrics.get("latency", {}).items())
    primary = metrics.get("primary_metric", "accuracy")
    score = f"{primary.replace('_', ' ')} {metrics[primary]:.4f}" if primary in metrics else ""
    return ", ".join(filter(None, (score, f"{metrics['size_bytes'] / 1e6:.1f} MB", latency)))


def _computed(state: RunState, stage: StageConfig, method: str, cfg, dst: Path
              ) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """(details, metrics, test predictions) of the method run on the stage's input into `dst`, measured (or, with a
    stage cache, an earlier identical attempt's)."""
    def compute() -> tuple[dict, dict, dict[str, np.ndarray]]:
        return _made(state, stage, method, cfg, dst), *state.measure(dst, f"stage {stage.name}")

    return _cached(state, {**state.attempt_key(method, cfg), "scored": state.scored} if state.cache else None, dst,
                   compute, f"stage {stage.name}: {method}")


def _made(state: RunState, stage: StageConfig, method: str, cfg, dst: Path) -> dict:
    """The method's details, its artifact written to `dst`. What a method makes depends on the train and validation
    splits (training, calibration, parity texts), not on the test split, unless it `reads_test`: with a stage cache,
    its artifact is shared by runs that differ only in their test split (a search's trials, measured on validation,
    and its winner's run, measured on test), and each measures it on its own test split."""
    if state.cache is None or METHODS[method].reads_test:
        return _call(state, method, cfg, dst)
    key = {**state.attempt_key(method, cfg), "data_sha256": state.fit_sha256, "measured": False}
    details, _, _ = _cached(state, key, dst, lambda: (_call(state, method, cfg, dst), {}, {}),
                            f"stage {stage.name}: {method}'s model", mark="made_in",
                            because="made on the same train and validation splits: ")
    return details


def _cached(state: RunState, key: dict | None, dst: Path | None, compute, what: str, mark: str = "cache_entry",
            because: str = "") -> tuple[dict, dict, dict[str, np.ndarray]]:
    """`compute()`'s (details, metrics, predictions), or with a stage cache (`key` set) an earlier identical
    result's, its artifact copied to `dst` (None: a measurement without an artifact) and its entry in the details
    under `mark`; a new result is stored. Another process computing the same key is waited for."""
    if not key:
        return compute()
    with state.cache.building(key):
        hit = state.cache.get(key, dst)
        if hit:
            log.info("%s taken from the cache (%s%s)", what, because, hit["entry"])
            return {**hit["details"], mark: hit["entry"]}, hit["metrics"], hit["predictions"]
        result = compute()
        state.cache.put(key, dst, *result)
    return result


def _value(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4g}"


def _missed(outcome: Outcome) -> str:
    if outcome.error is not None:
        return f"{type(outcome.error).__name__}: {outcome.error}"
    return "; ".join(f"{gate_name(g)} {_value(g['value'])} vs limit {g['limit']:g}"
                     for g in outcome.gates if not g["passed"])


def _run_stage(state: RunState, index: int, stage: StageConfig, key: dict) -> tuple[Outcome, str | None]:
    """Every attempt (the stage's method, then its fallbacks) until one passes; the stage record is written.
    Returns the last outcome and the sha256 of the artifact it passed with."""
    folder = state.run.clear_stage(index, stage.name)
    attempts = []
    for method, params in stage.attempts:
        check_interrupt()
        outcome = _attempt(state, stage, method, params, folder / "model")
        cpu = outcome.metrics.get("latency", {}).get("cpu", {})
        measured = {k: outcome.metrics[k] for k in ("accuracy", "size_bytes") if k in outcome.metrics} \
            | ({"p50_ms": cpu["p50_ms"]} if cpu else {})
        attempts.append({"method": method, "params": params, "status": outcome.status, "gates": outcome.gates,
                         "measured": measured,
                         **({"error": outcome.details["error"]} if "error" in outcome.details else {})})
        if outcome.status == "passed":
            break
        if outcome.error is None:  # an error was logged where it happened
            log.warning("stage %s: %s missed: %s", stage.name, method, _missed(outcome))
    sha256 = tree_sha256(folder / "model") if outcome.status == "passed" else None
    record = {"name": stage.name, "method": outcome.method, "status": outcome.status,
              "artifact": str(folder / "model"), "artifact_sha256": sha256,
              "kind": METHODS[outcome.method].output(state.kind), "gates": outcome.gates,
              "details": {**outcome.details, "attempts": attempts}, "run_id": state.run_id}
    config = {"stage": stage.model_dump(mode="json"), "method": outcome.method, "params": outcome.config,
              "reuse": key}
    state.run.write_stage(index, stage.name, record, config, outcome.metrics, state.predictions(outcome.preds))
    return outcome, sha256


def _reuse(state: RunState, index: int, hit: dict) -> None:
    """Adopt an earlier run's record: it now belongs to this run (and says where it came from)."""
    record = {k: v for k, v in hit.items() if k not in ("config", "predictions", "metrics")}
    record.update(run_id=state.run_id, reused_from=hit["run_id"])
    state.run.write_stage(index, hit["name"], record, metrics=hit["metrics"])
    log.info("%s: reused from run %s (--resume)", hit["name"], hit["run_id"])


def _baseline(state: RunState, model_dir: Path) -> None:
    state.source, state.source_sha256, state.torch_source = model_dir, tree_sha256(model_dir), model_dir
    state.baseline_artifact = model_dir
    key = state.reuse_key({"model": state.cfg.model, "model_dir": str(model_dir)})
    hit = state.reusable(0, "baseline", key, model_dir)
    if hit:
        _reuse(state, 0, hit)
        metrics, preds = hit["metrics"], hit["predictions"]
    else:
        state.run.clear_stage(0, "baseline")
        measured = state.measured_key(baseline=True, scored=state.scored) if state.cache else None
        _, metrics, preds = _cached(state, measured, None, lambda: ({}, *state.measure(model_dir, "baseline")),
                                  "baseline:")
        metrics = {**metrics, **state.task.baseline(state.data.test, preds["test"])}
        record = {"name": "baseline", "method": "baseline", "status": "passed", "artifact": str(model_dir),
                  "artifact_sha256": state.source_sha256, "kind": "torch", "gates": [], "details": {},
                  "run_id": state.run_id}
        state.run.write_stage(0, "baseline", record, {"reuse": key}, metrics, state.predictions(preds))
    state.baseline, state.baseline_preds, state.previous = metrics, preds, metrics
    primary = state.task.primary
    log.info("baseline: %s (%s CI [%.4f, %.4f])", _measured(metrics), primary.replace("_", " "),
             *metrics[f"{primary}_ci95"])


def _stages(state: RunState) -> tuple[str, Outcome] | None:
    """Run (or reuse) every stage in order; (name, outcome) of the first one that failed, or None."""
    for index, stage in enumerate(state.cfg.stages, start=1):
        evaluated = {"evaluation": ONNX_EVALUATION} if METHODS[stage.method].output(state.kind).startswith("onnx") \
            else {}
        key = state.reuse_key({**stage.model_dump(mode="json"), **evaluated,
                               **METHODS[stage.method].later(stage.params, state.context(stage))})
        hit = state.reusable(index, stage.name, key, state.run.stage_dir(index, stage.name) / "model")
        if hit:
            _reuse(state, index, hit)
            state.advance(Path(hit["artifact"]), hit["artifact_sha256"], hit["metrics"])
            state.kind = hit.get("kind", METHODS[hit["method"]].output(state.kind))
        else:
            outcome, sha256 = _run_stage(state, index, stage, key)
            if outcome.status != "passed":
                return stage.name, outcome
            state.advance(state.run.stage_dir(index, stage.name) / "model", sha256, outcome.metrics)
            state.kind = METHODS[outcome.method].output(state.kind)
        write_report(state.run)
    return None


def _final_bundle(state: RunState) -> None:
    """RUN_DIR/final: the model that passed every gate, shaped for the run's target (only when every stage
    passed); `edgepress bundle` calls the same function."""
    root = state.run.root
    manifest = run_manifest(root, state.cfg, state.data, state.previous, state.meta, state.source)
    bundle_model(state.source, root / "final", state.cfg.runtime.target, overwrite=True, manifest=manifest,
                 run_root=root)
    summarise_library_messages("final bundle")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _record_run(state: RunState, status: str, error: str | None = None) -> dict:
    """run.json (this run's id, status, config, environment), then the report built from the files."""
    if not state.meta:
        state.meta = {"run_id": state.run_id, "started": _now(), "config": state.cfg.model_dump(mode="json"),
                      "environment": environment(state.cfg.runtime.threads), "target": state.target}
    finished = {} if status == "running" else {"finished": _now()}
    write_json(state.run.root / "run.json", {**state.meta, "status": status, "error": error, **finished})
    return write_report(state.run)


def _stopped(state: RunState, error: BaseException) -> None:
    """An error ended the run: say so in run.log and in the report, without hiding the error itself."""
    if isinstance(error, EdgepressError):
        message = str(error)
    elif isinstance(error, KeyboardInterrupt):
        message = "interrupted (Ctrl-C); `--resume` reuses the stages that finished"
    else:
        message = f"internal error: {type(error).__name__}: {error}"
    log.error("run stopped: %s", message)
    try:
        _record_run(state, "error", message)
    except Exception as report_error:  # the original error is what the user must see; this one is logged
        log.error("the report could not be written: %s", report_error)


def _failure_error(state: RunState, name: str, outcome: Outcome) -> EdgepressError:
    where = f"report: {state.run.root / 'report.json'}"
    if outcome.error is not None:
        return type(outcome.error)(f"stage '{name}' failed: {outcome.error}\n{where}")
    return GateFailed(f"stage '{name}' missed its gates ({_missed(outcome)}); {where}")


TRIAL_NOTE = ("a search trial: the validation split stands in for the test split, which the search scores only "
              "for its finalists")


def run_pipeline(cfg: PipelineConfig, out: Path, resume: bool = False, config_file: Path | None = None,
                 cache: Path | None = None, evaluate_on: str = "test", noise_note: bool = True) -> dict:
    """Run `cfg` into `out`; returns the report. Raises GateFailed (after writing the report) when a stage and all
    its fallbacks miss a gate. With `resume`, each stage an earlier run in `out` passed with the same config,
    input artifact and data (every split's ids, texts and labels) is reused instead of run again. `config_file`, the
    YAML `cfg` came from, is kept apart from what the run replaces like the model and the data. With `cache` (a
    dir), every stage attempt is looked up in and stored to that stage cache (pipeline/stagecache.py).
    `evaluate_on="validation"` (a search trial) measures and gates every stage on the validation split, which then
    stands in for the test split everywhere (the methods' own details included, the data's digest and so every
    cache and resume key too): a trial never reads the test split. `noise_note=False`: no warning for an accuracy
    gate inside the test split's noise (a search's winner: its report speaks of its constraint)."""
    run = RunDir(Path(out))
    model_dir, data = check_inputs(cfg, run.root, config_file=config_file)
    if evaluate_on == "validation":
        data = replace(data, test=data.validation, note="; ".join(filter(None, (data.note, TRIAL_NOTE))))
    stage_cache = open_cache(cache, {"the run dir": run.root, **local_inputs(cfg.model, cfg.data)}) \
        if cache is not None else None
    data_sha256 = data.manifest()["content_sha256"]
    recorded = run.recorded_data()
    same_data = recorded == data_sha256
    if resume and (run.root / "run.json").is_file() and not same_data:
        why = "differ from what it used" if recorded else "were not recorded by it (an earlier edgepress)"
        log.warning("--resume: the data (every split's texts and labels) %s: every stage of the run in %s runs again",
                    why, out)
    earlier = not resume and (run.root / "run.json").is_file()
    state = RunState(cfg, run, uuid.uuid4().hex[:12], data, data_sha256, resume=resume and same_data,
                     fit_sha256=data.content_sha256(("train", "validation")),
                     target=resolve_target(cfg.runtime.target), cache=stage_cache, task=run_task(cfg))
    try:
        run.prepare([s.name for s in cfg.stages], state.resume)
    except OSError as e:
        raise ConfigError(f"--out {out} cannot be written: {e}. Fix: choose a directory you can write") from None
    handler = attach_log(run.root)
    if earlier:
        log.info("%s held an earlier run: every stage runs again (--resume reuses the stages whose config, input "
                 "and data are unchanged)", out)
    try:
        _record_run(state, "running")
        run.write_split(data)
        for line in missing_classes(data.class_counts()):
            log.warning("data: %s (the report says so too)", line)
        for line in noisy_gates(cfg, len(data.test)) if evaluate_on == "test" and noise_note else ():
            log.warning("%s", line)
        _baseline(state, model_dir)
        write_report(run)
        failed = _stages(state)
        if failed is None and onnx_path(state.source) is not None:
            _final_bundle(state)
        report = _record_run(state, "passed" if failed is None else "failed",
                             None if failed is None else f"stage '{failed[0]}': {_missed(failed[1])}")
    except BaseException as e:
        _stopped(state, e)
        raise
    finally:
        logging.getLogger("edgepress").removeHandler(handler)
        handler.close()
    if failed is not None:
        raise _failure_error(state, *failed)
    return report
