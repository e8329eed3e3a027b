"""The int8 graphs of all-MiniLM-L6-v2 on another machine's CPU: how much of the neighbours int8 keeps depends on the
CPU's integer kernels (on x86 without VNNI, ONNX Runtime's u8 x s8 products saturate in int16 unless the weights are
7-bit), so the graphs benchmarks/embeddings.py built here are measured there too, against this machine's float
vectors of the same texts, and timed beside a torch encoder of the same shape at natural lengths.

    # here: the graphs (int8 per channel; smoothed with 0.85; smoothed, GPTQ-rounded, word table float: the embedding
    # demo's; 8-bit weights, as a VNNI target builds them), the float graph's vectors of the demo's test texts, the
    # texts and the encoder's config into DIR (23 MB a graph, 59 MB the demo's)
    .venv/bin/python benchmarks/embedding_isa.py prepare --work runs/embeddings --dir isa [--graphs NAME ...]
    # there (onnxruntime, tokenizers, numpy; torch and transformers for the timing), 2 threads:
    python3 benchmarks/embedding_isa.py measure --dir isa --out RESULT.json

The torch encoder there has random weights: its time does not depend on their values. ORT candidates are timed
through the bundle's own predictor (tokenization included), torch on tokens made beforehand: the ratio is
conservative for ONNX Runtime.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # runtime/ alone: no torch, no pydantic
# name -> int8-dynamic's params (per channel; 8-bit weights, as a VNNI target builds them); --graphs picks some
GRAPHS = {"int8": {}, "int8-smooth": {"smooth": 0.85},
          "int8-smooth-gptq-table": {"smooth": 0.85, "gptq": True, "keep_float": ("EmbedLayerNormalization_0",)}}


def prepare(work: Path, out: Path, names: list[str]) -> None:
    """The graphs (built here with 8-bit weights), the float graph's vectors of the test texts, the texts."""
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.data import DataConfig, load_data
    from edgepress.device.predictor import Predictor
    from edgepress.teacher import encoder_dir

    data = load_data(DataConfig())
    for name in names:
        if not (out / name).is_dir():
            int8_dynamic(work / "fuse", out / name, data.validation.texts,
                         Int8DynamicConfig(per_channel=True, **GRAPHS[name]))
    fused = Predictor(work / "fuse", threads=2)
    np.save(out / "reference.npy", np.stack([fused.embed([t])[0] for t in data.test.texts]).astype(np.float32))
    (out / "texts.json").write_text(json.dumps(list(data.test.texts)))
    shutil.copy(encoder_dir() / "config.json", out / "encoder_config.json")


def neighbours(vectors: np.ndarray, k: int = 10) -> np.ndarray:
    similar = vectors @ vectors.T
    np.fill_diagonal(similar, -np.inf)
    return np.argsort(-similar, axis=1, kind="stable")[:, :k]


def torch_encoder(directory: Path, texts: list[str], graph: str):
    """A runner over pre-tokenized texts: the encoder's shape with random weights, mean pooling, unit length."""
    import torch
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    torch.set_num_threads(2)
    model = BertModel(BertConfig.from_json_file(directory / "encoder_config.json"), add_pooling_layer=False).eval()
    tokenizer = Tokenizer.from_file(str(directory / graph / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    feeds = []
    for encoding in tokenizer.encode_batch(texts):
        feeds.append({"input_ids": torch.tensor([encoding.ids]),
                      "attention_mask": torch.tensor([encoding.attention_mask]),
                      "token_type_ids": torch.tensor([encoding.type_ids])})

    def run(i: int):
        with torch.inference_mode():
            hidden = model(**feeds[i]).last_hidden_state
            mask = feeds[i]["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            return pooled / pooled.norm(dim=-1, keepdim=True)

    return run, torch.__version__


def measure(directory: Path, out: Path, rounds: int = 3, timed: int = 300) -> dict:
    import onnxruntime

    from edgepress.device.predictor import Predictor
    from edgepress.device.timing import cpu_flags, cpu_model

    texts = json.loads((directory / "texts.json").read_text())
    reference = np.load(directory / "reference.npy")
    predictors = {name: Predictor(directory / name, threads=2) for name in GRAPHS if (directory / name).is_dir()}
    result = {"cpu": cpu_model(), "vnni": bool(cpu_flags() & {"avx512_vnni", "avx_vnni"}),
              "onnxruntime": onnxruntime.__version__, "n_test": len(texts), "candidates": {}}
    for name, predictor in predictors.items():
        vectors = np.stack([predictor.embed([t])[0] for t in texts])
        cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
        overlap = [len(np.intersect1d(a, b)) / 10
                   for a, b in zip(neighbours(vectors), neighbours(reference), strict=True)]
        result["candidates"][name] = {"neighbour_overlap": float(np.mean(overlap)), "cosine": float(cosine.mean())}
    run_torch, result["torch"] = torch_encoder(directory, texts[:timed], next(iter(predictors)))
    runners = {"torch-fp32": run_torch,
               **{name: (lambda i, p=p: p.embed([texts[i]])) for name, p in predictors.items()}}
    seconds = {name: [] for name in runners}
    for r in range(rounds + 1):  # round 0 warms up
        for name, run in runners.items():
            times = []
            for i in range(timed):
                start = time.perf_counter()
                run(i)
                times.append(time.perf_counter() - start)
            if r:
                seconds[name].append(float(np.median(times)) * 1e3)
            time.sleep(0.3)  # idle worker threads spin a while: not into the next candidate's time
    torch_ms = float(np.median(seconds["torch-fp32"]))
    for name, rows in seconds.items():
        row = result["candidates"].setdefault(name, {})
        row.update(natural_p50_ms=float(np.median(rows)), round_p50_ms=rows,
                   natural_vs_torch=torch_ms / float(np.median(rows)))
    out.write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["prepare", "measure"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("runs/embeddings"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--graphs", nargs="+", choices=list(GRAPHS), default=list(GRAPHS))
    args = parser.parse_args()
    if args.step == "prepare":
        args.dir.mkdir(parents=True, exist_ok=True)
        prepare(args.work, args.dir, args.graphs)
    else:
        print(json.dumps(measure(args.dir, args.out or args.dir / "result.json"), indent=1))


if __name__ == "__main__":
    main()
