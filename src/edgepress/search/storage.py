"""The Optuna study: where the search's record lives (SQLite in SEARCH_DIR, or --storage), its sampler, asking and
telling trials with their results as attributes, a finished trial of the same point (`finished_twin`), trials a
killed worker left running, and the table of trials the report shows."""

import logging
import os
import socket
import time
import warnings
from pathlib import Path

import numpy as np

from edgepress.errors import ConfigError
from edgepress.search.config import SearchConfig
from edgepress.search.policy import objective_of

log = logging.getLogger(__name__)


STUDY = "edgepress-search"
HEARTBEAT_S, GRACE_S = 60, 180  # a trial of a worker that stopped beating this long ago is failed (other machines)


def sampler(seed: int, trials: int):
    """Optuna's multi-objective TPE (random for the first 4 trials), seeded by the search's seed and the number of
    trials in the study: one worker draws the same points every time, and two workers that start together do not
    draw the same points one after the other (with one seed, their random draws would be the same sequence)."""
    import optuna

    return optuna.samplers.TPESampler(seed=int(np.random.SeedSequence([seed, trials]).generate_state(1)[0]),
                                      n_startup_trials=4)


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
            fix = ("Fix: for --storage, a reachable database URL (e.g. postgresql+psycopg://user:password@host/db) "
                   "with its driver installed (pip install 'edgepress[postgres]')") if storage else \
                (f"Fix: the search's own database is damaged or is no database: start the search in another --out "
                 f"(the runs in {out / 'trials'} stay as they are)")
            raise ConfigError(f"the study at {url} cannot be opened ({type(e).__name__}: {e}). {fix}") from None


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


RESULT_ATTRS = ("stop", "why", "run_dir", "metric", "agreement", "p50_ms", "size_mb", "drop_ci95", "teacher_accuracy",
                "artifact", "pruned_prefix", "excess", "natural_mean_ms", "natural_p99_ms", "deferred")


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
        study.tell(trial, [result["accuracy"], objective_of(cfg, result)])


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


def asked_trials(study) -> list:
    """The trials asked for (not one waiting in the queue: an untried point put there for the next trial)."""
    import optuna

    return [t for t in study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING]


def killed(trial) -> bool:
    """A failed trial whose outcome was not told was stopped with its worker (killed, or its heartbeat lost)."""
    return trial.state.name == "FAIL" and trial.user_attrs.get("stop") not in ("error", "interrupted", "beaten")


def counted_trials(study) -> list:
    """The trials `--trials N` counts: every one asked but those stopped with their worker, whose point is free
    again (a search killed in its last trial, resumed, tries that point again rather than end without it)."""
    return [t for t in asked_trials(study) if not killed(t)]


def trial_rows(study) -> list[dict]:
    rows = []
    for t in asked_trials(study):
        stop = "killed" if killed(t) else t.user_attrs.get("stop") or t.state.name.lower()
        rows.append({"number": t.number, "params": t.params, "state": t.state.name.lower(), "stop": stop,
                     "why": t.user_attrs.get("why", ""),
                     "accuracy": t.values[0] if t.values else None,
                     **{k: t.user_attrs.get(k) for k in ("p50_ms", "size_mb", "agreement", "seconds", "run_dir",
                                                                  "worker", "epochs_trained", "natural_mean_ms",
                                                                  "natural_p99_ms", "deferred")}})
    return rows
