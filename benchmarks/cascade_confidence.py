"""Which confidence defers better in a cascade: the student's top probability (`top`) or the top two's difference
(`margin`; a token classifier's: its least sure real token's). One student, one fallback, one teacher: the cascade
method's own calibration (`compress.cascade`) is run with each rule on the validation split, and its front — the
share of texts deferred against agreement with the teacher and the primary metric — is compared at the same shares,
and by the share each rule needs to reach an agreement. With two classes the rules order the texts alike (margin =
2 top − 1): measure on a teacher with more labels or on a tagger.

    .venv/bin/python benchmarks/cascade_confidence.py --teacher DIR --student ONNX_DIR --data SOURCE \
        [--fallback ONNX_OR_MODEL_DIR] [--max-length 128] --out benchmarks/results/cascade_confidence-NAME.json

--fallback: default the teacher, made ready as the stage makes it (export, fuse, int8 per channel).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from harness import provenance, write_results

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

SHARES = (0.05, 0.1, 0.15, 0.2, 0.3)  # deferred shares the two fronts are compared at
AGREEMENTS = (0.95, 0.97, 0.98, 0.99)  # agreements the share each rule needs is reported for


def at_share(front: list[dict], share: float) -> dict:
    """The front's point whose deferred share is nearest `share`."""
    return min(front, key=lambda row: abs(row["deferred"] - share))


def needed(front: list[dict], agreement: float) -> float | None:
    """The smallest deferred share of the front whose agreement reaches `agreement` (None: none does)."""
    shares = [row["deferred"] for row in front if row["agreement"] >= agreement]
    return min(shares) if shares else None


def main() -> None:
    from edgepress.compress.cascade import CascadeConfig, cascade
    from edgepress.data import DataConfig
    from edgepress.models.loading import label2id_of
    from edgepress.tasks import task_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", type=Path, required=True, help="the teacher's torch model dir")
    parser.add_argument("--student", type=Path, required=True, help="the student's ONNX dir (a stage's model)")
    parser.add_argument("--data", required=True, help="the data source the teacher was trained on")
    parser.add_argument("--fallback", default="teacher", help="an ONNX or model dir; default: the teacher")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    task = task_of(args.teacher)
    data = task.load(DataConfig(source=args.data, max_length=args.max_length), label2id_of(args.teacher))
    fronts = {}
    with tempfile.TemporaryDirectory(prefix="edgepress-confidence-") as scratch:
        for rule in ("top", "margin"):
            cfg = CascadeConfig(fallback=args.fallback, confidence=rule, min_agreement=1e-9, max_length=args.max_length,
                                baseline_model=args.teacher, threads=args.threads)
            fronts[rule] = cascade(args.student, Path(scratch) / rule, data, cfg, task)["front"]
    rows = {rule: {"at_share": {str(s): at_share(front, s) for s in SHARES},
                   "share_needed": {str(a): needed(front, a) for a in AGREEMENTS}} for rule, front in fronts.items()}
    result = {"teacher": str(args.teacher), "student": str(args.student), "fallback": args.fallback,
              "data": args.data, "task": task.name, "labels": len(data.id2label), "n_validation": len(data.validation),
              "provenance": provenance(args.threads), "rules": rows, "fronts": fronts}
    write_results(args.out, result)
    print(f"{task.name}, {len(data.id2label)} labels, validation n = {len(data.validation)}")
    print("deferred | " + " | ".join(f"{rule} agreement" for rule in fronts))
    for share in SHARES:
        print(f"{share:.0%} | " + " | ".join(f"{rows[r]['at_share'][str(share)]['agreement']:.4f} "
                                             f"({rows[r]['at_share'][str(share)]['deferred']:.1%})" for r in fronts))
    for agreement in AGREEMENTS:
        print(f"share for agreement {agreement} | " + " | ".join(
            "–" if rows[r]["share_needed"][str(agreement)] is None else f"{rows[r]['share_needed'][str(agreement)]:.1%}"
            for r in fronts))
    print(json.dumps({"written": str(args.out)}))


if __name__ == "__main__":
    main()
