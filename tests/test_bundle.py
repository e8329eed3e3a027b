import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy
import onnxruntime
import pytest
import tokenizers
from typer.testing import CliRunner

from edgepress import device
from edgepress.cli.app import Target, app
from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
from edgepress.deploy import bundle, targets
from edgepress.deploy.bundle import bundle_model
from edgepress.deploy.web import web_modules
from edgepress.device import feeds, sessions
from edgepress.device.predictor import Predictor
from edgepress.errors import ConfigError, ModelError
from edgepress.files import file_sha256, foreign_files
from edgepress.pipeline.config import PipelineConfig
from edgepress.pipeline.measure import onnx_predictions
from edgepress.tasks import CLASSIFICATION

runner = CliRunner()
RUNTIME_PACKAGES = {"numpy", "onnxruntime", "tokenizers"}


@pytest.fixture(scope="module")
def int8_dirs(tmp_path_factory, tiny_onnx_dir, movie_data) -> dict[str, Path]:
    """The tiny graph quantized to int8 with full-range and with 7-bit (reduce_range) weights."""
    root = tmp_path_factory.mktemp("int8")
    texts = movie_data.validation.texts
    int8_dynamic(tiny_onnx_dir, root / "full", texts)
    int8_dynamic(tiny_onnx_dir, root / "reduced", texts, Int8DynamicConfig(reduce_range=True))
    return {"full": root / "full", "reduced": root / "reduced"}


DEVICE_FILES = sorted(Path(device.__file__).parent.glob("*.py"))  # the device package: what a bundle carries


def _imported(source: str) -> tuple[set[str], set[int]]:
    """(top-level packages imported absolutely, the levels of relative imports) in Python `source`."""
    tree = ast.parse(source)
    absolute = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    absolute |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0}
    return absolute, {node.level for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}


def test_the_device_package_imports_only_the_runtime_and_the_standard_library():
    """Every module of edgepress.device takes the three packages, the standard library and its siblings (relative
    imports, one level: the folder works under any name), and nothing else; the bundle's predict.py takes the
    package beside it."""
    absolute, levels = set(), set()
    for path in DEVICE_FILES:
        found, relative = _imported(path.read_text())
        absolute, levels = absolute | found, levels | relative
    assert absolute - set(sys.stdlib_module_names) == RUNTIME_PACKAGES and levels == {1}
    assert _imported(bundle.PREDICT_PY)[0] - set(sys.stdlib_module_names) == {bundle.DEVICE}


def test_the_cli_offers_every_target():
    assert [t.value for t in Target] == list(targets.TARGETS)


def test_a_bundle_carries_the_model_the_predictor_and_a_manifest(tiny_onnx_dir, tmp_path):
    out = bundle_model(tiny_onnx_dir, tmp_path / "bundle")
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"model.onnx", "tokenizer.json", "config.json", "predict.py", "edgepress.json"} <= names
    assert (out / "predict.py").read_text() == bundle.PREDICT_PY
    assert [(out / bundle.DEVICE / p.name).read_bytes() for p in DEVICE_FILES] == [p.read_bytes() for p in
                                                                                   DEVICE_FILES]  # one source
    manifest = json.loads((out / "edgepress.json").read_text())
    assert manifest["target"] == {"name": targets.detect_target(), "detected": True}
    assert {"domain": "ai.onnx", "op_type": "MatMul"} in manifest["operators"]
    assert manifest["opsets"]["ai.onnx"] == 18 and manifest["ir_version"] == 8
    assert manifest["onnxruntime"] == {"minimum": "1.14", "built_with": onnxruntime.__version__}
    assert {i["name"]: i["dtype"] for i in manifest["inputs"]} == {
        "input_ids": "int64", "attention_mask": "int64", "token_type_ids": "int64"}
    assert set(manifest["files"]) == names - {"edgepress.json"}
    assert all(file_sha256(out / name) == digest for name, digest in manifest["files"].items())
    assert manifest.get("metrics") is None  # a model dir brings no measurements; a run's bundle does


def _card_code(card: str) -> str:
    """The Python block of a model card's "onnxruntime alone" section."""
    return card.split("```python\n", 1)[1].split("```", 1)[0]


def test_a_bundle_is_a_hub_model_repo_with_a_card_whose_code_runs(tiny_onnx_dir, tmp_path):
    """README.md: front matter huggingface_hub's ModelCard parses; a model dir's bundle says nothing was measured;
    the card's onnxruntime code, run in the bundle dir, gives the predictor's logits."""
    from huggingface_hub import ModelCard

    out = bundle_model(tiny_onnx_dir, tmp_path / "bundle")
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "onnx" and card.data.pipeline_tag == "text-classification"
    assert {"edgepress", "onnx", "classification", targets.detect_target()} <= set(card.data.tags)
    assert card.data.eval_results is None and "edgepress measured nothing of it" in card.text
    assert "README.md" in json.loads((out / "edgepress.json").read_text())["files"]  # hashed like the rest
    done = subprocess.run([sys.executable, "-c", _card_code(card.text) + "\nprint(logits.tolist())"], cwd=out,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    numpy.testing.assert_allclose(json.loads(done.stdout), Predictor(out).logits([CLASSIFICATION.example_text]),
                                  atol=1e-5)
    web = ModelCard.load(bundle_model(tiny_onnx_dir, tmp_path / "web", "web") / "README.md")
    assert web.data.library_name == "transformers.js" and "web" in web.data.tags


def test_a_runs_bundle_card_gives_the_runs_figures_machine_date_and_gates(tmp_path, tiny_model_dir):
    """A run's bundle: model-index holds the test split's and each scored set's figures as the manifest records
    them, and the card names the gates passed, the machine and the date."""
    import yaml
    from huggingface_hub import ModelCard

    from edgepress.pipeline import runner as pipeline

    cfg = PipelineConfig.model_validate({
        "model": str(tiny_model_dir), "runtime": {"threads": 1, "latency": {"warmup": 1, "runs": 5}},
        "stages": [{"name": "export", "method": "export"},
                   {"name": "int8", "method": "int8-dynamic", "gates": {"accuracy": {"max_drop": 0.5},
                                                                        "size": {"max_mb": 100}}}]})
    pipeline.run_pipeline(cfg, tmp_path / "run")
    final = tmp_path / "run" / "final"
    manifest = json.loads((final / "edgepress.json").read_text())
    card = ModelCard.load(final / "README.md")
    figures = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    metrics = manifest["metrics"]
    assert figures[("test", "accuracy")] == round(metrics["accuracy"], 4)
    assert figures[("test", "agreement")] == round(metrics["agreement"], 4)
    assert figures[("typos", "agreement")] == round(metrics["sets"]["typos"]["agreement"], 4)
    assert "int8" in card.data.tags and card.data.to_dict()["edgepress"]["run_id"] == manifest["run_id"]
    assert [(g["stage"], g["kind"], g["passed"]) for g in manifest["gates"]] == [("int8", "accuracy", True),
                                                                                 ("int8", "size", True)]
    assert "| int8 | accuracy | max_drop | 0.5 |" in card.text and "| int8 | size | max_mb | 100 |" in card.text
    assert manifest["measured_at"][:10] in card.text and manifest["environment"]["cpu"] in card.text
    front = yaml.safe_load(card.content.split("---")[1])  # plain YAML too, as the Hub reads it
    assert front["model-index"][0]["results"][0]["metrics"][0]["type"] == "accuracy"


def test_minimum_onnxruntime_follows_the_newest_feature_used(int8_dirs, tmp_path):
    from edgepress.deploy.bundle import graph_facts, minimum_onnxruntime

    facts = graph_facts(int8_dirs["full"] / "model.onnx")
    assert minimum_onnxruntime(facts, "1.31.1") == "1.14"
    facts["operators"].append({"domain": "com.microsoft", "op_type": "MatMulNBits"})
    assert minimum_onnxruntime(facts, "1.31.1") == "1.17"
    facts["operators"].append({"domain": "com.microsoft", "op_type": "SomethingNew"})
    assert minimum_onnxruntime(facts, "1.31.1") == "1.31.1"  # unknown: the release it was checked with


def _script(bundle: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    """predict.py run as on a device: without PYTHONDONTWRITEBYTECODE (where Python caches what it imports)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run([python, str(bundle / "predict.py"), *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_predict_py_classifies_times_and_refuses_bad_input(tiny_onnx_dir, movie_data, tmp_path):
    out = bundle_model(tiny_onnx_dir, tmp_path / "bundle")
    texts = list(movie_data.test.texts[:20])
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n\n")
    result = _script(out, "--file", str(tmp_path / "texts.txt"), "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    python = Predictor(out)
    expected = [python.predict([text])[0] for text in texts]  # predict.py classifies each text alone
    assert [r["label"] for r in rows] == [p.label for p in expected] and [r["text"] for r in rows] == texts
    plain = _script(out, texts[0])
    assert plain.returncode == 0 and plain.stdout.split("\t")[0] == expected[0].label
    bench = _script(out, *texts[:3], "--bench", "--runs", "5", "--json")
    timing = json.loads(bench.stdout)
    assert timing["fixed"]["sequence_length"] == 128 and timing["fixed"]["runs"] == 5
    assert 0 < timing["natural"]["p50_ms"] <= timing["natural"]["p90_ms"]
    for args, message in [((), "no text to classify"), (("--file", str(tmp_path / "none.txt")), "cannot read"),
                          (("",), "text 1 of 1 is empty"), (("x", "--runs", "0"), "must be at least 1"),
                          (("x", "--bundle", str(tmp_path)), "is not a model bundle")]:
        bad = _script(out, *args)
        assert bad.returncode == 2 and message in bad.stderr and "Fix:" in bad.stderr, (args, bad.stderr)
        assert "Traceback" not in bad.stderr
    assert foreign_files(out, "edgepress.json") == []  # running it left nothing beside the bundle's own files
    bundle_model(tiny_onnx_dir, out, overwrite=True)  # so it can be bundled again in place (a run's final/ is)


def test_predict_py_runs_with_three_packages_and_agrees_with_edgepress(int8_dirs, movie_data, tmp_path):
    """A fresh venv holding onnxruntime, tokenizers and numpy alone (no edgepress, no torch, not even their
    declared dependencies) runs the bundle and gets the labels edgepress's evaluation got."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pins = [f"{module.__name__}=={module.__version__}" for module in (numpy, onnxruntime, tokenizers)]
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", *pins],
                   check=True, timeout=600)
    listed = subprocess.run([python, "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() "
                             "for d in m.distributions()))"], capture_output=True, text=True, check=True)
    assert listed.stdout.strip() == str(sorted(RUNTIME_PACKAGES))
    out = bundle_model(int8_dirs["full"], tmp_path / "bundle", "x86-vnni")
    texts = movie_data.test.texts[:200]
    (tmp_path / "texts.txt").write_text("\n".join(texts))
    result = _script(out, "--file", str(tmp_path / "texts.txt"), "--json", python=python)
    assert result.returncode == 0, result.stderr
    labels = [json.loads(line)["label"] for line in result.stdout.splitlines()]
    evaluated = onnx_predictions(int8_dirs["full"], texts, 128, None)
    assert labels == [("negative", "positive")[k] for k in evaluated]


def test_bundle_refuses_bad_input_before_writing(tiny_onnx_dir, tiny_model_dir, int8_dirs, tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"exists and is not empty. Fix: .* --overwrite"):
        bundle_model(tiny_onnx_dir, out)
    with pytest.raises(ConfigError, match=r"holds files that are not an edgepress bundle \(no edgepress.json\)"):
        bundle_model(tiny_onnx_dir, out, overwrite=True)  # --overwrite replaces a bundle, never a user's files
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()
    bundle_model(tiny_onnx_dir, out)
    bundle_model(tiny_onnx_dir, out, overwrite=True)  # an earlier bundle is replaced
    assert (out / "predict.py").is_file()
    with pytest.raises(ModelError, match=r"missing model.onnx.*Fix: bundle a run dir"):
        bundle_model(tiny_model_dir, tmp_path / "b2")
    with pytest.raises(ConfigError, match=r"unknown target 'risc-v'. Fix: choose one of x86-vnni"):
        bundle_model(tiny_onnx_dir, tmp_path / "b3", "risc-v")
    with pytest.raises(ConfigError, match=r"runs DequantizeLinear, DynamicQuantizeLinear, MatMulInteger\); target "
                                          r"cuda: .* Fix: end the pipeline with the fp16 stage"):
        bundle_model(int8_dirs["full"], tmp_path / "b4", "cuda")
    assert not any((tmp_path / name).exists() for name in ("b2", "b3", "b4"))


def test_the_device_reads_the_task_its_manifest_records_and_checks_the_graph_against_it(tiny_onnx_dir, tmp_path):
    """Every bundle's manifest names its task, and the device's reader is the one that task names: a manifest that
    names another task than its graph does, or none of edgepress's, is refused (exit 2, the fix), not read as
    whatever the graph's outputs suggest; a model dir without a manifest is read by its own files, as a run reads
    it (`tasks.task_of` and the device share `device.bundle.files_task`)."""
    out = bundle_model(tiny_onnx_dir, tmp_path / "bundle")
    manifest = json.loads((out / "edgepress.json").read_text())
    assert manifest["task"] == "classification" and Predictor(out).task == "classification"
    assert Predictor(tiny_onnx_dir).task == CLASSIFICATION.name  # an export dir: no manifest, its files say
    for task, message in [("embedding", "says its task is embedding, but its graph gives logits per text"),
                          ("token-classification", "but its graph gives logits per text"),
                          ("regression", "task 'regression' is none of classification, token-classification")]:
        (out / "edgepress.json").write_text(json.dumps({**manifest, "task": task}))
        with pytest.raises(ModelError, match=message):
            Predictor(out)
        refused = _script(out, "a fine film")
        assert refused.returncode == 2 and "Fix: bundle the model again" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        if task != "regression":  # bundling it again asks the files, which say otherwise
            with pytest.raises(ModelError, match=rf"its manifest says task {task}, its files say classification"):
                bundle_model(out, tmp_path / f"again-{task}")
            assert not (tmp_path / f"again-{task}").exists()
    older = {k: v for k, v in manifest.items() if k != "task"}  # a bundle written before manifests named the task
    (out / "edgepress.json").write_text(json.dumps(older))
    assert Predictor(out).task == "classification"
    assert json.loads((bundle_model(out, tmp_path / "again") / "edgepress.json").read_text())["task"] == (
        "classification")


def test_full_range_int8_is_refused_for_x86_without_vnni_unless_measured_there(int8_dirs, tmp_path):
    ranges = targets.int8_weight_ranges(int8_dirs["full"] / "model.onnx")
    assert ranges and max(ranges.values()) == 127
    assert max(targets.int8_weight_ranges(int8_dirs["reduced"] / "model.onnx").values()) <= 64
    with pytest.raises(ConfigError, match=r"full-range int8 weights .* Fix: quantize again with reduce_range: true"):
        bundle_model(int8_dirs["full"], tmp_path / "a", "x86-avx2")
    bundle_model(int8_dirs["reduced"], tmp_path / "b", "x86-avx2")
    measured = {"measured_on": "x86-avx2", "metrics": {"accuracy": 0.5}}
    manifest = json.loads((bundle_model(int8_dirs["full"], tmp_path / "c", "x86-avx2", manifest=measured)
                           / "edgepress.json").read_text())
    assert manifest["target"] == {"name": "x86-avx2", "detected": False} and manifest["metrics"] == {"accuracy": 0.5}


def test_a_bundle_of_a_bundle_keeps_what_was_measured(tiny_onnx_dir, tmp_path):
    first = bundle_model(tiny_onnx_dir, tmp_path / "a", "x86-vnni", manifest={"metrics": {"accuracy": 0.7},
                                                                                "measured_on": "x86-vnni"})
    again = json.loads((bundle_model(first, tmp_path / "b", "web") / "edgepress.json").read_text())
    assert again["metrics"] == {"accuracy": 0.7} and again["target"]["name"] == "web"
    device_file = DEVICE_FILES[0]
    assert again["files"][f"{bundle.DEVICE}/{device_file.name}"] == file_sha256(device_file)


def test_targets_fill_params_and_refuse_stages():
    params, filled = targets.target_params("x86-avx2", "int8-dynamic", {"per_channel": True})
    assert params == {"per_channel": True, "reduce_range": True} and "vpmaddubsw" in filled["reduce_range"]["why"]
    assert targets.target_params("x86-avx2", "int8-dynamic", {"per_channel": True, "reduce_range": False}) == (
        {"per_channel": True, "reduce_range": False}, {})  # explicit wins
    assert targets.target_params("x86-avx2", "int8-dynamic", {"per_channel": False}) == ({"per_channel": False}, {})
    assert targets.target_params("x86-avx2", "int8-dynamic", {}, per_channel_default=False) == ({}, {})
    assert targets.target_params("x86-avx2", "int8-static", {})[0] == {"reduce_range": True}
    assert targets.target_params("web", "int8-dynamic", {}) == ({}, {})
    stages = [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"}]
    with pytest.raises(ValueError, match=r"stage int8: int8-dynamic is refused by target cuda"):
        PipelineConfig(runtime={"target": "cuda"}, stages=stages)


def test_cli_bundle_and_run_target(tiny_onnx_dir, tmp_path):
    result = runner.invoke(app, ["bundle", str(tiny_onnx_dir), "--out", str(tmp_path / "b"), "--target", "web"])
    assert result.exit_code == 0, result.output
    assert "bundle for web" in result.output and (tmp_path / "b" / "predict.py").is_file()
    again = runner.invoke(app, ["bundle", str(tiny_onnx_dir), "--out", str(tmp_path / "b")])
    assert again.exit_code == 2 and "--overwrite" in again.output
    bad = runner.invoke(app, ["bundle", str(tiny_onnx_dir), "--out", str(tmp_path / "c"), "--target", "sparc"])
    assert bad.exit_code == 2 and "sparc" in bad.output



@pytest.mark.parametrize("target, reduced", [("x86-avx2", True), ("x86-vnni", False)])
def test_a_run_applies_its_target_and_bundles_for_it(tmp_path, tiny_model_dir, target, reduced):
    from edgepress.pipeline import runner

    cfg = PipelineConfig.model_validate({
        "model": str(tiny_model_dir), "runtime": {"threads": 1, "target": target, "latency": {"warmup": 1, "runs": 5}},
        "stages": [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic",
                                                            "params": {"per_channel": True}}]})
    out = tmp_path / "run"
    runner.run_pipeline(cfg, out)
    stage = out / "stages" / "02-int8"
    assert json.loads((stage / "config.json").read_text())["params"]["reduce_range"] is reduced
    filled = json.loads((stage / "stage.json").read_text())["details"]["target_defaults"]
    assert filled["reduce_range"]["value"] is reduced and filled["reduce_range"]["why"]
    peak = max(targets.int8_weight_ranges(stage / "model" / "model.onnx").values())
    assert (peak <= 64) is reduced
    assert json.loads((out / "run.json").read_text())["target"] == {"name": target, "detected": False}
    manifest = json.loads((out / "final" / "edgepress.json").read_text())
    assert manifest["target"] == {"name": target, "detected": False} and manifest["metrics"]["accuracy"] > 0
    assert manifest["measured_on"] == targets.detect_target() and manifest["environment"]["onnxruntime"]
    assert (out / "final" / "predict.py").is_file()
    with pytest.raises(ConfigError, match=r"MatMulInteger \(from stage int8\).*target cuda"):  # whom to blame
        bundle_model(out, tmp_path / "for-gpu", "cuda")


def test_a_mobile_bundle_adds_the_ort_format_and_the_usability_report(int8_dirs, movie_data, tmp_path):
    import onnxruntime as ort

    out = bundle_model(int8_dirs["full"], tmp_path / "mobile", "mobile")
    manifest = json.loads((out / "edgepress.json").read_text())
    mobile = manifest["mobile"]
    assert mobile["ort_vs_onnx_max_abs_diff"] <= 1e-4 and mobile["optimization_style"] == "Fixed"
    assert {"model.ort", "model.required_operators.config", "mobile_usability.txt"} <= set(manifest["files"])
    config = (out / "model.required_operators.config").read_text()
    assert "MatMulInteger" in config and "DynamicQuantizeLinear" in config  # what a reduced build must keep
    assert "NNAPI" in (out / "mobile_usability.txt").read_text()
    fed = feeds.encode(feeds.load_tokenizer(out, 128), movie_data.test.texts[:64],
                       ("input_ids", "attention_mask", "token_type_ids"))
    onnx_logits, ort_logits = (ort.InferenceSession(str(out / name)).run(["logits"], fed)[0]
                               for name in ("model.onnx", "model.ort"))
    assert (onnx_logits.argmax(1) == ort_logits.argmax(1)).all() and abs(onnx_logits - ort_logits).max() <= 1e-4


def test_a_mobile_bundles_ort_model_leaves_out_the_fusions_its_graph_was_measured_faster_without(tiny_onnx_dir,
                                                                                                tmp_path, movie_data):
    from edgepress.export.optimize import OptimizeConfig, optimize_onnx

    fused = tmp_path / "fused"
    optimize_onnx(tiny_onnx_dir, fused, movie_data.validation.texts,
                  OptimizeConfig(fusions="all", disable=("skip_layer_norm",)))
    assert "SkipLayerNormFusion" in sessions.disabled_optimizers(fused / "model.onnx")
    kept = bundle_model(fused, tmp_path / "kept", "mobile")
    (fused / sessions.SESSION_FILE).unlink()  # without it, ORT's optimizer fuses Add + LayerNormalization again
    refused = bundle_model(fused, tmp_path / "refused", "mobile")
    operators = {name: (out / "model.required_operators.config").read_text() for name, out in
                 (("kept", kept), ("refused", refused))}
    assert "SkipLayerNormalization" not in operators["kept"] and "LayerNormalization" in operators["kept"]
    assert "SkipLayerNormalization" in operators["refused"]
    assert json.loads((kept / "edgepress.json").read_text())["mobile"]["ort_vs_onnx_max_abs_diff"] <= 1e-4


def web_missing() -> str | None:
    """Why the web tests cannot run here, or None."""
    import shutil

    if shutil.which("node") is None:
        return "node is not installed (Debian: apt-get install nodejs npm; then make web)"
    try:
        web_modules()
    except ConfigError:
        return "web/node_modules is missing: make web (npm ci --ignore-scripts in web/)"
    return None


web = pytest.mark.skipif(web_missing() is not None, reason=str(web_missing()))
chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="chromium is not installed (apt-get "
                              "install chromium)")


def transformers_js(bundle_dir: Path, texts: list[str], tmp_path: Path, script: str = "classify.mjs") -> dict:
    """web/classify.mjs (transformers.js's text-classification pipeline under node) on `texts`, one at a time:
    {dtype, predictions: [{label, score}]}; or another script of web/ (embed.mjs: {dtype, options, vectors})."""
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    script = Path(__file__).resolve().parents[1] / "web" / script
    done = subprocess.run(["node", str(script), str(bundle_dir), str(tmp_path / "texts.json")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@web
def test_transformers_js_under_node_gives_the_predictors_labels(int8_dirs, movie_data, tmp_path):
    out = bundle_model(int8_dirs["reduced"], tmp_path / "web-bundle", "web")
    manifest = json.loads((out / "edgepress.json").read_text())
    assert manifest["web"]["dtype"] == "q8" and manifest["model_file"] == "onnx/model_quantized.onnx"
    assert manifest["web"]["pipeline"] == "text-classification" and "options" not in manifest["web"]
    assert (out / "onnx" / "model_quantized.onnx").is_file() and not (out / "model.onnx").exists()
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 128
    texts = list(movie_data.test.texts[:200])
    result = transformers_js(out, texts, tmp_path)
    python = Predictor(out)  # the same bundle, read through its manifest
    assert result["dtype"] == "q8"
    assert [p["label"] for p in result["predictions"]] == [python.predict([t])[0].label for t in texts]


def open_page(site: Path, text: str, screenshot: Path) -> dict:
    """web/page.mjs on the bundle `site` served on 127.0.0.1 (headless Chromium types `text`, presses the button
    and saves `screenshot`): {result, shown, requests}."""
    import http.server
    import threading
    from functools import partial

    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = Path(__file__).resolve().parents[1] / "web" / "page.mjs"
        done = subprocess.run(["node", str(script), f"http://127.0.0.1:{server.server_port}/index.html", text,
                               str(screenshot)], capture_output=True, text=True, timeout=600)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@web
@chromium
def test_the_page_classifies_a_typed_sentence_in_headless_chromium(int8_dirs, tmp_path):
    out = bundle_model(int8_dirs["reduced"], tmp_path / "site", "web")
    text = "a gripping, funny and beautifully acted film"
    result = open_page(out, text, tmp_path / "page.png")
    assert result["result"] == Predictor(out).predict([text])[0].label
    assert result["shown"].startswith(result["result"])
    assert all(url.startswith("http://127.0.0.1:") for url in result["requests"])  # nothing from the network
    assert (tmp_path / "page.png").stat().st_size > 1000


def test_what_a_target_fills_is_in_the_resume_key():
    """A per-channel int8 stage built for x86-vnni (8-bit) is not reused by a run for x86-avx2 (7-bit)."""
    from edgepress.pipeline.state import RunState

    stages = [{"name": "export", "method": "export"},
              {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True}}]
    cfg = PipelineConfig.model_validate({"stages": stages})
    stage = cfg.stages[1].model_dump(mode="json")
    keys = {t: RunState(cfg, None, "id", None, "split", False, target={"name": t}).reuse_key(stage)
            for t in ("x86-vnni", "x86-avx2")}
    assert keys["x86-vnni"]["stage"]["target_defaults"] == [{"reduce_range": False}]
    assert keys["x86-avx2"]["stage"]["target_defaults"] == [{"reduce_range": True}]
