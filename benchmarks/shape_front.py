"""Depth against width and rank, latency only: shapes a search may train (depth, heads, FFN neurons, hidden width,
FFN rank kept), cut from an encoder with a fresh classification head, each exported, fused and int8'd as the search's
shape table makes them (`search.shapes.time_shapes`: side by side, interleaved rounds), at the run's b1 x s128. The
weights are the pretrained encoder's, untrained for the task: the numbers say what the shapes cost, nothing about
what they keep (that needs each one trained: `edgepress search`).

    .venv/bin/python benchmarks/shape_front.py [--encoder minilm|mpnet] [--threads 2] [--out FILE.json]

minilm: the demo teacher's architecture (all-MiniLM-L6-v2, 6 x 384, FFN 1536), with today's demo search winner
(4 layers, FFN 1/2, int8) and the hand-made demo's (3 layers, heads 1/2, FFN 1/4) among the shapes; mpnet: the base
teacher's (all-mpnet-base-v2, 12 x 768, FFN 3072). Writes FILE.json and prints the table, fastest first, with each
shape's speed over the first shape (the reference).
"""

import argparse
import json
import tempfile
from pathlib import Path

from edgepress.data import DataConfig, load_data
from edgepress.files import write_json
from edgepress.models.loading import with_new_head
from edgepress.pipeline.environment import environment
from edgepress.runtime.latency import LatencyConfig
from edgepress.search.shapes import Shape, time_shapes
from edgepress.teacher import base_encoder_dir, encoder_dir

SHAPES = {
    "minilm": [Shape(4, ffn_keep=0.5), Shape(3), Shape(2), Shape(6), Shape(4), Shape(6, width_keep=0.5),
               Shape(6, width_keep=0.5, ffn_keep=0.5), Shape(4, width_keep=0.5), Shape(4, width_keep=0.5, ffn_keep=0.5),
               Shape(4, width_keep=0.75, ffn_keep=0.5), Shape(3, width_keep=0.5), Shape(3, width_keep=0.5,
               ffn_keep=0.5), Shape(6, width_keep=0.5, heads_keep=0.5, ffn_keep=0.5), Shape(6, rank_keep=0.25),
               Shape(4, rank_keep=0.25), Shape(4, ffn_keep=0.5, rank_keep=0.25),
               Shape(6, width_keep=0.5, rank_keep=0.25),
               # the hand-made demo's shape (vocab pruning aside), and width shapes about as fast
               Shape(3, heads_keep=0.5, ffn_keep=0.25), Shape(4, width_keep=0.5, ffn_keep=0.25),
               Shape(4, width_keep=0.5, heads_keep=0.5, ffn_keep=0.5), Shape(3, width_keep=0.5, heads_keep=0.5,
               ffn_keep=0.5), Shape(6, width_keep=0.5, heads_keep=0.5, ffn_keep=0.25),
               # the gentler width with the other cuts: what reaches 1.5x without halving the width
               Shape(4, width_keep=0.75, ffn_keep=0.5, rank_keep=0.25), Shape(4, width_keep=0.75, heads_keep=0.5,
               ffn_keep=0.5), Shape(4, width_keep=0.75, ffn_keep=0.25), Shape(3, width_keep=0.75, ffn_keep=0.5),
               # width 3/4 with the demo's own cuts: the width points about as fast as the demo
               Shape(3, width_keep=0.75, heads_keep=0.5, ffn_keep=0.5), Shape(3, width_keep=0.75, heads_keep=0.5,
               ffn_keep=0.25), Shape(3, width_keep=0.75, ffn_keep=0.25), Shape(4, width_keep=0.75, heads_keep=0.5,
               ffn_keep=0.25)],
    "mpnet": [Shape(12), Shape(4), Shape(3), Shape(12, width_keep=0.5), Shape(6, width_keep=0.5),
              Shape(6, width_keep=0.5, ffn_keep=0.5), Shape(4, width_keep=0.5), Shape(6, rank_keep=0.25),
              Shape(4, ffn_keep=0.5, rank_keep=0.25)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", choices=sorted(SHAPES), default="minilm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(f"benchmarks/results/shape_front_{args.encoder}.json")
    data = load_data(DataConfig())
    encoder = encoder_dir() if args.encoder == "minilm" else base_encoder_dir()
    with tempfile.TemporaryDirectory(prefix="edgepress-front-") as scratch:
        model, tokenizer = with_new_head(encoder, "AutoModelForSequenceClassification", data.id2label, seed=0)
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        shapes = SHAPES[args.encoder]
        table = time_shapes(Path(scratch), shapes, data.validation.texts, args.threads,
                            LatencyConfig(batch_size=1, sequence_length=128, warmup=20, runs=200))
    reference = table[shapes[0].name]["fixed_p50_ms"]
    rows = sorted(table.items(), key=lambda item: item[1]["fixed_p50_ms"])
    write_json(out, {"encoder": args.encoder, "reference": shapes[0].name, "shapes": table,
                     "environment": environment(args.threads)})
    print(f"{'shape':<48} {'p50 ms':>8} {'speed':>6} {'MB':>6}")
    for name, row in rows:
        print(f"{name:<48} {row['fixed_p50_ms']:>8.2f} {reference / row['fixed_p50_ms']:>5.2f}x "
              f"{row['size_mb']:>6.1f}")
    print(json.dumps({"written": str(out)}))


if __name__ == "__main__":
    main()
