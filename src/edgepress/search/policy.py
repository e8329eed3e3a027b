"""Which trials count and which points are not worth running: the objective, the passing trials, the validation
front, the best passing trial, and the shapes a passing trial beats in the shape table (`beaten_by`)."""

from edgepress.search.config import SearchConfig
from edgepress.search.prepare import Prepared


def objective_of(cfg: SearchConfig, result: dict) -> float:
    """A trial's latency (the fixed shape's p50; where the space chooses cascades, every trial's mean at natural
    lengths: a cascade's deferred texts cost both its models, which a p50 does not see), or its size."""
    if cfg.objective == "size":
        return result["size_mb"]
    return result["natural_mean_ms"] if cfg.space.cascade else result["p50_ms"]


SLOWER = 1.05  # a shape more than 5% slower (larger) in the shape table than another: beyond the table's noise


def shape_figure(cfg: SearchConfig, prepared: Prepared, shape: str) -> float:
    """The objective's figure of `shape` in the shape table (its int8 graph timed side by side with the others)."""
    return prepared.table[shape]["fixed_p50_ms" if cfg.objective == "latency" else "size_mb"]


def beaten_by(cfg: SearchConfig, prepared: Prepared, passing: list, params: dict) -> str | None:
    """Why the point `params` cannot win, if it cannot: a passing trial with the same quantization (and, for
    size, the same vocabulary choice: both change the shipped graph more than its shape does) has a shape more than
    5% faster (smaller) in the shape table. Shapes are compared in the table, timed side by side, not by trials
    timed minutes apart."""
    if params.get("cascade", "off") != "off":  # a slower student that defers fewer texts may yet be faster
        return None
    figure = shape_figure(cfg, prepared, params["shape"])
    unit = "ms" if cfg.objective == "latency" else "MB"
    for trial in passing:
        same = ("quantization",) if cfg.objective == "latency" else ("quantization", "vocab")
        same += ("cascade",) if "cascade" in params else ()  # a cascade trial's time is not its student shape's
        if all(trial.params[k] == params[k] for k in same) and \
                figure > SLOWER * shape_figure(cfg, prepared, trial.params["shape"]):
            return (f"beaten by trial {trial.number}, which passed: its shape ({trial.params['shape']}) is "
                    f"{shape_figure(cfg, prepared, trial.params['shape']):.4g} {unit} in the shape table, this "
                    f"point's {figure:.4g} {unit}")
    return None


def passing_trials(study) -> list:
    import optuna

    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("stop") == "passed"]


def validation_front(study) -> list:
    """The passing trials no other passing trial beats on both validation accuracy and the objective, by objective."""
    passing = passing_trials(study)
    front = [t for t in passing if not any(o.values[0] >= t.values[0] and o.values[1] <= t.values[1]
                                           and o.values != t.values for o in passing)]
    unique = {tuple(t.values): t for t in sorted(front, key=lambda t: t.number, reverse=True)}
    return sorted(unique.values(), key=lambda t: t.values[1])


def best_passing(study, objective: str):
    """The winner on validation: the most accurate passing trial among those whose objective is the best one's or,
    for latency, within 5% of it (`SLOWER`: trials are timed minutes apart, under whatever else the machine runs;
    sizes are exact). Then the better objective, then the earlier trial."""
    passing = passing_trials(study)
    if not passing:
        return None
    bound = min(t.values[1] for t in passing) * (SLOWER if objective == "latency" else 1.0)
    return min((t for t in passing if t.values[1] <= bound), key=lambda t: (-t.values[0], t.values[1], t.number))
