"""The Python API: docs/python.md's example (examples/python_api.py) runs end to end on a tiny model — run, typed
result, load, predict, search —, the CLI and the API give the same report for the same config, a pipeline built in
code is checked as its YAML is, a missed gate raises GateFailed naming the stage and gate, and `import edgepress`
imports no library until a name is used."""

import importlib.util
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import edgepress
from tests.test_stagecache import _csv
from tests.test_trust import FAST_RUNTIME, STAGES, invoke

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("python_api", ROOT / "examples" / "python_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory, movie_data) -> Path:
    return _csv(tmp_path_factory.mktemp("api") / "d.csv", movie_data)


def test_the_python_page_s_example_runs_loads_predicts_and_searches(example, tiny_model_dir, data, tmp_path,
                                                                     capsys):
    result = example.compress(str(tiny_model_dir), str(data), str(tmp_path), max_drop=0.5)
    assert isinstance(result, edgepress.RunResult) and result.passed and result.final == result.bundle
    assert [s.name for s in result.stages] == ["export", "fuse", "int8"]
    int8 = result.stage("int8")
    assert int8.method == "int8-dynamic" and int8.artifact.is_dir()
    [gate] = int8.gates
    assert (gate.kind, gate.rule, gate.limit, gate.passed) == ("accuracy", "max_drop", 0.5, True)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert int8.metrics.value == report["stages"][-1]["metrics"]["accuracy"]
    assert int8.metrics.ci95 == tuple(report["stages"][-1]["metrics"]["accuracy_ci95"])
    assert int8.metrics.latency["cpu"].p50_ms > 0 and int8.metrics.size_bytes < result.baseline.metrics.size_bytes

    predictions = example.ask(result.bundle, ["a quietly moving film", "dull"])
    labels = set(json.loads((tiny_model_dir / "config.json").read_text())["id2label"].values())
    assert [p.text for p in predictions] == ["a quietly moving film", "dull"]
    assert all(p.label in labels and 0 <= p.score <= 1 for p in predictions)

    found = example.search(str(tiny_model_dir), str(data), str(tmp_path), max_drop=0.5, trials=1)
    assert isinstance(found, edgepress.SearchResult) and len(found.trials) == 1
    assert found.trials[0].stop == "passed" and found.best_trial == found.trials[0].number
    assert found.config.is_file() and found.run.passed and (found.run.bundle / "predict.py").is_file()
    shown = capsys.readouterr().out
    assert "export passed\nfuse passed\nint8 passed\n" in shown and "best: trial" in shown


def test_the_cli_and_the_api_give_the_same_report_for_the_same_config(tiny_model_dir, data, tmp_path):
    body = {"model": str(tiny_model_dir), "data": {"source": str(data)}, "runtime": FAST_RUNTIME, "stages": STAGES}
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump(body))
    shown = invoke("run", config, "--out", tmp_path / "cli")
    assert shown.exit_code == 0, shown.output
    via_api = edgepress.run(body, tmp_path / "api")
    via_cli = edgepress.RunResult.read(tmp_path / "cli")
    for a, c in zip((via_api.baseline, *via_api.stages), (via_cli.baseline, *via_cli.stages), strict=True):
        assert (a.name, a.method, a.status, a.gates) == (c.name, c.method, c.status, c.gates)
        assert (a.metrics.value, a.metrics.agreement, a.metrics.size_bytes) == \
               (c.metrics.value, c.metrics.agreement, c.metrics.size_bytes)
    assert via_api.status == via_cli.status == "passed"
    for stage in via_api.stages:  # the CLI's summary line is the API result's
        assert f"{stage.name:<12} {stage.status:<7} accuracy {stage.metrics.value:.4f}" in shown.output


def test_a_pipeline_built_in_code_is_checked_as_its_yaml_is(tiny_model_dir):
    params = edgepress.Int8DynamicConfig(per_channel=True)
    stage = edgepress.StageConfig(name="int8", method="int8-dynamic", params=params)
    assert stage.params == {"per_channel": True}  # what a YAML would say: the fields set, nothing more
    wrong = r"stage 'int8' \(int8-dynamic\) needs an unfused ONNX graph .* but gets a torch model dir"
    with pytest.raises(edgepress.ConfigError, match=wrong):  # a dict: one ConfigError listing every problem
        edgepress.validate({"model": str(tiny_model_dir), "stages": [stage.model_dump()]})
    with pytest.raises(ValueError, match=wrong):  # a config object: pydantic's ValidationError, the same checks
        edgepress.PipelineConfig(model=str(tiny_model_dir), stages=[stage])
    with pytest.raises(edgepress.ConfigError, match="the config given"):
        edgepress.validate({"model": str(tiny_model_dir), "stages": [{"name": "x", "method": "nope"}]})
    with pytest.raises(edgepress.ConfigError, match="a config is a YAML file's path, a dict or a config object"):
        edgepress.run(3, "runs/never")
    with pytest.raises(ValueError, match="method int8-dynamic takes Int8DynamicConfig params, not DistillConfig"):
        edgepress.StageConfig(name="int8", method="int8-dynamic", params=edgepress.DistillConfig())
    found = edgepress.validate({"model": tiny_model_dir, "runtime": FAST_RUNTIME, "stages": STAGES})  # a Path too
    assert not found.is_search and set(found.sizes) == {"train", "validation", "test"}


@pytest.mark.parametrize("call, expected", [
    (lambda: edgepress.run({"stages": []}, None), "out is a path (a str or pathlib.Path), not None"),
    (lambda: edgepress.load(3), "bundle_dir is a path"),
    (lambda: edgepress.demo("/nonexistent/out", task="nope"), "task 'nope' is not one of classification, embedding"),
    (lambda: edgepress.evaluate("/nonexistent/model", split="tst"), "split 'tst' is not one of test, validation"),
    (lambda: edgepress.search({"model": "demo:minilm-movie"}, "/nonexistent/out", trials=0), "trials 0 is not"),
    (lambda: edgepress.RunResult.read("/"), "/ holds no report.json: it is not a run dir"),
])
def test_bad_arguments_raise_config_errors_that_name_the_fix_before_anything_runs(call, expected):
    with pytest.raises(edgepress.ConfigError, match=re.escape(expected)):
        call()


def test_a_missed_gate_raises_gate_failed_naming_the_stage_the_gate_and_the_result(tiny_model_dir, data, tmp_path):
    stages = [*STAGES[:2], {**STAGES[2], "gates": {"size": {"max_mb": 1e-6}}}]
    with pytest.raises(edgepress.GateFailed) as caught:
        edgepress.run({"model": str(tiny_model_dir), "data": {"source": str(data)}, "runtime": FAST_RUNTIME,
                       "stages": stages}, tmp_path / "run")
    failed = caught.value
    assert failed.stage == "int8" and [(g["kind"], g["rule"]) for g in failed.gates] == [("size", "max_mb")]
    assert failed.result.status == "failed" and failed.result.bundle is None
    assert failed.result.final == failed.result.stage("fuse").artifact  # the last model that passed
    [missed] = failed.result.stage("int8").missed
    assert missed.limit == 1e-6 and missed.value > missed.limit


def test_import_edgepress_imports_no_library_until_a_name_is_used():
    code = ("import sys, edgepress; print([m for m in ('torch', 'transformers', 'onnxruntime', 'pydantic', "
            "'edgepress.api') if m in sys.modules])")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "[]"
    assert all(getattr(edgepress, name) is not None for name in edgepress.__all__)
    assert edgepress.Int8DynamicConfig.__name__ == "Int8DynamicConfig"  # a method's params class, by its name
    with pytest.raises(AttributeError, match="no attribute 'NopeConfig'"):
        edgepress.NopeConfig  # noqa: B018


def test_search_and_export_are_the_api_s_functions_once_their_packages_are_imported():
    """edgepress.search and edgepress.export are also packages: importing one sets it on edgepress over the function,
    so the package itself calls the function (a whole test session imports both before any test runs)."""
    import edgepress.export.onnx  # noqa: F401
    import edgepress.search.study  # noqa: F401

    with pytest.raises(edgepress.ConfigError, match="a config is a YAML file's path"):
        edgepress.search(3, "/nonexistent/out")
    with pytest.raises(edgepress.ModelError, match="the model /nonexistent/model does not exist"):
        edgepress.export("/nonexistent/model", "/nonexistent/out")
    assert edgepress.search.study.run_search is not None and edgepress.export.onnx.export_onnx is not None
    assert "budget" in inspect.signature(edgepress.search).parameters and edgepress.export.__doc__.startswith("Export")


def test_the_readme_s_python_lines_run_as_the_python_page_shows_them(tiny_model_dir, data, tmp_path, monkeypatch):
    shown = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S).group(1)
    assert f"```python\n{shown}```" in (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(yaml.safe_dump({"model": str(tiny_model_dir), "data": {"source": str(data)},
                                                      "runtime": FAST_RUNTIME, "stages": STAGES}))
    exec(compile(shown, "README.md", "exec"), {})  # noqa: S102 - the README's own lines
    assert edgepress.RunResult.read(tmp_path / "runs" / "mine").passed


QUIET = """
import logging, sys, torch
import edgepress, transformers.utils.logging as hf
from tests.test_trust import FAST_RUNTIME, STAGES

def state():
    names = ("edgepress", "torchao", "torch.utils._pytree")
    return (torch.get_num_threads(), [logging.getLogger(n).level for n in names], logging.getLogger().handlers[:],
            hf.get_verbosity(), hf.is_progress_bar_enabled(), logging.getLogger("py.warnings").handlers[:])

before = state()
try:
    edgepress.run({"model": sys.argv[1], "data": {"source": sys.argv[2]}, "runtime": FAST_RUNTIME,
                   "stages": [*STAGES[:2], {**STAGES[2], "gates": {"size": {"max_mb": 1e-6}}}]}, sys.argv[3])
except edgepress.GateFailed as failed:
    assert failed.stage == "int8", failed
else:
    raise SystemExit("no GateFailed")
assert state() == before, (before, state())
"""


def test_a_library_call_prints_nothing_and_leaves_logging_and_threads_as_it_found_them(tiny_model_dir, data,
                                                                                        tmp_path):
    """The libraries under a run print nothing of their own (transformers' load bars, onnxruntime's module-level
    warnings, torchao's import lines): what they said is in run.log, once each, and the caller's settings stand."""
    done = subprocess.run([sys.executable, "-c", QUIET, str(tiny_model_dir), str(data), str(tmp_path / "run")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and (done.stdout, done.stderr) == ("", ""), done.stderr[-3000:]
    assert "onnxruntime said" in (tmp_path / "run" / "run.log").read_text()
