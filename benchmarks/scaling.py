"""Where each precision pays off, and how cost grows with length: latency only, on RANDOM-WEIGHT models of three
BERT shapes (BERT-base, the demo teacher's MiniLM-L6-H384, a 4-layer H256 mini), each as fp32 (exported and fused),
int8 (edgepress's int8-dynamic on the fused graph) and int4 (edgepress's int4, rtn, blocks of 32, on the unfused
graph), at batch 1 and 32 x sequence 32, 128 and 512 of real tokens. Random weights: the numbers say what the shapes
cost, nothing about accuracy (no parity or accuracy is claimed; the graphs' own parity checks are off).

    .venv/bin/python benchmarks/scaling.py [--threads 2] [--rounds 2] [--out benchmarks/results/scaling.json]

Per shape, the precisions of one model are timed in turn, `rounds` times (a pause between them); each timing runs
for at least MIN_SECONDS (at least 3 calls) after one warm-up call. Writes FILE.json and FILE.md (the table).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from edgepress.compress.int4 import Int4Config, int4
from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
from edgepress.data import DataConfig, load_data
from edgepress.device.feeds import fixed_shape_feeds, load_tokenizer
from edgepress.device.timing import cpu_model, interleaved, isa_flags, summarize
from edgepress.export.onnx import ExportConfig, export_onnx
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.export.parity import UNCHECKED, ort_runner
from edgepress.files import write_json
from edgepress.pipeline.environment import environment
from edgepress.runtime.session import SessionConfig, open_session
from edgepress.teacher import resolve_model

MODELS = {  # name -> (layers, hidden, heads, FFN)
    "bert-base (random weights)": (12, 768, 12, 3072),
    "minilm-l6-h384 (random weights)": (6, 384, 12, 1536),
    "mini-l4-h256 (random weights)": (4, 256, 4, 1024),
}
SHAPES = [(b, s) for b in (1, 32) for s in (32, 128, 512)]
MIN_SECONDS = 1.0


def build(name: str, shape: tuple, work: Path, texts: tuple[str, ...]) -> dict[str, Path]:
    """The random-weight classifier of `shape` (seed 0, the demo teacher's tokenizer) in three precisions."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    layers, hidden, heads, ffn = shape
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=ffn, num_labels=2, id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1}, attn_implementation="eager")
    folder = work / name.split()[0]
    BertForSequenceClassification(config).eval().save_pretrained(folder / "torch")
    AutoTokenizer.from_pretrained(resolve_model("demo:minilm-movie")).save_pretrained(folder / "torch")
    export_onnx(folder / "torch", folder / "onnx", texts, ExportConfig(parity=UNCHECKED))
    optimize_onnx(folder / "onnx", folder / "fp32", texts, OptimizeConfig(fusions="all", parity=UNCHECKED))
    int8_dynamic(folder / "fp32", folder / "int8", texts, Int8DynamicConfig(parity=UNCHECKED))
    int4(folder / "onnx", folder / "int4", texts, Int4Config(parity=UNCHECKED))
    return {p: folder / p for p in ("fp32", "int8", "int4")}


def time_one(run, feeds: dict) -> list[float]:
    run(feeds)
    seconds, start = [], time.perf_counter()
    while len(seconds) < 3 or time.perf_counter() - start < MIN_SECONDS:
        t = time.perf_counter()
        run(feeds)
        seconds.append(time.perf_counter() - t)
    return seconds


def time_model(graphs: dict[str, Path], texts: tuple[str, ...], threads: int, rounds: int) -> dict:
    """{precision: {"b{B}_s{S}": {p50_ms, tokens_per_s, ...}}}."""
    runners, feeds = {}, {}
    for precision, path in graphs.items():
        session = open_session(path / "model.onnx", SessionConfig(threads=threads))
        names = tuple(i.name for i in session.get_inputs())
        runners[precision] = ort_runner(session)
        tokenizer = load_tokenizer(path, 512)
        feeds[precision] = {(b, s): fixed_shape_feeds(tokenizer, texts, b, s, names, 512) for b, s in SHAPES}
    timed = interleaved({(precision, shape): lambda _, p=precision, shape=shape: time_one(runners[p], feeds[p][shape])
                         for shape in SHAPES for precision in graphs}, rounds, pause_s=0.3)
    seconds = {p: {shape: sum(timed[(p, shape)], []) for shape in SHAPES} for p in graphs}
    return {p: {f"b{b}_s{s}": {**summarize(x), "tokens_per_s": b * s / np.median(x)}
                for (b, s), x in by_shape.items()} for p, by_shape in seconds.items()}


def markdown(result: dict) -> str:
    lines = [f"CPU: {result['cpu']} ({', '.join(result['isa'])}), {result['threads']} threads, onnxruntime "
             f"{result['environment']['onnxruntime']}. Random weights: latency only.", "",
             "| model | precision | " + " | ".join(f"b{b}×s{s} p50 ms" for b, s in SHAPES) + " | int8 / int4 "
             "speedup over fp32 at b1×s128 |", "|" + "---|" * (3 + len(SHAPES))]
    for model, rows in result["models"].items():
        fp32 = rows["fp32"]["b1_s128"]["p50_ms"]
        for precision, shapes in rows.items():
            ratio = fp32 / shapes["b1_s128"]["p50_ms"]
            lines.append(f"| {model} | {precision} | " + " | ".join(f"{shapes[f'b{b}_s{s}']['p50_ms']:.1f}"
                                                                    for b, s in SHAPES) + f" | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "scaling.json")
    args = parser.parse_args()
    data = load_data(DataConfig())
    texts = data.test.texts
    result = {"environment": environment(args.threads), "cpu": cpu_model(),
              "isa": isa_flags(),
              "threads": args.threads, "rounds": args.rounds, "weights": "random (seed 0): latency only",
              "models": {}}
    with tempfile.TemporaryDirectory(prefix="edgepress-scaling-") as work:
        for name, shape in MODELS.items():
            graphs = build(name, shape, Path(work), data.validation.texts[:64])
            result["models"][name] = time_model(graphs, texts, args.threads, args.rounds)
            print(name, json.dumps({p: {k: round(v["p50_ms"], 2) for k, v in s.items()}
                                    for p, s in result["models"][name].items()}), flush=True)
    write_json(args.out, result)
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
