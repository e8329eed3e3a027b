"""Head and FFN-neuron importance: |d loss / d gate| summed per batch (Michel et al. 2019, what `heads` and `ffn`
use) against the sum of signed gradients made absolute at the end (what they used before), on the same batches.

    .venv/bin/python benchmarks/head_importance.py [--model demo:minilm-movie] [--batches 32] [--keep 0.5]

For each estimator: which units it keeps, how much the kept sets overlap, the rank correlation of the scores, and
the validation accuracy of the model pruned by it with no recovery fine-tune (what the fine-tune starts from).
Writes benchmarks/results/head_importance.json.
"""

import argparse
import copy
import json
import platform
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from edgepress.compress.structured import FfnConfig, HeadsConfig, _keep_top, gate_gradients, prune_ffn, prune_heads
from edgepress.data import DataConfig, load_data
from edgepress.models.evaluate import evaluate_classifier
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.pipeline.environment import environment
from edgepress.teacher import resolve_model

PRUNE = {"heads": prune_heads, "ffn": prune_ffn}


def compare(model, tokenizer, data, what: str, batches: int, keep: float) -> dict:
    cfg = (HeadsConfig if what == "heads" else FfnConfig)(importance_batches=batches, max_length=128)
    grads = list(gate_gradients(model, tokenizer, data, cfg, what))  # each (layers, units)
    scores = {"per_batch_abs": sum(np.abs(g) for g in grads), "signed_sum_abs": np.abs(sum(grads))}
    kept = {name: _keep_top(s, keep) for name, s in scores.items()}
    result = {"batches": len(grads), "keep": keep, "kept": kept,
              "overlap_per_layer": [len(set(a) & set(b)) / len(a) for a, b in
                                    zip(kept["per_batch_abs"], kept["signed_sum_abs"], strict=True)],
              "spearman_per_layer": [float(spearmanr(a, b).statistic) for a, b in
                                     zip(scores["per_batch_abs"], scores["signed_sum_abs"], strict=True)],
              "val_accuracy_pruned_no_recovery": {}}
    for name, units in kept.items():
        pruned = copy.deepcopy(model)
        PRUNE[what](pruned, units)
        metrics, _ = evaluate_classifier(pruned, tokenizer, data.validation, 128)
        result["val_accuracy_pruned_no_recovery"][name] = metrics["accuracy"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo:minilm-movie")
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "head_importance.json")
    args = parser.parse_args()
    model_dir = resolve_model(args.model)
    data = load_data(DataConfig(), label2id_of(model_dir))
    model, tokenizer = load_classifier(model_dir)
    baseline, _ = evaluate_classifier(model, tokenizer, data.validation, 128)
    results = {"model": args.model, "machine": platform.machine(), "environment": environment(),
               "val_accuracy_unpruned": baseline["accuracy"],
               **{what: compare(model, tokenizer, data, what, args.batches, args.keep) for what in PRUNE}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for what in PRUNE:
        r = results[what]
        print(f"{what}: kept-set overlap per layer {np.round(r['overlap_per_layer'], 2).tolist()}, spearman "
              f"{np.round(r['spearman_per_layer'], 2).tolist()}, validation accuracy pruned (no recovery) "
              f"{r['val_accuracy_pruned_no_recovery']} (unpruned {baseline['accuracy']:.4f})")


if __name__ == "__main__":
    main()
