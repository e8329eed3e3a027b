import json
import os

import numpy as np
import pytest

from edgepress.pipeline import demo
from edgepress.pipeline.config import AccuracyGate, RuntimeConfig
from edgepress.runtime.latency import LatencyConfig

STAGES = ["distill", "heads", "ffn", "vocab", "export", "fuse", "int8"]
FOLDERS = [f"{i:02d}-{name}" for i, name in enumerate(["baseline", *STAGES])]


def tiny_stage(stage):
    """A demo stage fit for the 2-layer, untrained tiny model: a 1-layer student; gates against the stage before
    only (the limits against the baseline, latency and size are for the real teacher; timing is for benchmarks/);
    every fusion (`auto` picks by timing, and the int8 of the set it picks decides which int8 attempt passes)."""
    accuracy = stage.gates.accuracy and stage.gates.accuracy.max_stage_drop
    accuracy = AccuracyGate(max_stage_drop=accuracy) if accuracy else None
    gates = stage.gates.model_copy(update={"latency": None, "size": None, "accuracy": accuracy})
    params = {**stage.params, "student_layers": 1} if stage.method == "distill" else stage.params
    params = {**params, "fusions": "all"} if stage.method == "optimize" else params
    return stage.model_copy(update={"gates": gates, "params": params})


@pytest.fixture(scope="module")
def demo_run(tiny_model_dir, tmp_path_factory):
    """The demo pipeline with the tiny model standing in for the teacher and few timed runs (the real teacher is
    in the slow tests): patched in while the module's tests run, and run once, into the dir it returns."""
    cfg = demo.demo_config()
    fast = RuntimeConfig(threads=1, latency=LatencyConfig(warmup=2, runs=10))
    few = cfg.data.transfer.model_copy(update={"max_texts": 300, "per_epoch": 100})  # the demo's transfer texts, few
    tiny = cfg.model_copy(update={"model": str(tiny_model_dir), "runtime": fast,
                                  "data": cfg.data.model_copy(update={"unlabeled": few}),
                                  "stages": [tiny_stage(s) for s in cfg.stages]})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "demo_config", lambda task="classification": tiny)
        out = tmp_path_factory.mktemp("demo") / "run"
        report = demo.run_demo(out, quick=True)
        yield out, report


def test_demo_writes_the_contract_report(demo_run):
    tiny_demo, report = demo_run
    distilled = report["stages"][0]
    assert distilled["method"] == "distill" and distilled["details"]["layer_map"] == [0]
    assert distilled["details"]["transfer_examples"] == 300  # every training stage learns the teacher on them too
    assert all(s["details"]["transfer_examples"] == 300 for s in report["stages"][1:3])  # heads, ffn
    assert len(distilled["details"]["history"]) == 1  # --quick: one epoch
    assert distilled["metrics"]["params"] < report["baseline"]["metrics"]["params"]
    assert json.loads((tiny_demo / "report.json").read_text()) == report
    assert {"version", "environment", "baseline", "stages", "final"} <= set(report)
    env = report["environment"]
    assert {"cpu", "cores", "threads", "python", "torch", "onnxruntime", "providers_available"} <= set(env)
    metrics = report["baseline"]["metrics"]
    assert {"accuracy", "accuracy_ci95", "n_test", "params", "nonzero_params", "sparsity", "size_bytes",
            "size_gzip_bytes", "macro_f1", "latency"} <= set(metrics)
    assert metrics["n_test"] == 1057
    assert metrics["accuracy_ci95"][0] <= metrics["accuracy"] <= metrics["accuracy_ci95"][1]
    assert [s["name"] for s in report["stages"]] == STAGES
    assert all(s["status"] == "passed" for s in report["stages"])
    assert report["final"]["artifact"] == str(tiny_demo / "final")
    assert report["final"]["metrics"] == report["stages"][-1]["metrics"]
    for stage in report["stages"]:
        assert {"name", "method", "status", "artifact", "metrics", "gates"} <= set(stage)
    assert all(s["gates"] for s in report["stages"][4:])  # export, fuse, int8 (the tiny demo drops max_drop gates)
    for stage in report["stages"][1:]:
        assert all({"kind", "rule", "limit", "value", "passed"} <= set(gate) for gate in stage["gates"])
        assert len(stage["metrics"]["accuracy_drop_ci95"]) == 2


def test_demo_records_the_split_and_each_stage(demo_run):
    tiny_demo, _ = demo_run
    split = json.loads((tiny_demo / "data_split.json").read_text())
    assert split["sizes"] == {"train": 8454, "validation": 1057, "test": 1057, "unlabeled": 300}
    baseline = tiny_demo / "stages" / "00-baseline"
    predictions = json.loads((baseline / "predictions.json").read_text())
    assert predictions["ids"] == split["ids"]["test"]
    assert json.loads((baseline / "stage.json").read_text())["status"] == "passed"
    latency = json.loads((baseline / "metrics.json").read_text())["latency"]["cpu"]
    assert latency["providers_used"] == ["torch-cpu"] and latency["runs"] == 10 and latency["threads"] == 1
    assert 0 < latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"]
    int8 = json.loads((tiny_demo / "stages" / FOLDERS[-1] / "stage.json").read_text())
    assert int8["details"]["quantized_ops"]["MatMulInteger"] > 0
    config = json.loads((tiny_demo / "stages" / FOLDERS[-1] / "config.json").read_text())
    # one scale per tensor first; per channel, the fallback, only where that failed (the untrained tiny model's
    # near-tied logits may fail its parity)
    first, *fallback = int8["details"]["attempts"]
    assert first["params"] == {} and config["params"]["per_channel"] is (first["status"] == "failed")
    assert [a["params"] for a in fallback] == ([{"per_channel": True}] if first["status"] == "failed" else [])
    assert (tiny_demo / "stages" / FOLDERS[-2] / "model" / "model.onnx").is_file()
    final = json.loads((tiny_demo / "stages" / FOLDERS[-1] / "predictions.json").read_text())["predictions"]
    fidelity = json.loads((tiny_demo / "stages" / FOLDERS[-1] / "metrics.json").read_text())
    assert fidelity["agreement"] == pytest.approx(np.mean(np.array(final) == predictions["predictions"]))
    assert fidelity["agreement_ci95"][0] <= fidelity["agreement"] <= fidelity["agreement_ci95"][1]
    log = (tiny_demo / "run.log").read_text()
    assert "baseline: accuracy" in log and "stage int8: int8-dynamic" in log
    markdown = (tiny_demo / "report.md").read_text()
    assert "| baseline |" in markdown and "✓ `int8` accuracy.max_stage_drop" in markdown
    assert "| speedup |" in markdown and "| 1.0x |" in markdown  # the baseline against itself
    assert "| agreement [95% CI] |" in markdown and f"| {fidelity['agreement']:.4f} [" in markdown
    # what ran, not what the installed onnxruntime lists (onnxruntime-gpu lists CUDA and TensorRT without a GPU)
    assert "Timed on: ONNX Runtime CPU, torch on CPU." in markdown and "Tensorrt" not in markdown
    assert "labels: negative, positive" in markdown
    html = (tiny_demo / "report.html").read_text()
    assert html.count("<svg") == 4 and "<td>int8</td>" in html and "✓ int8: accuracy.max_stage_drop" in html
    assert "<h3>accuracy against latency</h3>" in html and "Pareto front" in html and "Tensorrt" not in html
    mask = os.umask(0)
    os.umask(mask)
    assert (tiny_demo / "report.html").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


def test_final_bundle_is_the_gated_model_with_a_manifest(demo_run, movie_data):
    from edgepress.deploy.targets import detect_target
    from edgepress.device.predictor import Predictor

    tiny_demo, _ = demo_run
    final = tiny_demo / "final"
    manifest = json.loads((final / "edgepress.json").read_text())
    assert manifest["stages"] == STAGES and manifest["max_length"] == 128
    assert manifest["labels"] == {"0": "negative", "1": "positive"}
    assert manifest["target"] == {"name": detect_target(), "detected": True}  # no target set: this machine's
    assert {"model.onnx", "tokenizer.json", "config.json"} <= set(manifest["files"])
    gated = tiny_demo / "stages" / FOLDERS[-1] / "model" / "model.onnx"
    assert (final / "model.onnx").read_bytes() == gated.read_bytes()
    recorded = json.loads((tiny_demo / "stages" / FOLDERS[-1] / "predictions.json").read_text())
    texts = dict(zip(movie_data.test.ids, movie_data.test.texts, strict=True))
    predictor = Predictor(final)  # one text per call, as the run evaluated it
    labels = [predictor.predict([texts[i]])[0] for i in recorded["ids"][:100]]
    assert [p.label for p in labels] == [("negative", "positive")[k] for k in recorded["predictions"][:100]]
