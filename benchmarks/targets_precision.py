"""What `targets_precision: bf16` buys and costs: a teacher's outputs on transfer texts (the demo's IMDB sentences,
length-sorted batches as the pipeline labels them) computed in fp32 and under torch's bf16 autocast, timed
interleaved in one process (rounds alternate the order), and compared: texts/s, the share of texts whose argmax
agrees, the largest |logit difference|, and the mean KL at the distillation's temperature.

    .venv/bin/python benchmarks/targets_precision.py [--model demo:mpnet-movie] [--texts 2000] [--rounds 3]
    # --also demo:minilm-movie adds a second teacher; writes benchmarks/results/targets_precision.json

bf16 is fast only where the hardware computes it (AMX or AVX-512 BF16 on a CPU, a recent GPU): the CPU's flags are
recorded beside the figures.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def measure(spec: str, texts: list[str], rounds: int, max_length: int, temperature: float) -> dict:
    import numpy as np
    import torch

    from edgepress.models.evaluate import on_accelerator, predict_outputs
    from edgepress.tasks import task_of
    from edgepress.teacher import resolve_model

    path = resolve_model(spec)
    model, tokenizer = task_of(path).load_model(path)
    seconds: dict[str, list[float]] = {"fp32": [], "bf16": []}
    outputs = {}
    for r in range(rounds + 1):  # round 0 warms up and is not kept
        for precision in (("fp32", "bf16") if r % 2 else ("bf16", "fp32")):
            start = time.perf_counter()
            with on_accelerator(model, precision):
                outputs[precision] = predict_outputs(model, tokenizer, texts, max_length)
            if r:
                seconds[precision].append(time.perf_counter() - start)
    full, half = (torch.from_numpy(outputs[p]) for p in ("fp32", "bf16"))
    kl = torch.nn.functional.kl_div((half / temperature).log_softmax(-1), (full / temperature).softmax(-1),
                                    reduction="none").sum(-1)
    rate = {p: len(texts) / statistics.median(s) for p, s in seconds.items()}
    return {"model": spec, "texts": len(texts), "max_length": max_length, "seconds": seconds,
            "texts_per_s": rate, "speedup": rate["bf16"] / rate["fp32"],
            "argmax_agreement": float((full.argmax(-1) == half.argmax(-1)).float().mean()),
            "max_abs_diff": float((full - half).abs().max()), "mean_kl": float(kl.mean()),
            "temperature": temperature, "fp32_argmax_share_positive": float(np.mean(outputs["fp32"].argmax(-1)))}


def main() -> None:
    import torch

    from edgepress.data.imdb import imdb_sentences
    from edgepress.device.timing import cpu_model, isa_flags

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo:mpnet-movie")
    parser.add_argument("--also", action="append", default=[])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "targets_precision.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts = list(imdb_sentences()[:args.texts])
    rows = []
    for spec in [args.model, *args.also]:
        row = measure(spec, texts, args.rounds, args.max_length, 2.0)
        print(f"{spec}: fp32 {row['texts_per_s']['fp32']:.1f} texts/s, bf16 {row['texts_per_s']['bf16']:.1f} "
              f"({row['speedup']:.2f}x); argmax agreement {row['argmax_agreement']:.4f}, max |diff| "
              f"{row['max_abs_diff']:.3f}, mean KL(T=2) {row['mean_kl']:.2e}", flush=True)
        rows.append(row)
    args.out.write_text(json.dumps({"cpu": cpu_model(), "cpu_flags": isa_flags(),
                                    "threads": args.threads, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
