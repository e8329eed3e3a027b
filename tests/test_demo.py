import json

import pytest

from edgepress.pipeline import demo


@pytest.fixture
def tiny_demo(monkeypatch, tiny_model_dir, tmp_path):
    """The demo flow with the tiny model standing in for the teacher (the real one is in the slow test)."""
    monkeypatch.setattr(demo, "teacher_dir", lambda: tiny_model_dir)
    return tmp_path / "run"


def test_demo_writes_the_contract_report(tiny_demo, tiny_model_dir):
    report = demo.run_demo(tiny_demo, quick=True)
    on_disk = json.loads((tiny_demo / "report.json").read_text())
    assert on_disk == report
    assert {"version", "environment", "baseline", "stages", "final"} <= set(report)
    env = report["environment"]
    assert {"cpu", "cores", "threads", "python", "torch", "onnxruntime", "providers_available"} <= set(env)
    metrics = report["baseline"]["metrics"]
    assert {"accuracy", "accuracy_ci95", "n_test", "params", "nonzero_params", "sparsity", "size_bytes",
            "size_gzip_bytes", "macro_f1"} <= set(metrics)
    assert metrics["n_test"] == 1057
    assert metrics["accuracy_ci95"][0] <= metrics["accuracy"] <= metrics["accuracy_ci95"][1]
    assert report["final"] == report["baseline"] and report["stages"] == []
    assert report["config"]["quick"] is True


def test_demo_records_the_split_and_each_stage(tiny_demo):
    demo.run_demo(tiny_demo)
    split = json.loads((tiny_demo / "data_split.json").read_text())
    assert split["sizes"] == {"train": 8454, "validation": 1057, "test": 1057}
    baseline = tiny_demo / "stages" / "00-baseline"
    predictions = json.loads((baseline / "predictions.json").read_text())
    assert predictions["ids"] == split["ids"]["test"]
    assert json.loads((baseline / "stage.json").read_text())["status"] == "passed"
    assert "baseline: accuracy" in (tiny_demo / "run.log").read_text()
    assert "| baseline |" in (tiny_demo / "report.md").read_text()
    latency = json.loads((baseline / "metrics.json").read_text())["latency"]["cpu"]
    assert latency["providers_used"] == ["torch-cpu"] and latency["runs"] == 200 and latency["threads"] == 2
    assert 0 < latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"]
