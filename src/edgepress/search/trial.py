"""One trial: an ordinary `run_pipeline` of its point on the validation split, pruned at an epoch that can no longer
meet the accuracy constraint (`EpochWatch`) or before it starts when an earlier trial pruned the same stages;
what its report says (`trial_result`); a point already decided (`settle`) and the points still to try."""

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from edgepress.errors import EdgepressError, GateFailed
from edgepress.files import read_json
from edgepress.interrupt import check as check_interrupt
from edgepress.logs import words
from edgepress.pipeline.gates import gate_name
from edgepress.search.config import SearchConfig, cascade_params, pipeline_for
from edgepress.search.policy import beaten_by, passing_trials, shape_figure
from edgepress.search.prepare import Prepared, point_of
from edgepress.search.storage import finished_twin, twin_result
from edgepress.tasks import recorded_task

log = logging.getLogger(__name__)


class TrialPruned(EdgepressError):
    """A trial's training stopped at an epoch: it could no longer meet the accuracy constraint."""

    exit_code = 3


@dataclass
class EpochWatch:
    """Watches every training epoch of one trial (`models.train.watch_epochs`): counts them, and stops the trial when
    a stage can no longer reach `required`. From a stage's second epoch on, its best validation accuracy so far plus
    its pace for every epoch left (optimistic: gains shrink as training goes on) must come within `margin` of it.
    The first epoch is never judged: how fast a student learns depends on the task (the topic teacher went from
    0.911 to 0.972 between its first and second epochs)."""

    required: float
    margin: float
    epochs: int = 0
    best: float | None = None
    why: str = ""

    @staticmethod
    def scores(history: list[dict]) -> tuple[str, list[float]]:
        """(what the training run keeps its epochs by, its value at each epoch): the history's one `val_` figure (a
        classifier's `val_accuracy`, a token classifier's `val_f1`, a sentence encoder's `val_neighbour_overlap`)."""
        key = next(k for k in history[0] if k.startswith("val_"))
        return words(key.removeprefix("val_")), [h[key] for h in history]

    @classmethod
    def projected(cls, history: list[dict], epochs: int) -> float | None:
        """What the stage could reach by its last epoch at its pace: the larger of its last epoch's gain and its
        mean gain per epoch so far (one flat or noisy epoch does not stop a stage still learning), for every epoch
        left (None after one epoch)."""
        if len(history) < 2:
            return None
        _, score = cls.scores(history)
        pace = max(0.0, score[-1] - score[-2], (max(score) - score[0]) / (len(score) - 1))
        return max(score) + pace * (epochs - history[-1]["epoch"])

    def __call__(self, history: list[dict], epochs: int) -> None:
        self.epochs += 1
        name, score = self.scores(history)
        self.best = max(score)
        projected = self.projected(history, epochs)
        if projected is not None and projected < self.required - self.margin:
            self.why = (f"pruned after epoch {history[-1]['epoch']}/{epochs}: validation {name} {self.best:.4f}, "
                        f"at most {projected:.4f} by epoch {epochs} at its pace, more than {self.margin:g} below the "
                        f"{self.required:.4f} the constraint requires")
            raise TrialPruned(self.why)


def _stopped_at(report: dict) -> dict | None:
    """The stage record a run stopped at (the stages after it are listed as skipped)."""
    return next((s for s in report["stages"] if s["status"] not in ("passed", "skipped")), None)


def trial_result(cfg: SearchConfig, run_dir: Path) -> dict:
    """What a trial's run says, from its report: the last stage measured (its validation score by the task's primary
    metric, as `accuracy`; latency, size), its agreement with the teacher (the task's: labels, entity tags, or
    neighbours), and the constraints' violations (<= 0: met)."""
    report = read_json(run_dir / "report.json")
    metric = recorded_task(report["baseline"]["metrics"]).primary
    measured = [s for s in report["stages"] if metric in s["metrics"]]
    last = measured[-1] if measured else None
    if last is None or last is not report["stages"][-1]:
        failed = _stopped_at(report)
        return {"stop": "error", "why": report.get("error") or (failed and failed["status"]) or "no stage ran"}
    m, provider = last["metrics"], cfg.runtime.providers[0]
    result = {"metric": metric, "accuracy": m[metric], "teacher_accuracy": report["baseline"]["metrics"][metric],
              "drop_ci95": m.get(f"{metric}_drop_ci95"), "p50_ms": m["latency"][provider]["p50_ms"],
              "natural_mean_ms": m["latency"][provider]["natural"]["mean_ms"],
              "natural_p99_ms": m["latency"][provider]["natural"]["p99_ms"],
              **({"deferred": m["deferred"]} if "deferred" in m else {}),
              "size_mb": m["size_bytes"] / 1e6, "agreement": m["agreement"], "artifact": last["artifact"]}
    violations = {gate_name(g): 1.0 if g["excess"] is None else g["excess"] for g in last["gates"]}
    if cfg.constraints.fidelity:
        violations["fidelity.min_agreement"] = cfg.constraints.fidelity.min_agreement - result["agreement"]
    missed = [name for name, excess in violations.items() if excess > 0]
    return {**result, "violations": violations, "stop": "passed" if not missed else "missed",
            "why": ", ".join(missed)}


def _prefix(pipeline, stage: str) -> str:
    """The stages of `pipeline` up to `stage`, as what they compute (method and params, and the transfer texts they
    draw): two trials with the same prefix train the same models on the same teacher and data."""
    names = [s.name for s in pipeline.stages]
    stages = [[s.method, s.params] for s in pipeline.stages[:names.index(stage) + 1]]
    unlabeled = pipeline.data.unlabeled  # trained on too: part of what the prefix computes (when there is any)
    return json.dumps(stages if unlabeled is None else {"unlabeled": pipeline.data.transfer.model_dump(mode="json"),
                                                        "stages": stages}, sort_keys=True)


def pruned_prefixes(study) -> dict[str, int]:
    """{stage prefix: the first trial pruned in it}, over every pruned trial."""
    import optuna

    prefixes = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,)):
        if "pruned_prefix" in t.user_attrs:
            prefixes.setdefault(t.user_attrs["pruned_prefix"], t.number)
    return prefixes


def pruned_before(pipeline, prefixes: dict[str, int]) -> tuple[int, str] | None:
    """(trial number, prefix) of an earlier trial pruned in a prefix of `pipeline`'s stages, if one was."""
    return next(((prefixes[p], p) for p in (_prefix(pipeline, s.name) for s in pipeline.stages) if p in prefixes),
                None)


def run_trial(cfg: SearchConfig, prepared: Prepared, out: Path, point: dict, number: int, study) -> dict:
    from edgepress.models.train import watch_epochs
    from edgepress.pipeline.runner import run_pipeline

    pipeline = pipeline_for(cfg, prepared.depth, point, prepared.task)
    run_dir = out / "trials" / f"{number:04d}"
    started = time.monotonic()
    prunes = cfg.pruning and cascade_params(point) is None  # a cascade lifts its student's accuracy after training
    before = pruned_before(pipeline, pruned_prefixes(study)) if prunes else None
    if before is not None:
        earlier = study.trials[before[0]].user_attrs
        return {"stop": "pruned", "why": f"as trial {before[0]} ({earlier['why']}), whose stages it starts with",
                "pruned_prefix": before[1], "excess": earlier["excess"], "epochs_trained": 0, "seconds": 0.0}
    watch = EpochWatch(prepared.required, cfg.pruning.margin) if prunes else None
    pruned = None
    with watch_epochs(watch) if watch else contextlib.nullcontext():
        try:
            run_pipeline(pipeline, run_dir, cache=out / "cache", evaluate_on="validation")
        except TrialPruned:
            pruned = _stopped_at(read_json(run_dir / "report.json"))["name"]
        except GateFailed:
            pass  # the report says which gate; a missed constraint is a result
        except EdgepressError as e:
            log.warning("trial %d: %s", number, e)
    trained = {"epochs_trained": watch.epochs if watch else None, "run_dir": str(run_dir)}
    if pruned is not None:
        return {"stop": "pruned", "why": f"{pruned} {watch.why}", "pruned_prefix": _prefix(pipeline, pruned),
                "excess": prepared.required - watch.best, "seconds": time.monotonic() - started, **trained}
    result = trial_result(cfg, run_dir) if (run_dir / "report.json").is_file() else {"stop": "error",
                                                                                      "why": "no report"}
    return {**result, "seconds": time.monotonic() - started, **trained}


def settle(cfg: SearchConfig, prepared: Prepared, out: Path, study, trial, point: dict) -> dict:
    """The trial's result: a twin's (a point already tried), `beaten` (it could not be faster or smaller than a
    trial that passed: not worth a run), or its run's. A run stopped by anything (Ctrl-C, an error) is recorded
    `interrupted` and failed, and the exception goes on."""
    import optuna
    from optuna.storages._heartbeat import get_heartbeat_thread  # Optuna's own, outside Study.optimize

    if (twin := finished_twin(study, trial.params)) is not None:
        return twin_result(twin)
    if (beaten := beaten_by(cfg, prepared, passing_trials(study), trial.params)) is not None:
        return {"stop": "beaten", "why": beaten, "seconds": 0.0, "epochs_trained": 0}
    beat = get_heartbeat_thread(trial._trial_id, study._storage)  # what Study.optimize runs for each trial
    beat.start()
    try:
        result = run_trial(cfg, prepared, out, point, trial.number, study)
        check_interrupt()  # a Ctrl-C the trial's run lost: the trial did not finish as asked
        return result
    except BaseException as e:
        trial.set_user_attr("stop", "interrupted")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if isinstance(e, OSError):  # a full disk, a removed dir: every later trial would meet it too
            raise EdgepressError(f"trial {trial.number} stopped: {e}. Fix: free the disk space (each trial keeps "
                                 f"its run in {out / 'trials'}; the stage cache is in {out / 'cache'}), then "
                                 f"--resume") from None
        raise
    finally:
        beat.join()


def space_points(prepared: Prepared, shapes: list) -> list[dict]:
    """Every point of the space on `shapes`, as trial params, shape by shape in their order."""
    import itertools

    space = prepared.space
    return [{"shape": shape.name, "vocab": vocab, "quantization": quantization, "epochs": epochs, **transfer,
             **cascade}
            for shape, vocab, quantization, epochs, transfer, cascade in itertools.product(
                shapes, space.vocab, space.quantization, space.epochs, space.transfers(), space.cascades())]


def unsettled_points(cfg: SearchConfig, prepared: Prepared, study) -> list[dict]:
    """The points of the space (its allowed shapes), as trial params, fastest (smallest) shape first, that no trial
    has finished or is running, that do not start with a pruned trial's stages and that a passing trial does not
    beat (`beaten_by`)."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    tried = {json.dumps(t.params, sort_keys=True) for t in study.get_trials(deepcopy=False, states=states)}
    pruned, passing, points = pruned_prefixes(study), passing_trials(study), []
    shapes = sorted(prepared.shapes, key=lambda shape: shape_figure(cfg, prepared, shape.name))
    for params in space_points(prepared, shapes):
        if json.dumps(params, sort_keys=True) in tried or beaten_by(cfg, prepared, passing, params):
            continue
        point = point_of(prepared, params)
        if not cfg.pruning or cascade_params(point) is not None or not pruned_before(
                pipeline_for(cfg, prepared.depth, point, prepared.task), pruned):
            points.append(params)
    return points
