"""Finished runs' bundles timed side by side with shapes no run here trained, cut from the same teacher as the search's
shape table cuts them (`search.shapes.shape_graphs`: exported, fused, int8'd; latency does not depend on the
weights): a trained point's speed over today's demo search winner (4 layers, FFN 1/2, int8) without training the
winner again. The hand-made demo's shape (3 layers, heads 1/2, FFN 1/4) is timed too: beside the demo's own bundle
it says what the untrained shape misses (vocabulary pruning; the fusions, picked by timing on the first shape).

    .venv/bin/python benchmarks/runs_vs_shapes.py --run demo=runs/demo --run width4=runs/width4 [--repeats 3] \
        [--out benchmarks/results/runs_vs_shapes.json]

Each repeat is one `compare_latency` of every graph (b1 x s128 of real test tokens, and the test sentences at their
own lengths, one a call; 2 threads; 3 x 10 short interleaved rounds). Prints and writes each graph's speed over the
winner's shape (fixed / natural) per repeat.
"""

import argparse
import json
import tempfile
from pathlib import Path

from session_noise import THREADS, speeds_over

from edgepress.data import DataConfig, load_data
from edgepress.files import read_json
from edgepress.runtime.latency import LatencyConfig
from edgepress.search.shapes import Shape, shape_graphs
from edgepress.teacher import resolve_model

WINNER, DEMO = Shape(4, ffn_keep=0.5), Shape(3, heads_keep=0.5, ffn_keep=0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="NAME=DIR of a finished run (its final/)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "runs_vs_shapes.json")
    args = parser.parse_args()
    runs = {name: Path(path) for name, path in (r.split("=", 1) for r in args.run)}
    models = {read_json(run / "report.json")["config"]["model"] for run in runs.values()}
    if len(models) != 1:
        raise SystemExit(f"the runs distil different teachers ({sorted(models)}): no shape of one teacher to time")
    data = load_data(DataConfig())
    texts = tuple(data.test.texts)
    result = {"runs": {name: str(path) for name, path in runs.items()}, "threads": THREADS}
    with tempfile.TemporaryDirectory(prefix="edgepress-runs-shapes-") as scratch:
        latency = LatencyConfig(warmup=20, runs=100)
        shapes, left_out = shape_graphs(resolve_model(models.pop()), [WINNER, DEMO], data.validation.texts,
                                        Path(scratch), THREADS, latency)
        result["fusions_left_out"] = left_out
        graphs = {**{f"shape: {name}": path for name, path in shapes.items()},
                  **{name: run / "final" for name, run in runs.items()}}
        result["repeats"] = speeds_over(graphs, f"shape: {WINNER.name}", texts, args.repeats, latency)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
