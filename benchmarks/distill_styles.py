"""Does TinyBERT's layer-wise loss (hidden states + attention scores, Jiao et al. 2020) beat plain `hinton` for a
3-layer and a 2-layer student of the demo teacher? Each student is distilled with the demo's settings (4 epochs,
lr 1e-4, T 2, alpha 0.5, max length 128), evaluated on the test split, and compared with the hinton student of the
same depth by the paired bootstrap CI of the accuracy difference on the same test sentences.

    .venv/bin/python benchmarks/distill_styles.py [--layers 3 2] [--styles hinton tinybert] [--epochs 4]

Each distillation takes 20-60 min on 2 CPU cores (tinybert runs the teacher alongside every step). Results are
written after each one to benchmarks/results/distill_styles.json (an interrupted run keeps what finished; a re-run
skips the pairs already there).
"""

import argparse
import json
import tempfile
from pathlib import Path

from edgepress.compress.distill import DistillConfig, distill
from edgepress.data import DataConfig, load_data
from edgepress.data.metrics import accuracy_drop_ci95
from edgepress.files import write_json
from edgepress.models.evaluate import evaluate_classifier
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.pipeline.environment import environment
from edgepress.teacher import resolve_model

OUT = Path(__file__).parent / "results" / "distill_styles.json"


def run_one(model_dir: Path, data, layers: int, style: str, epochs: int) -> dict:
    cfg = DistillConfig(student_layers=layers, style=style, epochs=epochs, learning_rate=1e-4, temperature=2.0,
                        alpha=0.5, max_length=128)
    with tempfile.TemporaryDirectory() as tmp:
        details = distill(model_dir, Path(tmp) / "student", data, cfg)
        student, tokenizer = load_classifier(Path(tmp) / "student")
        metrics, preds = evaluate_classifier(student, tokenizer, data.test, 128)
    return {"layers": layers, "style": style, "config": cfg.model_dump(mode="json"), "test": metrics,
            "predictions": preds.tolist(), "val_accuracy": details["val_accuracy"],
            "best_epoch": details["best_epoch"], "history": details["history"],
            "train_seconds": details["train_seconds"]}


def compare(results: dict, labels) -> dict:
    """Per depth: each style's test accuracy minus hinton's, with the paired 95% CI."""
    out = {}
    for key, row in results.items():
        base = results.get(f"{row['layers']}-hinton")
        if base is None or row["style"] == "hinton":
            continue
        lo, hi = accuracy_drop_ci95(labels, row["predictions"], base["predictions"])  # style - hinton
        out[key] = {"minus_hinton": row["test"]["accuracy"] - base["test"]["accuracy"], "ci95": [lo, hi]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo:minilm-movie")
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 2])
    parser.add_argument("--styles", nargs="+", default=["hinton", "tinybert"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    model_dir = resolve_model(args.model)
    data = load_data(DataConfig(), label2id_of(model_dir))
    saved = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results = saved.get("runs", {})
    for layers in args.layers:
        for style in args.styles:
            key = f"{layers}-{style}"
            if key not in results:
                results[key] = run_one(model_dir, data, layers, style, args.epochs)
                write_json(args.out, {"model": args.model, "environment": environment(), "runs": results,
                                 "against_hinton": compare(results, data.test.labels)})
            print(key, f"test {results[key]['test']['accuracy']:.4f}", f"val {results[key]['val_accuracy']:.4f}",
                  f"{results[key]['train_seconds']:.0f} s")
    print(json.dumps(compare(results, data.test.labels), indent=2))


if __name__ == "__main__":
    main()
