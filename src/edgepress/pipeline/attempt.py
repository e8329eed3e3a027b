"""One attempt at a stage: a method run on the stage's input with the params it takes from the run (`Method.fill`,
the target's defaults, the parity gate's limits), its artifact measured and gated; with a stage cache, an earlier
identical attempt's result taken instead (`cached`). A method's EdgepressError is a failed attempt, never the end of
the run. The runner's loop (`runner.py`) tries a stage's attempts in turn."""

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgepress.configs import build
from edgepress.errors import EdgepressError, ExportParityError, SystemRefused
from edgepress.logs import duration, readable, summarise_library_messages, words
from edgepress.pipeline.config import Gates, ParityGate, StageConfig, with_target
from edgepress.pipeline.gates import evaluate_gates
from edgepress.pipeline.latency import side_by_side_speedup
from edgepress.pipeline.launch import launched
from edgepress.pipeline.state import RunState
from edgepress.registry import METHODS
from edgepress.tasks import recorded_task

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


def _with_parity_limits(params: dict, gate: ParityGate | None, config_type) -> dict:
    """A parity gate's limits become the method's own parity tolerance (the method checks parity itself)."""
    if gate is None or "parity" not in config_type.model_fields:
        return params
    limits = {k: v for k, v in gate.model_dump().items() if v is not None}
    return {**params, "parity": {**params.get("parity", {}), **limits}}


def _method_params(state: RunState, stage: StageConfig, method: str, params: dict) -> dict:
    """The params a method runs with: the stage's, `data.max_length` unless the stage sets its own, what the method
    takes from the run (`Method.fill`: int4's `torch_model`, `teacher: baseline`, optimize's timing), and the parity
    gate's limits. (The target's defaults are already in `params`: `attempt`.)"""
    spec = METHODS[method]
    if "max_length" in spec.config.model_fields and "max_length" not in params:
        params = {**params, "max_length": state.cfg.data.max_length}
    return _with_parity_limits(spec.filled(params, state.context(stage)), stage.gates.parity, spec.config)


def _parity_gates(error: ExportParityError, cfg) -> list[dict]:
    """The parity gates a method's own check missed, with the limits it applied."""
    limits = error.limits or cfg.parity
    gate = ParityGate(max_abs_diff=limits.max_abs_diff, min_agreement=limits.min_agreement)
    return evaluate_gates(Gates(parity=gate), {}, {}, {}, error.result)


def _call(state: RunState, method: str, cfg, dst: Path) -> dict:
    """The method's details: called here, or for a training method with `runtime.launch` set, in the processes the
    launcher starts."""
    spec, launch = METHODS[method], state.cfg.runtime.launch
    if launch is None or not spec.trains:
        return spec.call(state.kind, state.source, dst, state.data if spec.inputs == "splits" else
                         state.data.validation.texts, cfg, state.task)
    job = {"data": state.cfg.data.model_dump(mode="json"), "data_sha256": state.data_sha256, "task": state.task.name,
           "label2id": {name: i for i, name in state.data.id2label.items()}}
    details = launched(launch, method, state.source, dst, cfg.model_dump(mode="json"), job,
                       dst.parent / f"launch-{method}.log")
    return {**details, "launch": launch}


def attempt(state: RunState, stage: StageConfig, method: str, params: dict, dst: Path) -> Outcome:
    """Run one method on the stage's input, measure and gate what it gives; its EdgepressError is a failed
    attempt (a parity miss is recorded as the parity gate it is), never the end of the run; but the machine refusing
    a step (SystemRefused: a full disk, no memory) ends it, resumable."""
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
        time_speedup(state, stage, metrics, dst)
    except SystemRefused:  # the machine's refusal (a full disk), not the method's: no fallback would fare better
        raise
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
             "missed a gate", duration(time.perf_counter() - started), measured_text(metrics))
    return Outcome(method, cfg.model_dump(mode="json"), status, metrics, preds, gates, details)


def time_speedup(state: RunState, stage: StageConfig, metrics: dict, artifact: Path) -> None:
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
        statistic = cpu[key].get("statistic", "p50")
        log.info("stage %s: %.2fx the baseline side by side%s (%s %.2f ms vs %.2f ms)", stage.name,
                 cpu[key]["speedup"], where, statistic, cpu[key][f"{statistic}_ms"],
                 cpu[key][f"baseline_{statistic}_ms"])


def measured_text(metrics: dict) -> str:
    """'accuracy 0.8392, 7.8 MB, cpu p50 4.20 ms' for a log line (an embedder's: its neighbour overlap)."""
    latency = ", ".join(f"{p} p50 {m['p50_ms']:.2f} ms" for p, m in metrics.get("latency", {}).items())
    primary = recorded_task(metrics).primary
    score = f"{words(primary)} {metrics[primary]:.4f}" if primary in metrics else ""
    return ", ".join(filter(None, (score, f"{metrics['size_bytes'] / 1e6:.1f} MB", latency)))


def _computed(state: RunState, stage: StageConfig, method: str, cfg, dst: Path
              ) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """(details, metrics, test predictions) of the method run on the stage's input into `dst`, measured (or, with a
    stage cache, an earlier identical attempt's)."""
    def compute() -> tuple[dict, dict, dict[str, np.ndarray]]:
        return _made(state, stage, method, cfg, dst), *state.measure(dst, f"stage {stage.name}")

    return cached(state, {**state.attempt_key(method, cfg), "scored": state.scored} if state.cache else None, dst,
                   compute, f"stage {stage.name}: {method}")


def _made(state: RunState, stage: StageConfig, method: str, cfg, dst: Path) -> dict:
    """The method's details, its artifact written to `dst`. What a method makes depends on the train and validation
    splits (training, calibration, parity texts), not on the test split, unless it `reads_test`: with a stage cache,
    its artifact is shared by runs that differ only in their test split (a search's trials, measured on validation,
    and its winner's run, measured on test), and each measures it on its own test split."""
    if state.cache is None or METHODS[method].reads_test:
        return _call(state, method, cfg, dst)
    key = {**state.attempt_key(method, cfg), "data_sha256": state.fit_sha256, "measured": False}
    details, _, _ = cached(state, key, dst, lambda: (_call(state, method, cfg, dst), {}, {}),
                            f"stage {stage.name}: {method}'s model", mark="made_in",
                            because="made on the same train and validation splits: ")
    return details


def cached(state: RunState, key: dict | None, dst: Path | None, compute, what: str, mark: str = "cache_entry",
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
