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
heartbeat for one on another machine). The report is rewritten after every trial."""

import contextlib
import json
import logging
import math
import os
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from edgepress.data import DataSplits
from edgepress.errors import ConfigError, EdgepressError, GateFailed
from edgepress.files import check_apart, check_owned, check_writable, read_json, write_json, write_text
from edgepress.interrupt import check as check_interrupt
from edgepress.models.teacher import demo_depth
from edgepress.pipeline.gates import drop_noise, gate_name
from edgepress.pipeline.rundir import RunDir
from edgepress.search.config import SearchConfig, Space, pipeline_for
from edgepress.search.shapes import Shape, dominated, time_shapes

log = logging.getLogger(__name__)

MARKER = "search.json"  # what makes a directory a search dir
STUDY = "edgepress-search"
FINALISTS = 3
HEARTBEAT_S, GRACE_S = 60, 180  # a trial of a worker that stopped beating this long ago is failed (other machines)


class SearchExhausted(GateFailed):
    """The budget ended before any trial passed the constraints (exit 3, the report written)."""


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
    def projected(history: list[dict], epochs: int) -> float | None:
        """What the stage could reach by its last epoch at its pace: the larger of its last epoch's gain and its
        mean gain per epoch so far (one flat or noisy epoch does not stop a stage still learning), for every epoch
        left (None after one epoch)."""
        if len(history) < 2:
            return None
        accuracy = [h["val_accuracy"] for h in history]
        pace = max(0.0, accuracy[-1] - accuracy[-2], (max(accuracy) - accuracy[0]) / (len(accuracy) - 1))
        return max(accuracy) + pace * (epochs - history[-1]["epoch"])

    def __call__(self, history: list[dict], epochs: int) -> None:
        self.epochs += 1
        self.best = max(h["val_accuracy"] for h in history)
        projected = self.projected(history, epochs)
        if projected is not None and projected < self.required - self.margin:
            self.why = (f"pruned after epoch {history[-1]['epoch']}/{epochs}: validation accuracy {self.best:.4f}, "
                        f"at most {projected:.4f} by epoch {epochs} at its pace, more than {self.margin:g} below the "
                        f"{self.required:.4f} the constraint requires")
            raise TrialPruned(self.why)


@dataclass
class Prepared:
    """What the trials share: the teacher's dir and depth, the filled space, its shape table, the data splits, and
    the validation accuracy the accuracy constraint requires (the teacher's minus max_drop)."""

    model_dir: Path
    depth: int
    space: Space
    shapes: list[Shape]
    table: dict
    data: DataSplits
    required: float


def check_space(cfg: SearchConfig, loaded: tuple | None, depth: int, space) -> None:
    """Every point's pipeline is valid and every method's pre-run check accepts it on the teacher `loaded`
    ((model, tokenizer); None: the demo teacher, not built yet, is taken on trust); else one ConfigError naming
    each point refused (exit 2, before anything is trained)."""
    from edgepress.pipeline.inputs import check_methods

    if max(space.layers) > depth:
        raise ConfigError(f"space.layers asks for {max(space.layers)} layers; the teacher has {depth}. Fix: choose "
                          f"depths from 1 to {depth}")
    problems, checked = [], set()
    for point in space.points():
        try:
            pipeline = pipeline_for(cfg, depth, point)
            training = json.dumps([[s.method, s.params] for s in pipeline.stages], sort_keys=True)
            if loaded is not None and training not in checked:
                checked.add(training)
                check_methods(pipeline, *loaded)
        except EdgepressError as e:
            problems.append(f"point {point}: {e}")
    if problems:
        shown = "\n".join(f"  ✗ {p}" for p in problems[:5])
        raise ConfigError(f"{len(problems)} point(s) of the space cannot run:\n{shown}\nFix: narrow the space "
                          f"(space.layers, heads_keep, ffn_keep, quantization) to what this model takes")


def shape_table(prepared_dir: Path, model_dir: Path, shapes: list[Shape], cfg: SearchConfig, texts) -> dict:
    """The timed shapes (shapes.json in SEARCH_DIR, made once: a resumed search keeps its table)."""
    from edgepress.files import tree_sha256
    from edgepress.pipeline.stagecache import machine_key

    key = {"model_sha256": tree_sha256(model_dir), "shapes": [s.name for s in shapes],
           "runtime": cfg.runtime.model_dump(mode="json"), "max_length": cfg.data.max_length, "machine": machine_key()}
    path = prepared_dir / "shapes.json"
    if path.is_file() and read_json(path).get("key") == key:
        return read_json(path)["table"]
    latency = cfg.runtime.latency.model_copy(update={"warmup": min(cfg.runtime.latency.warmup, 10),
                                                     "runs": min(cfg.runtime.latency.runs, 50)})
    log.info("timing %d shapes as they would ship (export, fusion, int8), side by side", len(shapes))
    table = time_shapes(model_dir, shapes, texts, cfg.runtime.threads, latency, max_length=cfg.data.max_length)
    write_json(path, {"key": key, "table": table})
    return table


def allowed_shapes(cfg: SearchConfig, space, table: dict) -> tuple[list[Shape], dict[str, str]]:
    """(the shapes worth training, {shape: why not} for the others). The size limit applies here only where no
    later choice can shrink the graph below the int8 shape timed (no vocabulary pruning, no int4)."""
    shapes, why = space.shapes(), {}
    limit = cfg.constraints.latency.max_p50_ms if cfg.constraints.latency else None
    size = cfg.constraints.size.max_mb if cfg.constraints.size else None
    size_known = space.vocab == [False] and not any(q.startswith("int4") for q in space.quantization)
    for shape in shapes:
        row = table[shape.name]
        if limit is not None and row["fixed_p50_ms"] > limit:
            why[shape.name] = f"latency.max_p50_ms: {row['fixed_p50_ms']:.2f} ms in int8 > {limit:g}"
        elif size is not None and size_known and row["size_mb"] > size:
            why[shape.name] = f"size.max_mb: {row['size_mb']:.1f} MB in int8 > {size:g}"
    open_shapes = [s for s in shapes if s.name not in why]
    for name, by in dominated(table, open_shapes).items():
        why[name] = f"beaten by {by} (as fast and as small, keeps as much of the teacher)"
    return [s for s in shapes if s.name not in why], why


def search_noise(cfg: SearchConfig, n_validation: int) -> str | None:
    """The search's accuracy constraint, where its trials are judged (the validation split), when `n_validation`
    texts cannot resolve it: what `noisy_gates` says of a pipeline's gate."""
    accuracy = cfg.constraints.accuracy
    if accuracy.strict:
        return None
    line = drop_noise(accuracy.max_drop, n_validation, "validation")
    return None if line is None else f"constraints.{line} (the trials are judged on the validation split)"


def check_search(cfg: SearchConfig, build_teacher: bool = True) -> tuple[Path | None, tuple | None, int, Space,
                                                                       DataSplits]:
    """(model dir, (model, tokenizer), depth, the space filled for that depth, data splits) after every check a
    search makes before it writes anything: the model loads, every point of the space is a pipeline it takes, the
    data loads and fits it. `edgepress validate` runs it without building the demo teacher."""
    from edgepress.models.arch import depth as depth_of
    from edgepress.models.teacher import TEACHER, resolve_model
    from edgepress.pipeline.inputs import check_inputs, check_model
    from edgepress.tasks import CLASSIFICATION, task_of

    task = task_of(None if cfg.model == TEACHER else resolve_model(cfg.model))
    if task is not CLASSIFICATION:
        raise ConfigError(f"{cfg.model} is a model of task {task.name}; edgepress search covers classifiers so far. "
                          f"Fix: `edgepress init {cfg.model} DATA` writes a pipeline that fits it, for `edgepress run`")
    model_dir, loaded = check_model(cfg.model, build_teacher)
    depth = depth_of(loaded[0]) if loaded else demo_depth()
    space = cfg.space.filled(depth)
    check_space(cfg, loaded, depth, space)
    most = max(space.points(), key=lambda point: point.get("transfer", 0))  # the largest draw: it must fit the texts
    _, data = check_inputs(pipeline_for(cfg, depth, most), build_teacher=build_teacher)
    return model_dir, loaded, depth, space, data


def prepare(cfg: SearchConfig, out: Path, resume: bool, config_file: Path | None) -> Prepared:
    """Every check that needs no training, then the shape table and its filter; raises a ConfigError (exit 2) for
    bad input and for a space the constraints leave empty."""
    from edgepress.pipeline.inputs import local_inputs

    check_writable(out)
    check_apart(out, local_inputs(cfg.model, cfg.data, config_file))
    if (out / MARKER).is_file() and not resume:
        raise ConfigError(f"{out} holds a search. Fix: add --resume to continue it, or choose another --out")
    check_owned(out, MARKER, "search")
    if (out / MARKER).is_file() and not _same_config(read_json(out / MARKER)["config"], cfg):
        raise ConfigError(f"{out} holds a search of another config ({out / MARKER}): its trials would mix with "
                          f"this one's. Fix: choose another --out, or resume with the config it was started with")
    from edgepress.models.evaluate import evaluate_classifier

    model_dir, (model, tokenizer), depth, space, data = check_search(cfg)
    teacher, _ = evaluate_classifier(model, tokenizer, data.validation, cfg.data.max_length)  # as the trials do
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        write_json(out / MARKER, {"config": cfg.model_dump(mode="json"), "created": time.time()})
    table = shape_table(out, model_dir, space.shapes(), cfg, data.validation.texts)
    shapes, why = allowed_shapes(cfg, space, table)
    for name, reason in why.items():
        table[name]["excluded"] = reason
    if not shapes:
        reasons = sorted({reason.split(":")[0] for reason in why.values()})
        raise ConfigError(f"no shape of the space can meet the constraints ({', '.join(reasons)} excluded every "
                          f"one; the table: {out / 'shapes.json'}). Fix: loosen {' or '.join(reasons)}, or widen "
                          f"space.layers / heads_keep / ffn_keep toward smaller shapes")
    required = teacher["accuracy"] - cfg.constraints.accuracy.max_drop
    return Prepared(model_dir, depth, space, shapes, table, data, required)


def _same_config(recorded: dict, cfg: SearchConfig) -> bool:
    """`recorded` (search.json's) is `cfg`, fields added since it was written taking their defaults."""
    from pydantic import ValidationError

    try:
        return SearchConfig.model_validate(recorded) == cfg
    except ValidationError:
        return False


def open_study(cfg: SearchConfig, out: Path, storage: str | None):
    """The study in SEARCH_DIR/study.db (or `storage`, shared by workers on several machines), created or loaded;
    workers of this machine open it one at a time (the first one creates its tables)."""
    import optuna
    from filelock import FileLock

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage or f"sqlite:///{(out / 'study.db').resolve()}"
    for attempt in range(3):  # workers on other machines may be creating the same tables: the loser tries again
        try:
            with FileLock(out / ".study.lock"), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat's arguments
                rdb = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith(
                    "sqlite") else None, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
                return optuna.create_study(storage=rdb, sampler=sampler(cfg.seed, 0), study_name=STUDY,
                                           load_if_exists=True,
                                           directions=["maximize", "minimize"])
        except Exception as e:  # sqlalchemy's errors: a bad URL, a server that does not answer, a missing driver
            if attempt < 2 and not url.startswith("sqlite"):  # e.g. a table or type another worker just made
                time.sleep(1 + attempt)
                continue
            raise ConfigError(f"the study at {url} cannot be opened ({type(e).__name__}: {e}). Fix: for --storage, "
                              f"a reachable database URL (e.g. postgresql+psycopg://user:password@host/db) with its "
                              f"driver installed (pip install 'edgepress[postgres]')") from None


def fail_dead_trials(study) -> list[int]:
    """Running trials of a worker of this machine whose process is gone (killed): failed, so that the search goes
    on without them (a worker elsewhere: Optuna's heartbeat does the same after its grace period)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    dead = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker", {})
        if worker.get("host") == socket.gethostname() and not _alive(worker.get("pid", -1)):
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)  # no `stop`: the report says killed
            dead.append(trial.number)
    return dead


def await_others(study, poll_s: float = 2.0) -> None:
    """Wait for the trials other workers are running when this one's loop ends (their worker gone: failed as
    fail_dead_trials does), so that the finalists, the winner and the report are those of every trial asked for."""
    import optuna

    running = (optuna.trial.TrialState.RUNNING,)
    waiting = {t.number for t in study.get_trials(deepcopy=False, states=running)}
    if waiting:
        log.info("waiting for trial(s) %s of other workers to finish", sorted(waiting))
    while waiting:
        time.sleep(poll_s)
        fail_dead_trials(study)
        waiting &= {t.number for t in study.get_trials(deepcopy=False, states=running)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def _distributions(prepared: Prepared) -> dict:
    from optuna.distributions import CategoricalDistribution as Choice

    space = prepared.space
    return {"shape": Choice([s.name for s in prepared.shapes]), "vocab": Choice(space.vocab),
            "quantization": Choice(space.quantization), "epochs": Choice(space.epochs),
            **({"transfer": Choice(space.transfer)} if space.transfer else {})}


def _point(prepared: Prepared, params: dict) -> dict:
    shape = next(s for s in prepared.shapes if s.name == params["shape"])
    return {"layers": shape.layers, "heads_keep": shape.heads_keep, "ffn_keep": shape.ffn_keep,
            "vocab": params["vocab"], "quantization": params["quantization"], "epochs": params["epochs"],
            **({"transfer": params["transfer"]} if "transfer" in params else {})}


def _stopped_at(report: dict) -> dict | None:
    """The stage record a run stopped at (the stages after it are listed as skipped)."""
    return next((s for s in report["stages"] if s["status"] not in ("passed", "skipped")), None)


def trial_result(cfg: SearchConfig, run_dir: Path) -> dict:
    """What a trial's run says, from its report: the last stage measured (validation accuracy, latency, size),
    agreement with the teacher's labels, and the constraints' violations (<= 0: met)."""
    report = read_json(run_dir / "report.json")
    measured = [s for s in report["stages"] if "accuracy" in s["metrics"]]
    last = measured[-1] if measured else None
    if last is None or last is not report["stages"][-1]:
        failed = _stopped_at(report)
        return {"stop": "error", "why": report.get("error") or (failed and failed["status"]) or "no stage ran"}
    m, provider = last["metrics"], cfg.runtime.providers[0]
    teacher = read_json(RunDir(run_dir).stage_dir(0, "baseline") / "predictions.json")["predictions"]
    final = read_json(Path(last["artifact"]).parent / "predictions.json")["predictions"]
    result = {"accuracy": m["accuracy"], "teacher_accuracy": report["baseline"]["metrics"]["accuracy"],
              "drop_ci95": m.get("accuracy_drop_ci95"), "p50_ms": m["latency"][provider]["p50_ms"],
              "size_mb": m["size_bytes"] / 1e6, "agreement": float(np.mean(np.array(teacher) == np.array(final))),
              "artifact": last["artifact"]}
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

    pipeline = pipeline_for(cfg, prepared.depth, point)
    run_dir = out / "trials" / f"{number:04d}"
    started = time.monotonic()
    before = pruned_before(pipeline, pruned_prefixes(study)) if cfg.pruning else None
    if before is not None:
        earlier = study.trials[before[0]].user_attrs
        return {"stop": "pruned", "why": f"as trial {before[0]} ({earlier['why']}), whose stages it starts with",
                "pruned_prefix": before[1], "excess": earlier["excess"], "epochs_trained": 0, "seconds": 0.0}
    watch = EpochWatch(prepared.required, cfg.pruning.margin) if cfg.pruning else None
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


def _expected(durations: list[tuple[float, str]]) -> float:
    """What the next trial is expected to take: the median of the trials that trained to the end (pruned ones stop
    early, and the next may not), else of all."""
    full = [seconds for seconds, stop in durations if stop != "pruned"] or [seconds for seconds, _ in durations]
    return float(np.median(full)) if full else 0.0


def _objective(cfg: SearchConfig, result: dict) -> float:
    return result["p50_ms"] if cfg.objective == "latency" else result["size_mb"]


def search_loop(cfg: SearchConfig, prepared: Prepared, out: Path, study, budget_s: float | None,
                trials: int | None, progress) -> dict:
    """Trials until `trials` are in the study or the budget would be overrun by one more (the median trial's time);
    returns how the time was spent."""
    started, durations, exhausted, settled = time.monotonic(), [], False, False
    distributions = _distributions(prepared)
    while True:
        check_interrupt()
        fail_dead_trials(study)  # a killed local worker's trial: its point is free again
        done = len(_asked(study))
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
        trial = ask(study, distributions, out, lead, cfg.seed)
        trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": os.getpid()})
        point = _point(prepared, trial.params)
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


def settle(cfg: SearchConfig, prepared: Prepared, out: Path, study, trial, point: dict) -> dict:
    """The trial's result: a twin's (a point already tried), `beaten` (it could not be faster or smaller than a
    trial that passed: not worth a run), or its run's. A run stopped by anything (Ctrl-C, an error) is recorded
    `interrupted` and failed, and the exception goes on."""
    import optuna
    from optuna.storages._heartbeat import get_heartbeat_thread  # Optuna's own, outside Study.optimize

    if (twin := finished_twin(study, trial.params)) is not None:
        return twin_result(twin)
    if (beaten := beaten_by(cfg, prepared, _passing(study), trial.params)) is not None:
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


def tell(cfg: SearchConfig, study, trial, result: dict) -> None:
    """Record `result` on the trial and tell the study: failed without values (an error, beaten), pruned with how
    far below the constraint it was (the sampler ranks it by that), or finished with its values and constraints."""
    import optuna

    for key in (*RESULT_ATTRS, "seconds", "epochs_trained", "same_as"):
        if key in result:
            trial.set_user_attr(key, result[key])
    if result["stop"] in ("error", "beaten"):
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    elif result["stop"] == "pruned":
        trial.set_constraint("accuracy.max_drop", result["excess"])
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        for name, excess in result["violations"].items():  # > 0: missed; Optuna's samplers prefer the met
            trial.set_constraint(name, excess)
        study.tell(trial, [result["accuracy"], _objective(cfg, result)])


def sampler(seed: int, trials: int):
    """Optuna's multi-objective TPE (random for the first 4 trials), seeded by the search's seed and the number of
    trials in the study: one worker draws the same points every time, and two workers that start together do not
    draw the same points one after the other (with one seed, their random draws would be the same sequence)."""
    import optuna

    return optuna.samplers.TPESampler(seed=int(np.random.SeedSequence([seed, trials]).generate_state(1)[0]),
                                      n_startup_trials=4)


def ask(study, distributions: dict, out: Path, instead: dict | None, seed: int):
    """The next trial: `instead`'s params when given (queued and taken at once, so that no queued trial is left
    behind when the search stops; if another worker takes it first, that worker runs it and this one draws), else
    the sampler's draw. Workers sharing SEARCH_DIR ask one at a time: SQLite does not lock the queued trial a worker
    takes, and two could take the same one (a server's storage locks its row)."""
    from filelock import FileLock

    with FileLock(out / ".study.lock"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "heartbeat is supposed to be used with Study.optimize"
        study.sampler = sampler(seed, len(study.get_trials(deepcopy=False)))
        if instead is not None:
            study.enqueue_trial(instead)
        return study.ask(distributions)


RESULT_ATTRS = ("stop", "why", "run_dir", "agreement", "p50_ms", "size_mb", "drop_ci95", "teacher_accuracy",
                "artifact", "pruned_prefix", "excess")


def finished_twin(study, params: dict):
    """The first finished trial (measured or pruned) of exactly these params, if there is one."""
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return next((t for t in study.get_trials(deepcopy=False, states=states) if t.params == params), None)


def twin_result(twin) -> dict:
    """A trial's result as the earlier trial of the same point `twin` had it (nothing runs: the same pipeline on
    the same inputs makes the same models)."""
    attrs = {k: twin.user_attrs[k] for k in RESULT_ATTRS if k in twin.user_attrs}
    why = f"the point of trial {twin.number}" + (f": {attrs['why']}" if attrs.get("why") else "")
    result = {**attrs, "why": why, "same_as": twin.number, "seconds": 0.0, "epochs_trained": 0}
    if twin.values:
        result.update(accuracy=twin.values[0], violations=dict(twin.constraints))
    return result


def unsettled_points(cfg: SearchConfig, prepared: Prepared, study) -> list[dict]:
    """The points of the space (its allowed shapes), as trial params, fastest (smallest) shape first, that no trial
    has finished or is running, that do not start with a pruned trial's stages and that a passing trial does not
    beat (`beaten_by`)."""
    import itertools

    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    tried = {json.dumps(t.params, sort_keys=True) for t in study.get_trials(deepcopy=False, states=states)}
    pruned, passing = pruned_prefixes(study), _passing(study)
    space, points = prepared.space, []
    shapes = sorted(prepared.shapes, key=lambda shape: _shape_figure(cfg, prepared, shape.name))
    for shape, vocab, quantization, epochs, transfer in itertools.product(shapes, space.vocab, space.quantization,
                                                                           space.epochs, space.transfers()):
        params = {"shape": shape.name, "vocab": vocab, "quantization": quantization, "epochs": epochs, **transfer}
        if json.dumps(params, sort_keys=True) in tried or beaten_by(cfg, prepared, passing, params):
            continue
        if not (cfg.pruning and pruned_before(pipeline_for(cfg, prepared.depth, _point(prepared, params)), pruned)):
            points.append(params)
    return points


SLOWER = 1.05  # a shape more than 5% slower (larger) in the shape table than another: beyond the table's noise


def _shape_figure(cfg: SearchConfig, prepared: Prepared, shape: str) -> float:
    """The objective's figure of `shape` in the shape table (its int8 graph timed side by side with the others)."""
    return prepared.table[shape]["fixed_p50_ms" if cfg.objective == "latency" else "size_mb"]


def beaten_by(cfg: SearchConfig, prepared: Prepared, passing: list, params: dict) -> str | None:
    """Why the point `params` cannot win, if it cannot: a passing trial with the same quantization (and, for
    size, the same vocabulary choice: both change the shipped graph more than its shape does) has a shape more than
    5% faster (smaller) in the shape table. Shapes are compared in the table, timed side by side, not by trials
    timed minutes apart."""
    figure = _shape_figure(cfg, prepared, params["shape"])
    unit = "ms" if cfg.objective == "latency" else "MB"
    for trial in passing:
        same = ("quantization",) if cfg.objective == "latency" else ("quantization", "vocab")
        if all(trial.params[k] == params[k] for k in same) and \
                figure > SLOWER * _shape_figure(cfg, prepared, trial.params["shape"]):
            return (f"beaten by trial {trial.number}, which passed: its shape ({trial.params['shape']}) is "
                    f"{_shape_figure(cfg, prepared, trial.params['shape']):.4g} {unit} in the shape table, this "
                    f"point's {figure:.4g} {unit}")
    return None


def _passing(study) -> list:
    import optuna

    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("stop") == "passed"]


def validation_front(study) -> list:
    """The passing trials no other passing trial beats on both validation accuracy and the objective, by objective."""
    passing = _passing(study)
    front = [t for t in passing if not any(o.values[0] >= t.values[0] and o.values[1] <= t.values[1]
                                           and o.values != t.values for o in passing)]
    unique = {tuple(t.values): t for t in sorted(front, key=lambda t: t.number, reverse=True)}
    return sorted(unique.values(), key=lambda t: t.values[1])


def best_passing(study, objective: str):
    """The winner on validation: the most accurate passing trial among those whose objective is the best one's or,
    for latency, within 5% of it (`SLOWER`: trials are timed minutes apart, under whatever else the machine runs;
    sizes are exact). Then the better objective, then the earlier trial."""
    passing = _passing(study)
    if not passing:
        return None
    bound = min(t.values[1] for t in passing) * (SLOWER if objective == "latency" else 1.0)
    return min((t for t in passing if t.values[1] <= bound), key=lambda t: (-t.values[0], t.values[1], t.number))


def score_finalists(cfg: SearchConfig, prepared: Prepared, finalists: list) -> dict:
    """Each finalist's final model scored once on the test split, against the teacher there: accuracy with its CI
    and the paired drop's CI. A finalist another machine's worker made (its model is not here) is named, not
    scored: that worker's own report scores it."""
    from edgepress.data.metrics import accuracy_drop_ci95
    from edgepress.pipeline.measure import measure_artifact, measure_model_dir

    data, n = prepared.data, cfg.data.max_length
    teacher, teacher_preds = measure_model_dir(prepared.model_dir, data, n)
    scored = {"teacher": {"accuracy": teacher["accuracy"], "accuracy_ci95": teacher["accuracy_ci95"]}}
    for trial in finalists:
        if not Path(trial.user_attrs["artifact"]).exists():
            scored[str(trial.number)] = {"elsewhere": trial.user_attrs.get("worker", {}).get("host")}
            continue
        metrics, preds = measure_artifact(Path(trial.user_attrs["artifact"]), data, n, (), cfg.runtime.threads,
                                          cfg.runtime.latency)
        scored[str(trial.number)] = {"accuracy": metrics["accuracy"], "accuracy_ci95": metrics["accuracy_ci95"],
                                     "drop_ci95": accuracy_drop_ci95(data.test.labels, teacher_preds, preds)}
    return scored


def _asked(study) -> list:
    """The trials asked for (not one waiting in the queue: an untried point put there for the next trial)."""
    import optuna

    return [t for t in study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING]


def trial_rows(study) -> list[dict]:
    rows = []
    for t in _asked(study):
        # a failed trial whose outcome was not told was stopped with its worker (killed, or its heartbeat lost)
        stop = t.user_attrs.get("stop") or t.state.name.lower()
        if t.state.name == "FAIL" and stop not in ("error", "interrupted", "beaten"):
            stop = "killed"
        rows.append({"number": t.number, "params": t.params, "state": t.state.name.lower(), "stop": stop,
                     "why": t.user_attrs.get("why", ""),
                     "accuracy": t.values[0] if t.values else None,
                     **{k: t.user_attrs.get(k) for k in ("p50_ms", "size_mb", "agreement", "seconds", "run_dir",
                                                                  "worker", "epochs_trained")}})
    return rows


def write_search_report(cfg: SearchConfig, prepared: Prepared, out: Path, study, spent: dict,
                        finalists: dict | None = None, best: dict | None = None) -> dict:
    from edgepress.search.report import render_html, render_markdown

    front = validation_front(study)
    winner = best_passing(study, cfg.objective)
    report = {"config": cfg.model_dump(mode="json"), "objective": cfg.objective, "shapes": prepared.table,
              "required_accuracy": prepared.required,
              "trials": trial_rows(study), "front": [t.number for t in front],
              "winner": winner.number if winner else None, "finalists": finalists, "best": best, "spent": spent}
    write_json(out / "report.json", report)
    write_text(out / "report.md", render_markdown(report))
    write_text(out / "report.html", render_html(report))
    return report


def finish(cfg: SearchConfig, prepared: Prepared, out: Path, study, spent: dict) -> dict:
    """The finalists scored on test, best.yaml written and run into SEARCH_DIR/best (its report and bundle)."""
    from edgepress.pipeline.runner import run_pipeline

    front = validation_front(study)[:FINALISTS]
    winner = best_passing(study, cfg.objective)
    if winner is None:
        write_search_report(cfg, prepared, out, study, spent)
        raise SearchExhausted(f"no trial passed the constraints in {len(_asked(study))} trial(s); the best found is in "
                              f"{out / 'report.md'}. Fix: a longer --budget or more --trials, or looser constraints")
    finalists = score_finalists(cfg, prepared, [*front, *([] if winner in front else [winner])])
    pipeline = pipeline_for(cfg, prepared.depth, _point(prepared, winner.params))
    header = (f"# The search's winner (trial {winner.number} of {out}): validation accuracy "
              f"{winner.values[0]:.4f}, {cfg.objective} {winner.values[1]:.4g}.\n"
              f"# `edgepress run best.yaml --out RUN_DIR` reproduces it.\n")
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
    best = {"trial": winner.number, "accuracy": final["accuracy"], "accuracy_ci95": final["accuracy_ci95"],
            "drop_ci95": final.get("accuracy_drop_ci95"),
            "p50_ms": final["latency"][cfg.runtime.providers[0]]["p50_ms"], "size_mb": final["size_bytes"] / 1e6,
            "passed": missed is None, "bundle": str(out / "best" / "final") if missed is None else None,
            "reproduced": math.isclose(final["accuracy"], finalists[str(winner.number)]["accuracy"])
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
        raise ConfigError("give --budget (e.g. 2h) or --trials N: a search needs a limit")
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
