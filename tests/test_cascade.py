"""The cascade stage on tiny models: a student that hands its unsure texts to a faithful fallback, the threshold
chosen on validation alone, every text's answer the one model that `--json` names, the bundle's answers the run's,
and the refusals at validate."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edgepress.cli.app import app
from edgepress.device.cascade import CASCADE, FALLBACK, STUDENT, Cascade, confidence
from edgepress.device.predictor import Predictor
from edgepress.pipeline import runner
from edgepress.pipeline.config import load_config
from edgepress.tasks import CLASSIFICATION
from tests.conftest import save, tiny_bert
from tests.test_bundle import chromium, open_page, transformers_js, web
from tests.test_pipeline import FAST_RUNTIME, write_yaml

CLI = CliRunner()
# the student: the teacher's graph in int8 (per tensor); the fallback: the teacher fused, in fp32 (it agrees with
# the teacher on every text), so that full agreement on validation is reachable and needs some texts deferred
CASCADE_STAGE = {"name": "cascade", "method": "cascade",
                 "params": {"fallback_precision": "fp32", "min_agreement": 1.0}}
STAGES = [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"}, CASCADE_STAGE]


@pytest.fixture(scope="module")
def cascade_run(tmp_path_factory, trained_teacher):
    root = tmp_path_factory.mktemp("cascade")
    path = write_yaml(root / "p.yaml", {"model": str(trained_teacher), "runtime": FAST_RUNTIME, "stages": STAGES})
    report = runner.run_pipeline(load_config(path), root / "run")
    return root / "run", report


def test_confidence_is_the_top_probability_or_margin_and_a_taggers_least_sure_real_token():
    logits = np.log(np.array([[[0.7, 0.2, 0.1]]]))
    assert confidence(logits[0], np.ones((1, 1)), "top") == pytest.approx(0.7)
    assert confidence(logits[0], np.ones((1, 1)), "margin") == pytest.approx(0.5)
    tokens = np.log(np.array([[[0.2, 0.8], [0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.5, 0.5]]]))  # (1, 5, 2)
    mask = np.array([[1, 1, 1, 1, 0]])  # [CLS] a b [SEP] pad: the rows of a and b decide
    assert confidence(tokens, mask, "top") == pytest.approx(0.6)


def test_a_cascade_defers_the_texts_its_student_is_unsure_of(cascade_run):
    run, report = cascade_run
    assert report["status"] == "passed"
    stage = report["stages"][-1]
    details, metrics = stage["details"], stage["metrics"]
    spec = json.loads((run / "stages" / "03-cascade" / "model" / CASCADE).read_text())
    assert spec["threshold"] == details["cascade"]["threshold"] and spec["rule"] == "top"
    front = details["front"]
    assert front[0]["deferred"] == 0 and front[-1]["deferred"] == 1 and front[-1]["agreement"] == 1.0
    picked = details["cascade"]["validation"]
    assert picked["agreement"] == 1.0 and 0 < picked["deferred"] < 1
    # the fewest deferred of the grid's points that meet the target
    assert all(row["agreement"] < 1.0 for row in front if row["deferred"] < picked["deferred"])
    assert 0 < metrics["deferred"] < 1 and "deferred" in metrics["sets"]["typos"]
    student = report["stages"][-2]["metrics"]
    assert metrics["agreement"] >= student["agreement"]
    assert metrics["size_bytes"] == sum(metrics["cascade"].values())  # both graphs
    assert metrics["latency"]["cpu"]["natural"]["deferred"] >= 0
    bundle = run / "final"
    assert (bundle / CASCADE).is_file() and (bundle / FALLBACK / "model.onnx").is_file()
    manifest = json.loads((bundle / "edgepress.json").read_text())
    assert manifest["cascade"]["threshold"] == spec["threshold"]
    assert f"{FALLBACK}/model.onnx" in manifest["files"]


def test_each_answer_is_the_one_model_json_names_and_the_bundle_answers_as_the_run(cascade_run, movie_data):
    from edgepress.device.cli import main

    run, report = cascade_run
    bundle = run / "final"
    cascade = Cascade(bundle)
    student, fallback = Predictor(bundle), Predictor(bundle / FALLBACK)
    answers = cascade.predict_each(movie_data.test.texts)
    run_preds = json.loads((run / "stages" / "03-cascade" / "predictions.json").read_text())["predictions"]
    ids = {name: i for i, name in cascade.id2label.items()}
    assert [ids[a.label] for a in answers] == run_preds  # the bundle answers every test text as the run did
    deferred = [a for a in answers if a.model == FALLBACK]
    assert deferred and len(deferred) < len(answers)  # this threshold sends some texts each way
    picked = deferred[:10] + [a for a in answers if a.model == STUDENT][:10]
    for answer in picked:
        own = (student if answer.model == STUDENT else fallback).predict_each([answer.text])[0]
        assert (answer.label, answer.score) == (own.label, pytest.approx(own.score))
        assert (answer.confidence < cascade.threshold) == (answer.model == FALLBACK)
    answers, texts = picked, [a.text for a in picked]
    texts_file = run.parent / "texts.txt"
    texts_file.write_text("\n".join(texts) + "\n")
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--file", str(texts_file), "--json"], here=bundle) == 0
    lines = [json.loads(line) for line in printed.getvalue().splitlines()]
    assert [line["model"] for line in lines] == [a.model for a in answers]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--file", str(texts_file), "--bench", "--runs", "3", "--json"], here=bundle) == 0
    bench = json.loads(printed.getvalue())
    assert bench["deferred"] == pytest.approx(np.mean([a.model == FALLBACK for a in answers]))
    assert {"mean_ms", "p99_ms"} <= set(bench["natural"])


def test_the_threshold_is_chosen_on_validation_alone(cascade_run, trained_teacher, movie_data, tmp_path):
    """The cascade's method given other test texts makes the same threshold: the test split never chooses it."""
    from edgepress.compress.cascade import CascadeConfig, cascade

    run, _ = cascade_run
    student = run / "stages" / "02-int8" / "model"
    cfg = CascadeConfig(fallback_precision="fp32", min_agreement=1.0, baseline_model=trained_teacher, threads=1)
    other = replace(movie_data, test=movie_data.test.take(10))
    first = cascade(student, tmp_path / "a", movie_data, cfg, task=CLASSIFICATION)
    second = cascade(student, tmp_path / "b", other, cfg, task=CLASSIFICATION)
    assert first["cascade"]["threshold"] == second["cascade"]["threshold"]
    recorded = json.loads((run / "stages" / "03-cascade" / "model" / CASCADE).read_text())
    assert recorded["threshold"] == first["cascade"]["threshold"]


def test_a_cascade_bundle_refuses_a_target_it_is_not_built_for_and_ships_its_student_alone(cascade_run, tmp_path):
    run, _ = cascade_run
    result = CLI.invoke(app, ["bundle", str(run), "--out", str(tmp_path / "gpu"), "--target", "cuda"])
    assert result.exit_code == 2 and "--no-cascade" in result.output and not (tmp_path / "gpu").exists()
    result = CLI.invoke(app, ["bundle", str(run), "--out", str(tmp_path / "alone"), "--no-cascade"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "alone" / CASCADE).exists() and not (tmp_path / "alone" / FALLBACK).exists()
    manifest = json.loads((tmp_path / "alone" / "edgepress.json").read_text())
    assert "metrics" not in manifest and "cascade" in manifest["not_measured"]


@pytest.mark.parametrize("target", ["arm64", "mobile"])
def test_a_cascade_bundle_answers_as_the_run_on_every_target_it_ships_to(cascade_run, movie_data, tmp_path, target):
    from edgepress.deploy.bundle import bundle_model

    run, _ = cascade_run
    out = bundle_model(run, tmp_path / target, target)
    texts = movie_data.test.texts[:200]
    run_preds = json.loads((run / "stages" / "03-cascade" / "predictions.json").read_text())["predictions"][:200]
    cascade = Cascade(out)
    ids = {name: i for i, name in cascade.id2label.items()}
    assert [ids[p.label] for p in cascade.predict_each(texts)] == run_preds
    manifest = json.loads((out / "edgepress.json").read_text())
    assert manifest["cascade"]["threshold"] == cascade.threshold and f"{FALLBACK}/model.onnx" in manifest["files"]
    if target == "mobile":  # each graph's ORT format beside it
        assert (out / "model.ort").is_file() and (out / FALLBACK / "model.ort").is_file()
        assert manifest["mobile"]["fallback"]["ort_vs_onnx_max_abs_diff"] <= 1e-4


@web
def test_a_cascade_web_bundle_routes_and_answers_each_text_as_predict_py(cascade_run, movie_data, tmp_path):
    """Under Node, transformers.js through the bundle's own cascade.mjs (what its page runs): each text's route,
    confidence and label are predict.py's on the same bundle."""
    from edgepress.deploy.bundle import bundle_model

    run, _ = cascade_run
    out = bundle_model(run, tmp_path / "site", "web")
    manifest = json.loads((out / "edgepress.json").read_text())
    inner = manifest["web"]["fallback"]
    assert (out / FALLBACK / inner["model_file"]).is_file() and not (out / FALLBACK / "model.onnx").exists()
    cascade = Cascade(out)  # predict.py's reading of the same bundle (each graph in onnx/)
    unsure = sorted(cascade.predict_each(movie_data.test.texts), key=lambda p: p.confidence)
    texts = [p.text for p in unsure[:40] + unsure[-40:]]  # those about the threshold, and the surest
    python = cascade.predict_each(texts)
    assert {p.model for p in python} == {STUDENT, FALLBACK}
    node = transformers_js(out, texts, tmp_path)["predictions"]
    assert [p["model"] for p in node] == [p.model for p in python]
    assert [p["label"] for p in node] == [p.label for p in python]
    np.testing.assert_allclose([p["confidence"] for p in node], [p.confidence for p in python], atol=1e-4)


@web
@chromium
def test_the_page_hands_a_text_its_student_is_unsure_of_to_the_fallback(cascade_run, movie_data, tmp_path):
    from edgepress.deploy.bundle import bundle_model

    run, _ = cascade_run
    out = bundle_model(run, tmp_path / "site", "web")
    text = next(p for p in Cascade(out).predict_each(movie_data.test.texts) if p.model == FALLBACK)
    result = open_page(out, text.text, tmp_path / "page.png")
    assert (result["result"], result["model"]) == (text.label, FALLBACK)
    assert all(url.startswith("http://127.0.0.1:") for url in result["requests"])


def validate(tmp_path, model: Path, stages: list, **extra) -> object:
    path = write_yaml(tmp_path / "v.yaml", {"model": str(model), "stages": stages, **extra})
    return CLI.invoke(app, ["validate", str(path)])


def test_validate_refuses_what_a_cascade_cannot_do(tmp_path, trained_teacher, tiny_onnx_dir, cascade_run,
                                                  tokenizer):
    export = {"name": "export", "method": "export"}
    other = tmp_path / "other"
    other.mkdir()
    for f in tiny_onnx_dir.iterdir():
        if f.is_file():
            (other / f.name).write_bytes(f.read_bytes())
    config = json.loads((other / "config.json").read_text())
    config.update(id2label={"0": "bad", "1": "good"}, label2id={"bad": 0, "good": 1})
    (other / "config.json").write_text(json.dumps(config))
    result = validate(tmp_path, trained_teacher, [export, {"name": "c", "method": "cascade",
                                                           "params": {"fallback": str(other)}}])
    assert result.exit_code == 2 and "names its labels" in result.output and "Fix:" in result.output
    result = validate(tmp_path, trained_teacher, [export, {"name": "c", "method": "cascade",
                                                           "params": {"fallback": str(tmp_path / "nowhere")}}])
    assert result.exit_code == 2 and "does not exist" in result.output
    heavier = tmp_path / "heavier"  # four layers where the teacher has two: each text it answers costs more
    save(tiny_bert(tokenizer, num_hidden_layers=4), tokenizer, heavier)
    result = validate(tmp_path, trained_teacher, [export, {"name": "c", "method": "cascade",
                                                           "params": {"fallback": str(heavier)}}])
    assert result.exit_code == 2 and "weights" in result.output and "Fix:" in result.output
    for same in (trained_teacher, cascade_run[0] / "stages" / "01-export" / "model"):  # the teacher, torch and ONNX
        assert validate(tmp_path, trained_teacher, [export, {"name": "c", "method": "cascade",
                                                             "params": {"fallback": str(same)}}]).exit_code == 0
    result = validate(tmp_path, trained_teacher, [export, CASCADE_STAGE, {"name": "q", "method": "int8-dynamic"}])
    assert result.exit_code == 2 and "cascade" in result.output
    result = validate(tmp_path, trained_teacher, [export, CASCADE_STAGE], runtime={"target": "cuda"})
    assert result.exit_code == 2 and "--no-cascade" not in result.output and "target" in result.output
    result = validate(tmp_path, trained_teacher, [export, {**CASCADE_STAGE, "params": {"min_agreement": 0.9,
                                                                                     "max_drop": 0.01}}])
    assert result.exit_code == 2 and "not both" in result.output
    assert validate(tmp_path, trained_teacher, [export, CASCADE_STAGE]).exit_code == 0


def test_a_cascades_digest_covers_its_fallback_and_evaluate_and_bench_read_it_whole(cascade_run, tmp_path):
    import shutil

    from edgepress.files import tree_sha256

    run, report = cascade_run
    stage = report["stages"][-1]
    copy = tmp_path / "cascade"
    shutil.copytree(run / "stages" / "03-cascade" / "model", copy)
    assert tree_sha256(copy) == stage["artifact_sha256"]
    graph = copy / FALLBACK / "model.onnx"
    graph.write_bytes(graph.read_bytes() + b"\0")  # half of the artifact changed: --resume must not reuse it
    assert tree_sha256(copy) != stage["artifact_sha256"]
    result = CLI.invoke(app, ["evaluate", str(run / "final")])
    assert result.exit_code == 0, result.output
    assert f"accuracy {stage['metrics']['accuracy']:.4f}" in result.output
    assert f"cascade: {stage['metrics']['deferred']:.1%} of them answered by its fallback" in result.output
    result = CLI.invoke(app, ["bench", str(run / "final"), "--runs", "3", "--warmup", "1"])
    assert result.exit_code == 0 and "deferred to its fallback" in result.output, result.output
