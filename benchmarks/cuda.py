"""The comparison on a GPU: PyTorch fp16 eager against ONNX Runtime's CUDA provider running fp16 graphs with
IOBinding (inputs bound on the GPU once, logits left there), for the teacher and for an edgepress student, at
batch 1 and batch 32 x 128 real tokens. CUDA is verified as the provider that ran (a session that fell back to the
CPU is an error, not a slow row).

    .venv/bin/python benchmarks/cuda.py --teacher TEACHER_DIR --student RUN/stages/NN-fuse/model \
        --texts TEST.json [--rounds 3] [--out benchmarks/results/cuda.json]

TEACHER_DIR: the run's baseline model dir (fp32 or fp16 weights). The student: a fused ONNX dir of the run (its
`optimize` stage), fp32 or already fp16; fp32 graphs are converted to fp16 here with edgepress's `fp16` method, checked
on CUDA. TEST.json:
{"texts": [...], "labels": [...]}, the run's test split (written by `--write-texts RUN` on any machine). Accuracy of
each candidate on it and agreement with the teacher's fp16 torch labels are reported beside the latencies.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
from harness import provenance, write_results

from edgepress.device.feeds import encode, fixed_shape_feeds, load_tokenizer
from edgepress.device.timing import summarize
from edgepress.export.onnx import ExportConfig, export_onnx
from edgepress.export.optimize import Fp16Config, OptimizeConfig, fp16_onnx, optimize_onnx
from edgepress.files import read_json, write_json
from edgepress.runtime.session import SessionConfig, cuda_iobinding_runner, open_session

SHAPES = {"b1_s128": (1, 128, 20, 200), "b32_s128": (32, 128, 5, 50)}  # batch, seq, warm-up, timed runs
CUDA = "CUDAExecutionProvider"


def torch_candidate(teacher: Path, texts: list[str]):
    """(runner over feeds already on the GPU, feeds per shape, logits of `texts`) of the teacher in fp16 eager."""
    import torch

    from edgepress.models.evaluate import predict_logits
    from edgepress.models.loading import load_classifier

    model, tokenizer = load_classifier(teacher)
    model = model.half().cuda().eval()
    names = tuple(tokenizer.model_input_names)

    def run(feeds):
        with torch.inference_mode():
            logits = model(**feeds).logits
        torch.cuda.synchronize()
        return logits

    feeds = {shape: {k: torch.from_numpy(v).cuda() for k, v in batch.items()}
             for shape, batch in shape_feeds(teacher, texts, names).items()}
    return run, feeds, predict_logits(model, tokenizer, texts, 128)


def shape_feeds(model_dir: Path, texts: list[str], names: tuple[str, ...]) -> dict[str, dict]:
    tokenizer = load_tokenizer(model_dir, 512)
    return {shape: fixed_shape_feeds(tokenizer, tuple(texts), batch, seq, names, 512)
            for shape, (batch, seq, _, _) in SHAPES.items()}


def ort_candidate(fp16_dir: Path, texts: list[str]):
    """(IOBinding runner, feeds per shape, logits of `texts`) of an fp16 ONNX dir on CUDA."""
    session = open_session(fp16_dir / "model.onnx", SessionConfig(providers=("cuda",)))
    if session.get_providers()[0] != CUDA:
        raise RuntimeError(f"{fp16_dir}: ran on {session.get_providers()}, not CUDA")
    names = tuple(i.name for i in session.get_inputs())
    feeds = shape_feeds(fp16_dir, texts, names)
    run = cuda_iobinding_runner(session, list(feeds.values()))
    tokenizer = load_tokenizer(fp16_dir, 128)
    logits = np.concatenate([session.run(["logits"], encode(tokenizer, texts[i:i + 64], names))[0]
                             for i in range(0, len(texts), 64)])
    return run, feeds, logits


def is_fp16(model_dir: Path) -> bool:
    import onnx

    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer)


def fp16_graph(fp32_model: Path, work: Path, name: str, texts: tuple[str, ...]) -> Path:
    """An fp32 ONNX dir converted to fp16 and checked on CUDA; a torch model dir is exported and fused first; a
    graph already in fp16 (edgepress's `fp16` method, checked where it was made) is taken as it is."""
    if (fp32_model / "model.onnx").is_file() and is_fp16(fp32_model):
        return fp32_model
    if not (fp32_model / "model.onnx").is_file():
        export_onnx(fp32_model, work / f"{name}-export", texts, ExportConfig())
        optimize_onnx(work / f"{name}-export", work / f"{name}-fused", texts, OptimizeConfig(fusions="all"))
        fp32_model = work / f"{name}-fused"
    fp16_onnx(fp32_model, work / f"{name}-fp16", texts, Fp16Config(providers=("cuda",)))
    return work / f"{name}-fp16"


def fp32_copy(teacher: Path, work: Path) -> Path:
    """The teacher with fp32 weights (the exporter's input), whatever dtype it was saved in."""
    from edgepress.models.loading import load_classifier

    model, tokenizer = load_classifier(teacher)
    model.float().save_pretrained(work / "teacher-fp32")
    tokenizer.save_pretrained(work / "teacher-fp32")
    return work / "teacher-fp32"


def timed(candidates: dict, rounds: int) -> dict[str, dict]:
    """p50/p90/p99 per candidate and shape over the pooled runs of `rounds` interleaved rounds (one warm-up round
    first, dropped)."""
    seconds = {name: {shape: [] for shape in SHAPES} for name in candidates}
    for r in range(rounds + 1):
        for name, (run, feeds, _) in candidates.items():
            for shape, (_, _, warmup, runs) in SHAPES.items():
                for _ in range(warmup):
                    run(feeds[shape])
                for _ in range(runs):
                    start = time.perf_counter()
                    run(feeds[shape])
                    if r:
                        seconds[name][shape].append(time.perf_counter() - start)
    return {name: {shape: {**summarize(s), "sentences_per_s": SHAPES[shape][0] / np.median(s)}
                   for shape, s in by_shape.items()} for name, by_shape in seconds.items()}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", type=Path)
    parser.add_argument("--student", type=Path, help="a fused fp32 ONNX dir of the run")
    parser.add_argument("--texts", type=Path, help="the test split as JSON {texts, labels}")
    parser.add_argument("--write-texts", type=Path, metavar="RUN", help="write RUN's test split to --texts, exit")
    parser.add_argument("--work", type=Path, default=Path("/tmp/edgepress-cuda"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cuda.json")
    args = parser.parse_args()
    if args.write_texts:
        from compare import load_run

        _, data = load_run(args.write_texts)
        write_json(args.texts, {"texts": list(data.test.texts), "labels": data.test.labels.tolist()})
        return
    test = read_json(args.texts)
    texts, labels = test["texts"], np.asarray(test["labels"])
    candidates = {"teacher-torch-fp16": torch_candidate(args.teacher, texts),
                  "teacher-ort-fp16": ort_candidate(fp16_graph(fp32_copy(args.teacher, args.work), args.work,
                                                               "teacher", tuple(texts[:256])), texts),
                  "edgepress-student-ort-fp16": ort_candidate(fp16_graph(args.student, args.work, "student",
                                                                         tuple(texts[:256])), texts)}
    teacher_labels = candidates["teacher-torch-fp16"][2].argmax(-1)
    rows = timed(candidates, args.rounds)
    for name, (_, _, logits) in candidates.items():
        predicted = np.asarray(logits).argmax(-1)
        rows[name] |= {"accuracy": float(np.mean(predicted == labels)), "n": int(len(labels)),
                       "agreement_with_teacher_torch_fp16": float(np.mean(predicted == teacher_labels))}
    result = {"provenance": provenance(), "gpu": torch.cuda.get_device_name(), "providers_verified": CUDA,
              "rounds": args.rounds,
              "shapes": {k: v[:2] for k, v in SHAPES.items()}, "candidates": rows}
    write_results(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
