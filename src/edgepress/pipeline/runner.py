"""`edgepress run`: baseline, then each stage in order; after every stage measure, then gate. A stage that misses a
gate tries its fallbacks; when none passes the run stops (GateFailed, exit 3). The report is written either way."""

import json
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from edgepress.configs import build
from edgepress.data import DataSplits, load_data
from edgepress.data.metrics import accuracy_drop_ci95
from edgepress.deploy.bundle import write_bundle
from edgepress.errors import ExportParityError, GateFailed
from edgepress.files import read_json, write_json
from edgepress.models.loading import label2id_of
from edgepress.models.teacher import resolve_model
from edgepress.pipeline.config import Gates, ParityGate, PipelineConfig, StageConfig
from edgepress.pipeline.environment import environment
from edgepress.pipeline.gates import evaluate_gates
from edgepress.pipeline.latency import onnx_path
from edgepress.pipeline.measure import measure_artifact
from edgepress.pipeline.report import write_report
from edgepress.pipeline.rundir import RunDir, attach_log
from edgepress.registry import METHODS

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one attempt at a stage produced."""

    method: str
    config: dict
    status: str
    metrics: dict
    preds: np.ndarray | None
    gates: list[dict]
    details: dict


def _with_parity_limits(params: dict, gate: ParityGate | None, config_type) -> dict:
    """A parity gate's limits become the method's own parity tolerance (the method checks parity itself)."""
    if gate is None or "parity" not in config_type.model_fields:
        return params
    limits = {k: v for k, v in gate.model_dump().items() if v is not None}
    return {**params, "parity": {**params.get("parity", {}), **limits}}


def _parity_failure(error: ExportParityError, cfg) -> tuple[list[dict], dict]:
    gate = ParityGate(max_abs_diff=cfg.parity.max_abs_diff, min_agreement=cfg.parity.min_agreement)
    gates = evaluate_gates(Gates(parity=gate), {}, {}, {}, error.result)
    return gates, {"error": str(error), "parity": error.result}


def _attempt(stage: StageConfig, method: str, params: dict, src: Path, dst: Path, ctx: dict) -> Outcome:
    spec = METHODS[method]
    cfg = build(spec.config, _with_parity_limits(params, stage.gates.parity, spec.config), where=f"stage {stage.name}")
    log.info("stage %s: %s %s", stage.name, method, json.dumps(params) if params else "(defaults)")
    try:
        inputs = ctx["data"] if spec.inputs == "splits" else ctx["data"].validation.texts
        details = spec.run(src, dst, inputs, cfg)
    except ExportParityError as e:
        gates, details = _parity_failure(e, cfg)
        return Outcome(method, cfg.model_dump(mode="json"), "failed", {}, None, gates, details)
    metrics, preds = ctx["measure"](dst)
    metrics["accuracy_drop_ci95"] = accuracy_drop_ci95(ctx["data"].test.labels, ctx["baseline_preds"], preds)
    gates = evaluate_gates(stage.gates, metrics, ctx["baseline"], ctx["previous"], details.get("parity"))
    status = "passed" if all(g["passed"] for g in gates) else "failed"
    return Outcome(method, cfg.model_dump(mode="json"), status, metrics, preds, gates, details)


def _missed(gates: list[dict]) -> str:
    return "; ".join(f"{g['kind']}.{g['rule']} {g['value']} vs limit {g['limit']}" for g in gates if not g["passed"])


def _run_stage(run: RunDir, index: int, stage: StageConfig, src: Path, ctx: dict) -> Outcome:
    """Every attempt (the stage's method, then its fallbacks) until one passes; the stage record is written."""
    folder = run.stage_dir(index, stage.name)
    tries = [(stage.method, stage.params), *((a.method, a.params) for a in stage.on_fail.fallback)]
    attempts = []
    for method, params in tries:
        outcome = _attempt(stage, method, params, src, folder / "model", ctx)
        attempts.append({"method": method, "status": outcome.status, "gates": outcome.gates,
                         **({"error": outcome.details["error"]} if "error" in outcome.details else {})})
        if outcome.status == "passed":
            break
        log.warning("stage %s: %s missed %s", stage.name, method, _missed(outcome.gates))
    config = {"stage": stage.model_dump(mode="json"), "method": outcome.method, "params": outcome.config}
    run.write_stage(index, stage.name, method=outcome.method, artifact=str(folder / "model"), config=config,
                    metrics=outcome.metrics, status=outcome.status, gates=outcome.gates,
                    details={**outcome.details, "attempts": attempts},
                    predictions=_predictions(ctx["data"], outcome.preds))
    return outcome


def _predictions(data: DataSplits, preds: np.ndarray | None) -> dict | None:
    if preds is None:
        return None
    return {"ids": list(data.test.ids), "labels": data.test.labels.tolist(), "predictions": preds.tolist()}


def _reused(run: RunDir, index: int, name: str, same_config, ctx: dict) -> tuple[dict, np.ndarray] | None:
    """An earlier run's result for this stage, when --resume is on and everything before it was reused too."""
    if not ctx["resume"]:
        return None
    hit = run.reusable(index, name, same_config, list(ctx["data"].test.ids))
    if hit is None:
        ctx["resume"] = False  # this stage and every later one run again
        run.drop_stages_from(index)
        return None
    log.info("%s: reused from the earlier run (--resume)", name)
    return hit[0], np.asarray(hit[1])


def _baseline(run: RunDir, cfg: PipelineConfig, model_dir: Path, ctx: dict) -> None:
    config = {"model": cfg.model, "model_dir": str(model_dir), "data": cfg.data.model_dump(mode="json"),
              "runtime": cfg.runtime.model_dump(mode="json")}
    hit = _reused(run, 0, "baseline", lambda recorded: recorded == config, ctx)
    metrics, preds = hit or ctx["measure"](model_dir)
    if hit is None:
        run.write_stage(0, "baseline", method="baseline", artifact=str(model_dir), config=config, metrics=metrics,
                        predictions=_predictions(ctx["data"], preds))
    ctx.update(baseline=metrics, previous=metrics, baseline_preds=preds)
    log.info("baseline: accuracy %.4f %s", metrics["accuracy"], metrics["accuracy_ci95"])


def _final_bundle(run: RunDir, cfg: PipelineConfig, artifact: Path, data: DataSplits, metrics: dict) -> None:
    """RUN_DIR/final: the model that passed every gate, shaped for a device (only when every stage passed)."""
    summary = {k: metrics[k] for k in ("accuracy", "accuracy_ci95", "n_test", "size_bytes")}
    summary["latency_p50_ms"] = {p: m["p50_ms"] for p, m in metrics.get("latency", {}).items()}
    write_bundle(artifact, run.root / "final", {
        "model": cfg.model, "data": data.source, "max_length": cfg.data.max_length,
        "labels": {str(k): v for k, v in data.id2label.items()}, "stages": [s.name for s in cfg.stages],
        "source_artifact": str(artifact), "metrics": summary, "target": cfg.runtime.target,
    })


def _same_split(run: RunDir, data: DataSplits) -> bool:
    """The earlier run in this dir split the data exactly as now (every stage's training and test depend on it)."""
    path = run.root / "data_split.json"
    return path.is_file() and read_json(path)["sha256"] == data.manifest()["sha256"]


def run_pipeline(cfg: PipelineConfig, out: Path, resume: bool = False) -> dict:
    """Run `cfg` into `out`; returns the report. Raises GateFailed (after writing the report) when a stage and all
    its fallbacks miss a gate. With `resume`, the baseline and the leading stages that an earlier run in `out`
    passed with the same config, data split and test examples are reused instead of run again."""
    run = RunDir(Path(out))
    run.clear(keep_stages=resume)
    handler = attach_log(run.root)
    try:
        model_dir = resolve_model(cfg.model)
        data = load_data(cfg.data, label2id_of(model_dir))
        write_json(run.root / "run.json", {"config": cfg.model_dump(mode="json"), "environment": environment()})
        measure = partial(measure_artifact, data=data, max_length=cfg.data.max_length,
                          providers=cfg.runtime.providers, threads=cfg.runtime.threads, latency=cfg.runtime.latency)
        ctx = {"data": data, "measure": measure, "resume": resume and _same_split(run, data)}
        run.write_split(data)
        _baseline(run, cfg, model_dir, ctx)
        src, failed = model_dir, None
        for index, stage in enumerate(cfg.stages, start=1):
            declared = stage.model_dump(mode="json")
            hit = _reused(run, index, stage.name, lambda recorded, d=declared: recorded.get("stage") == d, ctx)
            outcome = None if hit else _run_stage(run, index, stage, src, ctx)
            if outcome is not None and outcome.status != "passed":
                failed = (stage, outcome)
                break
            src, ctx["previous"] = run.stage_dir(index, stage.name) / "model", hit[0] if hit else outcome.metrics
        if not failed and onnx_path(src) is not None:
            _final_bundle(run, cfg, src, data, ctx["previous"])
        report = write_report(run)
    finally:
        logging.getLogger("edgepress").removeHandler(handler)
        handler.close()
    if failed:
        stage, outcome = failed
        raise GateFailed(f"stage '{stage.name}' missed its gates ({_missed(outcome.gates)}); "
                         f"report: {run.root / 'report.json'}")
    return report
