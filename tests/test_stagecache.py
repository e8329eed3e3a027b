"""The stage cache: an attempt whose method, params, input, data content, runtime and machine match an earlier
one's takes its result, whatever run, stage name or gates it belongs to; anything else runs again."""

import json
from pathlib import Path

import yaml

from edgepress.pipeline import runner
from edgepress.pipeline.config import load_config
from tests.test_trust import FAST_RUNTIME, STAGES, invoke, snapshot


def _csv(path: Path, movie_data, flip: bool = False) -> Path:
    rows = zip(movie_data.train.texts[:200], movie_data.train.labels[:200], strict=True)
    path.write_text("text,label\n" + "".join(f'"{t.replace(chr(34), chr(39))}",{int(y) ^ flip}\n' for t, y in rows))
    return path


def _config(path: Path, model: Path, data: Path, stages=STAGES) -> Path:
    path.write_text(yaml.safe_dump({"model": str(model), "data": {"source": str(data)}, "runtime": FAST_RUNTIME,
                                    "stages": stages}))
    return path


def _stages(run: Path) -> list[dict]:
    return json.loads((run / "report.json").read_text())["stages"]


def test_a_second_run_takes_every_attempt_from_the_cache_whatever_its_stage_names_and_gates(tmp_path,
                                                                                          tiny_model_dir,
                                                                                          movie_data):
    data = _csv(tmp_path / "d.csv", movie_data)
    runner.run_pipeline(load_config(_config(tmp_path / "a.yaml", tiny_model_dir, data)), tmp_path / "a",
                        cache=tmp_path / "cache")
    first = _stages(tmp_path / "a")
    assert not any("cache_entry" in s["details"] for s in first)
    renamed = [{**s, "name": f"other-{s['name']}", "gates": {"accuracy": {"max_drop": 0.5}}} for s in STAGES]
    runner.run_pipeline(load_config(_config(tmp_path / "b.yaml", tiny_model_dir, data, renamed)), tmp_path / "b",
                        cache=tmp_path / "cache")
    second = _stages(tmp_path / "b")
    assert all(s["details"]["cache_entry"].startswith(str(tmp_path / "cache")) for s in second)
    assert [s["artifact_sha256"] for s in second] == [s["artifact_sha256"] for s in first]
    assert [s["metrics"]["latency"]["cpu"]["p50_ms"] for s in second] == \
        [s["metrics"]["latency"]["cpu"]["p50_ms"] for s in first]  # the measured result, not a new measurement
    assert [g["kind"] for g in second[0]["gates"]] == ["accuracy"]  # judged by this run's own gates
    log = (tmp_path / "b" / "run.log").read_text()
    assert "baseline: taken from the cache" in log and log.count("taken from the cache") == 4


def test_other_data_content_or_a_damaged_entry_runs_again(tmp_path, tiny_model_dir, movie_data):
    data = _csv(tmp_path / "d.csv", movie_data)
    stages = STAGES[:1]
    runner.run_pipeline(load_config(_config(tmp_path / "a.yaml", tiny_model_dir, data, stages)), tmp_path / "a",
                        cache=tmp_path / "cache")
    flipped = _csv(tmp_path / "flipped.csv", movie_data, flip=True)  # the same ids and texts, every label flipped
    runner.run_pipeline(load_config(_config(tmp_path / "b.yaml", tiny_model_dir, flipped, stages)), tmp_path / "b",
                        cache=tmp_path / "cache")
    assert "cache_entry" not in _stages(tmp_path / "b")[0]["details"]
    entries = sorted(p for p in (tmp_path / "cache").iterdir() if (p / "model").is_dir())
    # per run: the attempt measured, and the model it made (keyed by the train and validation splits alone); the two
    # baselines, measured on different data, have no model
    assert len(entries) == 4
    for entry in entries:  # a damaged artifact: the entry no longer matches its sha256
        (entry / "model" / "model.onnx").write_bytes(b"damaged")
    runner.run_pipeline(load_config(_config(tmp_path / "c.yaml", tiny_model_dir, data, stages)), tmp_path / "c",
                        cache=tmp_path / "cache")
    assert "cache_entry" not in _stages(tmp_path / "c")[0]["details"]
    assert _stages(tmp_path / "c")[0]["status"] == "passed"


def test_a_cache_inside_the_run_dir_or_an_input_is_refused(tmp_path, tiny_model_dir, movie_data):
    data = _csv(tmp_path / "d.csv", movie_data)
    config = _config(tmp_path / "a.yaml", tiny_model_dir, data, STAGES[:1])
    before = snapshot(tiny_model_dir)
    for cache in (tmp_path / "run" / "cache", tiny_model_dir / "cache"):
        result = invoke("run", config, "--out", tmp_path / "run", "--cache", cache)
        assert result.exit_code == 2 and "overlap. Fix: keep the cache in a directory of its own" in result.output
    assert not (tmp_path / "run").exists() and snapshot(tiny_model_dir) == before


def test_two_runs_at_once_compute_a_shared_stage_once(tmp_path, tiny_model_dir, movie_data):
    import subprocess
    import sys

    data = _csv(tmp_path / "d.csv", movie_data)
    stages = [{"name": "distill", "method": "distill", "params": {"student_layers": 1, "epochs": 3}}]
    config = _config(tmp_path / "a.yaml", tiny_model_dir, data, stages)
    runs = [subprocess.Popen([sys.executable, "-c", "from edgepress.cli.app import main; main()", "run", str(config),
                              "--out", str(tmp_path / name), "--cache", str(tmp_path / "cache")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in ("a", "b")]
    for run in runs:
        output = run.communicate(timeout=300)[0]
        assert run.returncode == 0, output
    # started together, one waits for the other's result (without the lock both missed the cache and both trained)
    taken = sorted("cache_entry" in _stages(tmp_path / name)[0]["details"] for name in ("a", "b"))
    assert taken == [False, True]
    assert _stages(tmp_path / "a")[0]["artifact_sha256"] == _stages(tmp_path / "b")[0]["artifact_sha256"]


def test_a_dir_a_methods_params_name_keys_its_stage_by_what_it_holds(tmp_path):
    """Every path param (int4's torch_model, a recovery's teacher: `PathName | None`, a Path inside Optional) is in
    the stage's keys by its content: a teacher dir changed under the same name is not taken for the old one."""
    from edgepress.registry import METHODS

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text('{"a": 1}')
    before = METHODS["heads"].files_read({"teacher": str(teacher), "keep": 0.5})
    (teacher / "config.json").write_text('{"a": 2}')
    assert set(before) == {"teacher"} and METHODS["heads"].files_read({"teacher": str(teacher)}) != before
    assert METHODS["heads"].files_read({"teacher": "baseline"}) == {}  # the run's own model, keyed as its input
    assert set(METHODS["int4"].files_read({"torch_model": str(teacher)})) == {"torch_model"}
