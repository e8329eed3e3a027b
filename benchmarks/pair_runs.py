"""Two runs of the demo's teacher and data, bundle against bundle: the agreement of each final bundle with the
teacher's labels, and its accuracy, on validation, test, test with typos and the demo archive's three other
registers (the sets benchmarks/distill_levers.py measures), with the paired 95% CI of what the second gains over the
first on the same texts. What compare.py cannot say across two of its runs: whether a change of recipe moved
fidelity beyond the noise of these few thousand texts. Latency is not measured here (compare.py times).

    .venv/bin/python benchmarks/pair_runs.py --before RUN_A --after RUN_B [--out FILE.json]

Each bundle predicts one text per call, as a run evaluates; the teacher (the runs' `model`) in torch on this CPU.
"""

import argparse
from pathlib import Path

import numpy as np
from distill_levers import fidelity_sets, predictions

from edgepress.data import DataConfig, load_data
from edgepress.data.metrics import accuracy_drop_ci95
from edgepress.device.predictor import Predictor
from edgepress.files import read_json, write_json
from edgepress.models.loading import label2id_of
from edgepress.teacher import resolve_model


def bundle_labels(bundle: Path, sets: dict, label2id: dict) -> dict[str, list[int]]:
    predictor = Predictor(bundle)
    return {name: [label2id[predictor.predict([t])[0].label] for t in s["texts"]] for name, s in sets.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="a finished run dir (its final/ bundle)")
    parser.add_argument("--after", type=Path, required=True, help="a finished run dir of the same teacher")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "pair_runs.json")
    args = parser.parse_args()
    models = {read_json(run / "report.json")["config"]["model"] for run in (args.before, args.after)}
    if len(models) != 1:
        raise SystemExit(f"the runs distil different teachers ({sorted(models)}): nothing to pair")
    teacher_dir = resolve_model(models.pop())
    label2id = label2id_of(teacher_dir)
    sets = fidelity_sets(load_data(DataConfig(), label2id))
    teacher = predictions(teacher_dir, sets)
    labels = {run: bundle_labels(run / "final", sets, label2id) for run in (args.before, args.after)}
    rows = {}
    for name, s in sets.items():
        t, truth = np.asarray(teacher[name]), np.asarray(s["labels"])
        before, after = (np.asarray(labels[run][name]) for run in (args.before, args.after))
        lo, hi = accuracy_drop_ci95(t, before, after)
        a_lo, a_hi = accuracy_drop_ci95(truth, before, after)
        rows[name] = {"n": len(t), "agreement": [float(np.mean(before == t)), float(np.mean(after == t))],
                      "agreement_gain_ci95": [-hi, -lo],
                      "accuracy": [float(np.mean(before == truth)), float(np.mean(after == truth))],
                      "accuracy_gain_ci95": [-a_hi, -a_lo]}
        print(f"{name:10} agreement {rows[name]['agreement'][0]:.4f} -> {rows[name]['agreement'][1]:.4f} "
              f"(gain CI [{-hi:+.3f}, {-lo:+.3f}])  accuracy {rows[name]['accuracy'][0]:.4f} -> "
              f"{rows[name]['accuracy'][1]:.4f}")
    write_json(args.out, {"before": str(args.before), "after": str(args.after), "teacher": str(teacher_dir),
                          "sets": rows})


if __name__ == "__main__":
    main()
