"""How far a side-by-side timing moves: ONNX graphs timed against a reference several times, as the search's shape
table and the speed gates time them (`pipeline.latency.compare_latency`).

    .venv/bin/python benchmarks/session_noise.py --graph winner=RUN/stages/05-int8/model \
        --graph narrow=RUN2/stages/06-int8/model [--repeats 3] [--out benchmarks/results/session_noise_turns.json]

The first graph is the reference, and it is timed a second time under the name `<name> again`: how far one graph
strays from itself is the noise floor. Each repeat is one `compare_latency` of every graph (b1×s128 of real test
tokens, and the test sentences at their own lengths, one a call; 2 threads; 20 warm-up calls, then 3 × 10 short
interleaved rounds of 10 fixed-shape calls and 20 sentences each). Prints and writes each graph's speed over the
reference (fixed / natural) per repeat.

benchmarks/results/session_noise.json was written by this script's first version (git show
f7a10c7:benchmarks/session_noise.py), which timed compare_latency as it was then, a session opened for each graph in
each of 3 rounds, against sessions opened once: the second way is what compare_latency does since.
"""

import argparse
import json
from pathlib import Path

from edgepress.data import DataConfig, load_data
from edgepress.pipeline.latency import compare_latency
from edgepress.runtime.latency import LatencyConfig

THREADS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", action="append", required=True, help="NAME=DIR of an ONNX model dir; the first "
                                                                         "is the reference")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "session_noise_turns.json")
    args = parser.parse_args()
    named = [g.split("=", 1) for g in args.graph]
    reference = named[0][0]
    graphs = {reference: Path(named[0][1]), f"{reference} again": Path(named[0][1]),
              **{name: Path(path) for name, path in named[1:]}}
    texts = tuple(load_data(DataConfig()).test.texts)
    result = {"graphs": {name: str(path) for name, path in graphs.items()}, "threads": THREADS,
              "repeats": speeds_over(graphs, reference, texts, args.repeats, LatencyConfig(warmup=20, runs=100))}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def speeds_over(graphs: dict[str, Path], reference: str, texts: tuple[str, ...], repeats: int,
                latency: LatencyConfig) -> list[dict]:
    """Per repeat (one `compare_latency` of every graph), each graph's p50s and its speed over `reference`, fixed
    shape and natural lengths; printed as they come."""
    rows = []
    for repeat in range(repeats):
        timed = compare_latency(graphs, texts, THREADS, cfg=latency)
        ref = timed[reference]
        row = {name: {"fixed_ms": t["fixed_p50_ms"], "natural_ms": t["natural_p50_ms"],
                      "speed_fixed": ref["fixed_p50_ms"] / t["fixed_p50_ms"],
                      "speed_natural": ref["natural_p50_ms"] / t["natural_p50_ms"]} for name, t in timed.items()}
        print(f"repeat {repeat}: " + ", ".join(f"{name} {r['speed_fixed']:.2f}/{r['speed_natural']:.2f}"
                                               for name, r in row.items()), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
