"""Where a side-by-side timing's noise comes from: ONNX graphs timed against a reference two ways, several times.

    .venv/bin/python benchmarks/session_noise.py --graph winner=RUN/stages/05-int8/model \
        --graph narrow=RUN2/stages/06-int8/model [--repeats 3] [--out benchmarks/results/session_noise.json]

The first graph is the reference, and it is timed a second time under the name `<name> again`: how far one graph
strays from itself is the noise floor. Each repeat times every graph (b1×s128 of real test tokens, and the test
sentences at their own lengths, one a call; 2 threads):
- `per-round sessions`: `pipeline.latency.compare_latency`, what the search's shape table and the speed gates use: a
  session opened for each graph in each of 3 interleaved rounds, 20 warm-up and 100 timed calls a round;
- `sessions once`: each graph's session opened once and warmed up once, then 30 interleaved rounds of 10 fixed-shape
  calls and 40 sentences; the median over rounds of each round's median.
Prints and writes each graph's speed over the reference (fixed / natural) per repeat.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from edgepress.data import DataConfig, load_data
from edgepress.device.feeds import (
    NATURAL_SENTENCES,
    bundle_tokenizer,
    fixed_shape_feeds,
    load_tokenizer,
    natural_feeds,
    position_limit,
)
from edgepress.device.timing import interleaved, seconds_of
from edgepress.export.parity import ort_runner
from edgepress.models.loading import read_model_config
from edgepress.pipeline.latency import compare_latency
from edgepress.runtime.latency import LatencyConfig
from edgepress.runtime.session import SessionConfig, open_session

THREADS, ROUNDS_ONCE = 2, 30


def per_round_sessions(graphs: dict[str, Path], texts: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    timed = compare_latency(graphs, texts, THREADS, cfg=LatencyConfig(warmup=20, runs=100))
    return {name: (t["fixed_p50_ms"], t["natural_p50_ms"]) for name, t in timed.items()}


def sessions_once(graphs: dict[str, Path], texts: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    runs = {}
    for name, graph in graphs.items():
        session = open_session(graph / "model.onnx", SessionConfig(providers=("cpu",), threads=THREADS))
        limit, names = position_limit(read_model_config(graph)), tuple(i.name for i in session.get_inputs())
        fixed = fixed_shape_feeds(load_tokenizer(graph, limit), texts, 1, 128, names, limit)
        natural = natural_feeds(bundle_tokenizer(graph, limit, 128), texts[:NATURAL_SENTENCES], names)
        runs[name] = (ort_runner(session), fixed, natural[:40])
        seconds_of(runs[name][0], [fixed], 20, 0)
    rounds = interleaved({name: lambda r=r, f=f, n=n: (np.median(seconds_of(r, [f], 2, 10)),
                                                       np.median(seconds_of(r, n, 0, len(n))))
                          for name, (r, f, n) in runs.items()}, ROUNDS_ONCE)
    return {name: (1e3 * float(np.median([a for a, _ in v])), 1e3 * float(np.median([b for _, b in v])))
            for name, v in rounds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", action="append", required=True, help="NAME=DIR of an ONNX model dir; the first "
                                                                         "is the reference")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "session_noise.json")
    args = parser.parse_args()
    named = [g.split("=", 1) for g in args.graph]
    reference = named[0][0]
    graphs = {reference: Path(named[0][1]), f"{reference} again": Path(named[0][1]),
              **{name: Path(path) for name, path in named[1:]}}
    texts = tuple(load_data(DataConfig()).test.texts)
    result = {"graphs": {name: str(path) for name, path in graphs.items()}, "threads": THREADS, "repeats": []}
    for repeat in range(args.repeats):
        row = {}
        for how, timing in (("per-round sessions", per_round_sessions), ("sessions once", sessions_once)):
            ms = timing(graphs, texts)
            row[how] = {name: {"fixed_ms": f, "natural_ms": n, "speed_fixed": ms[reference][0] / f,
                               "speed_natural": ms[reference][1] / n} for name, (f, n) in ms.items()}
            print(f"repeat {repeat} {how}: " + ", ".join(f"{name} {r['speed_fixed']:.2f}/{r['speed_natural']:.2f}"
                                                          for name, r in row[how].items()), flush=True)
        result["repeats"].append(row)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
