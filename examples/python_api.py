"""edgepress from Python: a pipeline built in code and run, its typed result read, the bundle loaded and asked, then
a search for the pipeline itself. `python examples/python_api.py MODEL_DIR DATA.csv OUT_DIR` on a classifier (what
`save_pretrained` wrote) and its data (a text and a label column); tests/test_api.py runs it on a tiny model."""

import sys
from pathlib import Path

import edgepress


def compress(model: str, data: str, out: str, max_drop: float = 0.01) -> edgepress.RunResult:
    """examples/your-model.yaml in code: export, fuse, int8 per channel, gated on accuracy."""
    config = edgepress.PipelineConfig(
        model=model,
        data=edgepress.DataConfig(source=data, text_column="text", label_column="label"),
        stages=[
            edgepress.StageConfig(name="export", method="export"),
            edgepress.StageConfig(name="fuse", method="optimize"),
            edgepress.StageConfig(name="int8", method="int8-dynamic",
                                  params=edgepress.Int8DynamicConfig(per_channel=True),
                                  gates=edgepress.Gates(accuracy=edgepress.AccuracyGate(max_drop=max_drop))),
        ],
    )
    try:
        result = edgepress.run(config, Path(out) / "run", progress=lambda stage: print(f"{stage.name} passed"))
    except edgepress.GateFailed as failed:  # the stage that missed, each gate it missed, and the run as it ended
        for gate in failed.result.stage(failed.stage).missed:
            print(f"{failed.stage} missed {gate.kind}.{gate.rule}: {gate.value} against {gate.limit}")
        raise
    for stage in (result.baseline, *result.stages):
        m = stage.metrics
        print(f"{stage.name:<8} {stage.status:<7} {m.primary} {m.value:.4f} {m.ci95}  "
              f"{m.size_bytes / 1e6:.1f} MB  cpu p50 {m.latency['cpu'].p50_ms:.2f} ms")
        for gate in stage.gates:
            print(f"         {gate.kind}.{gate.rule}: {gate.value} (limit {gate.limit}) "
                  f"{'passed' if gate.passed else 'missed'}")
    return result


def ask(bundle: Path, texts: list[str]) -> list:
    """The bundle as the device runs it (onnxruntime, tokenizers and numpy)."""
    predictor = edgepress.load(bundle)
    predictions = predictor.predict_each(texts)
    for p in predictions:
        print(f"{p.label} {p.score:.3f}  {p.text}")
    return predictions


def search(model: str, data: str, out: str, max_drop: float = 0.01, trials: int = 20) -> edgepress.SearchResult:
    """The fastest student within `max_drop` of the model on validation: shapes timed first, then trained."""
    found = edgepress.search({
        "model": model,
        "data": {"source": data},
        "constraints": {"accuracy": {"max_drop": max_drop}},
        "objective": "latency",
        "space": {"layers": [1, 2], "heads_keep": [1.0, 0.5], "ffn_keep": [1.0, 0.5], "vocab": [False],
                  "quantization": ["int8-dynamic-per-channel"], "epochs": [1]},
    }, Path(out) / "search", budget="2h", trials=trials)
    for trial in found.trials:
        print(f"trial {trial.number}: {trial.stop} {trial.params} accuracy {trial.accuracy} p50 {trial.p50_ms} ms")
    print(f"best: trial {found.best_trial}, {found.config}; on test: {found.run.stages[-1].metrics.value:.4f}")
    return found


if __name__ == "__main__":
    model_dir, data_file, out_dir = sys.argv[1:4]
    result = compress(model_dir, data_file, out_dir)
    ask(result.bundle, ["a quietly moving film", "two hours I will not get back"])
    search(model_dir, data_file, out_dir)
