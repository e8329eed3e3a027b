"""A run's verdict can be trusted: a failed run never destroys an earlier one, --resume never mixes two runs, every
bad input exits 2 with the fix named and no traceback, and what can be known before running is caught then."""

import hashlib
import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgepress.cli.app import app
from edgepress.errors import ConfigError, GateFailed, ModelError
from edgepress.pipeline import attempt, runner
from edgepress.pipeline.config import load_config
from edgepress.registry import METHODS
from edgepress.runtime.latency import LatencyConfig
from tests.conftest import has_cuda, save, tiny_bert

FAST_RUNTIME = {"threads": 1, "latency": {"warmup": 1, "runs": 5}}
# fusions: all, so that a stage run twice gives the same graph (auto's choice follows the machine's timing)
STAGES = [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize", "params": {"fusions": "all"}},
          {"name": "int8", "method": "int8-dynamic"}]


def write_config(path: Path, model: Path | str, stages=STAGES, **sections) -> Path:
    path.write_text(yaml.safe_dump({"model": str(model), "runtime": FAST_RUNTIME, "stages": stages, **sections}))
    return path


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` -> its sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def invoke(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})  # no wrapped lines
    assert isinstance(result.exception, SystemExit | None), result.exception  # no traceback, whatever happened
    return result


@pytest.fixture(scope="module")
def good_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished, passed run (export, fuse, int8 on the tiny model); tests work on copies."""
    root = tmp_path_factory.mktemp("good")
    config = write_config(root / "p.yaml", tiny_model_dir)
    runner.run_pipeline(load_config(config), root / "run")
    return root / "run"


@pytest.fixture
def earlier(good_run, tmp_path) -> Path:
    shutil.copytree(good_run, tmp_path / "run")
    return tmp_path / "run"


def corrupt_weights(model_dir: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "corrupt"
    shutil.copytree(model_dir, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated mid-copy
    return bad


def bad_json_config(model_dir: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "badjson"
    shutil.copytree(model_dir, bad)
    (bad / "config.json").write_text('{"model_type": "bert",')
    return bad


# --- 1. a failed run never destroys an earlier one -----------------------------------------------------------------

@pytest.mark.parametrize("case", ["model-typo", "data-typo", "corrupt-weights", "config-not-json", "cuda"])
def test_a_rerun_with_bad_inputs_leaves_the_earlier_run_as_it_was(case, earlier, tmp_path, tiny_model_dir):
    before = snapshot(earlier)
    model, sections, extra = tiny_model_dir, {}, []
    if case == "model-typo":
        model = tmp_path / "tiny-bertt"
    elif case == "data-typo":
        sections = {"data": {"source": str(tmp_path / "reviews.csvv")}}
    elif case == "corrupt-weights":
        model = corrupt_weights(tiny_model_dir, tmp_path)
    elif case == "config-not-json":
        model = bad_json_config(tiny_model_dir, tmp_path)
    elif has_cuda():
        pytest.skip("this machine has a GPU")
    else:
        extra = ["--device", "cuda"]
    config = write_config(tmp_path / "p.yaml", model, **sections)
    result = invoke("run", config, "--out", earlier, *extra)
    assert result.exit_code == 2, result.output
    assert "Fix:" in result.output
    assert snapshot(earlier) == before


# --- 1b. no command deletes what it did not write ------------------------------------------------------------------

@pytest.mark.parametrize("case", ["final-over-run", "run-over-stages", "run-into-final", "bundle-into-its-run"])
def test_bundle_never_replaces_its_own_run_or_what_it_reads(case, earlier):
    before = snapshot(earlier)
    source, out = {"final-over-run": (earlier / "final", earlier), "run-over-stages": (earlier, earlier / "stages"),
                   "run-into-final": (earlier, earlier / "final"),
                   "bundle-into-its-run": (earlier, earlier / "bundles" / "web")}[case]
    result = invoke("bundle", source, "--out", out, "--overwrite")
    assert result.exit_code == 2 and "Fix: write to" in result.output, result.output
    assert snapshot(earlier) == before


def test_bundle_overwrite_replaces_an_earlier_bundle_never_a_users_files(earlier, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    result = invoke("bundle", earlier, "--out", mine, "--overwrite")
    assert result.exit_code == 2 and "holds files that are not an edgepress bundle" in result.output
    assert invoke("bundle", earlier, "--out", tmp_path / "b").exit_code == 0
    (tmp_path / "b" / "notes.txt").write_text("mine too")  # a user's file inside an earlier bundle
    result = invoke("bundle", earlier, "--out", tmp_path / "b", "--overwrite")
    assert result.exit_code == 2 and "also holds files it did not write (notes.txt)" in result.output
    (tmp_path / "b" / "notes.txt").unlink()
    assert invoke("bundle", earlier, "--out", tmp_path / "b", "--overwrite").exit_code == 0
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_a_run_never_replaces_its_own_inputs(earlier, tmp_path, tiny_model_dir):
    inside = earlier / "stages" / "09-mine" / "model"  # looks like a stage folder: a run would delete it
    shutil.copytree(tiny_model_dir, inside)
    before = snapshot(earlier)
    result = invoke("run", write_config(tmp_path / "p.yaml", inside), "--out", earlier)
    assert result.exit_code == 2 and "holds the model" in result.output and "which this command reads" in result.output
    config = write_config(earlier / "final" / "p.yaml", tiny_model_dir)
    result = invoke("run", config, "--out", earlier)
    assert result.exit_code == 2 and "holds the config" in result.output
    config.unlink()
    assert snapshot(earlier) == before
    result = invoke("run", write_config(tmp_path / "p.yaml", tiny_model_dir), "--out", tiny_model_dir / "run")
    assert result.exit_code == 2 and "is inside the model" in result.output
    assert not (tiny_model_dir / "run").exists()


def test_export_replaces_only_an_earlier_export_and_never_its_model(tmp_path, tiny_model_dir):
    looks = tmp_path / "looks-like-an-export"  # model.onnx, config.json: an artifact by its look alone
    shutil.copytree(tiny_model_dir, looks / "model")
    (looks / "model.onnx").write_bytes(b"mine")
    result = invoke("export", looks / "model", "--out", looks)
    assert result.exit_code == 2 and "holds the model" in result.output
    assert (looks / "model.onnx").read_bytes() == b"mine"
    for _ in range(2):  # the second replaces the first: its own artifact
        result = invoke("export", tiny_model_dir, "--out", tmp_path / "onnx", "--no-optimize")
        assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "onnx" / "edgepress-export.json").read_text())
    assert set(record["files"]) == {p.name for p in (tmp_path / "onnx").iterdir()} - {"edgepress-export.json"}
    bundle = invoke("bundle", tmp_path / "onnx", "--out", tmp_path / "bundle")
    assert bundle.exit_code == 0 and not (tmp_path / "bundle" / "edgepress-export.json").exists()


# --- 2b. --resume covers what the data hold, not only their ids ---------------------------------------------------

def test_resume_after_the_labels_changed_reuses_nothing(tmp_path, tiny_model_dir, movie_data):
    part = movie_data.train.take(150)
    rows = ["id,text,label", *(f"{i},\"{t.replace(chr(34), chr(39))}\",{y}" for i, t, y in
                                zip(part.ids, part.texts, part.labels.tolist(), strict=True))]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1], data={"source": str(tmp_path / "d.csv")})
    first = runner.run_pipeline(load_config(config), tmp_path / "run")
    flipped = [rows[0], *(r[: r.rindex(",")] + "," + str(1 - int(r[-1])) for r in rows[1:])]
    (tmp_path / "d.csv").write_text("\n".join(flipped) + "\n")
    again = runner.run_pipeline(load_config(config), tmp_path / "run", resume=True)
    assert not any("reused_from" in s for s in [again["baseline"], *again["stages"]])
    assert again["baseline"]["metrics"]["accuracy"] == pytest.approx(1 - first["baseline"]["metrics"]["accuracy"])
    assert again["stages"][0]["metrics"]["accuracy"] == pytest.approx(1 - first["stages"][0]["metrics"]["accuracy"])


# --- 5. silent nonsense is refused ------------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "params", "message"), [
    ("magnitude", {"sparsity": 0}, "sparsity 0 removes no weight"),
    ("lottery", {"sparsity": 0.0}, "sparsity 0 removes no weight"),
    ("heads", {"keep": 1.0}, "keep 1.0 removes nothing"),
    ("ffn", {"keep": 1}, "keep 1.0 removes nothing"),
    ("distill", {"weight_decay": float("inf")}, "weight_decay: should be a finite number: got inf"),
    ("distill", {"epochs": True}, "epochs: should be a number, not true or false: got true"),
    ("int8-static", {"calibration_size": False}, "calibration_size: should be a number, not true or false"),
])
def test_params_that_change_nothing_or_are_not_numbers_are_refused(method, params, message, tmp_path):
    stages = [{"name": "s", "method": method, "params": params}]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"stages": stages}))
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_prune_that_would_zero_no_weight_in_a_round_is_refused_before_running(tmp_path, tiny_model_dir):
    stages = [{"name": "lt", "method": "lottery", "params": {"sparsity": 1e-5, "rounds": 3}},
              {"name": "mg", "method": "magnitude", "params": {"sparsity": 1e-5, "scope": "layer"}},
              {"name": "ok", "method": "lottery", "params": {"sparsity": 0.001, "rounds": 3}}]
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, stages))
    assert result.exit_code == 2 and "the run would refuse 2 stage(s)" in result.output, result.output
    assert "stage 'lt' (lottery): sparsity 1e-05 sets none of the model's 16,384 pruned weights to zero in round 1 " \
           "of 3. Fix: a higher sparsity or fewer rounds" in result.output
    assert "stage 'mg' (magnitude): sparsity 1e-05 sets none of the model's 16,384 pruned weights to zero. Fix: " \
           "a higher sparsity" in result.output


def test_gates_and_runtime_take_no_true_for_a_number(tmp_path):
    stages = [{"name": "e", "method": "export", "gates": {"parity": {"max_abs_diff": True}}}]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"runtime": {"threads": True}, "stages": stages}))
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "(2 problem(s))" in result.output
    assert "runtime.threads: should be a number" in result.output
    assert "stages.0.gates.parity.max_abs_diff: should be a number" in result.output


def test_a_loss_that_becomes_nan_fails_training_naming_the_step(tmp_path, tiny_model_dir, small_data):
    from edgepress.models.loading import load_classifier
    from edgepress.models.train import TrainConfig, train_classifier
    from edgepress.tasks import CLASSIFICATION

    model, tokenizer = load_classifier(tiny_model_dir)
    steps = []

    def nan_at_step_3(outputs, batch):
        steps.append(1)
        return outputs.loss * (float("nan") if len(steps) == 3 else 1.0)

    with pytest.raises(ModelError, match=r"training diverged: the loss is nan at step 3 \(epoch 1\)\. Fix: a lower "
                                         r"learning_rate"):
        train_classifier(model, tokenizer, small_data.train, TrainConfig(epochs=1, max_length=32), tmp_path / "out",
                         loss_fn=nan_at_step_3,
                         score=CLASSIFICATION.training_score(tokenizer, small_data.validation, 32))
    assert not (tmp_path / "out").exists()


# --- 6/7. targets, and no hidden dependence on the demo data -----------------------------------------------------

def test_export_and_bench_read_the_users_texts_whatever_the_labels(tmp_path, tokenizer, tiny_onnx_dir):
    model = tiny_bert(tokenizer)
    model.config.id2label, model.config.label2id = {0: "spam", 1: "ham"}, {"spam": 0, "ham": 1}
    save(model, tokenizer, tmp_path / "spam")
    result = invoke("export", tmp_path / "spam", "--out", tmp_path / "onnx", "--no-optimize")
    assert result.exit_code == 0, result.output  # parity needs texts, not the demo's negative/positive labels
    (tmp_path / "texts.csv").write_text("body\nwin a prize now\nlunch at noon?\nthe meeting moved to friday\n")
    result = invoke("export", tmp_path / "spam", "--out", tmp_path / "onnx2", "--no-optimize", "--data",
                    tmp_path / "texts.csv", "--text-column", "body")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "onnx2" / "edgepress-export.json").read_text())
    assert record["steps"]["export"]["parity"]["n_examples"] >= 3 and record["data"] == str(tmp_path / "texts.csv")
    result = invoke("bench", tiny_onnx_dir, "--runs", 2, "--warmup", 0, "--seq-len", 16, "--data",
                    tmp_path / "texts.csv", "--text-column", "body")
    assert result.exit_code == 0 and "1 x natural" in result.output, result.output
    result = invoke("bench", tiny_onnx_dir, "--data", tmp_path / "texts.csv")
    assert result.exit_code == 2 and "has no text column 'text'; its columns are: body" in result.output


def test_evaluate_and_bench_take_any_bundle_the_web_one_too(earlier, tmp_path):
    from edgepress.deploy import web

    if not all((web.web_modules() / p).is_file() for p in web.WEB_ASSETS.values()):
        pytest.skip("make web has not installed transformers.js")
    assert invoke("bundle", earlier, "--out", tmp_path / "web", "--target", "web").exit_code == 0
    assert not (tmp_path / "web" / "model.onnx").exists()
    result = invoke("evaluate", tmp_path / "web")
    expected = json.loads((earlier / "report.json").read_text())["final"]["metrics"]["accuracy"]
    assert result.exit_code == 0 and f"accuracy {expected:.4f}" in result.output, result.output
    result = invoke("bench", tmp_path / "web", "--runs", 2, "--warmup", 0)
    assert result.exit_code == 0, result.output


def test_quantized_graphs_of_every_kind_are_refused_for_cuda_and_a_4bit_table_for_mobile(tmp_path, tiny_onnx_dir,
                                                                                         movie_data):
    from edgepress.compress.int4 import Int4Config, int4
    from edgepress.compress.quantize import Int8StaticConfig, int8_static
    from edgepress.deploy.bundle import bundle_model

    texts = movie_data.validation.texts[:64]
    int8_static(tiny_onnx_dir, tmp_path / "qdq", texts, Int8StaticConfig(calibration_size=16))
    with pytest.raises(ConfigError, match=r"runs DequantizeLinear, QuantizeLinear\); target cuda"):
        bundle_model(tmp_path / "qdq", tmp_path / "b1", "cuda")
    int4(tiny_onnx_dir, tmp_path / "q4", texts, Int4Config(embeddings=True))
    with pytest.raises(ConfigError, match=r"keeps its word table in 4 bits .* Fix: int4 with embeddings: false"):
        bundle_model(tmp_path / "q4", tmp_path / "b2", "mobile")
    assert not (tmp_path / "b1").exists() and not (tmp_path / "b2").exists()


# --- 4b. validate knows what the run would refuse ---------------------------------------------------------------

def _word_level_model(tmp_path: Path, texts) -> Path:
    """A tiny BERT whose tokenizer is word-level (no pieces, no mask token), its words those of real sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in texts for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(t)})
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")
    return save(tiny_bert(tokenizer), tokenizer, tmp_path / "words")


def test_validate_refuses_what_each_method_would_refuse_on_this_model(tmp_path, tokenizer, movie_data):
    from transformers import AlbertConfig, AlbertForSequenceClassification

    from tests.conftest import tiny_distilbert

    distilbert = save(tiny_distilbert(tokenizer), tokenizer, tmp_path / "distilbert")
    stages = [{"name": "d", "method": "distill", "params": {"student_layers": 2}},
              {"name": "h", "method": "heads"}, {"name": "f", "method": "ffn"}]
    result = invoke("validate", write_config(tmp_path / "p.yaml", distilbert, stages))
    assert result.exit_code == 2 and "the run would refuse 1 stage(s)" in result.output, result.output
    assert "stage 'd' (distill): a 2-layer student from layers [0, 1] does not fit a 2-layer teacher" in result.output
    albert = AlbertConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    albert = save(AlbertForSequenceClassification(albert), tokenizer, tmp_path / "albert")
    config = write_config(tmp_path / "a.yaml", albert, stages)
    result = invoke("validate", config)
    assert result.exit_code == 2 and "the run would refuse 3 stage(s)" in result.output, result.output
    assert "stage 'h' (heads): edgepress does not know the layer layout of albert models; it knows bert, " in \
        result.output and "Fix: a model of one of those families, or only the ONNX stages" in result.output
    words = _word_level_model(tmp_path, movie_data.train.texts[:300])
    stages = [{"name": "v", "method": "vocab"}, {"name": "m", "method": "magnitude", "params": {"augment": {}}}]
    result = invoke("validate", write_config(tmp_path / "v.yaml", words, stages))
    assert result.exit_code == 2 and "has a WordLevel tokenizer. Fix: remove the vocab stage" in result.output
    assert "stage 'm' (magnitude): augment method mask needs a mask token" in result.output  # it has none
    before = snapshot(tmp_path)
    result = invoke("run", config, "--out", tmp_path / "run")  # the run refuses before it measures anything
    assert result.exit_code == 2 and "the run would refuse 3 stage(s)" in result.output
    assert not (tmp_path / "run").exists() and snapshot(tmp_path) == before


def test_validate_refuses_a_parity_gate_on_a_training_stage_and_labels_the_demo_teacher_lacks(tmp_path):
    stages = [{"name": "d", "method": "distill", "gates": {"parity": {"max_abs_diff": 0.1}}}]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"stages": stages}))
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "has a parity gate, but distill checks no parity" in result.output
    (tmp_path / "d.csv").write_text("text,label\n" + "win a prize,spam\nlunch at noon,ham\n" * 20)
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({"data": {"source": str(tmp_path / "d.csv")}}))
    result = invoke("validate", tmp_path / "q.yaml")
    assert result.exit_code == 2 and "labels the model does not know: 'ham', 'spam'" in result.output


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_validate_refuses_an_fp16_stage_checked_on_a_gpu_this_machine_lacks(tmp_path, tiny_model_dir):
    stages = [{"name": "e", "method": "export"}, {"name": "h", "method": "fp16"}]
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, stages))
    assert result.exit_code == 2 and "stage 'h' (fp16):" in result.output and "cuda" in result.output


def test_a_model_saved_without_label_names_goes_through_export_bundle_and_predict(tmp_path, tiny_model_dir,
                                                                                  movie_data):
    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                   if k not in ("id2label", "label2id")}))
    assert invoke("export", plain, "--out", tmp_path / "onnx").exit_code == 0
    result = invoke("bundle", tmp_path / "onnx", "--out", tmp_path / "bundle")
    assert result.exit_code == 0, result.output
    result = invoke("predict", tmp_path / "bundle", "a fine film")
    assert result.exit_code == 0 and result.output.startswith("LABEL_"), result.output
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(
        f'"{t.replace(chr(34), chr(39))}",{y}\n' for t, y in zip(movie_data.train.texts[:200],
                                                                   movie_data.train.labels[:200], strict=True)))
    for command in (("predict", tmp_path / "onnx", "a fine film"), ("evaluate", tmp_path / "onnx", "--data", data)):
        result = invoke(*command)  # the export itself names the labels: everything that reads it works
        assert result.exit_code == 0, result.output
    stages = [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"}]
    result = invoke("run", write_config(tmp_path / "p.yaml", plain, stages, data={"source": str(data)}),
                    "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output


def raising(error: Exception):
    def run(src, out, inputs, cfg):
        raise error
    return run


def test_a_method_error_is_a_failed_attempt_then_the_fallback_runs(monkeypatch, tmp_path, tiny_model_dir):
    broken = replace(METHODS["optimize"], run=raising(ModelError("the graph is broken. Fix: export it again")))
    monkeypatch.setitem(METHODS, "broken-optimize", broken)
    stages = [STAGES[0], {"name": "fuse", "method": "broken-optimize",
                          "on_fail": {"fallback": [{"method": "optimize"}]}}]
    report = runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir, stages)),
                                 tmp_path / "run")
    attempts = report["stages"][1]["details"]["attempts"]
    assert [(a["method"], a["status"]) for a in attempts] == [("broken-optimize", "failed"), ("optimize", "passed")]
    assert attempts[0]["error"] == "the graph is broken. Fix: export it again"
    assert report["status"] == "passed" and (tmp_path / "run" / "final" / "model.onnx").is_file()


def test_a_failing_method_leaves_a_complete_record_of_the_new_attempt(monkeypatch, earlier, tmp_path,
                                                                     tiny_model_dir):
    monkeypatch.setitem(METHODS, "int8-dynamic", replace(METHODS["int8-dynamic"],
                                                         run=raising(ModelError("no int8 today. Fix: wait"))))
    result = invoke("run", write_config(tmp_path / "p.yaml", tiny_model_dir), "--out", earlier)
    assert result.exit_code == 2 and "stage 'int8' failed: no int8 today" in result.output
    report = json.loads((earlier / "report.json").read_text())
    assert report["status"] == "failed" and "ModelError: no int8 today" in report["error"]
    assert [(s["name"], s["status"]) for s in report["stages"]] == [("export", "passed"), ("fuse", "passed"),
                                                                   ("int8", "failed")]
    assert report["stages"][-1]["artifact"] is None  # the failed method made none: none is named
    assert {s["run_id"] for s in report["stages"]} == {report["run_id"]}
    assert not (earlier / "final").exists()  # the earlier run's bundle is not handed over as this run's
    assert "stage int8: int8-dynamic failed: no int8 today" in (earlier / "run.log").read_text()
    markdown = (earlier / "report.md").read_text()
    assert "Failed: stage 'int8': ModelError: no int8 today. Fix: wait" in markdown
    assert "- ✗ `int8` error: no int8 today. Fix: wait" in markdown


def test_an_internal_error_is_reported_and_logged(monkeypatch, tmp_path, tiny_model_dir):
    monkeypatch.setitem(METHODS, "optimize", replace(METHODS["optimize"], run=raising(RuntimeError("a bug"))))
    with pytest.raises(RuntimeError, match="a bug"):
        runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir)), tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["status"] == "error" and report["error"] == "internal error: RuntimeError: a bug"
    assert [s["status"] for s in report["stages"]] == ["passed", "skipped", "skipped"]
    assert "run stopped: internal error: RuntimeError: a bug" in (tmp_path / "run" / "run.log").read_text()


# --- 2. --resume never mixes two runs ---------------------------------------------------------------------------

def test_resume_with_fewer_stages_reports_exactly_them(earlier, tmp_path, tiny_model_dir):
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:2])
    report = runner.run_pipeline(load_config(config), earlier, resume=True)
    assert [s["name"] for s in report["stages"]] == ["export", "fuse"]
    assert all(s.get("reused_from") for s in report["stages"])  # both reused, nothing ran again
    assert report["final"]["artifact"] == str(earlier / "final")
    fused = earlier / "stages" / "02-fuse" / "model" / "model.onnx"
    assert (earlier / "final" / "model.onnx").read_bytes() == fused.read_bytes()
    assert report["final"]["metrics"] == report["stages"][-1]["metrics"]
    assert not (earlier / "stages" / "03-int8").exists()


def test_a_rerun_without_resume_says_that_it_runs_every_stage_again(earlier, tmp_path, tiny_model_dir):
    runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1])), earlier)
    log = (earlier / "run.log").read_text()
    assert "held an earlier run: every stage runs again (--resume reuses" in log and "reused" not in log


def test_resume_with_another_split_reuses_nothing(earlier, tmp_path, tiny_model_dir):
    old_ids = json.loads((earlier / "stages" / "00-baseline" / "predictions.json").read_text())["ids"]
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1], data={"split": {"seed": 7}})
    report = runner.run_pipeline(load_config(config), earlier, resume=True)
    assert "reused" not in (earlier / "run.log").read_text()
    assert [s["name"] for s in report["stages"]] == ["export"]
    assert not any("reused_from" in s for s in report["stages"])
    new_ids = json.loads((earlier / "stages" / "00-baseline" / "predictions.json").read_text())["ids"]
    assert new_ids != old_ids and sorted(p.name for p in (earlier / "stages").iterdir()) == ["00-baseline",
                                                                                             "01-export"]


def test_resume_reruns_from_a_changed_input_and_survives_stray_folders(earlier, tmp_path, tokenizer):
    (earlier / "stages" / "notes").mkdir()  # a user's folder: not ours, left alone
    (earlier / "stages" / "07-stale").mkdir()  # ours by name, in no stage of this config: removed
    other = save(tiny_bert(tokenizer, seed=1), tokenizer, tmp_path / "other")  # another model at the same path
    config = write_config(tmp_path / "p.yaml", other)
    report = runner.run_pipeline(load_config(config), earlier, resume=True)
    assert not any("reused_from" in s for s in report["stages"])  # input hash changed: everything ran again
    assert (earlier / "stages" / "notes").is_dir() and not (earlier / "stages" / "07-stale").exists()
    report = runner.run_pipeline(load_config(config), earlier, resume=True)
    assert all("reused_from" in s for s in report["stages"])


def test_resume_does_not_reuse_a_tampered_artifact(earlier, tmp_path, tiny_model_dir):
    onnx_file = earlier / "stages" / "02-fuse" / "model" / "model.onnx"
    good = onnx_file.read_bytes()
    onnx_file.write_bytes(good + b"\0")
    report = runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir)), earlier,
                                 resume=True)
    # fuse runs again and gives the same graph (deterministic): int8's input hash matches again, so int8 is reused
    assert [bool(s.get("reused_from")) for s in report["stages"]] == [True, False, True]
    assert onnx_file.read_bytes() == good


# --- 3. bad input: exit 2, the fix named, no traceback ------------------------------------------------------------

def test_corrupt_or_unparsable_model_dirs_exit_2(tmp_path, tiny_model_dir):
    result = invoke("evaluate", corrupt_weights(tiny_model_dir, tmp_path))
    assert result.exit_code == 2 and "the weights file is corrupt or truncated" in result.output
    result = invoke("evaluate", bad_json_config(tiny_model_dir, tmp_path))
    assert result.exit_code == 2 and "config.json is not valid JSON" in result.output


def test_out_of_range_options_exit_2(tiny_onnx_dir):
    for option, value in (("--threads", 0), ("--runs", 0), ("--batch-size", 0), ("--warmup", -1)):
        result = invoke("bench", tiny_onnx_dir, option, value)
        assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, (option, result.output)


def test_out_that_cannot_be_a_run_dir_exits_2(tmp_path, tiny_model_dir):
    config = write_config(tmp_path / "p.yaml", tiny_model_dir)
    (tmp_path / "a-file").write_text("mine")
    result = invoke("run", config, "--out", tmp_path / "a-file")
    assert result.exit_code == 2 and "is a file. Fix: give the path of a directory" in result.output
    result = invoke("run", config, "--out", tmp_path / "a-file" / "run")
    assert result.exit_code == 2 and "cannot be created" in result.output
    assert (tmp_path / "a-file").read_text() == "mine"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    result = invoke("export", tiny_model_dir, "--out", tmp_path / "mine")
    assert result.exit_code == 2 and "holds files that are not an edgepress export" in result.output
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"


def test_unreadable_config_files_exit_2(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes("model: caf\xe9\n".encode("latin-1"))
    result = invoke("validate", tmp_path / "latin1.yaml")
    assert result.exit_code == 2 and "is not UTF-8 text" in result.output and "Fix: save it as UTF-8" in result.output
    result = invoke("validate", tmp_path)
    assert result.exit_code == 2 and "is a directory. Fix: give the path of a pipeline YAML file" in result.output


# --- 4. what can be known before running is caught before running ---------------------------------------------

def test_validate_checks_gates_against_providers_and_stage_kinds(tmp_path, tiny_model_dir):
    gate = [*STAGES[:2], {"name": "int8", "method": "int8-dynamic",
                          "gates": {"latency": {"provider": "cuda", "max_p50_ms": 5}}}]
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, gate))
    assert result.exit_code == 2
    assert "stage 'int8': its latency gate is on cuda, which runtime.providers (cpu) does not measure" in \
        result.output
    static = [*STAGES[:2], {"name": "int8", "method": "int8-static"}]
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, static))
    assert result.exit_code == 2
    assert ("stage 'int8' (int8-static) needs an unfused ONNX graph (what export gives) but gets a fused ONNX graph "
            "(what optimize gives) from stage 'fuse'") in result.output


def test_validate_checks_that_model_and_data_load(tmp_path, tiny_model_dir):
    result = invoke("validate", write_config(tmp_path / "p.yaml", tmp_path / "nope"))
    assert result.exit_code == 2 and "nope does not exist. Fix: check the path" in result.output
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, data={"source": str(tmp_path / "nope.csv")})
    result = invoke("validate", config)
    assert result.exit_code == 2 and "nope.csv does not exist" in result.output
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir))
    assert result.exit_code == 0 and "valid (3 stages" in result.output and "test 1057" in result.output


def test_validate_says_when_an_accuracy_gate_is_inside_the_test_splits_noise(tmp_path, tiny_model_dir):
    stages = [{"name": "export", "method": "export", "gates": {"accuracy": {"max_drop": 0.01}}},
              {"name": "fuse", "method": "optimize", "gates": {"accuracy": {"max_drop": 0.01, "strict": True}}},
              {"name": "int8", "method": "int8-dynamic", "gates": {"accuracy": {"max_drop": 0.02}}}]
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, stages))
    assert result.exit_code == 0
    assert ("note: stage 'export': accuracy.max_drop 0.01 is inside the noise of 1,057 test texts (there the "
            "paired 95% CI of a drop spans about ±0.02: a smaller drop cannot be told from chance)") in result.output
    assert "'fuse'" not in result.output and "'int8'" not in result.output  # judged on its CI; wide enough


def test_validate_and_run_say_what_the_config_leaves_unused(tmp_path, tiny_model_dir):
    """data.unlabeled with no stage that trains (they alone read it), and a config with no stages at all: valid, with
    a note that names the fix; a training stage, even as a fallback, reads the texts."""
    (tmp_path / "texts.txt").write_text("a fine film\na dull one\n")
    data = {"source": "demo:movie-snippets", "unlabeled": {"source": str(tmp_path / "texts.txt")}}
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1], data=data))
    assert result.exit_code == 0 and "valid (1 stage: export;" in result.output
    assert ("note: data.unlabeled is read only by stages that train (distill, heads, ffn, width, lowrank, magnitude, "
            "lottery, qat); no stage here trains, so its texts are not used. Fix: remove data.unlabeled, or add a "
            "training stage") in result.output
    vocab = {"name": "vocab", "method": "vocab", "on_fail": {"fallback": [{"method": "heads",
                                                                            "params": {"keep": 0.5}}]}}
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, [vocab], data=data))
    assert result.exit_code == 0 and "note:" not in result.output
    result = invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, []))
    assert result.exit_code == 0 and "valid (0 stages: none;" in result.output
    assert "note: the config has no stages: the run measures the model as it is (its baseline) and makes no bundle. " \
           "Fix: add stages" in result.output
    result = invoke("run", write_config(tmp_path / "p.yaml", tiny_model_dir, []), "--out", tmp_path / "run")
    assert result.exit_code == 0 and "the config has no stages" in (tmp_path / "run" / "run.log").read_text()


def test_duplicate_yaml_keys_are_an_error(tmp_path):
    (tmp_path / "p.yaml").write_text("model: demo:minilm-movie\nruntime:\n  threads: 2\n  threads: 4\n")
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "key 'threads' appears twice in one mapping (first on line 3)" in result.output


def test_a_yaml_merge_is_taken_and_the_keys_beside_it_win():
    from edgepress.pipeline.config import _UniqueKeyLoader

    text = "a: &c {epochs: 1, lr: 2e-5}\nb: {<<: *c, epochs: 2}\nc: {<<: [*c], lr: 1, lr: 2}\n"
    with pytest.raises(yaml.constructor.ConstructorError, match="key 'lr' appears twice"):  # beside it: still once
        yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    assert yaml.load(text.rsplit("c:", 1)[0], Loader=_UniqueKeyLoader)["b"] == {"epochs": 2, "lr": 2e-5}  # noqa: S506


def test_device_cuda_without_a_gpu_fails_before_anything_runs(tmp_path, tiny_model_dir):
    if has_cuda():
        pytest.skip("this machine has a GPU")
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1])
    result = invoke("run", config, "--out", tmp_path / "run", "--device", "cuda")
    assert result.exit_code == 2 and "the CUDA execution provider is not usable" in result.output
    assert not (tmp_path / "run").exists()


def test_device_override_is_validated_like_the_config(tmp_path, tiny_model_dir):
    stages = [*STAGES[:2], {"name": "int8", "method": "int8-dynamic", "gates": {"latency": {"min_speedup": 2}}}]
    result = invoke("run", write_config(tmp_path / "p.yaml", tiny_model_dir, stages), "--out", tmp_path / "run",
                    "--device", "cuda")
    assert result.exit_code == 2 and "its latency gate is on cpu, which runtime.providers (cuda)" in result.output


def test_empty_text_is_refused_everywhere(tiny_onnx_dir):
    result = invoke("predict", tiny_onnx_dir, "a fine film", "  ")
    assert result.exit_code == 2 and "text 2 of 2 is empty. Fix: give non-empty text" in result.output


# --- 6. messages in the user's words -------------------------------------------------------------------------

def test_messages_say_it_in_the_users_words(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "data": {"split": "80/10/10"}, "runtime": {"providers": "cpu"},
        "stages": [{"name": "q", "method": "int8-dynamic"}, {"name": "e", "method": "export"}]}))
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2
    assert "data.split: should be a mapping of keys to values, e.g. {key: value}: got '80/10/10'" in result.output
    assert "runtime.providers: should be a list, e.g. [a, b]: got 'cpu'" in result.output
    for jargon in ("valid tuple", "instance of", "Value error", "[{", "StageConfig"):
        assert jargon not in result.output


def test_gate_misses_are_rounded(tmp_path, tiny_model_dir):
    stages = [STAGES[0], {"name": "fuse", "method": "optimize", "gates": {"accuracy": {"min": 0.99}}}]
    result = invoke("run", write_config(tmp_path / "p.yaml", tiny_model_dir, stages), "--out", tmp_path / "run")
    assert result.exit_code == 3
    value = result.output.split("accuracy.min ", 1)[1].split(" vs limit 0.99")[0]
    assert len(value.replace("0.", "", 1)) <= 4, value  # 4 significant digits, not 0.49858088930936613


def test_a_speedup_gate_times_the_stage_beside_the_baseline(monkeypatch, tmp_path, tiny_model_dir):
    """The baseline was timed while the machine was busy (1000x its real p50): the gate still judges the stage
    against the baseline timed beside it, not against that figure."""
    measure = runner.RunState.measure

    def busy_baseline(state, artifact, who):
        metrics, preds = measure(state, artifact, who)
        if artifact == tiny_model_dir:
            metrics["latency"]["cpu"]["p50_ms"] *= 1000
        return metrics, preds

    monkeypatch.setattr(runner.RunState, "measure", busy_baseline)
    stages = [*STAGES[:2], {"name": "int8", "method": "int8-dynamic", "gates": {"latency": {"min_speedup": 1000}}}]
    with pytest.raises(GateFailed, match="latency.min_speedup"):
        runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir, stages)), tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    gate = report["stages"][-1]["gates"][0]
    paired, busy = gate["side_by_side"], report["baseline"]["metrics"]["latency"]["cpu"]["p50_ms"]
    assert report["status"] == "failed" and not gate["passed"] and gate["value"] == paired["speedup"] < 1000
    assert paired["baseline_p50_ms"] < busy / 100 and paired["rounds"] == 3 and paired["turns"] == 30
    assert busy / report["stages"][-1]["metrics"]["latency"]["cpu"]["p50_ms"] > 1000  # what the gate judged before
    assert "timed side by side: baseline" in (tmp_path / "run" / "report.md").read_text()
    assert "ms, p50 of 30 interleaved turns" in (tmp_path / "run" / "report.md").read_text()


def test_a_natural_speedup_gate_times_natural_lengths_beside_the_baseline(tmp_path, tiny_model_dir):
    """min_natural_speedup judges the two timed in turn at the test texts' natural lengths, not the fixed shape."""
    stages = [*STAGES[:2], {"name": "int8", "method": "int8-dynamic",
                            "gates": {"latency": {"min_natural_speedup": 1000}}}]
    with pytest.raises(GateFailed, match="latency.min_natural_speedup"):
        runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir, stages)), tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    [gate] = report["stages"][-1]["gates"]
    paired = gate["side_by_side"]
    assert not gate["passed"] and gate["value"] == paired["speedup"] == paired["baseline_p50_ms"] / paired["p50_ms"]
    assert paired["natural"] and "side_by_side" not in report["stages"][-1]["metrics"]["latency"]["cpu"]
    assert "timed side by side at natural lengths: baseline" in (tmp_path / "run" / "report.md").read_text()


def test_a_resumed_stage_is_timed_again_for_its_speedup_gate(monkeypatch, earlier, tmp_path, tiny_model_dir):
    """--resume reuses a stage only if its speedup, timed again beside the baseline now, still passes: the earlier
    run's figures (here: timed apart) are not the verdict."""
    slower = {"speedup": 0.5, "baseline_p50_ms": 1.0, "p50_ms": 2.0, "rounds": 3}
    monkeypatch.setattr(attempt, "side_by_side_speedup", lambda *args, **kwargs: slower)
    stages = [*STAGES[:2], {**STAGES[2], "gates": {"latency": {"min_speedup": 1.0}}}]
    with pytest.raises(GateFailed, match=r"latency.min_speedup 0.5 vs limit 1"):
        runner.run_pipeline(load_config(write_config(tmp_path / "p.yaml", tiny_model_dir, stages)), earlier,
                             resume=True)
    report = json.loads((earlier / "report.json").read_text())
    assert [bool(s.get("reused_from")) for s in report["stages"]] == [True, True, False]
    assert report["stages"][-1]["gates"][0]["side_by_side"] == slower


# --- a run killed mid-stage resumes to the same result -----------------------------------------------------------

def _wait_for(predicate, seconds: float, process) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not predicate():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "the run never reached the stage"
        time.sleep(0.01)


def _without_latency(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "latency"}


def test_a_run_killed_mid_stage_resumes_to_the_uninterrupted_result(good_run, tmp_path, tiny_model_dir):
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    config = write_config(tmp_path / "p.yaml", tiny_model_dir)  # the config good_run ran, uninterrupted
    process = subprocess.Popen([str(Path(sys.executable).parent / "edgepress"), "run", str(config), "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        log = out / "run.log"
        _wait_for(lambda: log.is_file() and "stage fuse: optimize" in log.read_text(), 120, process)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert not (out / "stages" / "02-fuse" / "stage.json").exists()  # killed inside the stage
    assert json.loads((out / "report.json").read_text())["status"] == "running"
    page = (out / "report.html").read_text()  # the table of what finished; the plots are drawn when a run ends
    assert "<td>export</td>" in page and "<svg" not in page and "drawn when the run ends" in page
    stopped = invoke("bundle", out, "--out", tmp_path / "b")  # no writer holds it: its writer is gone
    assert stopped.exit_code == 2 and "is a run that stopped before it finished" in stopped.output \
        and f"--out {out} --resume`" in stopped.output, stopped.output
    report = runner.run_pipeline(load_config(config), out, resume=True)
    assert [bool(s.get("reused_from")) for s in report["stages"]] == [True, False, False]
    uninterrupted = json.loads((good_run / "report.json").read_text())
    assert _without_latency(report["baseline"]["metrics"]) == _without_latency(uninterrupted["baseline"]["metrics"])
    for mine, theirs in zip(report["stages"], uninterrupted["stages"], strict=True):
        assert _without_latency(mine["metrics"]) == _without_latency(theirs["metrics"]), mine["name"]
        folder = f"stages/{report['stages'].index(mine) + 1:02d}-{mine['name']}"
        assert (out / folder / "predictions.json").read_text() == (good_run / folder / "predictions.json").read_text()
    assert (out / "final" / "model.onnx").read_bytes() == (good_run / "final" / "model.onnx").read_bytes()


# --- found by trying the CLI as a new user would ---------------------------------------------------------------

def test_broken_tokenizer_and_bundle_files_exit_2(tmp_path, tiny_model_dir, tiny_onnx_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "tokenizer.json").write_text("not a tokenizer")
    result = invoke("evaluate", model)
    assert result.exit_code == 2 and "the tokenizer files cannot be loaded" in result.output
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_onnx_dir, bundle)
    (bundle / "tokenizer.json").write_text("not a tokenizer")
    result = invoke("predict", bundle, "a fine film")
    assert result.exit_code == 2 and "tokenizer.json is not a readable tokenizer" in result.output
    (bundle / "config.json").write_text("{oops")
    result = invoke("predict", bundle, "a fine film")
    assert result.exit_code == 2 and "config.json is not valid JSON" in result.output


def test_text_that_is_not_utf8_is_refused(tiny_onnx_dir):
    from edgepress.device.predictor import Predictor
    from edgepress.errors import DataError

    with pytest.raises(DataError, match=r"text 1 of 1 is not valid UTF-8"):
        Predictor(tiny_onnx_dir).predict([b"caf\xe9".decode("utf-8", errors="surrogateescape")])


def test_data_too_small_for_its_splits_exits_2(tmp_path, tiny_model_dir):
    from tests.test_data import write_csv

    rows = [{"text": t, "label": lab} for t, lab in (("good", "positive"), ("bad", "negative"), ("fine", "positive"))]
    result = invoke("evaluate", tiny_model_dir, "--data", write_csv(tmp_path / "three.csv", rows))
    assert result.exit_code == 2 and "leaves the validation and test split empty (train 3, validation 0, test 0)" \
        in result.output


def test_lengths_beyond_the_models_positions_are_caught_before_running(tmp_path, tiny_model_dir):
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, data={"max_length": 512})
    result = invoke("validate", config)
    assert result.exit_code == 2 and "longer than the model's 128 positions: data.max_length 512" in result.output
    result = invoke("evaluate", tiny_model_dir, "--max-length", "512")
    assert result.exit_code == 2 and "longer than the model's 128 positions: --max-length 512" in result.output


def test_absurd_numbers_are_config_errors(tmp_path):
    (tmp_path / "p.yaml").write_text("runtime: {threads: 100000, latency: {runs: 1.0e+23}}\n")
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "(2 problem(s))" in result.output
    assert "runtime.threads: Input should be less than or equal to 1024: got 100000" in result.output
    assert "runtime.latency.runs:" in result.output


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10^9 values expanded
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"expands to more than 100,000 values"):
        load_config(tmp_path / "bomb.yaml")


@pytest.mark.parametrize("text", ["&a [*a]\n", "model: demo:minilm-movie\nstages: &s [*s]\n", "a: &a {b: *a}\n",
                                  "stages: [{name: e, method: export, params: &p {x: [*p]}}]\n"])
def test_a_yaml_alias_inside_the_value_it_names_is_refused(tmp_path, text):
    """Every node that holds itself through an alias, at the top or deep inside: exit 2, not a RecursionError."""
    (tmp_path / "p.yaml").write_text(text)
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "uses a YAML alias inside the value it names" in result.output, result.output


def test_validate_runs_every_methods_check_on_a_demo_teacher_without_building_it(tmp_path):
    """`validate` does not build the demo teacher, but checks each method on its architecture and tokenizer (its
    encoder with a fresh head), as a run would on the teacher: a student deeper than the teacher, a recovery's
    teacher that is no model, a search's pretrained student that does not exist are refused there too."""
    (tmp_path / "p.yaml").write_text("model: demo:minilm-movie\nstages:\n"
                                     "  - {name: d, method: distill, params: {student_layers: 9}}\n"
                                     "  - {name: w, method: width, params: {keep: 0.5, teacher: Baseline}}\n")
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "the run would refuse 2 stage(s)" in result.output, result.output
    assert "a 9-layer student from layers" in result.output and "does not fit a 6-layer teacher" in result.output
    (tmp_path / "s.yaml").write_text("model: demo:minilm-movie\n"
                                     "space: {student: [/nonexistent/model], quantization: [int8-dynamic]}\n")
    result = invoke("validate", tmp_path / "s.yaml")
    assert result.exit_code == 2 and "the model /nonexistent/model does not exist" in result.output, result.output


def test_a_config_that_is_no_regular_file_is_named_so(tmp_path):
    """A device or a pipe given as the config exists: it is said to be no file, not said to be missing."""
    import os

    os.mkfifo(tmp_path / "pipe.yaml")
    for path in (Path(os.devnull), tmp_path / "pipe.yaml"):
        result = invoke("validate", path)
        assert result.exit_code == 2 and "is not a file (a device, a pipe or a socket)" in result.output, result.output


def test_a_config_with_stages_and_a_search_space_is_named_both(tmp_path):
    (tmp_path / "p.yaml").write_text("model: demo:minilm-movie\nstages: []\nspace: {layers: [3]}\nobjective: size\n")
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "holds a pipeline's stages and a search's objective, space" in result.output


def test_a_schema_written_under_a_file_names_the_file(tmp_path):
    (tmp_path / "afile").write_text("mine")
    result = invoke("schema", "search", "--out", tmp_path / "afile" / "x.json")
    assert result.exit_code == 2 and f"{tmp_path / 'afile'} is a file" in result.output, result.output
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_search_space_takes_each_choice_once_and_true_or_false_unquoted():
    from edgepress.configs import build
    from edgepress.search.config import SearchConfig

    space = SearchConfig.model_validate({"space": {"vocab": [True, True, False], "quantization": [
        "int8-dynamic", "int8-dynamic", "int4"]}}).space
    assert space.vocab == [True, False] and space.quantization == ["int8-dynamic", "int4"]
    with pytest.raises(ConfigError, match=r"space.vocab.0: should be true or false: got 'no'. Fix: write true or "
                                          r"false, unquoted"):
        build(SearchConfig, {"space": {"vocab": ["no", True]}}, where="s.yaml")


def test_every_gate_without_a_limit_is_listed_and_counted(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"stages": [
        {"name": "e", "method": "export", "gates": {"accuracy": {}, "latency": {}, "size": {}}}]}))
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "(3 problem(s))" in result.output
    for kind in ("accuracy", "latency", "size"):
        assert f"the {kind} gate sets no limit" in result.output


def test_a_run_into_a_folder_of_other_files_is_refused(tmp_path, tiny_model_dir):
    folder = tmp_path / "photos"
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "photo.jpg").write_bytes(b"\xff\xd8")
    (folder / "report.md").write_text("my report")
    result = invoke("run", write_config(tmp_path / "p.yaml", tiny_model_dir), "--out", folder)
    assert result.exit_code == 2 and "holds files that are not an edgepress run" in result.output
    assert snapshot(folder) == {"final/photo.jpg": hashlib.sha256(b"\xff\xd8").hexdigest(),
                                "report.md": hashlib.sha256(b"my report").hexdigest()}


def test_a_mistyped_demo_model_names_the_demo_model(tmp_path):
    (tmp_path / "p.yaml").write_text("model: demo:minilm-mvie\n")
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "unknown demo model 'demo:minilm-mvie'. Fix: the demo models are " \
        "demo:minilm-movie and demo:mpnet-movie (classifiers), demo:minilm and demo:mpnet (sentence encoders)" \
        in result.output


def test_an_empty_onnx_file_and_labels_off_the_classifiers_rows_exit_2(tmp_path, tiny_onnx_dir, tiny_model_dir):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_onnx_dir, bundle)
    (bundle / "model.onnx").write_bytes(b"")
    result = invoke("predict", bundle, "a fine film")
    assert result.exit_code == 2 and "is not a loadable ONNX model" in result.output
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config.update(label2id={"negative": 0, "positive": 5}, id2label={"0": "negative", "5": "positive"})
    (model / "config.json").write_text(json.dumps(config))
    result = invoke("evaluate", model)
    assert result.exit_code == 2 and "label2id must number its 2 labels 0 to 1, each once" in result.output
    (tmp_path / "empty.yaml").write_text("")
    result = invoke("validate", tmp_path / "empty.yaml")
    assert result.exit_code == 2 and "empty.yaml is empty. Fix: write at least the model" in result.output


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors"])
def test_a_safetensors_index_naming_files_outside_the_dir_is_refused(shard, tmp_path, tiny_model_dir):
    """The weight_map of model.safetensors.index.json is followed by transformers' loader as written (a path
    traversal reported upstream): edgepress accepts only plain file names inside the model dir."""
    src = tmp_path / "sharded"
    shutil.copytree(tiny_model_dir, src)
    (src / "model.safetensors").rename(src / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"classifier.bias": "model-00001-of-00001.safetensors",
                                            "classifier.weight": shard}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    result = CliRunner().invoke(app, ["bench", str(src), "--runs", "1", "--warmup", "0"])
    assert result.exit_code == 2, result.output
    assert "names weight files outside the model dir" in result.output and "Traceback" not in result.output


# --- 8. reports that mislead: every attempt's numbers, the threads used, a split without a class -----------------

def test_the_run_records_the_threads_it_timed_on_and_gives_training_torchs_own(good_run, tiny_model_dir,
                                                                               movie_data):
    import torch

    from edgepress.pipeline.latency import measure_latency

    environment = json.loads((good_run / "run.json").read_text())["environment"]
    assert environment["threads"] == FAST_RUNTIME["threads"] and environment["training_threads"] >= 1
    torch.set_num_threads(2)
    measure_latency(tiny_model_dir, movie_data.test.texts[:8], threads=1, cfg=LatencyConfig(warmup=1, runs=2))
    assert torch.get_num_threads() == 2  # timing on 1 thread did not leave training on 1


def test_a_split_without_a_class_is_warned_of_in_the_log_and_the_report(tmp_path, tiny_model_dir, movie_data):
    from tests.test_data import write_csv

    rows = [{"text": t, "label": ["negative", "positive"][y]} for t, y in
            zip(movie_data.train.texts[:200], movie_data.train.labels[:200], strict=True)]
    (tmp_path / "d").mkdir()
    write_csv(tmp_path / "d" / "train.csv", rows[:150])
    write_csv(tmp_path / "d" / "validation.csv", rows[150:175])
    write_csv(tmp_path / "d" / "test.csv", [r for r in rows[175:] if r["label"] == "positive"])
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1], data={"source": str(tmp_path / "d")})
    result = invoke("run", config, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "data: the test split has no example of negative" in (tmp_path / "run" / "run.log").read_text()
    assert "⚠ The test split has no example of negative: accuracy there says nothing about it." in \
        (tmp_path / "run" / "report.md").read_text()


# --- 9. a console a person can read ------------------------------------------------------------------------------

def test_edgepress_log_lines_round_their_numbers_and_show_no_dicts(good_run):
    import re

    log = (good_run / "run.log").read_text()
    assert "parity: max |Δlogit|" in log and "stage fuse: optimize fusions all" in log
    assert not re.search(r"\d\.\d{7,}", log) and "{" not in log, log


def test_library_warnings_are_said_once_with_a_count_and_the_converter_prints_nothing(tmp_path, tiny_onnx_dir,
                                                                                      movie_data, caplog, capfd):
    import logging

    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.deploy.bundle import bundle_model
    from edgepress.logs import LIBRARY_MESSAGES, collect_library_messages, summarise_library_messages

    collect_library_messages()
    try:
        for k in range(2):
            int8_dynamic(tiny_onnx_dir, tmp_path / f"q{k}", movie_data.test.texts[:16], Int8DynamicConfig())
        bundle_model(tmp_path / "q0", tmp_path / "mobile", "mobile")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="edgepress"):
            summarise_library_messages("stage q")
    finally:
        logging.getLogger().removeHandler(LIBRARY_MESSAGES)
    said = [r.getMessage() for r in caplog.records if "consider to run pre-processing" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("stage q: onnxruntime said 2 times: Please consider"), said
    printed = capfd.readouterr()
    assert "consider to run pre-processing" not in printed.err and "Converting" not in printed.out


# --- found by the second new-user probe ----------------------------------------------------------------------------

def test_an_avx2_target_with_full_range_int8_is_refused_before_running(tmp_path, tiny_model_dir, monkeypatch):
    from edgepress.pipeline import config as pipeline_config

    monkeypatch.setattr(pipeline_config, "detect_target", lambda: "x86-vnni")  # built on a machine with VNNI
    fallback = {"method": "int8-static", "params": {"reduce_range": False}}
    stages = [{"name": "export", "method": "export"},
              {"name": "q", "method": "int8-dynamic", "on_fail": {"fallback": [fallback]}}]
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, stages, runtime={**FAST_RUNTIME,
                                                                                   "target": "x86-avx2"})
    result = invoke("validate", config)
    assert result.exit_code == 2 and "(2 problem(s))" in result.output, result.output
    assert "stage 'q' (int8-dynamic): its int8 weights would be full range (reduce_range off), which target x86-avx2 " \
           "refuses unless measured on a CPU without VNNI" in result.output
    assert "stage 'q' (int8-static): its int8 weights would be full range" in result.output
    stages[1]["params"], fallback["params"] = {"per_channel": True}, {}  # the target fills in reduce_range: true
    assert invoke("validate", write_config(tmp_path / "p.yaml", tiny_model_dir, stages,
                                           runtime={**FAST_RUNTIME, "target": "x86-avx2"})).exit_code == 0


def test_numbers_given_as_text_are_refused_once_and_bad_yaml_names_its_file_and_fix(tmp_path):
    stages = [{"name": "d", "method": "distill", "params": {"epochs": "1"}}]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"data": {"max_length": True}, "stages": stages}))
    result = invoke("validate", tmp_path / "p.yaml")
    assert result.exit_code == 2 and "(2 problem(s))" in result.output, result.output
    assert "epochs: should be a number, not text: got '1'. Fix: write it unquoted" in result.output
    assert "data.max_length: should be a number, not true or false" in result.output and "True" not in result.output
    # written as people write learning rates (YAML 1.1 would read 2e-5 as text): numbers
    from edgepress.pipeline.config import load_config

    (tmp_path / "e.yaml").write_text("stages:\n  - {name: d, method: distill, params: {learning_rate: 2e-5, "
                                     "temperature: 1E+1}}\n")
    assert load_config(tmp_path / "e.yaml").stages[0].params == {"learning_rate": 2e-5, "temperature": 10.0}
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n  data: {{\n")
    result = invoke("validate", tmp_path / "bad.yaml")
    assert result.exit_code == 2 and f"in {tmp_path / 'bad.yaml'}, line 1" in result.output
    assert "<unicode string>" not in result.output and "Fix: correct the YAML at that line" in result.output


def test_evaluate_and_bench_take_a_run_dir_and_name_a_missing_path(earlier, tmp_path, tiny_onnx_dir):
    for command in (("evaluate", earlier, "--data", "demo:movie-snippets"), ("bench", earlier, "--runs", "2",
                                                                             "--warmup", "0")):
        result = invoke(*command)
        assert result.exit_code == 0, result.output
        result = invoke(command[0], tmp_path / "nothere")
        assert result.exit_code == 2 and "nothere does not exist. Fix: check the path" in result.output


def test_a_test_split_too_short_for_the_latency_shape_is_refused_before_running(tmp_path, tiny_model_dir):
    (tmp_path / "d.csv").write_text("text,label\n" + "".join(f"sentence {i},{i % 2}\n" for i in range(40)))
    config = write_config(tmp_path / "p.yaml", tiny_model_dir, STAGES[:1], data={"source": str(tmp_path / "d.csv")})
    for command in (("validate", config), ("run", config, "--out", tmp_path / "run")):
        result = invoke(*command)
        assert result.exit_code == 2 and "runtime.latency: the test split's sentences (every stage is timed on " \
            "them) hold 16 tokens; 128 are needed for the fixed shape 1 x 128" in result.output, result.output
    assert not (tmp_path / "run").exists()


def test_a_csv_separated_by_semicolons_is_named_as_such(tmp_path, tiny_onnx_dir):
    (tmp_path / "semi.csv").write_text("id;text;label\n1;a fine, fine film;positive\n2;dull;negative\n")
    result = invoke("evaluate", tiny_onnx_dir, "--data", tmp_path / "semi.csv")
    assert result.exit_code == 2 and "semi.csv looks ';'-separated (its header is 'id;text;label')" in result.output


def test_version_and_neural_compressors_own_lines_are_collected(tmp_path, tiny_model_dir, tiny_onnx_dir, movie_data,
                                                                capfd):
    from edgepress import __version__
    from edgepress.compress.int4 import Int4Config, int4

    assert invoke("--version").output.strip() == f"edgepress {__version__}"
    capfd.readouterr()
    int4(tiny_onnx_dir, tmp_path / "gptq", movie_data.validation.texts[:32],
                  Int4Config(algorithm="gptq", torch_model=tiny_model_dir, calibration_size=16))
    printed = capfd.readouterr()
    assert "[INFO]" not in printed.err + printed.out and "Quantizing layer" not in printed.err + printed.out


def test_a_long_step_says_it_starts_and_how_long_it_took(caplog):
    from edgepress.logs import duration, step, tracked

    with caplog.at_level(logging.INFO, logger="edgepress"), step("building something"):
        assert list(tracked(iter(range(3)), 3, "items")) == [0, 1, 2]  # no terminal here: no bar, the items as they are
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["building something ...", "building something"]
    assert caplog.records[-1].getMessage().startswith("building something: done in 0.")
    assert [duration(s) for s in (0.42, 12.4, 185, 3720)] == ["0.4 s", "12 s", "3 min 05 s", "1 h 02 min"]


def test_a_ctrl_c_lost_in_a_finalizer_is_raised_at_the_next_check(monkeypatch):
    import os
    import signal
    import sys

    from edgepress.interrupt import check, latched

    class Finalized:
        def __del__(self):  # the KeyboardInterrupt raised in here is printed and dropped by Python
            os.kill(os.getpid(), signal.SIGINT)

    printed = []  # what Python would print as "Exception ignored in ...", with a traceback
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    before = signal.getsignal(signal.SIGINT)
    with latched():
        Finalized()  # Python goes on past this line, as it did in a search that ran on after Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            check()
    check()  # outside the block nothing is remembered
    assert signal.getsignal(signal.SIGINT) is before
    assert printed == [] and sys.unraisablehook == printed.append  # not lost, so not printed as a traceback
