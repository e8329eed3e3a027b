"""A sentence-embedding model compressed, side by side in one process: all-MiniLM-L6-v2 (the demo's encoder package,
a real sentence-transformers model) in torch, its exported and fused ONNX graphs, and int8 (dynamic, per channel)
with 0, 6 and 10 of its most sensitive nodes left float (`keep_float`); then a 3-layer student distilled from it
(`distill`: its vectors trained to the teacher's on the demo's train texts, 3 epochs), fused, and int8 with 0 and 6
nodes float.

    .venv/bin/python benchmarks/embeddings.py [--work runs/embeddings] [--rounds 5]
    # writes benchmarks/results/embeddings.{json,md}; about 20 minutes on 2 cores (what is built is kept in --work)

Quality is measured against the torch model's vectors of the demo's 1,057 test texts, each ONNX candidate embedding
one text per call (as a device and predict.py do): the share of each text's 10 nearest test texts that a candidate
finds again (neighbour overlap) and each text's cosine to its torch vector, with BCa 95% CIs over the texts. Latency
is timed as benchmarks/compare.py times it: every candidate in turn, `--rounds` rounds, b1 x 128 real tokens, natural
lengths one sentence a call, b32 x 128. The fusion set is the one `optimize` picks by timing int8 candidates here.
"""

import argparse
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import Candidate, latency_row, prepare, time_round  # noqa: E402

TORCH = "torch-fp32"
STUDENT = {"student_layers": 3, "epochs": 3, "learning_rate": 1e-4, "max_length": 128}


def onnx_chain(source: Path, work: Path, texts: tuple[str, ...], keep_float: tuple[int, ...], prefix: str = ""
               ) -> dict[str, Path]:
    """{candidate: its dir}: `source` (a sentence-transformers dir) exported, fused, and int8 per channel with each
    of `keep_float` nodes left float, each made once into `work` (work/kept.json remembers what each left float)."""
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.export.onnx import export_onnx
    from edgepress.export.optimize import OptimizeConfig, optimize_onnx
    from edgepress.files import read_json, write_json

    made = {f"{prefix}export": work / f"{prefix}export", f"{prefix}fuse": work / f"{prefix}fuse"}
    exported, fused = made.values()
    if not exported.is_dir():
        export_onnx(source, exported, texts)
    if not fused.is_dir():
        optimize_onnx(exported, fused, texts, OptimizeConfig(threads=2,
                                                             quantized_with=Int8DynamicConfig(per_channel=True)))
    kept = read_json(work / "kept.json") if (work / "kept.json").is_file() else {}
    for keep in keep_float:
        name = f"{prefix}int8" if keep == 0 else f"{prefix}int8-keep{keep}"
        made[name] = work / name
        if not made[name].is_dir() or name not in kept:
            details = int8_dynamic(fused, made[name], texts, Int8DynamicConfig(per_channel=True, keep_float=keep))
            kept[name] = details["kept_float"]
            write_json(work / "kept.json", kept)
    return made


def student(encoder: Path, work: Path, data) -> Path:
    """The 3-layer student of `encoder` (`distill`, STUDENT), made once into work/student."""
    from edgepress.compress.distill import DistillConfig, distill
    from edgepress.files import write_json

    out = work / "student"
    if not out.is_dir():
        details = distill(encoder, out, data, DistillConfig(**STUDENT))
        write_json(work / "student.json", details)
    return out


def quality(candidates: list[Candidate], texts: tuple[str, ...], max_length: int) -> dict[str, dict]:
    """Each candidate's neighbour overlap and cosine against the torch candidate's vectors of `texts`."""
    from edgepress.data.metrics import embedding_metrics
    from edgepress.models.evaluate import predict_outputs
    from edgepress.models.sentence import load_sentence_encoder
    from edgepress.runtime.predictor import Predictor

    vectors = {}
    for candidate in candidates:
        if candidate.onnx:
            vectors[candidate.name] = Predictor(candidate.path, threads=2, max_length=max_length).embed(texts)
        else:
            model, tokenizer = load_sentence_encoder(candidate.path)
            vectors[candidate.name] = predict_outputs(model, tokenizer, texts, max_length)
    return {name: embedding_metrics(vectors[TORCH], v) for name, v in vectors.items()}


def markdown(result: dict) -> str:
    rows = result["candidates"]
    base = rows[TORCH]
    lines = [f"CPU: {result['cpu']}, 2 threads, onnxruntime {result['environment']['onnxruntime']}, torch "
             f"{result['environment']['torch']}; {result['rounds']} interleaved rounds; {result['n_test']:,} test "
             f"texts of {result['data']}. Command: `{result['command']}`.", "",
             "| candidate | neighbour overlap top-10 [95% CI] | cosine to torch [95% CI] | MB | p50 ms b1×s128 "
             "(per round) | vs torch | p50 ms natural | vs torch | b32×s128 sentences/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, c in rows.items():
        (olo, ohi), (clo, chi) = c["neighbour_overlap_ci95"], c["cosine_ci95"]
        fixed, natural = c["fixed"], c["natural"]
        lines.append(f"| {name} | {c['neighbour_overlap']:.4f} [{olo:.4f}, {ohi:.4f}] | {c['cosine']:.4f} "
                     f"[{clo:.4f}, {chi:.4f}] | {c['size_bytes'] / 1e6:.1f} | {fixed['p50_ms']:.2f} "
                     f"({min(fixed['round_p50_ms']):.2f}–{max(fixed['round_p50_ms']):.2f}) | "
                     f"{base['fixed']['p50_ms'] / fixed['p50_ms']:.1f}x | {natural['p50_ms']:.2f} | "
                     f"{base['natural']['p50_ms'] / natural['p50_ms']:.1f}x | "
                     f"{c['batch32']['sentences_per_s']:.0f} |")
    kept, taught = result["kept_float"], result["student"]
    lines += ["", f"Student: {taught['student_layers']} layers from the teacher's {taught['layer_map']}, "
                  f"{taught['epochs']} epochs at learning rate {taught['learning_rate']:g} on the train texts "
                  f"(cosine + MSE to the teacher's vectors); epoch {taught['best_epoch']} kept (validation "
                  f"neighbour overlap {taught['val_neighbour_overlap']:.4f}).",
              "", "Nodes left float: " + "; ".join(f"{name}: {', '.join(nodes)}" for name, nodes in kept.items()
                                                  if nodes)]
    return "\n".join(lines) + "\n"


def main() -> None:
    from edgepress.data import DataConfig, load_data
    from edgepress.files import read_json, write_json
    from edgepress.models.introspect import size_metrics
    from edgepress.models.teacher import encoder_dir
    from edgepress.pipeline.environment import environment
    from edgepress.runtime.predictor import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("runs/embeddings"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "embeddings.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # progress, to stderr
    data, encoder = load_data(DataConfig()), encoder_dir()
    texts = data.validation.texts  # parity, sensitivity, fusion timing: never the test split
    made = onnx_chain(encoder, args.work, texts, (0, 6, 10))
    distilled = student(encoder, args.work, data)
    made |= {"student-torch": distilled, **onnx_chain(distilled, args.work, texts, (0, 6), "student-")}
    candidates = [Candidate(TORCH, encoder, False),
                  *(Candidate(name, path, (path / "model.onnx").is_file()) for name, path in made.items())]
    rows = quality(candidates, data.test.texts, 128)
    for candidate in candidates:
        prepare(candidate, data.test.texts, 2)
    for r in range(args.rounds + 1):  # round 0 warms every candidate up
        time_round(candidates, keep=r > 0)
    for candidate in candidates:
        graph = candidate.path / "model.onnx" if candidate.onnx else candidate.path
        rows[candidate.name].update(**size_metrics(graph), **latency_row(candidate))
    result = {"cpu": cpu_model(), "rounds": args.rounds, "environment": environment(2), "data": data.source,
              "n_test": len(data.test), "command": "python benchmarks/embeddings.py " + " ".join(sys.argv[1:]),
              "student": {**STUDENT, **read_json(args.work / "student.json")},
              "kept_float": read_json(args.work / "kept.json"), "candidates": rows}
    write_json(args.out, result)
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
