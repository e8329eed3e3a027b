"""What differs per task, in one object chosen once per run (`task_of`): what a model gives for a text, how those
predictions are scored alone and against the baseline's, the metric the `accuracy` gate judges (`primary`), the
graph's output, and the methods built for the task. One module a task: `classification.py`, `embedding.py`,
`token.py` (token-classification); this one chooses among them and checks a config against the one chosen.

Predictions of an ONNX graph are made one text per call (as a device makes them, and as `predict.py` does): with
dynamic int8, a padded batch would make each text's result depend on the others.
"""

from pathlib import Path

from edgepress.device.bundle import files_task
from edgepress.errors import ConfigError
from edgepress.tasks.classification import Classification, resolvable_drop
from edgepress.tasks.embedding import NEIGHBOURS, Embedding
from edgepress.tasks.token import ONLY_TAGGED_WORDS, TokenClassification

__all__ = ["CLASSIFICATION", "EMBEDDING", "NEIGHBOURS", "ONLY_TAGGED_WORDS", "TASKS", "check_methods_for",
           "check_metrics_for", "recorded_task", "resolvable_drop", "task_of",
           "token_task"]

CLASSIFICATION, EMBEDDING = Classification(), Embedding()
TASKS = {task.name: task for task in (CLASSIFICATION, EMBEDDING, TokenClassification())}


def recorded_task(metrics: dict):
    """The task a record of scores was scored by (a stage's or the baseline's metrics, as `scores()` wrote them):
    its `task`; a record written before that field, by its `primary_metric` (none: classification). The one reader
    of what a record is: every report, plot, summary and manifest asks it."""
    if metrics.get("task") in TASKS:
        return TASKS[metrics["task"]]
    return next((t for t in TASKS.values() if t.primary == metrics.get("primary_metric")), CLASSIFICATION)


def task_of(model_dir: Path | None, asked: str | None = None):
    """The task of the model in `model_dir` (None: a demo teacher, a classifier): embedding for a
    sentence-transformers dir, token-classification for a token classifier's (its tags read from config.json),
    else classification; `asked` (the config's `task`) must agree."""
    name = CLASSIFICATION.name if model_dir is None else files_task(model_dir)
    found = TASKS[name]
    if isinstance(found, TokenClassification):  # its tags are the model's own
        found = token_task(model_dir)
    if asked is not None and asked != found.name:
        why = {"embedding": "a sentence-transformers dir (it has modules.json)",
               "token-classification": "a token classifier (its config.json names a ...ForTokenClassification)"
               }.get(found.name, "a sequence classifier (no modules.json, no ...ForTokenClassification)")
        raise ConfigError(f"task: {asked}, but the model {model_dir} is {why}, so its task is {found.name}. Fix: "
                          f"task: {found.name}, or leave task out (it is read from the model dir)")
    return found


def token_task(model_dir: Path) -> TokenClassification:
    """The token-classification task of the model in `model_dir`: its tags (id2label), checked to be entity tags."""
    from edgepress.data.tagged import check_tag_names
    from edgepress.models.loading import label2id_of

    label2id = label2id_of(model_dir, torch_weights=False)
    tags = tuple(sorted(label2id, key=label2id.__getitem__))
    check_tag_names(tags, f"{model_dir}/config.json id2label")
    return TokenClassification(tags=tags)


def check_methods_for(task, stages) -> None:
    """Every stage method built for `task`; the ConfigError lists each that is not."""
    if isinstance(task, TokenClassification):
        augmented = [f"stage '{stage.name}' ({method})" for stage in stages for method, params in stage.attempts
                     if params.get("augment") is not None]
        if augmented:
            raise ConfigError(f"{', '.join(augmented)}: {ONLY_TAGGED_WORDS}")
    if task.methods is None:
        return
    why = dict(task.refused)
    wrong = [f"stage '{stage.name}': {method}" + (f" ({why[method]})" if method in why else "")
             for stage in stages for method, _ in stage.attempts if method not in task.methods]
    if wrong:
        lines = "\n".join(f"  ✗ {w}" for w in wrong)
        raise ConfigError(f"these methods are not built for {task.name} models yet:\n{lines}\nFix: use "
                          f"{', '.join(task.methods)} on {task.name} models")


def check_metrics_for(task, pairs: str | None, stages) -> None:
    """data.pairs only for an embedder, and every accuracy gate's `metric` one the task measures (spearman: where
    data.pairs names the pairs it is measured on); a ConfigError with its fix for the first that is not."""
    if pairs and task is not EMBEDDING:
        raise ConfigError(f"data.pairs ({pairs}) scores sentence vectors, and this is a {task.name} model. Fix: "
                          f"remove data.pairs, or give a sentence-transformers model")
    for stage in stages:
        metric = stage.gates.accuracy.metric if stage.gates.accuracy is not None else None
        if metric == "spearman" and task is EMBEDDING and not pairs:
            raise ConfigError(f"stage '{stage.name}': accuracy.metric spearman is measured on scored sentence pairs, "
                              f"and data.pairs names none. Fix: set data.pairs (demo:stsb, or a .csv / .jsonl file "
                              f"with sentence1, sentence2 and score columns), or metric: neighbour_overlap")
        if metric is not None and metric not in task.gated:
            raise ConfigError(f"stage '{stage.name}': accuracy.metric {metric} is not measured on {task.name} models. "
                              f"Fix: metric: {' or '.join(task.gated)}, or leave metric out ({task.primary})")
