"""A token classifier side by side (issue 30): the torch teacher, optimum's int8 recipe of it (export, O2, dynamic
int8 with this CPU's preset: benchmarks/peer.py in the peer venv) and the ONNX stages of an edgepress run, on the
CoNLL-2003 test split (3,453 sentences): entity F1 with its 95% CI and the paired CI of its drop from the teacher's,
F1 per entity type, agreement with the teacher's entities, size, and latency timed side by side (rounds, every
candidate in turn): b1 x 128 tokens and the test sentences at their natural lengths, one a call.

    .venv/bin/python benchmarks/ner_teacher.py --out runs/ner/teacher
    .venv/bin/edgepress run examples/ner-int8.yaml --out runs/ner/run     # the teacher quantized
    .venv/bin/edgepress run examples/ner.yaml --out runs/ner/small        # distilled, pruned, quantized
    make peer-env && .venv-peer/bin/python benchmarks/peer.py --build runs/ner/optimum --model runs/ner/teacher
    .venv/bin/python benchmarks/ner_compare.py --run runs/ner/small --stages distill int8 --peer runs/ner/optimum \\
        --extra 'edgepress int8 of the teacher=runs/ner/run/stages/03-int8/model' \\
        --out benchmarks/results/ner-small-compare.json

(`--run runs/ner/run --peer runs/ner/optimum --out benchmarks/results/ner-compare.json` made the teacher's table.)
"""

import argparse
from pathlib import Path

from harness import measured, provenance, table, write_results


def main() -> None:
    from edgepress.data import DataConfig
    from edgepress.data.metrics import entity_f1_drop_ci95, entity_metrics
    from edgepress.data.tagged import DEMO_TAGGED, load_tagged
    from edgepress.device.predictor import Predictor
    from edgepress.files import read_json
    from edgepress.models.introspect import size_metrics
    from edgepress.models.loading import label2id_of, load_classifier
    from edgepress.pipeline.latency import compare_latency, onnx_path
    from edgepress.tasks import task_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="an edgepress run of a token classifier")
    parser.add_argument("--peer", type=Path, help="optimum's int8 model dir of the run's model (peer.py --build)")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=DIR",
                        help="another ONNX model dir of the same teacher to time beside them (repeatable)")
    parser.add_argument("--stages", nargs="*", help="the run's stages to compare (default: each with a graph)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    teacher = Path(read_json(args.run / "run.json")["config"]["model"])  # the run's model (its baseline)
    task = task_of(teacher)
    data = load_tagged(DataConfig(source=DEMO_TAGGED), label2id_of(teacher))
    candidates = {"torch teacher": teacher, **({"optimum int8": args.peer} if args.peer else {}),
                  **{name: Path(d) for name, d in (extra.split("=", 1) for extra in args.extra)}}
    for stage in sorted((args.run / "stages").iterdir()):
        if (stage / "model" / "model.onnx").is_file() and (args.stages is None or stage.name[3:] in args.stages):
            candidates[f"edgepress {stage.name[3:]}"] = stage / "model"
    true = task.true_names(data.test)
    tags = {}
    for name, path in candidates.items():
        if onnx_path(path) is None:
            model, tokenizer = load_classifier(path)
            tags[name] = task.names(task.torch_predictions(model, tokenizer, data.test.texts, 128))
        else:
            tags[name] = task.names(task.onnx_predictions(Predictor(path, threads=args.threads, max_length=128),
                                                          data.test.texts, name))
        print(name, "F1", round(entity_metrics(true, tags[name], task.scheme)["f1"], 4), flush=True)
    base = tags["torch teacher"]
    rows = {}
    for name, path in candidates.items():
        figures = entity_metrics(true, tags[name], task.scheme)
        rows[name] = {"f1": figures["f1"], "f1_ci95": figures["f1_ci95"],
                      "f1_drop_ci95": entity_f1_drop_ci95(true, base, tags[name], task.scheme),
                      "agreement": entity_metrics(base, tags[name], task.scheme)["f1"],
                      "per_type_f1": {t: v["f1"] for t, v in figures["per_type"].items()},
                      **size_metrics(path if onnx_path(path) is None else onnx_path(path))}
    timings = compare_latency(candidates, data.test.texts, args.threads, args.rounds)
    teacher_ms = timings["torch teacher"]["natural_p50_ms"]
    for name, latency in timings.items():
        rows[name] |= latency | {"natural_speedup_vs_teacher": teacher_ms / latency["natural_p50_ms"]}
    result = {"provenance": provenance(args.threads), "data": f"{DEMO_TAGGED} test, {len(data.test):,} sentences",
              "run": str(args.run), "teacher": str(teacher), "rounds": args.rounds, "candidates": rows}
    if args.out:
        write_results(args.out, result, markdown(result))
    print(markdown(result))


def markdown(result: dict) -> str:
    """The side-by-side table as markdown."""
    rows = result["candidates"]
    types = list(next(iter(rows.values()))["per_type_f1"])
    lines = [f"{result['data']}. {measured(result['provenance'])} Latency: median of {result['rounds']} "
             f"interleaved rounds.", ""]
    header = ["candidate", "entity F1 [95% CI]", "drop vs teacher [paired 95% CI]", "agreement",
              *(f"{t} F1" for t in types), "MB", "p50 ms b1×s128", "p50 ms natural", "vs teacher"]
    cells = []
    for name, r in rows.items():
        (lo, hi), (dlo, dhi) = r["f1_ci95"], r["f1_drop_ci95"]
        cells.append([name, f"{r['f1']:.4f} [{lo:.4f}, {hi:.4f}]", f"[{dlo:+.4f}, {dhi:+.4f}]", f"{r['agreement']:.4f}",
                      *(f"{r['per_type_f1'][t]:.4f}" for t in types), f"{r['size_bytes'] / 1e6:.1f}",
                      f"{r['fixed_p50_ms']:.2f}", f"{r['natural_p50_ms']:.2f}",
                      f"{r['natural_speedup_vs_teacher']:.1f}x"])
    return "\n".join([*lines, *table(header, cells)]) + "\n"


if __name__ == "__main__":
    main()
