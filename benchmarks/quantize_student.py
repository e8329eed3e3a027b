"""Every quantization edgepress has, on one model, side by side: int8-dynamic (per tensor, per channel), int8-static,
qat, int4 (rtn, hqq, gptq, awq; with and without the word embeddings; accuracy levels 0 and 4), keep_float on the
4-bit graph, and optimize's fusions auto against all (each then int8-dynamic). Per variant: test accuracy with its
95% CI, the paired CI of the drop against the float model, size and gzip size, p50/p90 at the fixed shape and p50
at natural lengths (interleaved rounds on CPU, the float model and its fused graph timed beside them), and the
integer / low-bit kernels ONNX Runtime runs.

    .venv/bin/python benchmarks/quantize_student.py --model runs/demo/stages/01-distill/model \
        [--only int4] [--threads 2] [--rounds 3] [--work /tmp/edgepress-quantize-bench]

The demo's distilled 3-layer student is the model the issue asks about (`make demo` writes it). Variants already
built in --work are reused. Writes benchmarks/results/quantize_student.json and prints the table.
"""

import argparse
import json
import platform
import re
from pathlib import Path

from edgepress.compress.int4 import TORCH_ALGORITHMS, Int4Config, int4
from edgepress.compress.qat import QatConfig, qat
from edgepress.compress.quantize import Int8DynamicConfig, Int8StaticConfig, int8_dynamic, int8_static
from edgepress.data import DataConfig, load_data
from edgepress.data.metrics import accuracy_drop_ci95, classification_metrics
from edgepress.export.onnx import export_onnx
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.files import write_json
from edgepress.models.introspect import size_metrics
from edgepress.models.loading import label2id_of
from edgepress.pipeline.environment import environment
from edgepress.pipeline.latency import compare_latency, onnx_path
from edgepress.pipeline.measure import measure_model_dir, onnx_predictions
from edgepress.teacher import resolve_model

OUT = Path(__file__).parent / "results" / "quantize_student.json"


def recipes(model_dir: Path, work: Path, data, threads: int) -> dict:
    """name -> a function building that variant into a dir (returns the method's details)."""
    texts = data.validation.texts
    onnx_dir, fused = work / "onnx", work / "fused"
    out = {
        "int8-dynamic per-tensor": lambda d: int8_dynamic(fused, d, texts),
        "int8-dynamic per-channel": lambda d: int8_dynamic(fused, d, texts, Int8DynamicConfig(per_channel=True)),
        "int8-static": lambda d: int8_static(onnx_dir, d, texts),
        "qat": lambda d: _qat_then_export(model_dir, work / "qat-torch", d, data, QatConfig()),
        "qat reduce_range": lambda d: _qat_then_export(model_dir, work / "qat-rr-torch", d, data,
                                                       QatConfig(reduce_range=True)),
        "int8-dynamic per-channel reduce_range": lambda d: int8_dynamic(
            fused, d, texts, Int8DynamicConfig(per_channel=True, reduce_range=True)),
        "int8-static reduce_range": lambda d: int8_static(onnx_dir, d, texts, Int8StaticConfig(reduce_range=True)),
        "fusions auto, then int8-dynamic": lambda d: _auto_then_int8(onnx_dir, work, d, texts, threads),
    }
    for algorithm in ("rtn", "hqq", "gptq", "awq"):
        for embeddings in (False, True):
            for level in (0, 4):
                torch_model = {"torch_model": model_dir} if algorithm in TORCH_ALGORITHMS else {}
                cfg = Int4Config(algorithm=algorithm, embeddings=embeddings, accuracy_level=level, **torch_model)
                name = f"int4 {algorithm}{' +embeddings' if embeddings else ''} acc{level}"
                out[name] = lambda d, cfg=cfg: int4(onnx_dir, d, texts, cfg)
    for algorithm, block in (("rtn", 64), ("rtn", 128), ("gptq", 64), ("hqq", 64)):
        torch_model = {"torch_model": model_dir} if algorithm in TORCH_ALGORITHMS else {}
        cfg = Int4Config(algorithm=algorithm, embeddings=True, accuracy_level=4, block_size=block, **torch_model)
        out[f"int4 {algorithm} +embeddings acc4 block {block}"] = lambda d, cfg=cfg: int4(onnx_dir, d, texts, cfg)
    for keep in (2, 4):
        cfg = Int4Config(embeddings=True, accuracy_level=4, keep_float=keep)
        out[f"int4 rtn +embeddings acc4 keep_float {keep}"] = lambda d, cfg=cfg: int4(onnx_dir, d, texts, cfg)
    return out


def _qat_then_export(model_dir: Path, trained: Path, out: Path, data, cfg: QatConfig) -> dict:
    """qat into `trained` (kept: an export that fails does not cost the training again), then its export."""
    details = {} if trained.exists() else qat(model_dir, trained, data, cfg)
    return {**details, **export_onnx(trained, out, data.validation.texts)}


def _auto_then_int8(onnx_dir: Path, work: Path, out: Path, texts, threads: int) -> dict:
    """optimize with fusions: auto, timing each candidate quantized (as a run does before int8-dynamic), then it."""
    cfg = OptimizeConfig(quantized_with=Int8DynamicConfig(), threads=threads)
    fused = optimize_onnx(onnx_dir, work / "fused-auto", texts, cfg)
    return {"timing": fused["timing"], **int8_dynamic(work / "fused-auto", out, texts)}


def measure(artifact: Path, data, max_length: int, base_preds) -> tuple[dict, list]:
    preds = onnx_predictions(artifact, data.test.texts, max_length, 2)
    metrics = {**classification_metrics(data.test.labels, preds), **size_metrics(onnx_path(artifact)),
               "drop_ci95": accuracy_drop_ci95(data.test.labels, base_preds, preds)}
    return metrics, preds.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="the float torch model dir (the demo's distilled student)")
    parser.add_argument("--only", default="", help="build only the variants whose name contains this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgepress-quantize-bench"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    model_dir = resolve_model(args.model)
    data = load_data(DataConfig(), label2id_of(model_dir))
    texts, max_length = data.validation.texts, DataConfig().max_length
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "fused").exists():
        export_onnx(model_dir, args.work / "onnx", texts)
        optimize_onnx(args.work / "onnx", args.work / "fused", texts, OptimizeConfig(fusions="all"))
    base, base_preds = measure_model_dir(model_dir, data, max_length)
    rows = {"float (torch)": {"accuracy": base["accuracy"], "accuracy_ci95": base["accuracy_ci95"],
                              **size_metrics(model_dir)}}
    artifacts = {"float (torch)": model_dir, "float fused": args.work / "fused"}
    rows["float fused"] = measure(args.work / "fused", data, max_length, base_preds)[0]
    for name, build in recipes(model_dir, args.work, data, args.threads).items():
        if args.only not in name:
            continue
        path = args.work / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        try:
            details = build(path) if not path.exists() else json.loads((path / "details.json").read_text())
        except Exception as e:  # a variant this onnxruntime cannot build or run is a row that says so
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(name, "failed:", rows[name]["error"])
            continue
        write_json(path / "details.json", {k: v for k, v in details.items() if k != "history"})
        metrics, _ = measure(path, data, max_length, base_preds)
        rows[name] = {**metrics, "ort_kernels": details.get("ort_kernels"), "kept_float": details.get("kept_float"),
                      "timing": details.get("timing")}
        artifacts[name] = path
        print(f"{name}: accuracy {metrics['accuracy']:.4f}, {metrics['size_bytes'] / 1e6:.1f} MB")
    latency = compare_latency(artifacts, data.test.texts, args.threads, args.rounds)
    for name, timing in latency.items():
        rows[name]["latency"] = timing
    write_json(args.out, {"model": str(args.model), "environment": environment(args.threads),
                          "machine": platform.node(), "threads": args.threads, "rounds": args.rounds, "rows": rows})
    print("| variant | accuracy [95% CI] | drop CI | MB | gzip MB | p50 / p90 b1×s128 ms | p50 natural ms | kernels |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} |||||||")
            continue
        lat, ci, drop = r.get("latency", {}), r["accuracy_ci95"], r.get("drop_ci95")
        print(f"| {name} | {r['accuracy']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}] | "
              f"{f'[{drop[0]:+.3f}, {drop[1]:+.3f}]' if drop else '–'} | {r['size_bytes'] / 1e6:.1f} | "
              f"{r['size_gzip_bytes'] / 1e6:.1f} | {lat.get('fixed_p50_ms', 0):.2f} / {lat.get('fixed_p90_ms', 0):.2f} "
              f"| {lat.get('natural_p50_ms', 0):.2f} | {r.get('ort_kernels') or '–'} |")


if __name__ == "__main__":
    main()
