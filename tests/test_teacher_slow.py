"""The real thing: the demo teacher fine-tuned on the movie snippets, and the demo on it (minutes)."""

import json

import pytest

from edgepress.cli.app import app


@pytest.mark.slow
def test_demo_quick_reaches_the_teachers_accuracy(tmp_path):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    metrics = report["baseline"]["metrics"]
    assert metrics["accuracy"] >= 0.83
    assert 1000 < metrics["n_test"] < 1100
    assert metrics["accuracy_ci95"][1] - metrics["accuracy_ci95"][0] < 0.06
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages) == ["distill", "heads", "ffn", "vocab", "export", "fuse", "int8"]
    assert all(s["status"] == "passed" for s in stages.values())
    assert len(stages["distill"]["details"]["history"]) == 1  # --quick: one epoch
    assert stages["export"]["details"]["parity"]["max_abs_diff"] <= 1e-4
    assert (tmp_path / "run" / "final" / "edgepress.json").is_file()
    assert report["final"]["metrics"]["accuracy"] >= 0.80
    assert report["final"]["metrics"]["size_bytes"] < 9e6


@pytest.mark.slow
def test_teacher_exports_with_parity_and_predicts_torch_free(tmp_path):
    from edgepress.device.predictor import Predictor
    from edgepress.export.optimize import OptimizeConfig
    from edgepress.pipeline.export import export_model

    steps = export_model("demo:minilm-movie", tmp_path / "bundle", OptimizeConfig())
    parity = steps["export"]["parity"]
    assert parity["max_abs_diff"] <= 1e-4 and parity["agreement"] == 1.0
    assert steps["optimize"]["fused_ops"]["Attention"] == 6
    assert steps["optimize"]["parity"]["agreement"] >= 0.999
    prediction = Predictor(tmp_path / "bundle").predict(["a gorgeous, moving film"])[0]
    assert prediction.label == "positive"
