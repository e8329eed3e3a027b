"""ONNX Runtime's SkipLayerNormalization kernel against the Add + Add + LayerNormalization it fuses, and two graphs side
by side at natural lengths: why the embedding demo's `fuse` stage leaves SkipLayerNormalization out.

onnxruntime 1.31's CPU SkipLayerNormalization (contrib_ops/cpu/skip_layer_norm.cc) normalizes each row in a scalar
loop with a division per element; the ONNX LayerNormalization kernel it replaces is vectorized. Part 1 times chains
of 12 (a 6-layer encoder has 12) of each, on rows of 384 (MiniLM's width) at 27 tokens (the demo's texts' mean) and
at 128, on 1 and 2 intra-op threads, the two chains in turn for `--rounds` rounds. Part 2 (`--graphs A B`) times two
ONNX model dirs side by side as a speed gate does (`compare_latency`: the demo's test texts at their natural lengths,
one a call, and b1 x 128), each session honouring the `ort_session.json` beside its graph (the optimizers a left-out
fusion keeps off).

    .venv/bin/python benchmarks/layer_norm.py [--graphs runs/embdemo3/stages/03-int8/model \
        runs/embdemo4/stages/03-int8/model]    # writes benchmarks/results/layer_norm.json
"""

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
HIDDEN, CHAIN = 384, 12


def chain(kind: str) -> bytes:
    """CHAIN layer norms in a row, each adding the same skip and bias: fused (SkipLayerNormalization) or not."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), name)
               for name in ("gamma", "beta", "bias")]
    nodes, previous = [], "x"
    for i in range(CHAIN):
        out = "y" if i == CHAIN - 1 else f"t{i}"
        if kind == "SkipLayerNormalization":
            nodes.append(helper.make_node(kind, [previous, "skip", "gamma", "beta", "bias"], [out],
                                          domain="com.microsoft", epsilon=1e-12))
        else:
            nodes += [helper.make_node("Add", [previous, "skip"], [f"a{i}"]),
                      helper.make_node("Add", [f"a{i}", "bias"], [f"b{i}"]),
                      helper.make_node("LayerNormalization", [f"b{i}", "gamma", "beta"], [out], axis=-1,
                                       epsilon=1e-12)]
        previous = out
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, None, HIDDEN]) for n in ("x", "skip")]
    graph = helper.make_graph(nodes, "chain", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def time_chains(rounds: int) -> list[dict]:
    """µs per layer norm of each chain (its p50 run over 300, divided by CHAIN), per row count and thread count
    (median over rounds)."""
    import onnxruntime

    from edgepress.device.sessions import session_options
    from edgepress.device.timing import interleaved, time_runner

    kinds = ("SkipLayerNormalization", "Add+Add+LayerNormalization")
    rows = []
    for tokens in (27, 128):
        rng = np.random.default_rng(1)
        feed = {n: rng.standard_normal((1, tokens, HIDDEN)).astype(np.float32) for n in ("x", "skip")}
        for threads in (1, 2):
            # "basic": no fusion at session start, so the unfused chain stays as written
            sessions = {k: onnxruntime.InferenceSession(chain(k), session_options(threads, "basic"),
                                                        providers=["CPUExecutionProvider"]) for k in kinds}
            outputs = [s.run(None, feed)[0] for s in sessions.values()]
            micros = interleaved({kind: lambda _, s=session, x=feed: time_runner(lambda f: s.run(None, f), [x],
                                                                                 warmup=50, runs=300)["p50_ms"]
                                  * 1e3 / CHAIN for kind, session in sessions.items()}, rounds)
            row = {"tokens": tokens, "threads": threads, "max_abs_diff": float(np.abs(outputs[0] - outputs[1]).max()),
                   **{f"{k}_us": float(np.median(v)) for k, v in micros.items()}}
            row["ratio"] = row[f"{kinds[0]}_us"] / row[f"{kinds[1]}_us"]
            rows.append(row)
            print(row)
    return rows


def time_graphs(graphs: list[Path], rounds: int) -> dict:
    """Each graph dir's median p50 ms over `rounds` rounds taken in turn (pipeline.latency.compare_latency, as a
    speed gate times them: b1 x 128 real tokens and 200 test texts at their natural lengths), and its natural-length
    speedup over the first graph."""
    from edgepress.data import DataConfig, load_data
    from edgepress.pipeline.latency import compare_latency

    timed = compare_latency({str(g): g for g in graphs}, load_data(DataConfig()).test.texts, 2, rounds)
    first = timed[str(graphs[0])]["natural_p50_ms"]
    result = {name: {**t, "natural_speedup_vs_first": first / t["natural_p50_ms"]} for name, t in timed.items()}
    print(result)
    return result


def main() -> None:
    from edgepress.device.timing import cpu_model
    from edgepress.files import write_json
    from edgepress.pipeline.environment import environment

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=Path, nargs=2, help="two ONNX model dirs to time side by side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "layer_norm.json")
    args = parser.parse_args()
    result = {"cpu": cpu_model(), "environment": environment(2), "rounds": args.rounds,
              "command": "python benchmarks/layer_norm.py " + " ".join(sys.argv[1:]),
              "chains": time_chains(args.rounds)}
    if args.graphs:
        result["graphs"] = time_graphs(args.graphs, args.rounds)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
