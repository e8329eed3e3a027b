"""The peer: what users pick today for a BERT classifier on CPU -- optimum's exporter, ORTOptimizer (O2) and
ORTQuantizer (dynamic int8, the preset of this CPU) -- against an edgepress bundle, side by side in one process:
accuracy on the test split, latency (b1 x s128 and natural lengths, interleaved round by round), size.

optimum-onnx 0.1.0 (its latest release) caps transformers < 4.58, edgepress needs >= 5.3: the peer lives in its own
environment, built by `make peer-env`:

    make peer-env
    .venv-peer/bin/python benchmarks/peer.py --bundle runs/demo/final [--model demo:minilm-movie] [--threads 2]
    .venv-peer/bin/python benchmarks/peer.py --build runs/ner/optimum --model runs/ner/teacher  # a token classifier

Writes benchmarks/results/peer.json. With `--build DIR` it only writes the peer's model dir there and prints
{"preset": ...}: benchmarks/compare.py times it in edgepress's own environment, beside the other candidates.

The recipe as optimum ships it stops in ORT's quantizer on the O2 graph (it cannot type the fused contrib ops'
outputs); the one change made here is ORT's documented fix for that, `extra_options={"DefaultTensorType": FLOAT}`,
passed to the quantizer optimum builds (`peer_quantize`).
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from harness import provenance, write_results

from edgepress.data import DataConfig, load_data
from edgepress.device.predictor import Predictor
from edgepress.device.timing import cpu_flags
from edgepress.models.introspect import size_metrics
from edgepress.pipeline.latency import compare_latency


def peer_quantize(o2_dir: Path, out_dir: Path) -> str:
    """ORTQuantizer with optimum's dynamic preset for this CPU; returns the preset's name."""
    import onnx
    from onnxruntime.quantization import onnx_quantizer
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    flags = cpu_flags()
    preset = "avx512_vnni" if "avx512_vnni" in flags else "avx512" if "avx512f" in flags else "avx2"
    config = getattr(AutoQuantizationConfig, preset)(is_static=False, per_channel=False)
    original = onnx_quantizer.ONNXQuantizer.__init__

    def typed(self, *args, **kwargs):  # optimum builds extra_options itself and has no way to add this one
        kwargs.setdefault("extra_options", {})["DefaultTensorType"] = onnx.TensorProto.FLOAT
        original(self, *args, **kwargs)

    onnx_quantizer.ONNXQuantizer.__init__ = typed
    try:
        ORTQuantizer.from_pretrained(o2_dir, file_name="model_optimized.onnx").quantize(config, save_dir=out_dir)
    finally:
        onnx_quantizer.ONNXQuantizer.__init__ = original
    return preset


def build_peer(model_dir: Path, work: Path, peer: Path | None = None) -> tuple[Path, str]:
    """optimum export -> O2 -> dynamic int8, as a dir edgepress's Predictor reads (model.onnx + config + tokenizer),
    `peer` (default: work/peer); a token classifier (NER) through optimum's token-classification class."""
    from optimum.onnxruntime import ORTModelForSequenceClassification, ORTModelForTokenClassification, ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig
    from transformers import AutoTokenizer

    from edgepress.models.loading import is_token_classifier_dir

    kind = ORTModelForTokenClassification if is_token_classifier_dir(model_dir) else ORTModelForSequenceClassification
    model = kind.from_pretrained(model_dir, export=True)
    model.save_pretrained(work / "onnx")
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(work / "onnx")
    ORTOptimizer.from_pretrained(model).optimize(OptimizationConfig(optimization_level=2), save_dir=work / "o2")
    preset = peer_quantize(work / "o2", work / "int8")
    peer = peer or work / "peer"
    peer.mkdir(parents=True)
    shutil.copy(work / "int8" / "model_optimized_quantized.onnx", peer / "model.onnx")
    for side in (work / "onnx").iterdir():
        if side.suffix in (".json", ".txt") and side.name != "ort_config.json":
            shutil.copy(side, peer / side.name)
    return peer, preset


def main() -> None:
    from edgepress.teacher import resolve_model

    parser = argparse.ArgumentParser()
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--bundle", help="an edgepress bundle (a run's final/): compare the peer with it")
    what.add_argument("--build", type=Path, help="only build the peer's model dir here")
    parser.add_argument("--model", default="demo:minilm-movie", help="the model the peer compresses")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/peer.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="edgepress-peer-"))
    if args.build:
        _, preset = build_peer(resolve_model(args.model), work, args.build)
        shutil.rmtree(work)
        print(json.dumps({"preset": preset}))
        return
    data = load_data(DataConfig())
    peer, preset = build_peer(resolve_model(args.model), work)
    candidates = {"peer_optimum_o2_int8": peer, "edgepress_bundle": Path(args.bundle)}
    result = {"provenance": provenance(args.threads), "peer_preset": preset, "model": args.model,
              "bundle": args.bundle, "candidates": {}}
    for name, path in candidates.items():
        logits = Predictor(path, threads=args.threads).logits(data.test.texts)
        accuracy = float(np.mean(logits.argmax(-1) == data.test.labels))  # both keep the teacher's label ids
        result["candidates"][name] = {"accuracy": accuracy, **size_metrics(path / "model.onnx")}
    for name, latency in compare_latency(candidates, data.test.texts, args.threads, args.rounds).items():
        result["candidates"][name] |= latency
    peer_row, ours = result["candidates"]["peer_optimum_o2_int8"], result["candidates"]["edgepress_bundle"]
    result["speedup_vs_peer"] = {k: peer_row[k] / ours[k] for k in ("fixed_p50_ms", "natural_p50_ms")}
    write_results(Path(args.out), result)
    print(json.dumps(result["candidates"], indent=1), json.dumps(result["speedup_vs_peer"]))


if __name__ == "__main__":
    main()
