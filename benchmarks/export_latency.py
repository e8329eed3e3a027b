"""Torch fp32 vs exported ONNX fp32 vs fused ONNX (all fusions / SkipLayerNorm off), side by side in one run.

    .venv/bin/python benchmarks/export_latency.py [--model demo:minilm-movie] [--threads 2] [--out FILE]

Interleaves the candidates round by round (the machine is shared and noisy) and writes medians and ratios to
benchmarks/results/export_latency.json.
"""

import argparse
import json
import platform
import tempfile
from pathlib import Path

from edgepress.data import DataConfig, load_data
from edgepress.export.onnx import export_onnx
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.pipeline.environment import environment
from edgepress.pipeline.latency import compare_latency
from edgepress.teacher import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo:minilm-movie")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/export_latency.json")
    args = parser.parse_args()

    model_dir = resolve_model(args.model)
    data = load_data(DataConfig())
    work = Path(tempfile.mkdtemp(prefix="edgepress-bench-"))
    parity = export_onnx(model_dir, work / "onnx", data.validation.texts)["parity"]
    fused = optimize_onnx(work / "onnx", work / "fused", data.validation.texts, OptimizeConfig(fusions="all"))
    no_sln = optimize_onnx(work / "onnx", work / "fused-no-sln", data.validation.texts,
                           OptimizeConfig(fusions="all", disable=("skip_layer_norm", "bias_skip_layer_norm")))
    candidates = {"torch_fp32": model_dir, "onnx_fp32": work / "onnx", "onnx_fused": work / "fused",
                  "onnx_fused_no_skip_layer_norm": work / "fused-no-sln"}
    result = {"environment": environment(args.threads), "machine": platform.node(), "threads": args.threads,
              "shape": {"batch_size": 1, "sequence_length": 128}, "export_parity": parity,
              "fused_ops": fused["fused_ops"], "fused_parity": fused["parity"],
              "fused_no_sln_ops": no_sln["fused_ops"],
              "candidates": compare_latency(candidates, data.test.texts, args.threads, args.rounds)}
    base = result["candidates"]["torch_fp32"]
    for entry in result["candidates"].values():
        entry["fixed_speedup_vs_torch"] = base["fixed_p50_ms"] / entry["fixed_p50_ms"]
        entry["natural_speedup_vs_torch"] = base["natural_p50_ms"] / entry["natural_p50_ms"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["candidates"], indent=2))


if __name__ == "__main__":
    main()
