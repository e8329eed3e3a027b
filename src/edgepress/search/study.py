"""`edgepress search`: the fastest (or smallest) pipeline that passes the user's constraints, found by Optuna.

Flow: check the inputs and every point of the space (each is an ordinary pipeline: `config.pipeline_for`); time
every architecture shape as it would ship (`shapes.time_shapes`) and drop those that cannot meet the constraints or
are beaten by another; then trials, each an `edgepress run` of one point into SEARCH_DIR/trials/NNNN, measured and
gated on the **validation** split (`run_pipeline(evaluate_on="validation")`), sharing SEARCH_DIR/cache (a stage
cache: a distilled student is trained once for every trial that starts with it). Optuna's multi-objective TPE draws
the points (accuracy up, the objective down, the constraints as its constraints), latency first: until a trial
passes, each trial takes the fastest (for `objective: size`, the smallest) shape not yet settled, and once one has
passed, a point whose shape is slower in the shape table than a passing trial's of the same quantization is never
run (`beaten_by`): fast shapes are also the cheapest to train, and a hopeless one is pruned after two epochs of its
first stage. At the end the passing trials on the validation front are the finalists: their final models are scored
once on the test split, and the winner's pipeline is written as best.yaml and run as such into SEARCH_DIR/best (its
report, its bundle).

What is on disk: the study (SEARCH_DIR/study.db, or the --storage URL) is the record of what was tried; a trial is
told to it only once its run dir is complete. A trial whose training falls too far below the accuracy constraint
is pruned at that epoch (`EpochWatch`; Optuna's own pruners refuse multi-objective studies), and a later trial that
would train the same stages again is pruned before it starts. A killed search leaves a running trial, failed when
the search is resumed (`--resume`: at once for a worker of this machine whose process is gone; by Optuna's
heartbeat for one on another machine). The report is rewritten after every trial.

This module is the search's loop and its end (`run_search`, `search_loop`, `finish`); what the trials share is made
in `prepare.py`, the study kept in `storage.py`, one trial run and read in `trial.py`, and which trials count and
which points are not worth running decided in `policy.py`."""

import collections
import logging
import math
import os
import socket
import time
from pathlib import Path

import numpy as np
import yaml

from edgepress.errors import ConfigError, GateFailed
from edgepress.files import read_json, write_json, write_text
from edgepress.interrupt import check as check_interrupt
from edgepress.logs import words
from edgepress.pipeline.config import PipelineConfig
from edgepress.search.config import SearchConfig, pipeline_for
from edgepress.search.policy import best_passing, validation_front
from edgepress.search.prepare import Prepared, distributions, point_of, prepare, search_noise
from edgepress.search.storage import (
    ask,
    asked_trials,
    await_others,
    counted_trials,
    fail_dead_trials,
    open_study,
    tell,
    trial_rows,
)
from edgepress.search.trial import settle, space_points, unsettled_points

log = logging.getLogger(__name__)


FINALISTS = 3


class SearchExhausted(GateFailed):
    """The budget ended before any trial passed the constraints (exit 3, the report written)."""


def _expected(durations: list[tuple[float, str]]) -> float:
    """What the next trial is expected to take: the median of the trials that trained to the end (pruned ones stop
    early, and the next may not), else of all."""
    full = [seconds for seconds, stop in durations if stop != "pruned"] or [seconds for seconds, _ in durations]
    return float(np.median(full)) if full else 0.0


def search_loop(cfg: SearchConfig, prepared: Prepared, out: Path, study, budget_s: float | None,
                trials: int | None, progress) -> dict:
    """Trials until `trials` are in the study (one killed with its worker not counted) or the budget would be overrun
    by one more (the median trial's time); returns how the time was spent."""
    started, durations, exhausted, settled = time.monotonic(), [], False, False
    drawn = distributions(prepared)
    while True:
        check_interrupt()
        fail_dead_trials(study)  # a killed local worker's trial: its point is free again
        done = len(counted_trials(study))
        if trials is not None and done >= trials:
            break
        elapsed = time.monotonic() - started
        if budget_s is not None and elapsed + _expected(durations) > budget_s:
            break
        untried = unsettled_points(cfg, prepared, study)
        if not untried:
            log.warning("every point of the space has been tried (or starts with a pruned trial's stages): the "
                        "search ends before its limit")
            exhausted = True
            break
        # latency first: until a trial passes, and after a draw settled without a run, the next trial takes the
        # fastest (smallest) point not yet settled instead of the sampler's draw
        lead = untried[0] if settled or best_passing(study, cfg.objective) is None else None
        trial = ask(study, drawn, out, lead, cfg.seed)
        trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": os.getpid()})
        point = point_of(prepared, trial.params)
        log.info("trial %d: %s", trial.number, point)
        result = settle(cfg, prepared, out, study, trial, point)
        settled = result["stop"] == "beaten" or "same_as" in result
        if not settled:
            durations.append((result["seconds"], result["stop"]))
        tell(cfg, study, trial, result)
        write_search_report(cfg, prepared, out, study, spent={"seconds": time.monotonic() - started})
        if progress is not None:
            progress(trial.number, result, best_passing(study, cfg.objective))
    return {"seconds": time.monotonic() - started, "trials_here": len(durations), "exhausted": exhausted}


def score_finalists(cfg: SearchConfig, prepared: Prepared, finalists: list) -> dict:
    """Each finalist's final model scored once on the test split, against the teacher there, as a run measures a
    stage (`measure_artifact`, then the task's figures against the baseline's predictions): the task's primary
    metric (as `accuracy`) with its CI and the paired drop's CI. A finalist another machine's worker made (its
    model is not here) is named, not scored: that worker's own report scores it."""
    from edgepress.pipeline.measure import measure_artifact, measure_model_dir

    data, n, task = prepared.data, cfg.data.max_length, prepared.task
    teacher, teacher_preds = measure_model_dir(prepared.model_dir, data, n, task)
    scored = {"teacher": primary_figures(task, {**teacher, **task.baseline(data.test, teacher_preds)})}
    for trial in finalists:
        if not Path(trial.user_attrs["artifact"]).exists():
            scored[str(trial.number)] = {"elsewhere": trial.user_attrs.get("worker", {}).get("host")}
            continue
        metrics, preds = measure_artifact(Path(trial.user_attrs["artifact"]), data, n, (), cfg.runtime.threads,
                                          cfg.runtime.latency, task)
        scored[str(trial.number)] = primary_figures(task, {**metrics, **task.versus(data.test, teacher_preds, preds)})
    return scored


def primary_figures(task, metrics: dict) -> dict:
    """{accuracy, accuracy_ci95, drop_ci95}: the task's primary metric of a run's `metrics`, its CI, and the paired
    CI of its drop from the baseline's (where measured: not the baseline's own)."""
    primary = task.primary
    return {"accuracy": metrics[primary], "accuracy_ci95": metrics[f"{primary}_ci95"],
            "drop_ci95": metrics.get(f"{primary}_drop_ci95")}


def shape_points(cfg: SearchConfig, prepared: Prepared, study) -> dict[str, dict]:
    """Per allowed shape: {points: how many points of the space have it, left: how many of them are still to try
    (`unsettled_points`: not tried, not starting with a pruned trial's stages, not beaten by a passing trial)}."""
    points = collections.Counter(params["shape"] for params in space_points(prepared, prepared.shapes))
    left = collections.Counter(params["shape"] for params in unsettled_points(cfg, prepared, study))
    return {shape.name: {"points": points[shape.name], "left": left[shape.name]} for shape in prepared.shapes}


def write_search_report(cfg: SearchConfig, prepared: Prepared, out: Path, study, spent: dict,
                        finalists: dict | None = None, best: dict | None = None) -> dict:
    from edgepress.search.report import render_html, render_markdown

    front = validation_front(study)
    winner = best_passing(study, cfg.objective)
    report = {"config": cfg.model_dump(mode="json"), "objective": cfg.objective, "metric": prepared.metric,
              "shapes": prepared.table, "shape_points": shape_points(cfg, prepared, study),
              "required_accuracy": prepared.required,
              "trials": trial_rows(study), "front": [t.number for t in front],
              "winner": winner.number if winner else None, "finalists": finalists, "best": best, "spent": spent}
    write_json(out / "report.json", report)
    write_text(out / "report.md", render_markdown(report))
    write_text(out / "report.html", render_html(report))
    return report


def with_timed_choices(pipeline: PipelineConfig, run_dir: Path) -> PipelineConfig:
    """`pipeline` with what its trial's run chose by timing written in: each `fusions: auto` stage becomes
    `fusions: all` less the set that trial left out. Timed again, on a busy machine, auto can keep another set (another
    graph, size and speed), and best.yaml would no longer be the trial it names."""
    done = {stage["name"]: stage.get("details") or {} for stage in read_json(run_dir / "report.json")["stages"]}
    stages = []
    for stage in pipeline.stages:
        chose = done.get(stage.name, {})
        if stage.method == "optimize" and "timing" in chose:
            stage = stage.model_copy(update={"params": {**stage.params, "fusions": "all",
                                                        "disable": chose["disabled"]}})
        stages.append(stage.model_dump(mode="json"))
    return PipelineConfig.model_validate({**pipeline.model_dump(mode="json"), "stages": stages})


def finish(cfg: SearchConfig, prepared: Prepared, out: Path, study, spent: dict) -> dict:
    """The finalists scored on test, best.yaml written and run into SEARCH_DIR/best (its report and bundle)."""
    from edgepress.pipeline.runner import run_pipeline

    front = validation_front(study)[:FINALISTS]
    winner = best_passing(study, cfg.objective)
    if winner is None:
        write_search_report(cfg, prepared, out, study, spent)
        raise SearchExhausted(f"no trial passed the constraints in {len(asked_trials(study))} trial(s); the best found "
                              f"is in {out / 'report.md'}. Fix: a longer --budget or more --trials, or looser "
                              f"constraints")
    finalists = score_finalists(cfg, prepared, [*front, *([] if winner in front else [winner])])
    pipeline = with_timed_choices(pipeline_for(cfg, prepared.depth, point_of(prepared, winner.params), prepared.task),
                                  Path(winner.user_attrs["run_dir"]))
    metric = words(prepared.metric)
    header = (f"# The search's winner (trial {winner.number} of {out}): validation {metric} "
              f"{winner.values[0]:.4f}, {cfg.objective} {winner.values[1]:.4g}.\n"
              f"# `edgepress run best.yaml --out RUN_DIR` reproduces it (the fusions are those the trial's timing "
              f"chose on this machine).\n")
    body = pipeline.model_dump(mode="json", exclude_defaults=True)  # but the model and the data, always named
    body = {"model": pipeline.model, "data": {"source": pipeline.data.source, **body.pop("data", {})},
            **{k: v for k, v in body.items() if k != "model"}}
    write_text(out / "best.yaml", header + yaml.safe_dump(body, sort_keys=False))
    missed = None
    try:
        run_pipeline(pipeline, out / "best", cache=out / "cache", config_file=out / "best.yaml", noise_note=False)
    except GateFailed as e:  # passed on validation, not on test: the verdict is the test split's
        missed = str(e)
    final = read_json(out / "best" / "report.json")["stages"][-1]["metrics"]
    best = {"trial": winner.number, **primary_figures(prepared.task, final),
            "p50_ms": final["latency"][cfg.runtime.providers[0]]["p50_ms"], "size_mb": final["size_bytes"] / 1e6,
            "natural_mean_ms": final["latency"][cfg.runtime.providers[0]]["natural"]["mean_ms"],
            **({"deferred": final["deferred"]} if "deferred" in final else {}),
            "passed": missed is None, "bundle": str(out / "best" / "final") if missed is None else None,
            "reproduced": math.isclose(final[prepared.metric], finalists[str(winner.number)]["accuracy"])
            if "accuracy" in finalists[str(winner.number)] else None}
    report = write_search_report(cfg, prepared, out, study, spent, finalists, best)
    if missed is not None:
        raise GateFailed(f"the winner on validation (trial {winner.number}) missed the constraints on the test split "
                         f"when best.yaml ran: {missed}")
    return report


def run_search(cfg: SearchConfig, out: Path, budget_s: float | None = None, trials: int | None = None,
               resume: bool = False, storage: str | None = None, config_file: Path | None = None,
               progress=None) -> dict:
    """Search `cfg`'s space into `out`; returns the report. Raises ConfigError (exit 2) before any training for bad
    input or an empty space, SearchExhausted (exit 3) when no trial passed."""
    out = Path(out)
    if budget_s is None and trials is None:
        raise ConfigError("a search needs a limit. Fix: give --budget (e.g. 2h) or --trials N")
    if storage is not None and not storage.strip():  # e.g. --storage "$URL" with URL unset
        raise ConfigError("--storage is empty. Fix: give a database URL (e.g. postgresql+psycopg://user:password@host/"
                          "db), or leave --storage out for SEARCH_DIR/study.db")
    prepared = prepare(cfg, out, resume, config_file)
    if (line := search_noise(cfg, len(prepared.data.validation))) is not None:
        log.warning("%s", line)
    study = open_study(cfg, out, storage)
    killed = fail_dead_trials(study)
    if killed:
        log.warning("trials %s were stopped by a killed search: failed, the search goes on", killed)
    spent = search_loop(cfg, prepared, out, study, budget_s, trials, progress)
    await_others(study)
    from filelock import FileLock

    with FileLock(out / ".finish.lock"):  # workers sharing SEARCH_DIR finish one after the other
        return finish(cfg, prepared, out, study, spent)
