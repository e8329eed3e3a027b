"""What each distillation lever buys the demo's 3-layer student (issue 27): transfer data (perturbed copies of the
train texts, `augment`, labelled by the teacher's soft logits), alpha, epochs, depth. Every variant is the demo's
distill stage (3 layers from teacher layers 0/2/4, hinton, 4 epochs, lr 1e-4, T 2, alpha 0.5, max length 128) with
one thing changed (`layers4-augment2`: two). The `chain` variants run the demo's whole training chain, distill then
heads (keep 0.5) and ffn (keep 0.25), each recovered by a 4-epoch distillation fine-tune, with one lever changed:
`teacher`, recoveries that learn the teacher's logits rather than their input's; augment in every stage; a milder
ffn; another seed. Each model is measured in torch fp32 (quantization is not the question here) on the validation
split (what a search selects on), the test split, the test split with typos and the demo archive's three other
registers (`edgepress.data.fidelity`): accuracy, and agreement with the teacher's labels; against `plain` (or
`chain`), the paired 95% CIs of the differences on the same texts.

    .venv/bin/python benchmarks/distill_levers.py [--variants augment2 plain ...] [--out FILE]
    .venv/bin/python benchmarks/distill_levers.py --merge A.json B.json   # runs made in parallel, into --out

A plain student takes 6–11 min on 2 cores, the chain about 15; transfer data multiplies the steps by (1 + copies
per text), or by (train + per_epoch) / train for unlabeled texts drawn per epoch (`imdb*` variants: 25,000 IMDB
sentences an epoch make a 3-layer student's 4 epochs 105 s on an H100, 27 s without them; about 4x the 2-core
time). On a CUDA GPU training and prediction run there (80–280 s a chain variant on an H100). Results are
written after each variant to benchmarks/results/distill_levers.json (an interrupted run keeps what finished; a
re-run skips the variants already there), each with the device it trained on; a file measured against a teacher
whose labels differ on any text is refused.
"""

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np

from edgepress.compress.distill import DistillConfig, distill
from edgepress.compress.structured import FfnConfig, HeadsConfig, ffn, heads
from edgepress.data import DataConfig, load_data
from edgepress.data.fidelity import demo_registers, with_typos
from edgepress.data.metrics import accuracy_drop_ci95
from edgepress.device.timing import cpu_model
from edgepress.files import write_json
from edgepress.models.evaluate import predict_logits
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.pipeline.environment import environment
from edgepress.teacher import resolve_model

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
    # the demo's whole training chain: distill, then heads (keep 0.5) and ffn (keep 0.25), each recovered by a
    # 4-epoch distillation fine-tune; measured after ffn, against `chain`
    "chain": {"then": {}},
    "chain-augment2": {"augment": {"factor": 2}, "then": {"augment": {"factor": 2}}},
    "chain-teacher": {"then": {"teacher": True}},
    "chain-teacher-augment2": {"augment": {"factor": 2}, "then": {"teacher": True, "augment": {"factor": 2}}},
    "chain-ffn0.5": {"then": {}, "ffn_keep": 0.5},
    "chain-teacher-ffn0.5": {"then": {"teacher": True}, "ffn_keep": 0.5},
    "chain-teacher-epochs8": {"epochs": 8, "then": {"teacher": True, "epochs": 8}},
    "chain-teacher-layers4": {"student_layers": 4, "then": {"teacher": True}},
    "chain-teacher-layers4-augment2": {"student_layers": 4, "augment": {"factor": 2},
                                       "then": {"teacher": True, "augment": {"factor": 2}}},
    **{f"chain-teacher-augment2-{m}": {"augment": {"factor": 2, "methods": [m]},
                                       "then": {"teacher": True, "augment": {"factor": 2, "methods": [m]}}}
       for m in ("mask", "neighbours", "ngram")},
    "chain-teacher-augment4": {"augment": {"factor": 4}, "then": {"teacher": True, "augment": {"factor": 4}}},
    # the same recipes trained from another seed: how far one draw moves the figures
    "chain-seed1": {"seed": 1, "then": {"seed": 1}},
    "chain-teacher-augment2-seed1": {"seed": 1, "augment": {"factor": 2},
                                     "then": {"seed": 1, "teacher": True, "augment": {"factor": 2}}},
    # transfer data (issue 49): IMDB users' review sentences (demo:imdb-sentences) labelled by the teacher, in
    # every stage of the chain with teacher recoveries; `imdb<pool>` the texts sampled (max_texts), `pe<n>` the
    # texts each epoch draws (per_epoch; unset: all). Measured against chain-teacher.
    **{f"chain-teacher-imdb{name}": {"unlabeled": unlabeled, "then": {"teacher": True}, "against": "chain-teacher"}
       for name, unlabeled in {
           "25k": {"max_texts": 25_000},
           "100k-pe25k": {"max_texts": 100_000, "per_epoch": 25_000},
           "300k-pe25k": {"max_texts": 300_000, "per_epoch": 25_000},
           "300k-pe50k": {"max_texts": 300_000, "per_epoch": 50_000},
           "all-pe25k": {"per_epoch": 25_000},
           "all-pe100k": {"per_epoch": 100_000}}.items()},
    # plain and layers4 again, on the GPU the imdb variants trained on: what those are paired with
    "plain-gpu": {},
    "layers4-gpu": {"student_layers": 4},
    **{f"imdb{name}": {"unlabeled": unlabeled, "against": "plain-gpu"} for name, unlabeled in {
        "25k": {"max_texts": 25_000}, "100k-pe25k": {"max_texts": 100_000, "per_epoch": 25_000},
        "300k-pe25k": {"max_texts": 300_000, "per_epoch": 25_000},
        "300k-pe50k": {"max_texts": 300_000, "per_epoch": 50_000}}.items()},
    # a cap a newcomer's 2 cores can afford: 8,000 of a 25,000 pool an epoch (the train split's size again)
    "imdb25k-pe8k": {"unlabeled": {"max_texts": 25_000, "per_epoch": 8_000}, "against": "plain"},
    "layers4-imdb25k": {"student_layers": 4, "unlabeled": {"max_texts": 25_000}, "against": "layers4-gpu"},
    "chain-teacher-layers4-imdb300k-pe25k": {"student_layers": 4, "then": {"teacher": True},
                                             "unlabeled": {"max_texts": 300_000, "per_epoch": 25_000},
                                             "against": "chain-teacher-layers4"},
    # the chain at the demo's cap, with the augmentation cross, and the 4-layer chain at that cap
    "chain-teacher-imdb25k-pe8k": {"unlabeled": {"max_texts": 25_000, "per_epoch": 8_000}, "then": {"teacher": True},
                                   "against": "chain-teacher"},
    "chain-teacher-augment2-imdb25k-pe8k": {"augment": {"factor": 2}, "unlabeled": {"max_texts": 25_000,
                                            "per_epoch": 8_000}, "then": {"teacher": True, "augment": {"factor": 2}},
                                            "against": "chain-teacher-augment2"},
    "chain-teacher-layers4-imdb25k-pe8k": {"student_layers": 4, "then": {"teacher": True},
                                           "unlabeled": {"max_texts": 25_000, "per_epoch": 8_000},
                                           "against": "chain-teacher-layers4"},
    # TinyBERT's hidden-state and attention losses beside the soft targets, without and with the transfer texts
    "tinybert-gpu": {"style": "tinybert", "against": "plain-gpu"},
    "tinybert-imdb25k": {"style": "tinybert", "unlabeled": {"max_texts": 25_000}, "against": "tinybert-gpu"},
}
CHAIN = (("heads", 0.5), ("ffn", 0.25))  # the demo's structured stages and what they keep
REGISTER_SIZE = 500  # the first 500 of each register, as its recorded results read them (compare.py reads all)


def fidelity_sets(data) -> dict[str, dict]:
    sets = {"validation": {"texts": data.validation.texts, "labels": data.validation.labels},
            "test": {"texts": data.test.texts, "labels": data.test.labels},
            "typos": {"texts": with_typos(data.test.texts), "labels": data.test.labels}}
    return sets | demo_registers(REGISTER_SIZE)


def predictions(model_dir: Path, sets: dict) -> dict[str, list[int]]:
    import torch

    model, tokenizer = load_classifier(model_dir)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    return {name: predict_logits(model, tokenizer, s["texts"], DEMO["max_length"]).argmax(-1).tolist()
            for name, s in sets.items()}


def run_one(teacher: Path, data, sets: dict, variant: dict) -> dict:
    """The variant's student (and with `then`, the chain's heads and ffn stages after it, `teacher: true` recovering
    from the teacher's logits instead of the stage input's), measured after its last stage; with `unlabeled`, every
    stage trains on demo:imdb-sentences too (data.unlabeled with those settings)."""
    if "unlabeled" in variant:
        config = DataConfig(unlabeled={"source": "demo:imdb-sentences", **variant["unlabeled"]})
        data = load_data(config, {name: i for i, name in data.id2label.items()})
    changes = {k: v for k, v in variant.items() if k not in ("then", "ffn_keep", "unlabeled", "against")}
    cfg = DistillConfig(**{**DEMO, **changes})
    with tempfile.TemporaryDirectory() as tmp:
        details = distill(teacher, Path(tmp) / "student", data, cfg)
        last, stages = Path(tmp) / "student", []
        if "then" in variant:
            then = {**variant["then"], **({"teacher": teacher} if variant["then"].get("teacher") else {})}
            for method, keep in CHAIN:
                keep = variant.get("ffn_keep", keep) if method == "ffn" else keep
                params = {"keep": keep, "epochs": DEMO["epochs"], "max_length": DEMO["max_length"], **then}
                made = (heads if method == "heads" else ffn)(
                    last, Path(tmp) / method, data, (HeadsConfig if method == "heads" else FfnConfig)(**params))
                stages.append({"method": method, "keep": keep, "val_accuracy": made["val_accuracy"],
                               "train_seconds": made["train_seconds"]})
                last = Path(tmp) / method
        preds = predictions(last, sets)
    return {"changes": variant, "config": cfg.model_dump(mode="json"), "predictions": preds,
            "device": _device(),  # a variant added later may train on another machine
            **{k: details[k] for k in ("best_epoch", "history", "transfer_examples")},
            "val_accuracy": stages[-1]["val_accuracy"] if stages else details["val_accuracy"],
            "train_seconds": details["train_seconds"] + sum(s["train_seconds"] for s in stages),
            **({"distill_val_accuracy": details["val_accuracy"], "stages": stages} if stages else {})}


def _device() -> str:
    """What trained: the GPU's name where training ran on one, else the CPU's."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_model()


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
            reference = run["changes"].get("against", "chain" if "then" in run["changes"] else "plain")
            if reference in runs and name != reference:
                base = runs[reference]["predictions"][s]
                row["agreement_gain_ci95"] = _gain(t, base, p)
                row["accuracy_gain_ci95"] = _gain(labels, base, p)
            rows[s] = row
        out[name] = {"sets": rows, "val_accuracy": run["val_accuracy"], "train_seconds": run["train_seconds"],
                     "device": run.get("device", run.get("cpu")), "transfer_examples": run["transfer_examples"],
                     **({"stages": run["stages"]} if "stages" in run else {})}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo:minilm-movie")
    parser.add_argument("--variants", nargs="+", default=["augment2", "plain"], choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--merge", type=Path, nargs="+", help="add the runs of these result files (written by "
                        "parallel runs against the same teacher) to --out, and rewrite its summary; a variant in "
                        "several files: the last file's run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # progress lines
    if args.merge:
        return merge(args.out, args.merge)
    teacher_dir = resolve_model(args.model)
    data = load_data(DataConfig(), label2id_of(teacher_dir))
    sets = fidelity_sets(data)
    saved = json.loads(args.out.read_text()) if args.out.is_file() else {}
    teacher = predictions(teacher_dir, sets)
    if saved and saved.get("teacher_predictions") != teacher:  # a rebuilt teacher that differs: not comparable
        raise SystemExit(f"the teacher's predictions differ from those in {args.out} (another teacher, or the same on "
                         "another device labelling a borderline text otherwise): its variants are not comparable. "
                         "Fix: --out a new file, or move the old one away")
    runs = saved.get("runs", {})
    for name in args.variants:
        if name not in runs:
            runs[name] = run_one(teacher_dir, data, sets, VARIANTS[name])
            write_json(args.out, {"model": args.model, "environment": environment(threads=2), "base": DEMO,
                                  "sizes": {s: len(v["texts"]) for s, v in sets.items()},
                                  "summary": summary(runs, teacher, sets), "runs": runs,
                                  "teacher_predictions": teacher,
                                  "labels": {s: np.asarray(v["labels"]).tolist() for s, v in sets.items()}})
        row = summary(runs, teacher, sets)[name]
        print(name, f"val {row['val_accuracy']:.4f}", f"{row['train_seconds']:.0f} s",
              *(f"{s} acc {r['accuracy']:.4f} agree {r['agreement']:.4f}" for s, r in row["sets"].items()), sep="\n  ")


def merge(out: Path, files: list[Path]) -> None:
    results = [json.loads(f.read_text()) for f in ([out] if out.is_file() else []) + files]
    teacher = results[0]["teacher_predictions"]
    if any(r["teacher_predictions"] != teacher for r in results):
        raise SystemExit("these files measured their variants against teachers that label some text differently "
                         "(another teacher, or another device): not comparable")
    runs = {name: run for r in results for name, run in r["runs"].items()}
    labels = next((r["labels"] for r in results if "labels" in r), None)
    if labels is None:
        raise SystemExit("none of these files records the sets' labels (written before --merge existed): re-run one "
                         "variant into a new file and merge with it")
    sets = {s: {"labels": np.asarray(v)} for s, v in labels.items()}
    write_json(out, {**results[0], "summary": summary(runs, teacher, sets), "runs": runs, "labels": labels})


if __name__ == "__main__":
    main()
