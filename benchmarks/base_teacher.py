"""A base-size teacher: all-mpnet-base-v2 (demo:mpnet: MPNet, 12 x 768, 110M; `make base-model`) fine-tuned with a
fresh 2-class head on the demo's movie snippets (the demo's own seeded split), beside the demo teacher (MiniLM-L6,
22M), in one process: validation and test accuracy, training time, and torch latency at b1 x s128, at natural
lengths and at b32 x s128, timed interleaved (benchmarks/compare.py's rounds).

    .venv/bin/python benchmarks/base_teacher.py [--rounds 5] [--threads 2]
    # the teacher, demo:mpnet-movie, is built on first use into the cache (EDGEPRESS_CACHE/models/mpnet-movie), like
    # the demo teacher (edgepress.teacher.BASE_RECIPE); on 2 CPU cores that is about an hour (one epoch;
    # MiniLM-L6's two take 19 minutes there, and an MPNet-base training step 6.7x MiniLM's); on a GPU, minutes.
    # Writes benchmarks/results/base_teacher.{json,md}
    .venv/bin/python benchmarks/base_teacher.py --step-times
    # what the build will cost here, before building: one training step (32 texts x 64 tokens) and one b1 x s128
    # torch forward of each encoder with a fresh head, medians after a warm-up
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import TEACHER, Candidate, fidelity_sets, latency_row, prepare, quality, time_round  # noqa: E402

from edgepress.teacher import BASE_RECIPE, BASE_TEACHER  # noqa: E402


def step_times(threads: int, steps: int = 4, forwards: int = 12) -> None:
    """Median seconds of a training step (32 train texts x 64 tokens, AdamW) and of a b1 x s128 forward, per
    encoder, and the base teacher's epochs of the demo's train split that the step time alone comes to."""
    import statistics
    import time

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from edgepress.data import DataConfig, load_data
    from edgepress.models.evaluate import forward_inputs
    from edgepress.teacher import base_encoder_dir, encoder_dir

    torch.set_num_threads(threads)
    data = load_data(DataConfig())
    for name, path in (("MiniLM-L6", encoder_dir()), ("MPNet-base", base_encoder_dir())):
        words = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
        step = []
        for i in range(steps):
            batch = words(list(data.train.texts[i * 32:(i + 1) * 32]), padding=True, truncation=True, max_length=64,
                          return_tensors="pt")
            start = time.perf_counter()
            model(**forward_inputs(model, batch), labels=torch.zeros(32, dtype=torch.long)).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step.append(time.perf_counter() - start)
        long = words([" ".join(data.test.texts[:20])], truncation=True, max_length=128, return_tensors="pt")
        forward = []
        model.eval()
        with torch.inference_mode():
            for _ in range(forwards):
                start = time.perf_counter()
                model(**forward_inputs(model, long))
                forward.append(time.perf_counter() - start)
        median = statistics.median(step[1:])
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, training step "
              f"{median:.2f} s, b1 x s128 forward {statistics.median(forward[2:]) * 1e3:.1f} ms; {BASE_RECIPE.epochs} "
              f"epoch(s) of {len(data.train)} texts: ~{BASE_RECIPE.epochs * len(data.train) / 32 * median / 60:.0f} "
              f"min of steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step-times", action="store_true", help="time a training step and a forward, build nothing")
    args = parser.parse_args()
    if args.step_times:
        step_times(args.threads)
        return

    from edgepress.data import DataConfig, load_data
    from edgepress.files import read_json
    from edgepress.models.introspect import param_counts
    from edgepress.models.loading import load_classifier
    from edgepress.teacher import MANIFEST, teacher_dir

    data = load_data(DataConfig(max_length=128))
    paths = {TEACHER: teacher_dir(), "base-teacher-torch-fp32": teacher_dir(BASE_TEACHER)}  # the demo's: reference
    candidates = [Candidate(name, path, False) for name, path in paths.items()]
    rows = quality(candidates, fidelity_sets(data, ""), 128, args.threads)
    for candidate in candidates:
        prepare(candidate, data.test.texts, args.threads, 128)
    for r in range(args.rounds + 1):
        time_round(candidates, keep=r > 0)
    for candidate in candidates:
        built = read_json(candidate.path / MANIFEST)
        rows[candidate.name].update(latency_row(candidate), params=param_counts(load_classifier(candidate.path)[0]),
                                    val_accuracy=built["val_accuracy"], train_seconds=built["train_seconds"],
                                    recipe=built["recipe"], encoder=built["encoder"])
    out = HERE / "results" / "base_teacher.json"
    out.write_text(json.dumps({"threads": args.threads, "rounds": args.rounds, "candidates": rows}, indent=1))
    lines = ["| teacher | params | val accuracy | test accuracy | train s | b1 x s128 ms | natural ms "
             "| b32 x s128 ms |", "|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['params']['params'] / 1e6:.1f}M | {row['val_accuracy']:.4f} | "
                     f"{row['accuracy']:.4f} | {row['train_seconds']:.0f} | {row['fixed']['p50_ms']:.2f} | "
                     f"{row['natural']['p50_ms']:.2f} | {row['batch32']['p50_ms']:.1f} |")
    (HERE / "results" / "base_teacher.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
