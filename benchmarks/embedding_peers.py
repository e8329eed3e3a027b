"""What users of a sentence-transformers model pick today, built from the same encoder, for benchmarks/embeddings.py:

- sentence-transformers' own int8: `SentenceTransformer(model, backend="onnx")` (optimum's exporter) and
  `export_dynamic_quantized_onnx_model` with the preset of this CPU (avx512_vnni, or avx2 on a CPU without VNNI).
  sentence-transformers 6 needs transformers 5, while its ONNX path (optimum-onnx 0.1.0) caps transformers < 4.58:
  built in the peer venv (`make peer-env`, sentence-transformers 5). Its graph gives token embeddings; the mean
  pooling and normalization its Python modules run after the graph are done here in numpy, as they do them.
- model2vec's static model: `model2vec.distill.distill(model, pca_dims=256)` (model2vec[distill] 0.10 caps
  transformers < 5.4: built in its own venv, `make m2v-env`); read back and run by `model2vec.StaticModel` (numpy and
  tokenizers alone) in edgepress's venv.

    .venv-peer/bin/python benchmarks/embedding_peers.py st --model DIR --out DIR --preset avx2
    .venv-m2v/bin/python benchmarks/embedding_peers.py m2v --model DIR --out DIR

Each build prints one JSON line; the rest of this module is what embeddings.py imports to run them.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ST_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "config.json")


def build_st(model: Path, out: Path, preset: str) -> dict:
    """(peer venv) sentence-transformers' ONNX export of `model` and its dynamic int8 with `preset`, into `out`:
    model.onnx (the int8 graph) beside the tokenizer and config."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    saved = out.with_name(out.name + "-st")
    SentenceTransformer(str(model), backend="onnx", device="cpu").save(str(saved))
    export_dynamic_quantized_onnx_model(SentenceTransformer(str(saved), backend="onnx", device="cpu"), preset,
                                        str(saved), push_to_hub=False)
    out.mkdir(parents=True, exist_ok=True)
    [graph] = (saved / "onnx").glob(f"model_q*int8_{preset}.onnx")  # qint8, or quint8 weights (the avx2 preset's)
    shutil.copy(graph, out / "model.onnx")
    for name in ST_FILES:
        if (saved / name).is_file():
            shutil.copy(saved / name, out / name)
    import sentence_transformers

    return {"preset": preset, "graph": graph.name, "sentence_transformers": sentence_transformers.__version__}


def build_m2v(model: Path, out: Path) -> dict:
    """(m2v venv) model2vec's distillation of `model` (256 PCA dimensions, its default) into `out`."""
    import model2vec
    from model2vec.distill import distill

    distill(model_name=str(model), pca_dims=256).save_pretrained(str(out))
    return {"model2vec": model2vec.__version__, "pca_dims": 256}


def built(kind: str, python: Path, model: Path, out: Path, *extra: str) -> dict:
    """Build a peer with `python` (its venv) unless `out` holds it; what its build said (kept in out/built.json)."""
    record = out / "built.json"
    if record.is_file():
        return json.loads(record.read_text())
    if not python.exists():
        raise SystemExit(f"{python} not found: {kind} is built in its own venv. Fix: make "
                         f"{'peer-env' if kind == 'st' else 'm2v-env'} (or pass its --*-python)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a local model dir; nothing is fetched
    done = subprocess.run([str(python), __file__, kind, "--model", str(model), "--out", str(out), *extra],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"building {kind} failed:\n{done.stderr[-3000:]}")
    said = json.loads(done.stdout.strip().splitlines()[-1])
    record.write_text(json.dumps(said))
    return said


def mean_pooled(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling(mean) then Normalize, in numpy: (batch, seq, dim) tokens, (batch, seq) mask ->
    (batch, dim)."""
    weights = mask[..., None].astype(np.float32)
    pooled = (tokens * weights).sum(1) / np.clip(weights.sum(1), 1e-9, None)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


def st_runner(session):
    """A runner of the sentence-transformers graph: its token embeddings pooled and normalized as its modules do."""
    names = [i.name for i in session.get_inputs()]

    def run(feed: dict) -> np.ndarray:
        tokens = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
        return mean_pooled(tokens, feed["attention_mask"])

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["st", "m2v"])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="avx512_vnni")
    args = parser.parse_args()
    said = build_st(args.model, args.out, args.preset) if args.kind == "st" else build_m2v(args.model, args.out)
    print(json.dumps(said))


if __name__ == "__main__":
    sys.exit(main())
