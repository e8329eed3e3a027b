"""A sentence-embedding model compressed, side by side in one process: all-MiniLM-L6-v2 (the demo's encoder package,
a real sentence-transformers model) in torch, its exported and fused ONNX graphs, and int8 (dynamic, per channel)
with 0, 6 and 10 of its most sensitive nodes left float (`keep_float`), and smoothed (`smooth: 0.85`, SmoothQuant)
with 0 and 3, and smoothed with its weights rounded by GPTQ (`gptq: true`), with the word table left float too (the
embedding demo's int8 stage); then a 3-layer student distilled from it (`distill`: its vectors trained to the
teacher's on the demo's train texts, 3 epochs), fused, and int8. Beside them the peers users pick today, built from
the same encoder (benchmarks/embedding_peers.py): sentence-transformers' own ONNX int8 and model2vec's static model.

    make peer-env m2v-env
    .venv/bin/python benchmarks/embeddings.py [--work runs/embeddings] [--rounds 5]
    # writes benchmarks/results/embeddings.{json,md}; about 30 minutes on 2 cores (what is built is kept in --work)
    make base-model peer-env
    .venv/bin/edgepress run examples/embedding-base.yaml --out runs/embedding-base
    .venv/bin/python benchmarks/embeddings.py --encoder demo:mpnet --work runs/embeddings-base --keep-float \
        --smooth-keep 0 --smooth 0.8 --no-student --no-m2v --also runs/embedding-base/final \
        --out benchmarks/results/embeddings-base.json
    # the same for the base-size encoder all-mpnet-base-v2 (plain int8 of it fails its parity check, so none):
    # smoothed, smoothed and GPTQ-rounded, that with its lookup tables float, and the pipeline's bundle (--also),
    # beside sentence-transformers' own int8 of it

int8 weights are 7-bit (`reduce_range`) where the CPU has no VNNI, as a pipeline's x86-avx2 target sets them.

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

from compare import NATURAL, Candidate, latency_row, prepare, time_round  # noqa: E402
from embedding_peers import built, st_runner  # noqa: E402
from harness import measured, provenance, table, write_results  # noqa: E402

TORCH = "torch-fp32"
STUDENT = {"student_layers": 3, "epochs": 3, "learning_rate": 1e-4, "max_length": 128}
SMOOTH = 0.85
TABLES = ("Gather", "EmbedLayerNormalization")  # lookup tables: quantize_dynamic gives each table one scale
ST_INT8, M2V = "sentence-transformers-int8", "model2vec-256d"


def onnx_chain(source: Path, work: Path, texts: tuple[str, ...], keep_float: tuple[int, ...], prefix: str = "",
               smooth_keep: tuple[int, ...] = (), reduce_range: bool = False, smooth: float = SMOOTH
               ) -> dict[str, Path]:
    """{candidate: its dir}: `source` (a sentence-transformers dir) exported, fused, and int8 per channel with each
    of `keep_float` nodes left float, and smoothed (`smooth`) with each of `smooth_keep`, each made once into `work`
    (work/kept.json remembers what each left float)."""
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic, int8_dynamic_as_shipped
    from edgepress.export.onnx import export_onnx
    from edgepress.export.optimize import OptimizeConfig, optimize_onnx
    from edgepress.files import read_json, write_json

    made = {f"{prefix}export": work / f"{prefix}export", f"{prefix}fuse": work / f"{prefix}fuse"}
    exported, fused = made.values()
    if not exported.is_dir():
        export_onnx(source, exported, texts)
    if not fused.is_dir():
        optimize_onnx(exported, fused, texts, OptimizeConfig(threads=2, quantized_with={"per_channel": True}),
                      int8_dynamic_as_shipped)
    kept = read_json(work / "kept.json") if (work / "kept.json").is_file() else {}
    variants = {f"int8{f'-keep{keep}' if keep else ''}": {"keep_float": keep} for keep in keep_float}
    variants |= {f"int8-smooth{f'-keep{keep}' if keep else ''}": {"smooth": smooth, "keep_float": keep}
                 for keep in smooth_keep}
    if smooth_keep:  # the embedding demo's int8 stage (its lookup tables left float), and the step before it
        variants |= {"int8-smooth-gptq": {"smooth": smooth, "gptq": True},
                     "int8-smooth-gptq-table": {"smooth": smooth, "gptq": True, "keep_float": lookup_tables(fused)}}
    for short, params in variants.items():
        name = prefix + short
        made[name] = work / name
        if not made[name].is_dir() or name not in kept:
            cfg = Int8DynamicConfig(per_channel=True, reduce_range=reduce_range, **params)
            kept[name] = int8_dynamic(fused, made[name], texts, cfg)["kept_float"]
            write_json(work / "kept.json", kept)
    return made


def lookup_tables(fused: Path) -> tuple[str, ...]:
    """The lookup tables int8-dynamic would quantize in the graph in `fused`: the fused embeddings
    (EmbedLayerNormalization: words, positions, token types) where ONNX Runtime fused them, else each table's Gather
    (MPNet's words, positions and relative-attention bias)."""
    from edgepress.compress.quantize import int8_dynamic_nodes
    from edgepress.files import read_onnx

    quantized = set(int8_dynamic_nodes(fused / "model.onnx"))
    return tuple(node.name for node in read_onnx(fused / "model.onnx", external_data=False).graph.node
                 if node.name in quantized and node.op_type in TABLES)


def left_out(fused: Path) -> list[str]:
    """The fusions `optimize` left out of the graph in `fused` (what its ort_session.json records)."""
    from edgepress.device.sessions import SESSION_FILE
    from edgepress.files import read_json

    return read_json(fused / SESSION_FILE)["left_out_fusions"] if (fused / SESSION_FILE).is_file() else []


def student(encoder: Path, work: Path, data) -> Path:
    """The 3-layer student of `encoder` (`distill`, STUDENT), made once into work/student."""
    from edgepress.compress.distill import DistillConfig, distill
    from edgepress.files import write_json

    out = work / "student"
    if not out.is_dir():
        details = distill(encoder, out, data, DistillConfig(**STUDENT))
        write_json(work / "student.json", details)
    return out


def open_m2v(candidate: Candidate, texts: tuple[str, ...]) -> None:
    """model2vec's static model as a candidate: a runner over lists of texts, its feeds texts (b1: the 128-token text
    the ONNX candidates' fixed shape holds, decoded; natural: each text; b32: 32 of the 128-token text)."""
    from model2vec import StaticModel

    from edgepress.device.feeds import fixed_shape_feeds, load_tokenizer

    model = StaticModel.from_pretrained(str(candidate.path))
    tokenizer = load_tokenizer(candidate.path, 128)
    ids = fixed_shape_feeds(tokenizer, texts, 1, 128, ("input_ids", "attention_mask"), 128)["input_ids"][0]
    long = tokenizer.decode(ids.tolist(), skip_special_tokens=True)
    candidate.runner = model.encode
    candidate.feeds = {"fixed": [[long]], "natural": [[t] for t in texts[:NATURAL]], "batch32": [[long] * 32]}


def open_candidate(candidate: Candidate, texts: tuple[str, ...]) -> list:
    """Open `candidate` for timing (its runner and feeds: compare.prepare, or a peer's own); returns a feed for each
    of `texts`, one text a call, for its vectors."""
    if candidate.name == M2V:
        open_m2v(candidate, texts)
        return [[t] for t in texts]
    from edgepress.device.feeds import load_tokenizer, natural_feeds

    if candidate.name == ST_INT8:
        return open_st(candidate, texts)
    prepare(candidate, texts, 2, 128)
    names = tuple(candidate.feeds["natural"][0])
    return natural_feeds(load_tokenizer(candidate.path, 128), texts, names)


def open_st(candidate: Candidate, texts: tuple[str, ...]) -> list:
    """sentence-transformers' graph (token embeddings out: edgepress's predictor refuses it as a bundle) in a session
    made as every other candidate's is (2 threads, spinning within a run only), pooled by `st_runner`; feeds as
    compare.prepare builds them."""
    import onnxruntime

    from edgepress.device.feeds import fixed_shape_feeds, load_tokenizer, natural_feeds
    from edgepress.device.sessions import session_options

    session = onnxruntime.InferenceSession(str(candidate.path / "model.onnx"), session_options(2),
                                           providers=["CPUExecutionProvider"])
    names, tokenizer = tuple(i.name for i in session.get_inputs()), load_tokenizer(candidate.path, 128)
    candidate.runner = st_runner(session)
    candidate.feeds = {"fixed": [fixed_shape_feeds(tokenizer, texts, 1, 128, names, 128)],
                       "natural": natural_feeds(tokenizer, texts[:NATURAL], names),
                       "batch32": [fixed_shape_feeds(tokenizer, texts, 32, 128, names, 128)]}
    return natural_feeds(tokenizer, texts, names)


def quality(vectors: dict[str, object]) -> dict[str, dict]:
    """Each candidate's neighbour overlap and cosine against the torch candidate's vectors (a vector of another
    dimension: its overlap alone)."""
    from edgepress.data.metrics import embedding_metrics

    return {name: embedding_metrics(vectors[TORCH], v) for name, v in vectors.items()}


def markdown(result: dict) -> str:
    rows = result["candidates"]
    base = rows[TORCH]
    lines = [f"Encoder: {result.get('encoder', 'demo:minilm')}. {measured(result['provenance'])} "
             f"{result['rounds']} interleaved rounds; {result['n_test']:,} test texts of {result['data']}.", ""]
    header = ["candidate", "neighbour overlap top-10 [95% CI]", "cosine to torch [95% CI]", "MB",
              "p50 ms b1×s128 (per round)", "vs torch", "p50 ms natural", "vs torch", "b32×s128 sentences/s"]
    cells = []
    for name, c in rows.items():
        (olo, ohi), fixed, natural = c["neighbour_overlap_ci95"], c["fixed"], c["natural"]
        cosine = "–" if c["cosine"] is None else f"{c['cosine']:.4f} [{c['cosine_ci95'][0]:.4f}, " \
                                                   f"{c['cosine_ci95'][1]:.4f}]"
        cells.append([name, f"{c['neighbour_overlap']:.4f} [{olo:.4f}, {ohi:.4f}]", cosine,
                      f"{c['size_bytes'] / 1e6:.1f}",
                      f"{fixed['p50_ms']:.2f} ({min(fixed['round_p50_ms']):.2f}–{max(fixed['round_p50_ms']):.2f})",
                      f"{base['fixed']['p50_ms'] / fixed['p50_ms']:.1f}x", f"{natural['p50_ms']:.2f}",
                      f"{base['natural']['p50_ms'] / natural['p50_ms']:.1f}x",
                      f"{c['batch32']['sentences_per_s']:.0f}"])
    lines += table(header, cells)
    kept, taught = result["kept_float"], result["student"]
    if taught:
        lines += ["", f"Student: {taught['student_layers']} layers from the teacher's {taught['layer_map']}, "
                      f"{taught['epochs']} epochs at learning rate {taught['learning_rate']:g} on the train texts "
                      f"(cosine + MSE to the teacher's vectors); epoch {taught['best_epoch']} kept (validation "
                      f"neighbour overlap {taught['val_neighbour_overlap']:.4f})."]
    lines += ["", "Nodes left float: " + "; ".join(f"{name}: {', '.join(nodes)}" for name, nodes in kept.items()
                                                  if nodes),
              "", f"Fusions left out of the fused graph (its ort_session.json; when this script made work/fuse, "
                  f"chosen by timing the int8 candidates): "
                  f"{', '.join(result['fusions_left_out']) or 'none'}. "
                  f"int8 weights 7-bit (reduce_range): {result['reduce_range']}. Peers: " + "; ".join(
                  f"{name}: {', '.join(f'{k} {v}' for k, v in said.items())}"
                  for name, said in result["peers"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    import numpy as np

    from edgepress.data import DataConfig, load_data
    from edgepress.deploy.targets import detect_target
    from edgepress.files import read_json
    from edgepress.models.introspect import size_metrics
    from edgepress.teacher import BASE_ENCODER, ENCODER, resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("runs/embeddings"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "embeddings.json")
    parser.add_argument("--peer-python", type=Path, default=Path(".venv-peer/bin/python"))
    parser.add_argument("--m2v-python", type=Path, default=Path(".venv-m2v/bin/python"))
    parser.add_argument("--encoder", choices=[ENCODER, BASE_ENCODER], default=ENCODER,
                        help="the sentence encoder compressed: all-MiniLM-L6-v2 or all-mpnet-base-v2")
    parser.add_argument("--keep-float", type=int, nargs="*", default=[0, 6, 10],
                        help="int8 candidates: each with this many of its most sensitive nodes left float")
    parser.add_argument("--smooth-keep", type=int, nargs="*", default=[0, 3],
                        help="smoothed int8 candidates (and the GPTQ-rounded ones, when any): nodes left float")
    parser.add_argument("--smooth", type=float, default=SMOOTH, help="SmoothQuant's α for the smoothed candidates")
    parser.add_argument("--no-student", dest="student", action="store_false", help="no distilled 3-layer student")
    parser.add_argument("--no-m2v", dest="m2v", action="store_false", help="no model2vec peer")
    parser.add_argument("--also", type=Path, nargs="*", default=[],
                        help="ONNX dirs of the same encoder timed beside the rest (e.g. a run's final/), named by dir")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # progress, to stderr
    data, encoder = load_data(DataConfig()), resolve_model(args.encoder)
    texts = data.validation.texts  # parity, sensitivity, smoothing, fusion timing: never the test split
    reduce_range = detect_target() == "x86-avx2"
    made = onnx_chain(encoder, args.work, texts, tuple(args.keep_float), smooth_keep=tuple(args.smooth_keep),
                      reduce_range=reduce_range, smooth=args.smooth)
    if args.student:
        distilled = student(encoder, args.work, data)
        made |= {"student-torch": distilled,
                 **onnx_chain(distilled, args.work, texts, (0,), "student-", reduce_range=reduce_range)}
    made |= {f"run-{path.name}": path for path in args.also}
    preset = "avx2" if reduce_range else "avx512_vnni"
    peers = {ST_INT8: built("st", args.peer_python, encoder, args.work / "st-int8", "--preset", preset)}
    made[ST_INT8] = args.work / "st-int8"
    if args.m2v:
        peers[M2V] = built("m2v", args.m2v_python, encoder, args.work / "m2v")
        made[M2V] = args.work / "m2v"
    candidates = [Candidate(TORCH, encoder, False),
                  *(Candidate(name, path, (path / "model.onnx").is_file()) for name, path in made.items())]
    vectors = {}
    for candidate in candidates:  # vectors one text a call, as a device embeds them
        every = open_candidate(candidate, data.test.texts)
        vectors[candidate.name] = np.concatenate([np.asarray(candidate.runner(feed)) for feed in every])
    rows = quality(vectors)
    for r in range(args.rounds + 1):  # round 0 warms every candidate up
        time_round(candidates, keep=r > 0)
    for candidate in candidates:
        graph = candidate.path / "model.onnx" if candidate.onnx else candidate.path
        rows[candidate.name].update(**size_metrics(graph), **latency_row(candidate))
    result = {"provenance": provenance(2), "rounds": args.rounds, "data": data.source, "n_test": len(data.test),
              "encoder": args.encoder, "reduce_range": reduce_range,
              "student": {**STUDENT, **read_json(args.work / "student.json")} if args.student else None,
              "peers": peers, "kept_float": read_json(args.work / "kept.json"), "candidates": rows,
              "fusions_left_out": left_out(args.work / "fuse")}
    write_results(args.out, result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
