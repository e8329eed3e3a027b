"""`edgepress search` (issue 25): the latency-first table of shapes, trials on validation sharing a stage cache,
best.yaml reproduced by `edgepress run`, bad input, resume after SIGKILL, two workers on one study."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from edgepress.models.loading import load_classifier
from edgepress.runtime.latency import LatencyConfig
from edgepress.search.config import load_search, pipeline_for
from edgepress.search.policy import beaten_by, best_passing, passing_trials
from edgepress.search.prepare import prepare
from edgepress.search.shapes import Shape, build_shape, dominated, time_shapes
from edgepress.search.storage import ask, await_others, open_study, trial_rows, twin_result
from edgepress.search.study import search_loop
from edgepress.search.trial import EpochWatch, TrialPruned
from edgepress.tasks import CLASSIFICATION, EMBEDDING
from tests.test_stagecache import _csv
from tests.test_trust import FAST_RUNTIME, invoke


def test_a_shape_is_built_with_its_depth_heads_and_ffn_width(tiny_model_dir):
    teacher, _ = load_classifier(tiny_model_dir)
    model = build_shape(teacher, Shape(layers=1, heads_keep=0.5, ffn_keep=0.5))
    layer = model.bert.encoder.layer
    assert len(layer) == 1 and model.config.num_hidden_layers == 1
    assert layer[0].attention.self.query.out_features == teacher.config.hidden_size // 2
    assert model.config.intermediate_size == round(teacher.config.intermediate_size * 0.5)
    assert len(teacher.bert.encoder.layer) == 2  # the teacher is untouched


def test_the_space_chooses_the_hidden_width_and_a_narrowed_point_gets_a_width_stage(tiny_model_dir):
    """space.width_keep (issue 53): a shape narrowed to a share of the hidden state (its heads and FFN as they are),
    named apart from the full-width one (whose name, and so a shape table made before the field, is unchanged), its
    point's pipeline narrowed by `width` after distill; a narrower shape keeps less of the teacher."""
    from edgepress.search.config import SearchConfig
    from edgepress.search.shapes import keeps_as_much

    teacher, _ = load_classifier(tiny_model_dir)
    model = build_shape(teacher, Shape(layers=1, width_keep=0.5))
    assert model.bert.embeddings.word_embeddings.embedding_dim == teacher.config.hidden_size // 2
    assert model.bert.encoder.layer[0].attention.self.query.out_features == teacher.config.hidden_size
    cfg = SearchConfig.model_validate({"model": str(tiny_model_dir), "space": {**SPACE, "width_keep": [0.5, 1.0]}})
    filled = cfg.space.filled(2)
    names = [s.name for s in filled.shapes()]
    assert names == ["1 layers, heads 1, ffn 1", "1 layers, heads 1, ffn 1, width 0.5", "1 layers, heads 0.5, ffn 1",
                     "1 layers, heads 0.5, ffn 1, width 0.5"]
    narrowed = next(p for p in filled.points() if p.get("width_keep") == 0.5)
    stages = [(s.method, s.params) for s in pipeline_for(cfg, 2, narrowed, CLASSIFICATION).stages]
    assert stages[0][0] == "distill" and stages[1] == (  # a classifier's width learns the teacher's hidden states
        "width", {"keep": 0.5, "teacher": "baseline", "epochs": 1, "hidden_weight": 1.0})
    assert pipeline_for(cfg, 2, narrowed, EMBEDDING).stages[1].params == {"keep": 0.5, "teacher": "baseline",
                                                                        "epochs": 1}
    assert SearchConfig.model_validate({"space": SPACE}).space.filled(2).width_keep == [1.0]
    assert keeps_as_much(Shape(1), Shape(1, width_keep=0.5)) and not keeps_as_much(Shape(1, width_keep=0.5), Shape(1))



def test_the_space_chooses_the_ffn_rank_and_a_factored_point_gets_a_lowrank_stage_that_factors_as_timed(
        tiny_model_dir):
    """space.rank_keep (issue 53): a shape whose FFN Linears are factored at a share of their rank, named apart, its
    point's pipeline factored by `lowrank` after width, every FFN Linear whatever its own timing (the shape table
    timed the whole shape); a lower rank keeps less of the teacher."""
    from edgepress.search.config import SearchConfig
    from edgepress.search.shapes import keeps_as_much

    teacher, _ = load_classifier(tiny_model_dir)
    model = build_shape(teacher, Shape(layers=1, rank_keep=0.25))
    ffn = model.bert.encoder.layer[0].intermediate.dense
    assert (ffn.rank, ffn.in_features, ffn.out_features) == (8, 32, teacher.config.intermediate_size)
    cfg = SearchConfig.model_validate({"model": str(tiny_model_dir),
                                       "space": {**SPACE, "width_keep": [0.5, 1.0], "rank_keep": [1.0, 0.25]}})
    filled = cfg.space.filled(2)
    assert "1 layers, heads 0.5, ffn 1, width 0.5, rank 0.25" in [s.name for s in filled.shapes()]
    point = next(p for p in filled.points() if p.get("rank_keep") == 0.25 and p.get("width_keep") == 0.5)
    stages = [(s.method, s.params) for s in pipeline_for(cfg, 2, point, CLASSIFICATION).stages]
    assert [m for m, _ in stages[:3]] == ["distill", "width", "lowrank"]
    assert stages[2][1] == {"keep": 0.25, "teacher": "baseline", "epochs": 1, "only_where_faster": False}
    half = SearchConfig.model_validate({"model": str(tiny_model_dir), "targets_precision": "bf16",
                                        "train_precision": "bf16",
                                        "space": {**SPACE, "width_keep": [0.5, 1.0], "rank_keep": [1.0, 0.25]}})
    trained = [s for s in pipeline_for(half, 2, point, CLASSIFICATION).stages if "epochs" in s.params]
    assert len(trained) == 3 and all(s.params["targets_precision"] == s.params["train_precision"] == "bf16"
                                     for s in trained)  # every training stage
    assert SearchConfig.model_validate({"space": SPACE}).space.filled(2).rank_keep == [1.0]
    alike = SearchConfig.model_validate({"space": {**SPACE, "width_keep": [0.5, 0.50000001, 1.0]}}).space.filled(2)
    assert alike.width_keep == [1.0, 0.5]  # shares that a shape's name shows alike are one choice, one shape
    assert len({s.name for s in alike.shapes()}) == len(alike.shapes())
    assert keeps_as_much(Shape(1), Shape(1, rank_keep=0.5)) and not keeps_as_much(Shape(1, rank_keep=0.5), Shape(1))

def test_what_the_libraries_said_timing_shapes_is_said_as_the_shape_table_s(tiny_model_dir, tmp_path, monkeypatch):
    """ONNX Runtime's fusion warnings while the shapes are timed are said under "shape table" there, not carried
    into the first trial's first stage (where a search's first trial logged a 4-layer distill's "hidden size 192")."""
    import logging

    from edgepress.logs import LIBRARY_MESSAGES
    from edgepress.search import prepare as prepare_module
    from edgepress.search.config import SearchConfig

    def timing(*args, **kwargs):
        LIBRARY_MESSAGES.emit(logging.LogRecord("onnxruntime", logging.WARNING, "x.py", 1, "fused nothing", None, None))
        return {Shape(1).name: {"fixed_p50_ms": 1.0, "size_mb": 1.0}}

    monkeypatch.setattr(prepare_module, "time_shapes", timing)
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("edgepress").addHandler(handler)
    try:
        cfg = SearchConfig.model_validate({"model": str(tiny_model_dir), "space": SPACE})
        prepare_module.shape_table(tmp_path, tiny_model_dir, [Shape(1)], cfg, ("a text",), None)
    finally:
        logging.getLogger("edgepress").removeHandler(handler)
    assert "shape table: onnxruntime said: fused nothing" in said and not LIBRARY_MESSAGES.seen


def test_shapes_are_timed_as_they_ship_and_the_dominated_named(tiny_model_dir, movie_data, monkeypatch):
    """Each shape exported, fused with the fusions a run's optimize would pick (timed after int8 on the first
    shape, then used for every one), int8'd, timed side by side; a shape slower and larger than another is named."""
    from edgepress.search import shapes as shapes_module

    fused, real = [], shapes_module.optimize_onnx

    def recording(src, out, texts, cfg, *as_shipped):
        fused.append(cfg)
        details = real(src, out, texts, cfg, *as_shipped)
        return {**details, "disabled": ["skip_layer_norm"]} if cfg.fusions == "auto" else details

    monkeypatch.setattr(shapes_module, "optimize_onnx", recording)
    shapes = [Shape(2), Shape(1), Shape(1, heads_keep=0.5, ffn_keep=0.5)]
    latency = LatencyConfig(warmup=2, runs=10)
    table = time_shapes(tiny_model_dir, shapes, movie_data.validation.texts[:64], threads=1, latency=latency)
    assert list(table) == [s.name for s in shapes]
    assert fused[0].fusions == "auto" and fused[0].threads == 1 and fused[0].latency == latency
    assert fused[0].quantized_with is not None  # timed as the int8 graph it becomes
    assert all(cfg.fusions == "all" and cfg.disable == ("skip_layer_norm",) for cfg in fused[1:]) and len(fused) == 3
    assert all(row["fusions_left_out"] == ["skip_layer_norm"] for row in table.values())
    assert all(row["fixed_p50_ms"] > 0 and row["providers_used"] == ["CPUExecutionProvider"] for row in table.values())
    sizes = [table[s.name]["size_mb"] for s in shapes]
    assert sizes[0] > sizes[1] > sizes[2]  # int8 graphs of fewer layers, then fewer heads and neurons
    a, b, c, d = Shape(2), Shape(2, heads_keep=0.5), Shape(1), Shape(2, ffn_keep=0.5)
    synthetic = {a.name: {"fixed_p50_ms": 1.0, "size_mb": 5.0}, b.name: {"fixed_p50_ms": 1.2, "size_mb": 5.0},
                 c.name: {"fixed_p50_ms": 0.5, "size_mb": 3.0}, d.name: {"fixed_p50_ms": 0.8, "size_mb": 5.0}}
    # half the heads is no faster than all of them: never worth training. The 1-layer shape beats every other on
    # both counts but keeps less of the teacher, and d is faster than a: neither is beaten
    assert dominated(synthetic, [a, b, c, d]) == {b.name: a.name}


# The search on the tiny teacher: one student depth, two head shares, two int8 recipes (4 points), so that every
# trial starts with the same distilled student (trained once, then taken from the cache)
SPACE = {"layers": [1], "heads_keep": [1.0, 0.5], "ffn_keep": [1.0], "vocab": [False],
         "quantization": ["int8-dynamic", "int8-dynamic-per-channel"], "epochs": [1]}


def test_every_shipped_search_config_makes_valid_pipelines():
    for path in sorted(Path(__file__).resolve().parents[1].glob("examples/search-*.yaml")):
        cfg = load_search(path)
        space = cfg.space.filled(6)  # the demo teacher's depth
        task = EMBEDDING if cfg.model == "demo:minilm" else CLASSIFICATION  # a token classifier's: no width here
        pipelines = [pipeline_for(cfg, 6, point, task) for point in space.points()]
        assert len(pipelines) == len(space.shapes()) * len(space.quantization) * len(space.vocab) * len(space.epochs)
        assert all(p.stages[-1].gates.accuracy.max_drop == cfg.constraints.accuracy.max_drop for p in pipelines)
        smooth = pipeline_for(cfg, 6, {**space.points()[0], "quantization": "int8-dynamic-smooth"}, task)
        assert [(s.method, s.params) for s in smooth.stages[-3:]] == [
            ("export", {}), ("optimize", {}), ("int8-dynamic", {"per_channel": True, "smooth": 0.85})]


def search_config(path: Path, model: Path, data: Path, **changes) -> Path:
    body = {"model": str(model), "data": {"source": str(data)}, "runtime": FAST_RUNTIME,
            "constraints": {"accuracy": {"max_drop": 0.5}}, "space": SPACE, **changes}
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(scope="module")
def searched(tmp_path_factory, tiny_model_dir, movie_data) -> Path:
    root = tmp_path_factory.mktemp("search")
    config = search_config(root / "search.yaml", tiny_model_dir, _csv(root / "d.csv", movie_data))
    result = invoke("search", config, "--out", root / "out", "--trials", 3)
    assert result.exit_code == 0, result.output
    return root / "out"


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


# What a trial of the tiny search may come to (max_drop 0.5 passes every student): run and passed, or not run since
# a passing trial's shape is faster in the shape table (which of the two tiny shapes is faster is the machine's say)
OUTCOMES = ("passed", "beaten")


def _ran(trials: list[dict]) -> list[dict]:
    """The trials that ran: not a point drawn again (its earlier result taken), nor one beaten before it ran."""
    return [t for t in trials if "the point of trial" not in t["why"] and t["stop"] != "beaten"]


def test_a_search_trains_its_trials_on_validation_and_shares_their_prefix(searched):
    report = _report(searched)
    assert len(report["trials"]) == 3 and all(t["stop"] in OUTCOMES for t in report["trials"])
    assert list(report["shapes"]) == ["1 layers, heads 1, ffn 1", "1 layers, heads 0.5, ffn 1"]
    ran = _ran(report["trials"])
    assert len({json.dumps(t["params"], sort_keys=True) for t in ran}) == len(ran)
    for trial in ran:
        split = json.loads((Path(trial["run_dir"]) / "data_split.json").read_text())
        assert split["ids"]["test"] == split["ids"]["validation"]  # a trial never reads the test split
    logs = [(Path(t["run_dir"]) / "run.log").read_text() for t in ran]
    assert sum("stage distill: distill taken from the cache" in log for log in logs) == len(ran) - 1  # trained once
    assert report["winner"] in report["front"] and report["finalists"]["teacher"]["accuracy"] > 0
    assert "## Finalists on the test split" in (searched / "report.md").read_text()
    assert "<svg" in (searched / "report.html").read_text()


def test_best_yaml_is_a_pipeline_that_edgepress_run_reproduces(searched, tmp_path):
    best = _report(searched)["best"]
    assert best["reproduced"] and Path(best["bundle"], "predict.py").is_file()
    # its stages' models are the trial's (made on the same train and validation splits), measured on test: nothing
    # is trained again, and the fusions chosen by timing are the trial's, written into best.yaml (fused again
    # without timing, to the trial's graph: the int8 stage after it is the trial's)
    log = (searched / "best" / "run.log").read_text()
    assert "epoch 1/" not in log and "fusions timed" not in log
    for stage, method in (("distill", "distill"), ("export", "export"), ("int8", "int8-dynamic")):
        assert f"stage {stage}: {method}'s model taken from the cache (made on the same train" in log
    run_dir = next(t["run_dir"] for t in _report(searched)["trials"] if t["number"] == best["trial"])
    trial = json.loads((Path(run_dir) / "report.json").read_text())
    fuse = next(s for s in yaml.safe_load((searched / "best.yaml").read_text())["stages"] if s["name"] == "fuse")
    chosen = next(s for s in trial["stages"] if s["name"] == "fuse")["details"]["disabled"]
    assert fuse["params"]["fusions"] == "all" and fuse["params"].get("disable", []) == chosen
    result = invoke("run", searched / "best.yaml", "--out", tmp_path / "again")
    assert result.exit_code == 0, result.output
    final = json.loads((tmp_path / "again" / "report.json").read_text())["stages"][-1]["metrics"]
    assert final["accuracy"] == best["accuracy"] and final["accuracy_drop_ci95"] == best["drop_ci95"]
    assert final["size_bytes"] / 1e6 == pytest.approx(best["size_mb"])


def test_a_second_search_into_the_same_dir_needs_resume(searched):
    result = invoke("search", searched.parent / "search.yaml", "--out", searched, "--trials", 1)
    assert result.exit_code == 2 and "--resume" in result.output


@pytest.mark.parametrize("changes, args, expected", [
    ({"constraints": {"latency": {"max_p50_ms": 1e-6}}}, ("--trials", 1), "latency.max_p50_ms excluded every one"),
    ({"space": {**SPACE, "layers": [5]}}, ("--trials", 1), "the teacher has 2"),
    ({}, ("--budget", "soon"), "is not a duration"),
    ({}, (), "needs a limit. Fix: give --budget"),
    ({"stages": [{"name": "x", "method": "export"}]}, ("--trials", 1), "is a pipeline config (it has stages)"),
    ({"space": {**SPACE, "cascade": ["off", {"threads": 1}]}}, ("--trials", 1), "a cascade choice takes fallback"),
    ({"space": {**SPACE, "cascade": [{"min_agreement": 2}]}}, ("--trials", 1), "min_agreement"),
])
def test_bad_searches_exit_2_before_any_training(tmp_path, tiny_model_dir, movie_data, changes, args, expected):
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data), **changes)
    result = invoke("search", config, "--out", tmp_path / "out", *args)
    assert result.exit_code == 2 and expected in result.output, result.output
    assert not (tmp_path / "out" / "trials").exists()


def test_the_space_chooses_how_many_transfer_texts_each_trial_draws(tmp_path, tiny_model_dir, movie_data):
    """space.transfer: each point's pipeline draws that many of data.unlabeled's texts an epoch (0: none), and a
    trial with transfer texts trains on them; a space that chooses it without data.unlabeled is refused."""
    texts = tmp_path / "u.txt"
    texts.write_text("\n".join(movie_data.test.texts[500:700]) + "\n")  # none of the 200-row CSV's
    data = _csv(tmp_path / "d.csv", movie_data)
    space = {**SPACE, "heads_keep": [1.0], "quantization": ["int8-dynamic"], "transfer": [0, 64]}
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, data, space=space)
    body = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**body, "data": {**body["data"], "unlabeled": str(texts)}}))
    cfg = load_search(config)
    points = cfg.space.filled(2).points()
    assert [p["transfer"] for p in points] == [0, 64]
    pipelines = [pipeline_for(cfg, 2, point, CLASSIFICATION) for point in points]
    assert pipelines[0].data.unlabeled is None and pipelines[1].data.transfer.per_epoch == 64
    result = invoke("search", config, "--out", tmp_path / "out", "--trials", 2)
    assert result.exit_code == 0, result.output
    trials = {t["params"]["transfer"]: t for t in _report(tmp_path / "out")["trials"]}
    assert set(trials) == {0, 64}
    for transfer, trial in trials.items():
        assert trial["stop"] == "passed"  # one shape: neither is beaten, both run
        details = json.loads((Path(trial["run_dir"]) / "report.json").read_text())["stages"][0]["details"]
        assert details["transfer_examples"] == (200 if transfer else 0)
    bad = search_config(tmp_path / "bad.yaml", tiny_model_dir, data, space=space)
    result = invoke("validate", bad)
    assert result.exit_code == 2 and "space.transfer draws transfer texts from data.unlabeled, which is not set" \
        in result.output, result.output
    more = config.with_name("more.yaml")  # a draw above the texts there are: named as the space's, not per_epoch's
    more.write_text(config.read_text().replace("- 64", "- 500"))
    result = invoke("validate", more)
    assert result.exit_code == 2 and "space.transfer draws up to 500 texts an epoch, more than the 200 " \
        "data.unlabeled gives" in result.output, result.output


def test_validate_checks_a_search_config_and_run_refuses_one(tmp_path, tiny_model_dir, movie_data):
    data = _csv(tmp_path / "d.csv", movie_data)
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, data)
    result = invoke("validate", config)
    assert result.exit_code == 0, result.output
    assert "valid search (4 points, 2 shapes, of a 2-layer classification teacher" in result.output
    assert "inside the noise" not in result.output  # max_drop 0.5: resolvable on any split
    tight = search_config(tmp_path / "tight.yaml", tiny_model_dir, data, constraints={"accuracy": {"max_drop": 0.01}})
    result = invoke("validate", tight)  # a line the validation split, where trials are judged, cannot resolve
    assert result.exit_code == 0 and "note: constraints.accuracy.max_drop 0.01 is inside the noise of" in result.output
    assert "validation texts" in result.output and "(the trials are judged on the validation split)" in result.output
    strict = search_config(tmp_path / "strict.yaml", tiny_model_dir, data,
                           constraints={"accuracy": {"max_drop": 0.01, "strict": True}})
    assert "inside the noise" not in invoke("validate", strict).output  # its CI is judged: no note
    bad = search_config(tmp_path / "bad.yaml", tiny_model_dir, data, space={**SPACE, "layers": [5]})
    result = invoke("validate", bad)
    assert result.exit_code == 2 and "the teacher has 2" in result.output, result.output
    result = invoke("run", config, "--out", tmp_path / "run")
    assert result.exit_code == 2 and "is a search config" in result.output and "edgepress search" in result.output
    assert not (tmp_path / "run").exists()


def _worker(config: Path, out: Path, *args) -> subprocess.Popen:
    command = [sys.executable, "-c", "from edgepress.cli.app import main; main()", "search", str(config), "--out",
               str(out), *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("stop, stopped", [(signal.SIGKILL, "killed"), (signal.SIGINT, "interrupted")])
def test_a_killed_or_interrupted_search_resumes_where_it_stopped(tmp_path, tiny_model_dir, movie_data, stop,
                                                                 stopped):
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data))
    worker = _worker(config, tmp_path / "out", "--trials", 5)
    deadline = time.monotonic() + 240
    while len(list((tmp_path / "out").glob("trials/*/run.json"))) < 2 and worker.poll() is None:
        assert time.monotonic() < deadline, "the search did not reach its second run"
        time.sleep(0.2)
    worker.send_signal(stop)  # Ctrl-C stops the trial under way and the search with it, at once
    output = worker.communicate(timeout=60)[0]
    assert worker.returncode != 0 and "Traceback" not in output, output
    result = invoke("search", config, "--out", tmp_path / "out", "--trials", 5, "--resume")
    assert result.exit_code == 0, result.output
    trials = _report(tmp_path / "out")["trials"]
    killed = [t["number"] for t in trials if t["stop"] == stopped]
    assert len(killed) == 1 and all(t["stop"] in OUTCOMES for t in trials if t["number"] not in killed)
    assert any(t["number"] > killed[0] and t["worker"]["pid"] != worker.pid for t in trials)  # went on after it


def test_two_workers_share_one_study_and_run_each_trial_once(tmp_path, tiny_model_dir, movie_data):
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data))
    workers = [_worker(config, tmp_path / "out", "--trials", 4, "--resume") for _ in range(2)]
    for worker in workers:
        output = worker.communicate(timeout=600)[0]
        assert worker.returncode == 0, output
    report = _report(tmp_path / "out")
    trials = report["trials"]
    # each worker checks the count before it asks: both may ask for the 4th; fewer when the points ran out (a
    # passing trial's faster shape beats the slower shape's points)
    assert len(trials) <= 5 and (len(trials) >= 4 or report["spent"]["exhausted"])
    assert [t["number"] for t in trials] == list(range(len(trials))) and all(t["stop"] in OUTCOMES for t in trials)
    assert len({t["worker"]["pid"] for t in trials}) == 2  # both worked
    ran = _ran(trials)
    assert len({t["run_dir"] for t in ran}) == len(ran)


def test_a_queued_point_is_asked_at_once_and_workers_draw_apart(tmp_path, tiny_model_dir, movie_data):
    import optuna
    from optuna.distributions import CategoricalDistribution

    cfg = load_search(search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data)))
    study = open_study(cfg, tmp_path, None)
    points = CategoricalDistribution(list(range(1000)))
    first = ask(study, {"p": points}, tmp_path, None, seed=13)
    # a second worker asking while the first trial runs draws with another seed: not the same point again
    second = ask(study, {"p": points}, tmp_path, None, seed=13)
    assert first.params != second.params
    taken = ask(study, {"p": points}, tmp_path, {"p": 7}, seed=13)  # the point queued after a drawn twin
    assert taken.params == {"p": 7} and taken.number == 2
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))  # nothing left in the queue
    # the same study history gives the same draw: one worker's search is reproducible
    (tmp_path / "again").mkdir()
    again = open_study(cfg, tmp_path / "again", None)
    assert ask(again, {"p": points}, tmp_path / "again", None, seed=13).params == first.params


def test_a_worker_waits_for_the_trials_other_workers_run_before_it_finishes(tmp_path, tiny_model_dir, movie_data):
    import socket
    import threading

    cfg = load_search(search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data)))
    study = open_study(cfg, tmp_path, None)
    live, dead = ask(study, {}, tmp_path, None, seed=13), ask(study, {}, tmp_path, None, seed=13)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead.set_user_attr("worker", {"host": socket.gethostname(), "pid": int(gone.stdout)})  # a killed worker's
    threading.Timer(1.0, lambda: study.tell(live, [0.9, 1.0])).start()  # another worker's, told a second later
    started = time.monotonic()
    await_others(study, poll_s=0.1)
    assert time.monotonic() - started >= 1.0
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "FAIL"]


def test_trials_go_latency_first_and_a_shape_slower_than_a_passing_one_never_runs(tmp_path, tiny_model_dir,
                                                                                   movie_data):
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data))
    cfg, out = load_search(config), tmp_path / "out"
    prepared = prepare(cfg, out, resume=False, config_file=config)
    fast, slow = "1 layers, heads 0.5, ffn 1", "1 layers, heads 1, ffn 1"
    prepared.table[fast]["fixed_p50_ms"], prepared.table[slow]["fixed_p50_ms"] = 1.0, 2.0  # as if timed so
    study = open_study(cfg, out, None)
    spent = search_loop(cfg, prepared, out, study, budget_s=None, trials=12, progress=None)
    rows = trial_rows(study)
    assert rows[0]["params"]["shape"] == fast and rows[0]["stop"] == "passed"  # the fastest shape first
    assert spent["exhausted"]  # the 2 fast points run, the 2 slow ones settled: nothing left to try
    assert [r["params"]["shape"] for r in _ran(rows)] == [fast, fast]  # the slow shape never ran
    assert all(r["stop"] == "beaten" and r["epochs_trained"] == 0 for r in rows if r["params"]["shape"] == slow)
    per_channel = next(r for r in rows if r["params"]["quantization"] == "int8-dynamic-per-channel")
    point = {**per_channel["params"], "shape": slow}  # the sampler may draw it: it would be recorded, not run
    assert beaten_by(cfg, prepared, passing_trials(study), point) == (
        f"beaten by trial {per_channel['number']}, which passed: its shape ({fast}) is 1 ms in the shape table, "
        f"this point's 2 ms")
    prepared.table[slow]["fixed_p50_ms"] = 1.04  # within 5% of a passing shape: still worth a run
    assert beaten_by(cfg, prepared, passing_trials(study), point) is None


def test_the_winner_is_the_most_accurate_of_the_trials_within_timing_noise_of_the_fastest(tmp_path):
    import optuna

    study = optuna.create_study(directions=["maximize", "minimize"])
    for accuracy, p50, stop in ((0.86, 3.00, "passed"), (0.87, 3.12, "passed"), (0.88, 3.20, "passed"),
                                (0.90, 2.00, "missed")):
        trial = study.ask()
        trial.set_user_attr("stop", stop)
        study.tell(trial, [accuracy, p50])
    assert best_passing(study, "latency").number == 1  # within 5% of 3.00 ms; trial 2 is 6.7% slower
    assert best_passing(study, "size").number == 0  # sizes are exact: the smallest wins


def _curve(*accuracies: float) -> list[dict]:
    return [{"epoch": i, "val_accuracy": a} for i, a in enumerate(accuracies, start=1)]


def test_a_stage_is_pruned_by_its_pace_from_its_second_epoch():
    watch = EpochWatch(required=0.97, margin=0.01)
    watch(_curve(0.91), 4)  # the first epoch is never judged (the topic teacher's first: 0.911)
    watch(_curve(0.91, 0.94), 4)  # at this pace 0.94 + 2 x 0.03 = 1.0
    with pytest.raises(TrialPruned, match=r"after epoch 3/4: validation accuracy 0.9410, at most 0.9565 by epoch 4"):
        watch(_curve(0.91, 0.94, 0.941), 4)  # its mean pace, 0.0155 an epoch, is the larger: 0.941 + 0.0155
    assert watch.epochs == 3 and watch.best == 0.941
    # one noisy epoch does not stop a stage still learning: 0.855 after 0.86, but 3 points an epoch on average
    EpochWatch(required=0.895, margin=0.01)(_curve(0.80, 0.86, 0.855), 4)
    assert EpochWatch.projected(_curve(0.95, 0.93), 4) == 0.95  # no gain at all: its best
    with pytest.raises(TrialPruned, match="after epoch 2/2"):  # the last epoch: the best must be within the margin
        EpochWatch(required=0.97, margin=0.01)(_curve(0.9, 0.959), 2)
    # a schedule still under way is not judged (magnitude's first epochs): the epochs left count from the last one
    assert EpochWatch.projected([{"epoch": 3, "val_accuracy": 0.8}, {"epoch": 4, "val_accuracy": 0.82}], 5) == \
        pytest.approx(0.84)
    # a token classifier's stage keeps its epochs by entity F1, a sentence encoder's by neighbour overlap
    f1 = [{"epoch": i, "train_loss": 1.0, "val_f1": a} for i, a in enumerate((0.5, 0.52), start=1)]
    with pytest.raises(TrialPruned, match=r"after epoch 2/2: validation f1 0.5200"):
        EpochWatch(required=0.7, margin=0.01)(f1, 2)
    assert EpochWatch.scores([{"epoch": 1, "train_loss": 1.0, "val_neighbour_overlap": 0.8}]) == \
        ("neighbour overlap", [0.8])


def test_a_trial_that_cannot_meet_the_constraint_is_pruned_and_no_prefix_is_trained_twice(
        tmp_path, tiny_model_dir, movie_data):
    # On the tiny teacher a student matches the teacher within noise, so the accuracy the constraint requires is
    # set out of reach here (1.0); everything else is the search's own loop: the epoch watch inside the training
    # loop, the pruned stage recorded by the run, the prefix remembered, the study told, the space exhausted
    space = {**SPACE, "layers": [1, 2], "quantization": ["int8-dynamic"], "epochs": [3]}  # 2: no distillation
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data),
                           pruning={"margin": 0.01}, space=space)
    cfg, out = load_search(config), tmp_path / "out"
    prepared = prepare(cfg, out, resume=False, config_file=config)
    prepared.required = 1.0
    study = open_study(cfg, out, None)
    spent = search_loop(cfg, prepared, out, study, budget_s=None, trials=20, progress=None)
    assert spent["exhausted"] and len(study.trials) < 20  # all 4 points settled: the search ended by itself
    rows = {r["number"]: r for r in trial_rows(study)}
    trained = [t for t in study.trials if rows[t.number]["epochs_trained"]]
    assert len({t.user_attrs["pruned_prefix"] for t in trained}) == len(trained)  # no prefix trained twice
    assert all(rows[t.number]["epochs_trained"] == 2 and t.state.name == "PRUNED" for t in trained)
    first_student = next(t for t in trained if t.params["shape"].startswith("1 layers"))
    assert rows[first_student.number]["why"].startswith("distill pruned after epoch 2/3: validation accuracy 0.")
    distill, *after = json.loads((Path(rows[first_student.number]["run_dir"]) / "report.json").read_text())["stages"]
    assert distill["name"] == "distill" and distill["status"] == "failed" and "pruned" in distill["details"]["error"]
    assert {s["status"] for s in after} == {"skipped"}
    for row in rows.values():
        if row["stop"] == "pruned" and not row["epochs_trained"]:  # pruned before it started, or drawn again
            assert row["why"].startswith(("as trial ", "the point of trial "))
            assert row["run_dir"] is None or row["why"].startswith("the point of trial ")  # the twin's run dir
    assert all(t.constraints["accuracy.max_drop"] > 0.01 for t in study.trials if t.state.name == "PRUNED")
    teacher_depth = [t for t in study.trials if t.params["shape"] == "2 layers, heads 1, ffn 1"]
    assert teacher_depth[0].user_attrs["stop"] == "passed" and rows[teacher_depth[0].number]["epochs_trained"] == 0
    again = twin_result(teacher_depth[0])  # a point drawn again takes its earlier result, nothing runs
    assert again["same_as"] == teacher_depth[0].number and again["seconds"] == 0 and again["stop"] == "passed"
    assert again["accuracy"] == teacher_depth[0].values[0] and again["p50_ms"] == teacher_depth[0].user_attrs["p50_ms"]
    assert f"{2 * len(trained)} training epoch(s) run in all" in (out / "report.md").read_text()
    # the shape table says each shape is settled, and by which trials: none would train if drawn again
    rows = {line.split(" | ")[0].lstrip("| "): line for line in (out / "report.md").read_text().splitlines()}
    for name, counts in _report(out)["shape_points"].items():
        assert counts["left"] == 0 and "settled: none of its" in rows[name]
        assert ("not drawn" if not any(t.params["shape"] == name for t in study.trials) else "trial") in rows[name]


def test_a_search_dir_from_before_a_new_field_resumes_when_the_field_is_at_its_default(
        tmp_path, tiny_model_dir, movie_data):
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data))
    recorded = load_search(config).model_dump(mode="json")
    out = tmp_path / "out"
    out.mkdir()
    (out / "search.json").write_text(json.dumps({"config": {**recorded, "pruning": {"margin": 0.5}}}))
    result = invoke("search", config, "--out", out, "--trials", 1, "--resume")
    assert result.exit_code == 2 and "holds a search of another config" in result.output, result.output
    (out / "search.json").write_text(json.dumps({"config": {k: v for k, v in recorded.items() if k != "pruning"}}))
    result = invoke("search", config, "--out", out, "--trials", 1, "--resume")
    assert result.exit_code == 0, result.output


def _postgres_bin(name: str) -> str | None:
    import glob
    import shutil

    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)


@pytest.fixture
def postgres_url():
    """A PostgreSQL server of its own (Debian's `postgresql` package) on 127.0.0.1, for this test only; the test
    skips where there is no server program or no driver. As root, the server runs as the `postgres` user (it refuses
    to run as root)."""
    import os
    import pwd
    import shutil
    import socket
    import tempfile

    pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server programs (Debian: apt-get install postgresql)")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="edgepress-pg-"))
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "edgepress", "--no-sync"], check=True,
                   capture_output=True)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-w", "-l", str(root / "server.log"), "-o",
                    f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off", "start"], check=True,
                   capture_output=True)
    try:
        yield f"postgresql+psycopg://edgepress@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_workers_with_their_own_dirs_share_a_study_in_postgresql(tmp_path, tiny_model_dir, movie_data, postgres_url):
    # two machines, as far as one can tell them apart here: each worker its own SEARCH_DIR, one study on the server
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data))
    workers = [_worker(config, tmp_path / f"out{i}", "--trials", 4, "--storage", postgres_url) for i in range(2)]
    for worker in workers:
        output = worker.communicate(timeout=600)[0]
        assert worker.returncode == 0, output
    reports = [_report(tmp_path / f"out{i}") for i in range(2)]
    trials = reports[1]["trials"]
    assert len(trials) <= 5 and (len(trials) >= 4 or reports[1]["spent"]["exhausted"])
    assert [t["number"] for t in trials] == list(range(len(trials)))
    assert all(t["stop"] in OUTCOMES for t in trials) and len({t["worker"]["pid"] for t in trials}) == 2
    # each ran in its own dir (a trial beaten or drawn again ran nowhere: it has no run dir, or its twin's)
    outs = {worker.pid: tmp_path / f"out{i}" for i, worker in enumerate(workers)}
    ran = _ran(trials)
    assert ran and all(Path(t["run_dir"]).parent.parent.resolve() == outs[t["worker"]["pid"]].resolve() for t in ran)
    assert len({t["worker"]["pid"] for t in reports[0]["trials"]}) == 2  # one study, seen by both
    assert not (tmp_path / "out0" / "study.db").exists()


def test_a_search_may_end_its_trials_with_a_cascade_and_best_yaml_keeps_it(tmp_path, tiny_model_dir, movie_data):
    """space.cascade: a trial's pipeline ends with the cascade stage of its choice, judged (and ranked, by the mean
    latency at natural lengths) as what ships; best.yaml reproduces it."""
    cascade = {"fallback_precision": "fp32", "min_agreement": 0.9}
    space = {**SPACE, "heads_keep": [1.0], "quantization": ["int8-dynamic"], "cascade": [cascade]}
    config = search_config(tmp_path / "s.yaml", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data), space=space)
    result = invoke("search", config, "--out", tmp_path / "out", "--trials", 1)
    assert result.exit_code == 0, result.output
    report = _report(tmp_path / "out")
    [trial] = report["trials"]
    assert json.loads(trial["params"]["cascade"]) == cascade and trial["stop"] == "passed"
    assert trial["deferred"] is not None and trial["natural_mean_ms"] > 0
    best = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    assert best["stages"][-1]["method"] == "cascade" and best["stages"][-1]["params"] == cascade
    assert "accuracy" in best["stages"][-1]["gates"]  # the constraints gate what ships: the cascade
    assert "mean ms natural (the objective)" in (tmp_path / "out" / "report.md").read_text()
    assert report["best"]["deferred"] is not None
