"""What `vocab` keeps of the run's unlabeled texts, and what it costs: a torch model pruned to the train split's
tokens alone, and to those and the tokens data.unlabeled's texts (the demo's 25,000 IMDB sentences) give at least k
times, for several k, scored on validation beside the unpruned model (torch fp32, the run's max_length): accuracy,
agreement with the unpruned model and with the teacher, each difference as a paired 95% CI, and the rows kept (the
bytes they cost at int8: one byte a row and hidden dimension). Validation chooses; test is printed for reporting.

    .venv/bin/python benchmarks/vocab_unlabeled.py --model DIR [--teacher TEACHER_DIR] \
        --out benchmarks/results/vocab_unlabeled.json

DIR: a classifier of the demo teacher's tokenizer, e.g. the demo's ffn stage (runs/demo/stages/03-ffn/model).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

COUNTS = (1, 2, 3, 4, 5, 10)  # unlabeled_min_count values tried beside `unlabeled: false`


def paired(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Paired BCa 95% interval of mean(a) - mean(b), two 0/1 vectors over the same texts."""
    from edgepress.data.metrics import accuracy_drop_ci95

    return accuracy_drop_ci95(np.ones_like(a), a, b)  # base = a, new = b: mean(a == 1) - mean(b == 1)


def main() -> None:
    from edgepress.compress.vocab import VocabConfig, vocab_prune
    from edgepress.data import DataConfig
    from edgepress.data.load import load_data
    from edgepress.models.loading import label2id_of
    from edgepress.tasks import CLASSIFICATION

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--teacher", type=Path, help="the teacher whose labels agreement is counted against")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = DataConfig.model_validate({"source": "demo:movie-snippets", "max_length": 128, "unlabeled": {
        "source": "demo:imdb-sentences", "max_texts": 25000}})
    data = load_data(cfg, label2id_of(args.model))
    splits = {"validation": data.validation, "test": data.test}

    def predictions(model_dir: Path) -> dict[str, np.ndarray]:
        model, words = CLASSIFICATION.load_model(model_dir)
        return {s: CLASSIFICATION.torch_predictions(model, words, part.texts, 128) for s, part in splits.items()}

    unpruned = predictions(args.model)
    teacher = predictions(args.teacher) if args.teacher else None
    hidden = CLASSIFICATION.load_model(args.model)[0].config.hidden_size
    options = {"unlabeled false": VocabConfig(unlabeled=False)} | {
        f"unlabeled_min_count {k}": VocabConfig(unlabeled_min_count=k) for k in COUNTS}
    rows, right = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, option in options.items():
            out = Path(scratch) / name.replace(" ", "-")
            details = vocab_prune(args.model, out, data, option, CLASSIFICATION)
            preds = predictions(out)
            row = {"rows_after": details["rows_after"],
                   "embedding_int8_mb": round(details["rows_after"] * hidden / 1e6, 3),
                   "test_token_coverage": details["test_token_coverage"]}
            for split, part in splits.items():
                right[name, split] = (preds[split] == part.labels).astype(float)
                row[split] = {"accuracy": float(right[name, split].mean()),
                              "agreement_unpruned": float(np.mean(preds[split] == unpruned[split]))}
                if teacher:
                    row[split]["agreement_teacher"] = float(np.mean(preds[split] == teacher[split]))
            rows[name] = row
    for split in splits:  # each option against the train split alone and against every unlabeled token
        for name in options:
            for other in ("unlabeled false", "unlabeled_min_count 1"):
                rows[name][split][f"accuracy_minus {other}_ci95"] = paired(right[name, split], right[other, split])
    base = {s: {"accuracy": float(np.mean(unpruned[s] == p.labels))} for s, p in splits.items()}
    result = {"model": str(args.model), "teacher": str(args.teacher) if args.teacher else None,
              "unlabeled_texts": len(data.unlabeled), "unpruned": base, "rows": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        v, t = row["validation"], row["test"]
        print(f"{name:24s} rows {row['rows_after']:6d}  val acc {v['accuracy']:.4f} "
              f"(- train-only {v['accuracy_minus unlabeled false_ci95']}) agree-unpruned {v['agreement_unpruned']:.4f}"
              f" agree-teacher {v.get('agreement_teacher', float('nan')):.4f} | test acc {t['accuracy']:.4f}")


if __name__ == "__main__":
    main()
