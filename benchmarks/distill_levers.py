"""What each distillation lever buys the demo's 3-layer student (issue 27): transfer data (perturbed copies of the
train texts, `augment`, labelled by the teacher's soft logits), alpha, epochs, depth. Every variant is the demo's
distill stage (3 layers from teacher layers 0/2/4, hinton, 4 epochs, lr 1e-4, T 2, alpha 0.5, max length 128) with
one thing changed (`layers4-augment2`: two). Each student is measured in torch fp32 (quantization is not the
question here) on the validation split (what a search selects on), the test split, the test split with typos and
the demo archive's three other registers (`edgepress.data.fidelity`): accuracy, and agreement with the teacher's
labels; against `plain`, the paired 95% CIs of the differences on the same texts.

    .venv/bin/python benchmarks/distill_levers.py [--variants augment2 plain ...] [--out FILE]

A plain student takes 6–11 min on 2 cores; transfer data multiplies the steps by (1 + copies per text). Results
are written after each variant to benchmarks/results/distill_levers.json (an interrupted run keeps what finished; a
re-run skips the variants already there), each with the CPU it trained on.
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from edgepress.compress.distill import DistillConfig, distill
from edgepress.data import DataConfig, load_data
from edgepress.data.fidelity import demo_registers, with_typos
from edgepress.data.metrics import accuracy_drop_ci95
from edgepress.files import write_json
from edgepress.models.evaluate import predict_logits
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.models.teacher import resolve_model
from edgepress.pipeline.environment import environment
from edgepress.runtime.predictor import cpu_model

OUT = Path(__file__).parent / "results" / "distill_levers.json"
DEMO = {"student_layers": 3, "style": "hinton", "epochs": 4, "learning_rate": 1e-4, "temperature": 2.0,
        "alpha": 0.5, "max_length": 128}
VARIANTS = {
    "plain": {},
    "augment2": {"augment": {"factor": 2}},
    "augment4": {"augment": {"factor": 4}},
    "augment4-2epochs": {"augment": {"factor": 4}, "epochs": 2},
    "alpha1": {"alpha": 1.0},
    "epochs8": {"epochs": 8},
    "layers4": {"student_layers": 4},
    "layers4-augment2": {"student_layers": 4, "augment": {"factor": 2}},
}
REGISTER_SIZE = 500  # as benchmarks/compare.py


def fidelity_sets(data) -> dict[str, dict]:
    sets = {"validation": {"texts": data.validation.texts, "labels": data.validation.labels},
            "test": {"texts": data.test.texts, "labels": data.test.labels},
            "typos": {"texts": with_typos(data.test.texts), "labels": data.test.labels}}
    return sets | demo_registers(REGISTER_SIZE)


def predictions(model_dir: Path, sets: dict) -> dict[str, list[int]]:
    model, tokenizer = load_classifier(model_dir)
    return {name: predict_logits(model, tokenizer, s["texts"], DEMO["max_length"]).argmax(-1).tolist()
            for name, s in sets.items()}


def run_one(teacher: Path, data, sets: dict, changes: dict) -> dict:
    cfg = DistillConfig(**{**DEMO, **changes})
    with tempfile.TemporaryDirectory() as tmp:
        details = distill(teacher, Path(tmp) / "student", data, cfg)
        preds = predictions(Path(tmp) / "student", sets)
    return {"changes": changes, "config": cfg.model_dump(mode="json"), "predictions": preds,
            "cpu": cpu_model(),  # a variant added later may train on another machine
            **{k: details[k] for k in ("val_accuracy", "best_epoch", "history", "train_seconds",
                                       "transfer_examples")}}


def _gain(reference, base, new) -> list[float]:
    """Paired 95% CI of agreement-or-accuracy(new) - (base) against `reference` labels."""
    lo, hi = accuracy_drop_ci95(reference, base, new)
    return [-hi, -lo]


def summary(runs: dict, teacher: dict, sets: dict) -> dict:
    """Per variant and set: accuracy, agreement with the teacher; against plain, the paired CIs of both gains."""
    out = {}
    for name, run in runs.items():
        rows = {}
        for s, truth in sets.items():
            p, t, labels = np.asarray(run["predictions"][s]), np.asarray(teacher[s]), truth["labels"]
            row = {"accuracy": float(np.mean(p == labels)), "teacher_accuracy": float(np.mean(t == labels)),
                   "agreement": float(np.mean(p == t))}
            if "plain" in runs and name != "plain":
                base = runs["plain"]["predictions"][s]
                row["agreement_gain_ci95"] = _gain(t, base, p)
                row["accuracy_gain_ci95"] = _gain(labels, base, p)
            rows[s] = row
        out[name] = {"sets": rows, "val_accuracy": run["val_accuracy"], "train_seconds": run["train_seconds"],
                     "cpu": run["cpu"], "transfer_examples": run["transfer_examples"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo:minilm-movie")
    parser.add_argument("--variants", nargs="+", default=["augment2", "plain"], choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    teacher_dir = resolve_model(args.model)
    data = load_data(DataConfig(), label2id_of(teacher_dir))
    sets = fidelity_sets(data)
    saved = json.loads(args.out.read_text()) if args.out.is_file() else {}
    teacher = predictions(teacher_dir, sets)
    if saved and saved.get("teacher_predictions") != teacher:  # a rebuilt teacher that differs: not comparable
        raise SystemExit(f"the teacher's predictions differ from those in {args.out}: its variants were measured "
                         "against another teacher. Fix: --out a new file, or move the old one away")
    runs = saved.get("runs", {})
    for name in args.variants:
        if name not in runs:
            runs[name] = run_one(teacher_dir, data, sets, VARIANTS[name])
            write_json(args.out, {"model": args.model, "environment": environment(threads=2), "base": DEMO,
                                  "sizes": {s: len(v["texts"]) for s, v in sets.items()},
                                  "summary": summary(runs, teacher, sets), "runs": runs,
                                  "teacher_predictions": teacher})
        row = summary(runs, teacher, sets)[name]
        print(name, f"val {row['val_accuracy']:.4f}", f"{row['train_seconds']:.0f} s",
              *(f"{s} acc {r['accuracy']:.4f} agree {r['agreement']:.4f}" for s, r in row["sets"].items()), sep="\n  ")


if __name__ == "__main__":
    main()
