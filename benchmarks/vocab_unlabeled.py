"""What `vocab`'s `unlabeled` choice keeps: a torch model pruned to the train split's tokens alone, and to the train
split's and data.unlabeled's (the demo's 25,000 IMDB sentences), scored on validation and test beside the unpruned
model (torch fp32, the run's max_length), with the rows each keeps.

    .venv/bin/python benchmarks/vocab_unlabeled.py --model DIR --out benchmarks/results/vocab_unlabeled.json

DIR: a classifier of the demo teacher's tokenizer, e.g. a search's cached ffn stage (SEARCH_DIR/cache/KEY/model).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def main() -> None:
    from edgepress.compress.vocab import VocabConfig, vocab_prune
    from edgepress.data import DataConfig
    from edgepress.data.load import load_data
    from edgepress.models.loading import label2id_of
    from edgepress.tasks import CLASSIFICATION

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = DataConfig.model_validate({"source": "demo:movie-snippets", "max_length": 128, "unlabeled": {
        "source": "demo:imdb-sentences", "max_texts": 25000}})
    data = load_data(cfg, label2id_of(args.model))

    def scored(model_dir: Path) -> dict:
        model, words = CLASSIFICATION.load_model(model_dir)
        return {split: CLASSIFICATION.scores(part, CLASSIFICATION.torch_predictions(model, words, part.texts, 128))[
            "accuracy"] for split, part in (("validation", data.validation), ("test", data.test))}

    rows = {"unpruned": scored(args.model)}
    with tempfile.TemporaryDirectory() as scratch:
        for unlabeled in (False, True):
            out = Path(scratch) / f"v{int(unlabeled)}"
            details = vocab_prune(args.model, out, data, VocabConfig(unlabeled=unlabeled), CLASSIFICATION)
            rows[f"unlabeled {str(unlabeled).lower()}"] = {**scored(out), "rows_after": details["rows_after"],
                                                           "test_token_coverage": details["test_token_coverage"]}
    args.out.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
