"""`edgepress run`: baseline, then each stage in order; after every stage measure, then gate. A stage that misses a
gate, or whose method fails with an EdgepressError, tries its fallbacks; when none passes the run stops (GateFailed,
exit 3; or the method's error). The report is written either way.

What is on disk at every instant: nothing of an earlier run in RUN_DIR is touched until the new run's inputs have
been checked (`inputs.check_inputs`). Then the earlier report, log and bundle go, and every record written names
this run's id, so report.json, rewritten after the baseline and after each stage (status `running`) and once more at
the end (`passed`, `failed` or `error`), describes this attempt alone. A killed run leaves stage records that
`--resume` checks (config, input hash, split) before it reuses them."""

import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgepress.data.dataset import missing_classes
from edgepress.deploy.bundle import bundle_model, run_manifest
from edgepress.deploy.targets import resolve_target
from edgepress.device.locks import check_not_written, writing
from edgepress.errors import ConfigError, EdgepressError, GateFailed, refused_by_system
from edgepress.files import tree_sha256, write_json
from edgepress.interrupt import check as check_interrupt
from edgepress.logs import summarise_library_messages, words
from edgepress.pipeline.attempt import Outcome, attempt, cached, measured_text, time_speedup
from edgepress.pipeline.config import PipelineConfig, StageConfig
from edgepress.pipeline.environment import environment
from edgepress.pipeline.gates import evaluate_gates, gate_name
from edgepress.pipeline.inputs import check_inputs, config_notes, local_inputs, run_task
from edgepress.pipeline.latency import onnx_path
from edgepress.pipeline.measure import ONNX_EVALUATION
from edgepress.pipeline.report import build_report, write_report
from edgepress.pipeline.rundir import RunDir, run_log
from edgepress.pipeline.stagecache import open_cache
from edgepress.pipeline.state import RunState
from edgepress.registry import METHODS

log = logging.getLogger(__name__)


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
        outcome = attempt(state, stage, method, params, folder / "model")
        cpu = outcome.metrics.get("latency", {}).get("cpu", {})
        measured = {k: outcome.metrics[k] for k in (state.task.primary, "size_bytes") if k in outcome.metrics} \
            | ({"p50_ms": cpu["p50_ms"]} if cpu else {})
        attempts.append({"method": method, "params": params, "status": outcome.status, "gates": outcome.gates,
                         "measured": measured,
                         **({"error": outcome.details["error"]} if "error" in outcome.details else {})})
        if outcome.status == "passed":
            break
        if outcome.error is None:  # an error was logged where it happened
            log.warning("stage %s: %s missed: %s", stage.name, method, _missed(outcome))
    sha256 = tree_sha256(folder / "model") if outcome.status == "passed" else None
    made = (folder / "model").exists()  # a method that raised left none; one that missed its gates, its model
    record = {"name": stage.name, "method": outcome.method, "status": outcome.status,
              "artifact": str(folder / "model") if made else None, "artifact_sha256": sha256,
              "kind": METHODS[outcome.method].output(state.kind), "gates": outcome.gates,
              "details": {**outcome.details, "attempts": attempts}, "run_id": state.run_id}
    config = {"stage": stage.model_dump(mode="json"), "method": outcome.method, "params": outcome.config,
              "reuse": key}
    state.run.write_stage(index, stage.name, record, config, outcome.metrics, state.predictions(outcome.preds))
    return outcome, sha256


def _reusable(state: RunState, index: int, name: str, key: dict, artifact: Path) -> dict | None:
    """With --resume, the earlier run's passed record of this stage if `key` matches, its `artifact` is intact,
    and its gates still pass against this run's baseline and previous stage."""
    hit = state.run.reusable(index, name, key, artifact) if state.resume else None
    if hit is None or sorted(hit["predictions"]) != sorted(state.scored):  # an earlier run scored other sets
        return None
    hit = {**hit, "predictions": {k: np.asarray(v) for k, v in hit["predictions"].items()}}
    if index == 0:
        return hit
    stage = state.cfg.stages[index - 1]
    metrics = {**hit["metrics"], **state.versus_baseline(hit["metrics"], hit["predictions"])}
    time_speedup(state, stage, metrics, artifact)  # a speed verdict is timed when given, a reused stage too
    gates = evaluate_gates(stage.gates, metrics, state.baseline, state.previous, hit["details"].get("parity"))
    return {**hit, "metrics": metrics, "gates": gates} if all(g["passed"] for g in gates) else None


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
    hit = _reusable(state, 0, "baseline", key, model_dir)
    if hit:
        _reuse(state, 0, hit)
        metrics, preds = hit["metrics"], hit["predictions"]
    else:
        state.run.clear_stage(0, "baseline")
        measured = state.measured_key(baseline=True, scored=state.scored) if state.cache else None
        _, metrics, preds = cached(state, measured, None, lambda: ({}, *state.measure(model_dir, "baseline")),
                                  "baseline:")
        metrics = {**metrics, **state.task.baseline(state.data.test, preds["test"])}
        record = {"name": "baseline", "method": "baseline", "status": "passed", "artifact": str(model_dir),
                  "artifact_sha256": state.source_sha256, "kind": "torch", "gates": [], "details": {},
                  "run_id": state.run_id}
        state.run.write_stage(0, "baseline", record, {"reuse": key}, metrics, state.predictions(preds))
    state.baseline, state.baseline_preds, state.previous = metrics, preds, metrics
    summarise_library_messages("baseline")  # what loading and measuring the model said, not the first stage's
    primary = state.task.primary
    log.info("baseline: %s (%s CI [%.4f, %.4f])", measured_text(metrics), words(primary),
             *metrics[f"{primary}_ci95"])


def _stages(state: RunState) -> tuple[str, Outcome] | None:
    """Run (or reuse) every stage in order; (name, outcome) of the first one that failed, or None."""
    for index, stage in enumerate(state.cfg.stages, start=1):
        evaluated = {"evaluation": ONNX_EVALUATION} if METHODS[stage.method].output(state.kind).startswith("onnx") \
            else {}
        key = state.reuse_key({**stage.model_dump(mode="json"), **evaluated,
                               **METHODS[stage.method].later(stage.params, state.context(stage))})
        hit = _reusable(state, index, stage.name, key, state.run.stage_dir(index, stage.name) / "model")
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
        if state.progress is not None:
            state.progress(stage.name)
    return None


def _final_bundle(state: RunState) -> None:
    """RUN_DIR/final: the model that passed every gate, shaped for the run's target (only when every stage
    passed); `edgepress bundle` calls the same function."""
    root = state.run.root
    gates = [{"stage": stage["name"], **{k: gate.get(k) for k in ("kind", "rule", "limit", "value", "passed")}}
             for stage in build_report(state.run)["stages"] for gate in stage.get("gates", [])]
    manifest = run_manifest(root, state.cfg, state.data, state.previous, state.meta, state.source, state.task, gates)
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
    elif refused_by_system(error) is not None:
        message = str(refused_by_system(error))
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
    return GateFailed(f"stage '{name}' missed its gates ({_missed(outcome)}); {where}", stage=name,
                      gates=tuple(g for g in outcome.gates if not g["passed"]))


TRIAL_NOTE = ("a search trial: the validation split stands in for the test split, which the search scores only "
              "for its finalists")


def run_pipeline(cfg: PipelineConfig, out: Path, resume: bool = False, config_file: Path | None = None,
                 cache: Path | None = None, evaluate_on: str = "test", noise_note: bool = True,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Run `cfg` into `out`; returns the report. Raises GateFailed (after writing the report) when a stage and all
    its fallbacks miss a gate. With `resume`, each stage an earlier run in `out` passed with the same config,
    input artifact and data (every split's ids, texts and labels) is reused instead of run again. `config_file`, the
    YAML `cfg` came from, is kept apart from what the run replaces like the model and the data. With `cache` (a
    dir), every stage attempt is looked up in and stored to that stage cache (pipeline/stagecache.py).
    `evaluate_on="validation"` (a search trial) measures and gates every stage on the validation split, which then
    stands in for the test split everywhere (the methods' own details included, the data's digest and so every
    cache and resume key too): a trial never reads the test split. `noise_note=False`: no warning for an accuracy
    gate inside the test split's noise nor for a part of the config left unused (`config_notes`): a search's winner,
    whose report speaks of its constraint and whose config the search wrote. `progress(name)` is called as each
    stage passes (run or reused), once the report holds it."""
    run = RunDir(Path(out))
    check_not_written(run.root)  # before the checks: what they read there is another process's, half written
    model_dir, data = check_inputs(cfg, run.root, config_file=config_file)
    with writing(run.root, "--out"):
        return _run(cfg, run, model_dir, data, resume, cache, evaluate_on, noise_note, progress)


def _run(cfg: PipelineConfig, run: RunDir, model_dir: Path | None, data, resume: bool, cache: Path | None,
         evaluate_on: str, noise_note: bool, progress: Callable[[str], None] | None) -> dict:
    """`run_pipeline` once its inputs are checked and it holds the run dir's lock."""
    out = run.root
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
                     target=resolve_target(cfg.runtime.target), cache=stage_cache, task=run_task(cfg),
                     progress=progress)
    try:
        run.prepare([s.name for s in cfg.stages], state.resume)
    except OSError as e:
        raise refused_by_system(e, out) or ConfigError(f"--out {out} cannot be written: {e}. Fix: choose a directory "
                                                       f"you can write") from None
    with run_log(run.root):
        if earlier:
            log.info("%s held an earlier run: every stage runs again (--resume reuses the stages whose config, input "
                     "and data are unchanged)", out)
        try:
            _record_run(state, "running")
            run.write_split(data)
            for line in missing_classes(data.class_counts()):
                log.warning("data: %s (the report says so too)", line)
            for line in config_notes(cfg, len(data.test)) if evaluate_on == "test" and noise_note else ():
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
            refused = refused_by_system(e)
            if refused is not None and refused is not e:
                raise refused from None
            raise
    if failed is not None:
        raise _failure_error(state, *failed)
    return report
