"""Where an ONNX graph's time goes at the test texts' natural lengths, one text a call, as a device embeds or
classifies them: ONNX Runtime's own profiler (2 intra-op threads spinning within a run, and the optimizers the graph's
ort_session.json keeps off: the bundle's session options), each operator type's share of the kernel time, and the
mean run time (profiling adds its own overhead: compare shares, not absolute times, with benchmarks/embeddings.py's).

    .venv/bin/python benchmarks/op_profile.py runs/embdemo/stages/03-int8/model [--texts 200]
"""

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path


def main() -> None:

    from edgepress.data import DataConfig, load_data
    from edgepress.device.feeds import load_tokenizer, natural_feeds
    from edgepress.device.sessions import load_session, session_options

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="an ONNX model dir (model.onnx and its tokenizer)")
    parser.add_argument("--texts", type=int, default=200)
    args = parser.parse_args()
    texts = load_data(DataConfig()).test.texts[: args.texts]
    with tempfile.TemporaryDirectory() as scratch:
        options = session_options(2)
        options.enable_profiling, options.profile_file_prefix = True, str(Path(scratch) / "profile")
        session = load_session(args.model / "model.onnx", options=options)  # its ort_session.json too, as a bundle
        feeds = natural_feeds(load_tokenizer(args.model, 128), texts, tuple(i.name for i in session.get_inputs()))
        for feed in feeds:
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    kernels, runs = Counter(), 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            kernels[event["args"]["op_name"]] += event["dur"]
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            runs += event["dur"]
    total = sum(kernels.values())
    print(f"{args.model}: {len(feeds)} texts, mean run {runs / len(feeds) / 1e3:.2f} ms (profiled)")
    for op, micros in kernels.most_common():
        print(f"  {op:28s} {100 * micros / total:5.1f}%  {micros / len(feeds):8.1f} µs a run")


if __name__ == "__main__":
    main()
