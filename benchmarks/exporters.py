"""torch.onnx's two exporters, side by side: TorchScript (`dynamo=False`, what `export` uses) and dynamo (torch's
default), each over eager and sdpa attention, on tiny BERT / DistilBERT / RoBERTa / head-pruned BERT and the demo
teacher (MiniLM-L6, real). Per candidate: export time, hard parity (64 real validation sentences alone and in padded
batches of 8), the ops ONNX Runtime's BERT optimizer fuses and the fused graph's parity; for dynamo graphs also
onnxscript's ORT fusions (`optimize_for_ort`). For the teacher, the fused graphs' latency (b1 x s128 and natural
lengths), interleaved in one process.

    .venv/bin/python benchmarks/exporters.py [--model NAME=DIR ...] [--threads 2] [--rounds 3] [--out FILE]

Writes benchmarks/results/exporters.json.
"""

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the tiny models the tests build
from tests.conftest import tiny_bert, tiny_distilbert, tiny_roberta  # noqa: E402

from edgepress.data import DataConfig, load_data
from edgepress.device.feeds import load_tokenizer
from edgepress.export.onnx import EXAMPLE, model_inputs, pin_head_counts, torch_runner, write_onnx
from edgepress.export.optimize import FUSED_OPS
from edgepress.export.parity import ONNX_FILE, ort_runner, parity_feeds, spread_by_length
from edgepress.models.heads import remove_heads
from edgepress.models.loading import load_classifier
from edgepress.pipeline.environment import environment
from edgepress.pipeline.latency import compare_latency
from edgepress.runtime.session import SessionConfig, open_session
from edgepress.tasks import CLASSIFICATION
from edgepress.teacher import encoder_dir, resolve_model


def tiny_models():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(encoder_dir())

    def pruned(tok):
        model = tiny_bert(tok, seed=3, num_attention_heads=4)
        remove_heads(model, {0: [0, 2], 1: [3]})
        return model

    builders = {"tiny-bert": tiny_bert, "tiny-distilbert": tiny_distilbert, "tiny-roberta": tiny_roberta,
                "tiny-bert-pruned-heads": pruned}
    return {name: (build(tokenizer).eval(), tokenizer) for name, build in builders.items()}


def parity(reference, path: Path, feeds) -> dict:
    """max |Δlogit| of the graph at `path` vs `reference`, batch 1 and padded batches apart."""
    run = ort_runner(open_session(path, SessionConfig(optimization="disable")))
    diffs = [float(np.max(np.abs(reference(f) - run(f)))) for f in feeds]
    singles = sum(1 for f in feeds if f["input_ids"].shape[0] == 1)
    return {"single_max_abs_diff": max(diffs[:singles]), "batched_max_abs_diff": max(diffs[singles:])}


def ort_fuse(src: Path, dst: Path) -> dict:
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(src), model_type="bert", opt_level=0)
    fused.save_model_to_file(str(dst))
    return {op: n for op, n in fused.get_fused_operator_statistics().items() if n and op in FUSED_OPS}


def onnxscript_fuse(src: Path, dst: Path) -> dict:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, counts = optimize_for_ort(ir.load(str(src)))
    ir.save(model, str(dst))
    return {name: n for name, n in counts.items() if n}


def candidate(model, tokenizer, work: Path, exporter: str, attention: str, feeds, padded: bool = True) -> dict:
    work.mkdir(parents=True)
    model.set_attn_implementation(attention)
    reference = torch_runner(model)  # the model as it runs in torch (this attention)
    out = {"exporter": exporter, "attention": attention, "example": "padded" if padded else "one sentence"}
    start = time.perf_counter()
    try:
        write_onnx(model, tokenizer, work / ONNX_FILE, opset=18, task=CLASSIFICATION, dynamo=exporter == "dynamo",
                   attention=attention, example_texts=EXAMPLE if padded else EXAMPLE[1:])
    except Exception as e:  # a failed export is a result
        return {**out, "export_error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"}
    out["export_seconds"] = round(time.perf_counter() - start, 2)
    out["pinned_reshapes"] = pin_head_counts(work / ONNX_FILE)
    try:
        out["parity"] = parity(reference, work / ONNX_FILE, feeds)
    except Exception as e:  # a graph ONNX Runtime cannot run is a result too
        return {**out, "run_error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"}
    fusers = {"ort_optimizer": ort_fuse} | ({"onnxscript_optimize_for_ort": onnxscript_fuse}
                                            if exporter == "dynamo" else {})
    for name, fuse in fusers.items():
        fused = work / name
        fused.mkdir()
        try:
            out[name] = {"fused_ops": fuse(work / ONNX_FILE, fused / ONNX_FILE)}
            out[name]["parity"] = parity(reference, fused / ONNX_FILE, feeds)
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"}
            traceback.print_exc()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/exporters.json")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                        help="more trained model dirs to compare on (e.g. a run's distilled or head-pruned student)")
    args = parser.parse_args()

    data = load_data(DataConfig())
    texts = spread_by_length(data.validation.texts, 64)
    work = Path(tempfile.mkdtemp(prefix="edgepress-exporters-"))
    teacher_dir = resolve_model("demo:minilm-movie")
    models = tiny_models() | {"teacher-minilm": load_classifier(teacher_dir)} | {
        name: load_classifier(Path(path)) for name, path in (spec.split("=", 1) for spec in args.model)}
    results = {}
    for name, (model, tokenizer) in models.items():
        feeds = parity_feeds(load_tokenizer(teacher_dir, 128), texts, model_inputs(model, tokenizer), 8)
        results[name] = [candidate(model, tokenizer, work / name / f"{exporter}-{attention}", exporter, attention,
                                   feeds)
                         for exporter in ("torchscript", "dynamo") for attention in ("eager", "sdpa")]
        # what an exporter makes of an example batch without padding
        results[name] += [candidate(model, tokenizer, work / name / f"{exporter}-eager-unpadded", exporter, "eager",
                                    feeds, padded=False) for exporter in ("torchscript", "dynamo")]
        print(json.dumps({name: results[name]}, indent=1), flush=True)

    # latency of the teacher's fused graphs, interleaved round by round
    teacher_work = work / "teacher-minilm"
    latency_dirs = {}
    for row in (r for r in results["teacher-minilm"] if r["example"] == "padded"):
        for fuser in ("ort_optimizer", "onnxscript_optimize_for_ort"):
            if "fused_ops" in row.get(fuser, {}):
                d = teacher_work / f"{row['exporter']}-{row['attention']}" / fuser
                for side in teacher_dir.iterdir():  # config and tokenizer beside the graph
                    if side.suffix in (".json", ".txt"):
                        shutil.copy(side, d / side.name)
                latency_dirs[f"{row['exporter']}-{row['attention']}-{fuser}"] = d
    latency = compare_latency(latency_dirs, data.test.texts, args.threads, args.rounds)
    result = {"environment": environment(args.threads), "machine": platform.node(), "cpu": platform.processor(),
              "threads": args.threads, "parity_texts": len(texts), "candidates": results, "teacher_latency": latency}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(latency, indent=1))


if __name__ == "__main__":
    main()
