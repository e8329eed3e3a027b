"""What unstructured zeros buy, side by side: a dense model against its magnitude-pruned version as torch, as fused
ONNX fp32 and as dynamic int8 ONNX: latency (interleaved rounds on CPU), bytes and gzip bytes, share of zeros.

    .venv/bin/python benchmarks/sparse_latency.py --sparse runs/magnitude/stages/01-prune/model \
        [--dense demo:minilm-movie] [--threads 2] [--rounds 3]

Writes benchmarks/results/sparse_latency.json. Expected: the same latency (no runtime here skips zeros), a smaller
gzip.
"""

import argparse
import platform
import tempfile
from pathlib import Path

from edgepress.compress.quantize import int8_dynamic
from edgepress.data import DataConfig, load_data
from edgepress.export.onnx import export_onnx
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.files import write_json
from edgepress.models.introspect import size_metrics
from edgepress.pipeline.environment import environment
from edgepress.pipeline.latency import compare_latency, onnx_path
from edgepress.pipeline.measure import onnx_param_counts
from edgepress.teacher import resolve_model


def variants(name: str, model_dir: Path, work: Path, texts: tuple[str, ...]) -> dict[str, Path]:
    """The torch dir, its fused ONNX and its int8 ONNX."""
    export_onnx(model_dir, work / f"{name}-onnx", texts)
    optimize_onnx(work / f"{name}-onnx", work / f"{name}-fused", texts, OptimizeConfig(fusions="all"))
    int8_dynamic(work / f"{name}-fused", work / f"{name}-int8", texts)
    return {f"{name}_torch": model_dir, f"{name}_fused": work / f"{name}-fused", f"{name}_int8": work / f"{name}-int8"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dense", default="demo:minilm-movie")
    parser.add_argument("--sparse", type=Path, required=True, help="a magnitude or lottery stage's model dir")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sparse_latency.json")
    args = parser.parse_args()
    data = load_data(DataConfig())
    with tempfile.TemporaryDirectory(prefix="edgepress-sparse-") as tmp:
        candidates = {**variants("dense", resolve_model(args.dense), Path(tmp), data.validation.texts),
                      **variants("sparse", args.sparse, Path(tmp), data.validation.texts)}
        latency = compare_latency(candidates, data.test.texts, args.threads, args.rounds)
        sizes = {name: {**size_metrics(onnx_path(path) or path),
                        **(onnx_param_counts(onnx_path(path)) if onnx_path(path) else {})}
                 for name, path in candidates.items()}
    result = {"environment": environment(args.threads), "machine": platform.node(), "threads": args.threads,
              "rounds": args.rounds, "dense": args.dense, "sparse": str(args.sparse), "latency": latency,
              "sizes": sizes,
              "sparse_over_dense": {kind: {"fixed_p50": latency[f"sparse_{kind}"]["fixed_p50_ms"]
                                           / latency[f"dense_{kind}"]["fixed_p50_ms"],
                                           "gzip": sizes[f"sparse_{kind}"]["size_gzip_bytes"]
                                           / sizes[f"dense_{kind}"]["size_gzip_bytes"]}
                                    for kind in ("torch", "fused", "int8")}}
    write_json(args.out, result)
    for kind, ratio in result["sparse_over_dense"].items():
        print(f"{kind}: sparse/dense latency {ratio['fixed_p50']:.3f}, gzip {ratio['gzip']:.3f}")


if __name__ == "__main__":
    main()
