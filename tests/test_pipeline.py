import json
import re
from pathlib import Path

import onnx
import pytest
import yaml
from typer.testing import CliRunner

from edgepress.cli.app import app
from edgepress.configs import build
from edgepress.errors import ConfigError, GateFailed
from edgepress.pipeline import runner
from edgepress.pipeline.config import Gates, PipelineConfig, load_config
from edgepress.pipeline.gates import evaluate_gates
from edgepress.pipeline.state import stage_context
from edgepress.registry import METHODS

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted([*(p for p in ROOT.glob("examples/*.yaml") if not p.name.startswith("search-")),
                  *ROOT.glob("src/edgepress/pipeline/demo*.yaml")])  # search configs: tests/test_search.py
FAST_RUNTIME = {"threads": 1, "latency": {"warmup": 1, "runs": 5}}


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert all(stage.method in METHODS for stage in cfg.stages)


def test_validate_lists_every_problem(tmp_path):
    path = write_yaml(tmp_path / "bad.yaml", {
        "data": {"source": "x.csv", "max_len": 3},
        "stages": [{"name": "q", "method": "int8-dynamic", "params": {"per_chanel": True}},
                   {"name": "p", "method": "prune-everything"}],
    })
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "(3 problem(s))" in message
    assert "✗ data.max_len: unknown key" in message
    assert "params of int8-dynamic: per_chanel: unknown key (check its spelling" in message
    assert ("unknown method 'prune-everything': choose from distill, heads, ffn, width, lowrank, vocab, magnitude, "
            "lottery, qat, export, optimize, fp16, int8-dynamic, int8-static, int4") in message


def test_stage_order_and_names_are_checked():
    with pytest.raises(ValueError, match=r"stage 'q' \(int8-dynamic\) needs an unfused ONNX graph \(what export "
                                         r"gives\) or a fused ONNX graph \(what optimize gives\) but gets a torch "
                                         r"model dir from the model"):
        PipelineConfig.model_validate({"stages": [{"name": "q", "method": "int8-dynamic"}]})
    with pytest.raises(ValueError, match=r"stage names must be unique; repeated: e"):
        PipelineConfig.model_validate({"stages": [{"name": "e", "method": "export"}, {"name": "e", "method": "fp16"}]})
    # a cut (a fallback too) of what lowrank factored before it: refused before anything trains
    with pytest.raises(ValueError, match=r"stage 'f' \(width\) cuts ffn_in, ffn_out whole; stage 'r' stores them as "
                                         r"factors before it. Fix: put stage 'r' after stage 'f', or leave ffn_in, "
                                         r"ffn_out out of its parts"):
        PipelineConfig.model_validate({"stages": [
            {"name": "r", "method": "lowrank"},
            {"name": "f", "method": "heads", "on_fail": {"fallback": [{"method": "width"}]}}]})
    with pytest.raises(ValueError, match=r"stage 'h' \(heads\) cuts attn_out whole; stage 'r' stores it"):
        PipelineConfig.model_validate({"stages": [{"name": "r", "method": "lowrank", "params": {"parts": ["attn_out"]}},
                                                  {"name": "f", "method": "ffn"}, {"name": "h", "method": "heads"}]})
    # what the cuts leave whole may be factored before them: the word table, before heads and ffn
    PipelineConfig.model_validate({"stages": [{"name": "r", "method": "lowrank", "params": {"parts": ["words"]}},
                                              {"name": "h", "method": "heads"}, {"name": "f", "method": "ffn"}]})
    with pytest.raises(ConfigError) as refused:  # a second width: each problem names its own fix, and no other
        build(PipelineConfig, {"stages": [{"name": "w", "method": "width"}, {"name": "w2", "method": "width"}]})
    assert str(refused.value).endswith("stage 'w2' (width) would cut again what stage 'w' cut: width takes a model "
                                       "it has not cut. Fix: one width stage, with the keep you want in the end")
    PipelineConfig.model_validate({"stages": [{"name": "f", "method": "ffn"}, {"name": "r", "method": "lowrank"},
                                              {"name": "r2", "method": "lowrank", "params": {"parts": ["words"]}}]})


def test_missing_config_and_bad_yaml_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output
    (tmp_path / "broken.yaml").write_text("stages: [\n")
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "broken.yaml")])
    assert result.exit_code == 2 and "is not valid YAML" in result.output


def test_gates_compare_each_limit():
    gates = Gates.model_validate({
        "accuracy": {"max_drop": 0.01, "max_stage_drop": 0.005, "min": 0.8},
        "latency": {"provider": "cpu", "min_speedup": 1.5, "max_p50_ms": 5, "max_p90_ms": 7, "max_p99_ms": 8},
        "size": {"max_mb": 30, "min_ratio": 3},
        "parity": {"max_abs_diff": 1e-3, "min_agreement": 0.99},
    })
    baseline = {"accuracy": 0.85, "size_bytes": 90e6, "latency": {"cpu": {"p50_ms": 12.0}}}
    previous = {"accuracy": 0.846}
    stage = {"accuracy": 0.842, "size_bytes": 25e6, "latency": {"cpu": {"p50_ms": 6.0, "p90_ms": 7.0, "p99_ms": 9.5}}}
    results = {(g["kind"], g["rule"]): g for g in
               evaluate_gates(gates, stage, baseline, previous, {"max_abs_diff": 2e-3, "agreement": 1.0})}
    drop = results["accuracy", "max_drop"]
    assert drop["passed"] and drop["value"] == pytest.approx(0.008)
    assert results["accuracy", "max_stage_drop"]["passed"]
    assert results["latency", "min_speedup"]["value"] == 2.0 and results["latency", "min_speedup"]["passed"]
    assert not results["latency", "max_p50_ms"]["passed"] and results["latency", "max_p90_ms"]["passed"]
    tail = results["latency", "max_p99_ms"]  # the tail: 9.5 ms against 8
    assert not tail["passed"] and tail["value"] == 9.5 and tail["excess"] == pytest.approx(1.5)
    assert results["size", "max_mb"]["passed"] and results["size", "min_ratio"]["value"] == pytest.approx(3.6)
    assert not results["parity", "max_abs_diff"]["passed"] and results["parity", "min_agreement"]["passed"]


def test_natural_speedup_gate_divides_natural_p50s():
    """min_natural_speedup: the natural-length p50s (each stage's own timing, or the side-by-side one when there is
    one), never the fixed shape's."""
    gates = Gates.model_validate({"latency": {"min_natural_speedup": 3}})
    baseline = {"latency": {"cpu": {"p50_ms": 12.0, "natural": {"p50_ms": 6.0}}}}
    stage = {"latency": {"cpu": {"p50_ms": 6.0, "natural": {"p50_ms": 1.5}}}}
    [own] = evaluate_gates(gates, stage, baseline, baseline, None)
    assert own["rule"] == "min_natural_speedup" and own["value"] == 4.0 and own["passed"]
    paired = {"speedup": 2.5, "baseline_p50_ms": 5.0, "p50_ms": 2.0, "rounds": 3, "natural": True}
    stage["latency"]["cpu"]["side_by_side_natural"] = paired
    [side] = evaluate_gates(gates, stage, baseline, baseline, None)
    assert side["value"] == 2.5 and not side["passed"] and side["side_by_side"] == paired
    from edgepress.pipeline.report import gate_text

    assert gate_text(side).startswith("latency.min_natural_speedup: 2.5, timed side by side at natural lengths")


def test_strict_accuracy_gate_holds_the_upper_end_of_the_drop_ci():
    baseline, stage = {"accuracy": 0.85}, {"accuracy": 0.845, "accuracy_drop_ci95": [-0.004, 0.016]}
    loose, strict = ({"accuracy": {"max_drop": 0.01, **extra}} for extra in ({}, {"strict": True}))
    [point] = evaluate_gates(Gates.model_validate(loose), stage, baseline, baseline, None)
    [upper] = evaluate_gates(Gates.model_validate(strict), stage, baseline, baseline, None)
    assert point["passed"] and point["value"] == pytest.approx(0.005)  # the point estimate is within 1 point...
    assert not upper["passed"] and upper["value"] == 0.016  # ...but a drop of 1.6 points is not ruled out
    assert upper["strict"] and upper["point_estimate"] == pytest.approx(0.005)
    from edgepress.pipeline.report import gate_text

    assert gate_text(upper) == ("accuracy.max_drop: 0.016, upper end of the paired 95% CI (point estimate 0.005) "
                                "(limit 0.01)")
    with pytest.raises(ValueError, match=r"accuracy.strict applies to max_drop, which is not set. Fix: add max_drop"):
        Gates.model_validate({"accuracy": {"min": 0.8, "strict": True}})
    with pytest.raises(ValueError, match=r"the accuracy gate sets no limit: give at least one of max_drop, "
                                         r"max_stage_drop, min \["):
        Gates.model_validate({"accuracy": {"strict": False}})


def test_fidelity_gate_holds_the_agreement_with_the_baseline_or_the_lower_end_of_its_ci():
    from edgepress.pipeline.report import gate_text

    stage = {"accuracy": 0.85, "agreement": 0.955, "agreement_ci95": [0.941, 0.967]}
    loose, strict = ({"fidelity": {"min_agreement": 0.95, **extra}} for extra in ({}, {"strict": True}))
    [point] = evaluate_gates(Gates.model_validate(loose), stage, stage, stage, None)
    [lower] = evaluate_gates(Gates.model_validate(strict), stage, stage, stage, None)
    assert point["passed"] and point["value"] == 0.955 and point["excess"] == pytest.approx(-0.005)
    assert not lower["passed"] and lower["value"] == 0.941 and lower["excess"] == pytest.approx(0.009)
    assert gate_text(lower) == ("fidelity.min_agreement: 0.941, lower end of the 95% CI (point estimate 0.955) "
                                "(limit 0.95)")
    [unmeasured] = evaluate_gates(Gates.model_validate(loose), {"accuracy": 0.85}, stage, stage, None)
    assert not unmeasured["passed"] and unmeasured["value"] is None


def test_pareto_front_keeps_the_points_nothing_beats():
    from edgepress.pipeline.plots import pareto_front

    points = [("slow-best", 30.0, 0.84, []), ("fast", 5.0, 0.82, []), ("dominated", 10.0, 0.81, []),
              ("middle", 9.0, 0.83, []), ("tie-slower", 12.0, 0.83, [])]
    assert [p[0] for p in pareto_front(points)] == ["fast", "middle", "slow-best"]


def test_gate_on_an_unmeasured_provider_fails():
    gates = Gates.model_validate({"latency": {"provider": "cuda", "max_p50_ms": 5}})
    [result] = evaluate_gates(gates, {"latency": {}}, {"latency": {}}, {}, None)
    assert result["value"] is None and not result["passed"]


def run_config(tmp_path, stages, model: Path) -> Path:
    return write_yaml(tmp_path / "p.yaml", {"model": str(model), "runtime": FAST_RUNTIME, "stages": stages})


def test_failed_gate_tries_fallbacks_then_exits_3_with_the_report(tmp_path, tiny_model_dir):
    path = run_config(tmp_path, [
        {"name": "export", "method": "export"},
        {"name": "fuse", "method": "optimize", "gates": {"accuracy": {"min": 0.99}},  # untrained: ~0.5
         "on_fail": {"fallback": [{"method": "optimize", "params": {"disable": ["skip_layer_norm"]}}]}},
        {"name": "never", "method": "int8-dynamic"},
    ], tiny_model_dir)
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 3, result.output
    assert "stage 'fuse' missed its gates (accuracy.min" in result.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["passed", "failed", "skipped"]
    assert report["status"] == "failed" and report["error"].startswith("stage 'fuse': accuracy.min")
    assert Path(report["stages"][1]["artifact"], "model.onnx").is_file()  # the model that missed, to inspect
    attempts = report["stages"][1]["details"]["attempts"]
    assert [a["method"] for a in attempts] == ["optimize", "optimize"]
    config = json.loads((tmp_path / "run" / "stages" / "02-fuse" / "config.json").read_text())
    assert config["params"]["disable"] == ["skip_layer_norm"]  # the last attempt's exact config
    assert report["final"]["artifact"].endswith("01-export/model")
    assert not (tmp_path / "run" / "final").exists()  # a run that missed a gate hands over no bundle
    report_md = (tmp_path / "run" / "report.md").read_text()  # each attempt with its params, numbers and misses
    assert '`fuse` attempt 2: optimize {"disable": ["skip_layer_norm"]} failed (accuracy 0.' in report_md
    assert "): accuracy.min: 0." in report_md and " MB, CPU p50 " in report_md


def test_parity_gate_tightens_the_methods_check(tmp_path, tiny_model_dir):
    path = run_config(tmp_path, [
        {"name": "export", "method": "export"},
        {"name": "int8", "method": "int8-dynamic", "gates": {"parity": {"max_abs_diff": 1e-9}}},
    ], tiny_model_dir)
    with pytest.raises(GateFailed, match=r"parity.max_abs_diff"):
        runner.run_pipeline(load_config(path), tmp_path / "run")
    stage = json.loads((tmp_path / "run" / "stages" / "02-int8" / "stage.json").read_text())
    assert stage["status"] == "failed" and "does not match its reference" in stage["details"]["error"]
    assert stage["gates"][0]["value"] > 1e-9
    assert "| int8 | failed | – |" in (tmp_path / "run" / "report.md").read_text()


def test_quick_shortens_only_training_stages():
    from edgepress.pipeline.demo import QUICK_EPOCHS, shortened

    cfg = PipelineConfig.model_validate({"stages": [
        {"name": "d", "method": "distill", "params": {"epochs": 6, "student_layers": 2}},
        {"name": "e", "method": "export", "params": {"opset": 17}},
    ]})
    quick = shortened(cfg)
    assert quick.stages[0].params == {"epochs": QUICK_EPOCHS, "student_layers": 2}
    assert quick.stages[1].params == {"opset": 17}
    assert quick.data == cfg.data and quick.model == cfg.model  # same teacher, same test split


def test_a_gate_without_a_limit_is_an_error():
    with pytest.raises(ValueError, match=r"the latency gate sets no limit: give at least one of max_p50_ms, "
                                         r"max_p90_ms, max_p99_ms, min_speedup"):
        Gates.model_validate({"latency": {"provider": "cpu"}})


def test_resume_reuses_passed_stages_and_reruns_from_the_first_change(tmp_path, tiny_model_dir):
    stages = [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"}]
    out = tmp_path / "run"
    runner.run_pipeline(load_config(run_config(tmp_path, stages, tiny_model_dir)), out)
    export_model = out / "stages" / "01-export" / "model" / "model.onnx"
    first = export_model.stat().st_mtime_ns
    stages[1]["params"] = {"per_channel": True}
    report = runner.run_pipeline(load_config(run_config(tmp_path, stages, tiny_model_dir)), out, resume=True)
    assert export_model.stat().st_mtime_ns == first  # export reused
    config = json.loads((out / "stages" / "02-int8" / "config.json").read_text())
    assert config["params"]["per_channel"] is True  # int8 ran again with its new params
    log = (out / "run.log").read_text()
    assert "baseline: reused" in log and "export: reused" in log and "int8: reused" not in log
    # without a terminal, a line per step with its duration (what CI and a log file show)
    assert re.search(r"stage int8: int8-dynamic passed its gates in [\d.]+ s: accuracy 0\.\d{4}, [\d.]+ MB, cpu p50 "
                     r"[\d.]+ ms", log), log
    assert [s["status"] for s in report["stages"]] == ["passed", "passed"]
    # a gate changed, nothing else: the stage is reused and its record judged by the new gate
    int8_model = out / "stages" / "02-int8" / "model" / "model.onnx"
    made = int8_model.stat().st_mtime_ns
    stages[1]["gates"] = {"accuracy": {"max_drop": 1.0, "strict": True}}
    report = runner.run_pipeline(load_config(run_config(tmp_path, stages, tiny_model_dir)), out, resume=True)
    assert int8_model.stat().st_mtime_ns == made and "int8: reused" in (out / "run.log").read_text()
    assert report["stages"][1]["gates"][0]["strict"] is True
    # without --resume: everything again
    runner.run_pipeline(load_config(run_config(tmp_path, stages, tiny_model_dir)), out)
    assert export_model.stat().st_mtime_ns != first


def test_resume_runs_again_a_stage_whose_method_default_changed_since(tmp_path, tiny_model_dir, monkeypatch):
    """A run dir made before a method's default changed (vocab's unlabeled_min_count did) is not reused as if it
    had been made with the new default: the key holds each attempt's params with its defaults filled in."""
    import dataclasses

    from pydantic import Field

    from edgepress.compress.quantize import Int8DynamicConfig
    from edgepress.export.parity import ParityConfig
    from edgepress.registry import METHODS

    stages = [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"}]
    out = tmp_path / "run"
    runner.run_pipeline(load_config(run_config(tmp_path, stages, tiny_model_dir)), out)

    class LooserByDefault(Int8DynamicConfig):  # a default no target fills in
        parity: ParityConfig = Field(ParityConfig(max_abs_diff=2.0, min_agreement=0.9), description="changed")

    monkeypatch.setitem(METHODS, "int8-dynamic", dataclasses.replace(METHODS["int8-dynamic"],
                                                                     config=LooserByDefault))
    runner.run_pipeline(load_config(run_config(tmp_path, stages, tiny_model_dir)), out, resume=True)
    log = (out / "run.log").read_text()
    assert "export: reused" in log and "int8: reused" not in log
    config = json.loads((out / "stages" / "02-int8" / "config.json").read_text())
    assert config["params"]["parity"]["max_abs_diff"] == 2.0


def test_a_magnitude_stage_reports_both_sparsities_and_what_its_zeros_buy(tmp_path, tiny_model_dir):
    path = run_config(tmp_path, [
        {"name": "prune", "method": "magnitude",
         "params": {"sparsity": 0.8, "include": ["embeddings"], "epochs": 1, "max_length": 32}},
    ], tiny_model_dir)
    runner.run_pipeline(load_config(path), tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    stage, base = report["stages"][0], report["baseline"]["metrics"]
    zeros = stage["details"]["sparsity"]
    assert zeros["pruned_weights_sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert zeros["all_params_sparsity"] == pytest.approx(stage["metrics"]["sparsity"])  # over every parameter
    assert stage["metrics"]["size_gzip_bytes"] < 0.5 * base["size_gzip_bytes"]
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Sparsity" in markdown and "Neither torch nor ONNX Runtime skips zeros" in markdown
    assert f"gzip {stage['metrics']['size_gzip_bytes'] / 1e6:.1f} MB against {base['size_gzip_bytes'] / 1e6:.1f}" \
        in markdown
    assert "Neither torch nor ONNX Runtime skips zeros" in (tmp_path / "run" / "report.html").read_text()
    assert (base["task"], base["primary_metric"]) == (stage["metrics"]["task"], "accuracy") == \
        ("classification", "accuracy")  # every record says what it was scored as


def test_a_record_is_read_as_its_task_and_one_from_before_the_field_by_its_primary_metric():
    from edgepress.tasks import CLASSIFICATION, TASKS, recorded_task

    for task in TASKS.values():
        assert recorded_task({"task": task.name, "primary_metric": task.primary}) is task
        assert recorded_task({"primary_metric": task.primary}) is task  # written before `task`
    assert recorded_task({}) is CLASSIFICATION  # a classifier's record from before `primary_metric`


def test_a_lottery_stage_is_reported_beside_its_random_control():
    from edgepress.pipeline.report import _sparse_lines

    latency = {"cpu": {"p50_ms": 5.0}}
    stage = {"name": "ticket", "method": "lottery", "metrics": {"accuracy": 0.84, "size_gzip_bytes": 50e6,
                                                                 "latency": latency},
             "details": {"sparsity": {"pruned_weights_sparsity": 0.6, "pruned_weights": 1000,
                                      "all_params_sparsity": 0.3},
                         "rounds": [{"sparsity": 0.6, "val_accuracy": 0.85, "control_val_accuracy": 0.8}],
                         "control_test": {"accuracy": 0.79, "ticket_minus_control_ci95": [0.02, 0.08]}}}
    report = {"baseline": {"metrics": {"size_gzip_bytes": 80e6, "latency": latency}}, "stages": [stage]}
    (line,) = _sparse_lines(report)
    assert "60.0% of the 1,000 pruned weights are zero (30.0% of all parameters)" in line
    assert "(60.0%: 0.8500 vs 0.8000); test 0.8400 vs 0.7900, ticket − control 95% CI [+0.0200, +0.0800]" in line


def test_stages_recorded_before_runtime_launch_existed_are_still_reused():
    """The reuse key of a run without `launch` is what runs wrote before the field was added; with it, it differs."""
    from edgepress.pipeline.config import RuntimeConfig
    from edgepress.pipeline.state import runtime_key

    assert sorted(runtime_key(RuntimeConfig())) == ["latency", "providers", "target", "threads"]
    launched = runtime_key(RuntimeConfig(launch="accelerate launch --multi_gpu --num_processes 2"))
    assert launched["launch"] == "accelerate launch --multi_gpu --num_processes 2"


def test_an_int4_gptq_stage_quantizes_the_model_the_graph_was_exported_from(tmp_path, tiny_model_dir):
    path = run_config(tmp_path, [
        {"name": "export", "method": "export"},
        {"name": "int4", "method": "int4", "params": {"algorithm": "gptq", "calibration_size": 16}},
    ], tiny_model_dir)
    runner.run_pipeline(load_config(path), tmp_path / "run")
    config = json.loads((tmp_path / "run" / "stages" / "02-int4" / "config.json").read_text())
    assert config["params"]["torch_model"] == str(tiny_model_dir)  # the export stage's input, filled in by the run
    stage = json.loads((tmp_path / "run" / "stages" / "02-int4" / "stage.json").read_text())
    assert stage["details"]["quantized_ops"] == {"MatMulNBits": 12}
    ops = {n.op_type for n in onnx.load(str(tmp_path / "run" / "final" / "model.onnx")).graph.node}
    assert "MatMulNBits" in ops and "MatMul" in ops  # the attention products stay float


def test_optimize_times_its_candidates_as_the_next_stage_will_quantize_them(tmp_path, tiny_model_dir):
    path = run_config(tmp_path, [
        {"name": "export", "method": "export"},
        {"name": "fuse", "method": "optimize"},
        {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True}},
    ], tiny_model_dir)
    runner.run_pipeline(load_config(path), tmp_path / "run")
    params = json.loads((tmp_path / "run" / "stages" / "02-fuse" / "config.json").read_text())["params"]
    assert params["quantized_with"]["per_channel"] is True and params["threads"] == 1
    assert params["latency"]["runs"] == 5  # the run's latency section
    timing = json.loads((tmp_path / "run" / "stages" / "02-fuse" / "stage.json").read_text())["details"]["timing"]
    assert timing["timed_int8"] is True and timing["chosen"] in timing["candidates"]


def test_optimize_times_at_natural_lengths_when_a_later_stage_gates_speed_there(tmp_path, tiny_model_dir):
    fuse = {"name": "fuse", "method": "optimize"}
    stages = [{"name": "export", "method": "export"}, fuse,
              {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True},
               "gates": {"latency": {"min_natural_speedup": 2.0}}}]
    cfg = load_config(run_config(tmp_path, stages, tiny_model_dir))
    def later(cfg):
        return METHODS["optimize"].later(cfg.stages[1].params, stage_context(cfg, cfg.stages[1], "x86-avx2"))

    filled = later(cfg)
    assert filled["natural"] is True and filled["quantized_with"]["reduce_range"] is True  # the target's default
    stages[2]["gates"] = {"latency": {"min_speedup": 2.0}}  # the fixed shape: timed there
    cfg = load_config(run_config(tmp_path, stages, tiny_model_dir))
    assert "natural" not in later(cfg)
    fuse["params"] = {"fusions": "all"}  # nothing timed
    cfg = load_config(run_config(tmp_path, stages, tiny_model_dir))
    assert later(cfg) == {}


def test_a_qat_stage_then_export_gives_the_int8_graph(tmp_path, tiny_model_dir):
    path = run_config(tmp_path, [
        {"name": "qat", "method": "qat", "params": {"epochs": 1, "max_length": 32}},
        {"name": "export", "method": "export"},
    ], tiny_model_dir)
    runner.run_pipeline(load_config(path), tmp_path / "run")
    stages = tmp_path / "run" / "stages"
    records = [json.loads((stages / d / "stage.json").read_text()) for d in ("01-qat", "02-export")]
    assert [r["kind"] for r in records] == ["torch-qat", "onnx-int8"]
    assert records[1]["details"]["ort_kernels"] == {"MatMulIntegerToFloat": 12}
    ops = {n.op_type for n in onnx.load(str(tmp_path / "run" / "final" / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops


def test_every_stage_is_held_to_the_baseline_on_typos_and_the_users_own_sets(tmp_path, tiny_model_dir, movie_data):
    from edgepress.data.fidelity import with_typos

    texts = movie_data.train.texts[:40]
    reviews = tmp_path / "reviews.csv"  # labelled by name: accuracy as well
    reviews.write_text("text,label\n" + "".join(f'"{t.replace(chr(34), chr(39))}",{"positive" if y else "negative"}\n'
                                                for t, y in zip(texts, movie_data.train.labels[:40], strict=True)))
    notes = tmp_path / "notes.txt"
    notes.write_text("\n".join(movie_data.train.texts[40:70]) + "\n")
    gate = {"fidelity": {"min_agreement": 0.5, "on": ["typos", "reviews", "notes"]}}
    path = write_yaml(tmp_path / "p.yaml", {
        "model": str(tiny_model_dir), "runtime": FAST_RUNTIME,
        "data": {"fidelity_sets": {"reviews": str(reviews), "notes": str(notes)}},
        "stages": [{"name": "export", "method": "export", "gates": gate}, {"name": "int8", "method": "int8-dynamic"}]})
    report = runner.run_pipeline(load_config(path), tmp_path / "run")
    stages = tmp_path / "run" / "stages"
    base = json.loads((stages / "00-baseline" / "predictions.json").read_text())
    int8 = json.loads((stages / "02-int8" / "predictions.json").read_text())
    assert sorted(base["sets"]) == sorted(int8["sets"]) == ["notes", "reviews", "typos"]
    sets = report["stages"][1]["metrics"]["sets"]
    for name, n in (("typos", 1057), ("reviews", 40), ("notes", 30)):
        agreement = sum(a == b for a, b in zip(base["sets"][name], int8["sets"][name], strict=True)) / n
        assert sets[name]["n"] == n and sets[name]["agreement"] == pytest.approx(agreement)
        assert sets[name]["agreement_ci95"][0] <= agreement <= sets[name]["agreement_ci95"][1]
    assert "accuracy" in sets["reviews"] and "accuracy" not in sets["notes"] and "accuracy" in sets["typos"]
    gates = report["stages"][0]["gates"]
    assert [(g["kind"], g["on"]) for g in gates] == [("fidelity", "typos"), ("fidelity", "reviews"),
                                                     ("fidelity", "notes")]
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Fidelity" in markdown and "| stage | typos | notes | reviews |" in markdown  # yaml sorts the names
    assert "fidelity.min_agreement on typos: " in markdown
    assert "<h2>Fidelity</h2>" in (tmp_path / "run" / "report.html").read_text()
    # the typos are seeded: the same texts give the same copies, most differ from their text (a word drawn shorter
    # than three letters is left as it is)
    assert with_typos(texts) == with_typos(texts)
    assert sum(a != b for a, b in zip(with_typos(texts), texts, strict=True)) >= 0.8 * len(texts)


def test_a_fidelity_gate_on_a_set_the_run_does_not_measure_is_refused():
    with pytest.raises(ValueError, match=r"stage e: fidelity.on names 'tweets', which the run does not measure\. "
                                         r"Fix: test, typos, or a set named in data.fidelity_sets \(reviews\)"):
        PipelineConfig.model_validate({"data": {"fidelity_sets": {"reviews": "r.csv"}}, "stages": [
            {"name": "e", "method": "export", "gates": {"fidelity": {"min_agreement": 0.9, "on": ["tweets"]}}}]})
    with pytest.raises(ValueError, match=r"fidelity set names must be words .* other than test, typos, validation, "
                                         r"train, pairs: got 'typos'\. Fix: rename them"):
        PipelineConfig.model_validate({"data": {"fidelity_sets": {"typos": "t.txt"}}})


def test_a_fidelity_gate_holds_each_set_it_names():
    stage = {"accuracy": 0.85, "agreement": 0.99, "agreement_ci95": [0.98, 1.0],
             "sets": {"typos": {"n": 100, "agreement": 0.9, "agreement_ci95": [0.85, 0.95]}}}
    gates = Gates.model_validate({"fidelity": {"min_agreement": 0.95, "on": ["test", "typos"]}})
    test, typos = evaluate_gates(gates, stage, stage, stage, None)
    assert test["passed"] and test["on"] == "test" and test["value"] == 0.99
    assert not typos["passed"] and typos["value"] == 0.9 and typos["excess"] == pytest.approx(0.05)
    [strict] = evaluate_gates(Gates.model_validate({"fidelity": {"min_agreement": 0.8, "strict": True,
                                                                 "on": ["typos"]}}), stage, stage, stage, None)
    assert strict["passed"] and strict["value"] == 0.85 and strict["point_estimate"] == 0.9
    [unmeasured] = evaluate_gates(gates.model_copy(update={"fidelity": gates.fidelity.model_copy(
        update={"on": ("typos",)})}), {"accuracy": 0.85}, stage, stage, None)
    assert not unmeasured["passed"] and unmeasured["value"] is None


@pytest.mark.parametrize(("name", "content", "message"), [
    ("r.parquet", "x", r"data.fidelity_sets.reviews \(.*r.parquet\) is not a .txt, .csv or .jsonl file\. Fix"),
    ("r.csv", "body\na film\n", r"has no text column 'text'; its columns are: body\. Fix: set data.text_column"),
    ("r.csv", "text,label\na film,great\n", r"labels the model does not know: 'great'"),
    ("r.txt", "", r"has no texts\. Fix: one text per line"),
])
def test_bad_fidelity_sets_are_refused_with_the_fix(tmp_path, name, content, message):
    from edgepress.data import DataConfig, load_data
    from edgepress.errors import DataError

    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=message):
        load_data(DataConfig(fidelity_sets={"reviews": str(tmp_path / name)}), {"negative": 0, "positive": 1})
