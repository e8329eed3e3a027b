"""What `train_precision: bf16` buys: the same training run (edgepress's one loop, `train_classifier`, one epoch over
real movie snippets) of a student cut from a teacher's layers, in fp32 and under torch's bf16 autocast, timed
interleaved in one process (rounds alternate the order). Each round starts from the same weights and seed; the
figures are texts/s (the run's seconds, a tiny validation included) and each run's training loss.

    .venv/bin/python benchmarks/train_precision.py [--model demo:mpnet-movie] [--layers 6] [--texts 640]
    # --rounds 3; writes benchmarks/results/train_precision.json

bf16 is fast only where the hardware computes it (AMX or AVX-512 BF16 on a CPU, a recent GPU): the CPU's flags are
recorded beside the figures. What it does to accuracy is measured by whole runs (docs/methods.md).
"""

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def main() -> None:
    import torch

    from edgepress.compress.distill import DistillConfig, make_student
    from edgepress.data import DataConfig, load_data
    from edgepress.device.timing import cpu_model, isa_flags
    from edgepress.models.train import TrainConfig, train_classifier
    from edgepress.tasks import task_of
    from edgepress.teacher import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo:mpnet-movie")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--texts", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "train_precision.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    task = task_of(path)
    teacher, tokenizer = task.load_model(path)
    student, _ = make_student(teacher, DistillConfig(student_layers=args.layers))
    data = load_data(DataConfig(max_length=args.max_length))
    train, validation = data.train.take(args.texts), data.validation.take(32)
    score = task.training_score(tokenizer, validation, args.max_length)
    seconds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    losses: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for r in range(args.rounds + 1):  # round 0 warms up and is not kept
        for precision in (("fp32", "bf16") if r % 2 else ("bf16", "fp32")):
            cfg = TrainConfig(epochs=1, max_length=args.max_length, learning_rate=1e-4, train_precision=precision)
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                result = train_classifier(copy.deepcopy(student), tokenizer, train, cfg, Path(out), score=score)
                if r:
                    seconds[precision].append(time.perf_counter() - start)
                    losses[precision].append(result.history[0]["train_loss"])
    rate = {p: args.texts / statistics.median(s) for p, s in seconds.items()}
    print(f"{args.model} cut to {args.layers} layers: fp32 {rate['fp32']:.1f} texts/s, bf16 {rate['bf16']:.1f} "
          f"({rate['bf16'] / rate['fp32']:.2f}x); train loss fp32 {losses['fp32'][0]:.4f}, bf16 "
          f"{losses['bf16'][0]:.4f}", flush=True)
    args.out.write_text(json.dumps({
        "cpu": cpu_model(), "cpu_flags": isa_flags(), "threads": args.threads, "torch": torch.__version__,
        "model": args.model, "layers": args.layers, "texts": args.texts, "max_length": args.max_length,
        "seconds": seconds, "texts_per_s": rate, "speedup": rate["bf16"] / rate["fp32"], "train_loss": losses},
        indent=1))


if __name__ == "__main__":
    main()
