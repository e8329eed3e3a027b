"""`edgepress init MODEL DATA`: a commented starting pipeline that fits a model and its data. The model is loaded
(its depth, heads, labels, positions, tokenizer), the data is read as a run reads it (its splits and their sizes),
the methods whose pre-run checks refuse this model are left out (the comment says why), `max_length` covers 95% of
the train texts, and the final accuracy gate is one the test split can resolve. The config is validated, with every
method's check, before it is written."""

import json
import math
import textwrap
from datetime import date
from pathlib import Path

import numpy as np
import yaml

from edgepress.compress.structured import BASELINE
from edgepress.data.config import DataConfig
from edgepress.errors import ConfigError, EdgepressError, refused_by_system


def fitting_length(tokenizer, texts: tuple[str, ...], positions: int) -> tuple[int, str]:
    """(max_length: the 95th percentile of the token counts of up to 2,000 texts drawn at random (seeded), rounded
    up to 32, within the model's positions; what to say about it)."""
    rng = np.random.default_rng(13)
    sample = [texts[i] for i in rng.choice(len(texts), size=min(2000, len(texts)), replace=False)]
    counts = np.array([len(ids) for ids in tokenizer(sample, truncation=False)["input_ids"]])
    p95 = int(np.percentile(counts, 95))
    length = max(32, min(positions, math.ceil(p95 / 32) * 32))
    said = f"95% of the train texts fit in {p95} tokens, so max_length {length}"
    if length < p95:
        said += (f" (the model's positions; {np.mean(counts > length):.0%} of the train texts are longer and are "
                 f"cut there)")
    return length, said


def _candidates(depth: int, final_drop: float, int8: dict) -> list[tuple[str, dict]]:
    """(why, stage) of the starting pipeline, in order: a half-depth student, half its heads and FFN, the unused
    vocabulary, then export, fusion and int8 (with the task's `int8` params), the final stage gated by what the test
    split can resolve."""
    loose = {"accuracy": {"max_drop": min(1.0, round(2 * final_drop + 0.01, 3))}}
    student = [(f"a {depth // 2}-layer student distilled from the model's {depth} layers (about half the latency)",
                {"name": "distill", "method": "distill", "params": {"student_layers": depth // 2, "epochs": 2},
                 "gates": loose})] if depth >= 2 else []
    return [*student,
            ("half of every layer's attention heads, the least important ones, then a recovery fine-tune that "
             "learns your model's outputs",
             {"name": "heads", "method": "heads", "params": {"keep": 0.5, "epochs": 2, "teacher": BASELINE},
              "gates": loose}),
            ("half of every layer's FFN neurons, the least important ones, then a recovery fine-tune that learns "
             "your model's outputs",
             {"name": "ffn", "method": "ffn", "params": {"keep": 0.5, "epochs": 2, "teacher": BASELINE},
              "gates": loose}),
            ("the word-table rows of tokens the train split never uses (no training)",
             {"name": "vocab", "method": "vocab", "gates": loose}),
            ("ONNX, checked against torch", {"name": "export", "method": "export"}),
            ("ONNX Runtime's fusions, the fastest set as timed on this machine",
             {"name": "fuse", "method": "optimize"}),
            ("int8 weights, per channel" + (", smoothed (SmoothQuant)" if "smooth" in int8 else "") +
             "; the gates of the whole pipeline: raise min_speedup to what you need",
             {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True, **int8},
              "gates": {"accuracy": {"max_drop": final_drop}, "latency": {"min_speedup": 2.0}}})]


def _applicable(candidates: list[tuple[str, dict]], model, tokenizer, task) -> tuple[list, list[str]]:
    """(the candidates this model takes, a line for each one its method's pre-run check refuses or that is not built
    for the model's task)."""
    from edgepress.registry import METHODS

    kept, left_out = [], []
    for why, stage in candidates:
        spec = METHODS[stage["method"]]
        if task.methods is not None and stage["method"] not in task.methods:
            left_out.append(f"{stage['name']} left out: {stage['method']} is not built for {task.name} models yet")
            continue
        try:
            if spec.check is not None:
                spec.check(model, tokenizer, spec.config.model_validate(stage.get("params", {})), task)
            kept.append((why, stage))
        except EdgepressError as e:
            left_out.append(f"{stage['name']} left out: {e}")
    return kept, left_out


def _yaml(value) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=None, width=120)


def starter_config(model: str, data: DataConfig) -> str:
    """The text of a starting pipeline for `model` (a model dir) and `data`, validated."""
    from edgepress.configs import build
    from edgepress.device.feeds import position_limit
    from edgepress.models.loading import label2id_of, read_model_config
    from edgepress.pipeline.config import PipelineConfig
    from edgepress.pipeline.inputs import check_inputs, check_model
    from edgepress.tasks import task_of
    from edgepress.teacher import DEMO_TEACHERS, resolve_model

    task = task_of(None if model in DEMO_TEACHERS else resolve_model(model))
    model_dir, (loaded, tokenizer) = check_model(model, build_teacher=True, task=task)
    label2id = label2id_of(model_dir) if task.labelled else None  # an embedder has no labels
    splits = task.load(data, label2id)
    positions = position_limit(read_model_config(model_dir))
    max_length, length_said = fitting_length(tokenizer, splits.train.texts, positions)
    depth = int(loaded.config.num_hidden_layers)  # transformers maps each architecture's own name onto it
    final_drop = task.starter_drop(len(splits.test.labels))
    candidates = _candidates(depth, final_drop, dict(task.int8_params))
    unfit = dict(task.starter_leaves_out)
    stages, left_out = _applicable([c for c in candidates if c[1]["name"] not in unfit], loaded, tokenizer, task)
    left_out += list(unfit.values())
    body = {"model": str(model), "data": {**data.model_dump(mode="json", exclude_defaults=True),
                                          "source": data.source, "max_length": max_length},
            "runtime": {"providers": ["cpu"], "threads": 2, "latency": {"sequence_length": max_length}}}
    sizes = ", ".join(f"{name} {n:,}" for name, n in splits.manifest()["sizes"].items())
    header = [f"A starting pipeline for {model} and {data.source}, written by `edgepress init` on {date.today()}.",
              _model_line(loaded, tokenizer, positions, sorted(label2id, key=label2id.get) if label2id else None,
                          task.predicts),
              f"The data: {sizes} examples{f' ({splits.note})' if splits.note else ''}; {length_said}.",
              task.starter_gate_line(final_drop, len(splits.test.labels)),
              *left_out,
              "Check it: edgepress validate THIS_FILE; run it: edgepress run THIS_FILE --out runs/NAME.",
              "To let edgepress choose the stages and their params instead: edgepress search (docs/search.md)."]
    comments = [f"# {part}" for line in header for part in textwrap.wrap(line, 116, break_on_hyphens=False)]
    lines = [*comments, _yaml(body).rstrip(), "stages:"]
    for why, stage in stages:
        lines += [f"  # {why}", *("  " + line for line in _yaml([stage]).rstrip().splitlines())]
    text = "\n".join(lines) + "\n"
    check_inputs(build(PipelineConfig, yaml.safe_load(text), where="the starting pipeline"))  # as validate does
    return text


def _model_line(model, tokenizer, positions: int, labels: list[str] | None, noun: str = "labels") -> str:
    """'The model: BertForSequenceClassification, 6 layers, hidden 384, FFN 1536, 12 heads, ...' from the loaded
    config (whose attribute map gives every architecture's sizes the same names); `labels` None: an embedder's
    pooling instead."""
    from edgepress.models.width import hidden_size

    config = model.config
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", None)
    kind = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"] if tokenizer.is_fast else "slow"
    if labels is None:
        layout = model.layout
        gives = f"sentence vectors ({'+'.join(layout.pooling)} pooling{', normalized' if layout.normalize else ''})"
    else:
        gives = f"{len(labels)} {noun} ({', '.join(labels[:8]) + (', ...' if len(labels) > 8 else '')})"
    return (f"The model: {', '.join(config.architectures or [config.model_type])}, {config.num_hidden_layers} "
            f"layers, hidden {hidden_size(config)}, FFN {ffn}, {config.num_attention_heads} heads, {positions} "
            f"positions, {gives}, a {kind} tokenizer.")


def write_starter(model: str, data: DataConfig, out: Path | None) -> str:
    """The starting pipeline's text, also written to `out` when given: a new file, never one that appeared while
    the model and data were read (created beside it, then linked into place, which fails if the name is taken)."""
    if out is not None and out.exists():
        raise ConfigError(f"--out {out} exists. Fix: choose another file name, or remove it first")
    text = starter_config(model, data)
    if out is not None:
        import os
        import tempfile

        try:
            fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        except OSError as e:
            raise refused_by_system(e, out) or ConfigError(f"--out {out} cannot be written: {e}. Fix: a file in a "
                                                           f"directory you can write") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.link(tmp, out)
        except FileExistsError:
            raise ConfigError(f"--out {out} exists. Fix: choose another file name, or remove it first") from None
        finally:
            os.unlink(tmp)
    return text
