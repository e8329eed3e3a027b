import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from edgepress.cli.app import app
from edgepress.device.feeds import fixed_shape_feeds, load_tokenizer, natural_feeds
from edgepress.device.predictor import Predictor
from edgepress.device.timing import summarize, time_runner
from edgepress.errors import ConfigError, ModelError, ProviderUnavailable
from edgepress.runtime.latency import LatencyConfig
from edgepress.runtime.session import SessionConfig, open_session, provider_names
from tests.conftest import cuda, has_cuda

runner = CliRunner()


def test_session_runs_on_the_providers_asked_for(tiny_onnx_dir):
    session = open_session(tiny_onnx_dir / "model.onnx", SessionConfig(threads=1))
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_unknown_provider_names_the_choices():
    with pytest.raises(ConfigError, match=r"unknown provider 'tpu': choose from cpu, cuda"):
        provider_names(["tpu"])


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_an_error_that_says_why(tiny_onnx_dir):
    with pytest.raises(ProviderUnavailable) as e:
        open_session(tiny_onnx_dir / "model.onnx", SessionConfig(providers=("cuda",)))
    message = str(e.value)
    assert message.startswith("the CUDA execution provider is not usable: no NVIDIA driver on this machine")
    assert "running on CPUExecutionProvider instead" in message


def test_truncated_onnx_is_refused(tiny_onnx_dir, tmp_path):
    data = (tiny_onnx_dir / "model.onnx").read_bytes()
    (tmp_path / "model.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match=r"is not a loadable ONNX model \(truncated or corrupt\?\).*Fix: export it"):
        open_session(tmp_path / "model.onnx")


def test_graph_with_other_inputs_is_refused(tmp_path):
    x = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["pixels"], ["probs"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(ModelError) as e:
        open_session(tmp_path / "model.onnx")
    assert "inputs are pixels; expected input_ids, attention_mask[, token_type_ids]" in str(e.value)
    assert "outputs are probs; expected logits or sentence_embedding" in str(e.value)


def test_summarize_percentiles():
    stats = summarize([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert stats["p50_ms"] == pytest.approx(50.5) and stats["p90_ms"] == pytest.approx(90.1)
    assert stats["p99_ms"] == pytest.approx(99.01) and stats["mean_ms"] == pytest.approx(50.5)
    assert stats["runs"] == 100


def test_time_runner_calls_warmup_plus_runs():
    calls = []
    stats = time_runner(calls.append, [{"a": 1}, {"a": 2}], warmup=3, runs=5)
    assert len(calls) == 8 and stats["runs"] == 5


def test_fixed_shape_is_filled_with_real_tokens(tiny_onnx_dir, movie_data):
    tokenizer = load_tokenizer(tiny_onnx_dir, 128)
    names = ("input_ids", "attention_mask", "token_type_ids")
    feeds = fixed_shape_feeds(tokenizer, movie_data.test.texts, 2, 64, names, 128)
    assert feeds["input_ids"].shape == (2, 64) and feeds["attention_mask"].all()
    pad = tokenizer.token_to_id("[PAD]")
    assert not (feeds["input_ids"] == pad).any()
    first = tokenizer.encode(movie_data.test.texts[0]).ids
    assert feeds["input_ids"][0, : len(first)].tolist() == first
    natural = natural_feeds(tokenizer, movie_data.test.texts[:20], names)
    assert len({f["input_ids"].shape[1] for f in natural}) > 5  # natural lengths, not padded to one


def test_sequence_longer_than_the_position_limit(tiny_onnx_dir, movie_data):
    with pytest.raises(ConfigError, match=r"sequence_length 256 is longer than the model's position limit 128"):
        fixed_shape_feeds(load_tokenizer(tiny_onnx_dir, 128), movie_data.test.texts, 1, 256, ("input_ids",), 128)


def test_predictor_matches_the_session(tiny_onnx_dir, movie_data):
    predictor = Predictor(tiny_onnx_dir)
    texts = list(movie_data.test.texts[:10])
    predictions = predictor.predict(texts)
    logits = predictor.logits(texts)
    assert [p.label for p in predictions] == [predictor.id2label[i] for i in logits.argmax(1)]
    assert all(abs(sum(p.scores.values()) - 1) < 1e-6 and p.score == max(p.scores.values()) for p in predictions)
    one_by_one = np.concatenate([predictor.logits([t]) for t in texts])
    np.testing.assert_allclose(logits, one_by_one, atol=1e-5)  # padding does not change a text's logits


def test_predictor_truncates_long_texts(tiny_onnx_dir):
    predictor = Predictor(tiny_onnx_dir, max_length=32)
    long_text = " ".join(["wonderful"] * 500)
    kept = " ".join(["wonderful"] * 30)  # [CLS] + 30 words + [SEP] = 32 tokens
    np.testing.assert_allclose(predictor.logits([long_text]), predictor.logits([kept]), atol=1e-6)
    assert not np.allclose(predictor.logits([kept]), predictor.logits(["wonderful"]), atol=1e-6)


def test_bundle_without_tokenizer(tiny_onnx_dir, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_onnx_dir, bundle)
    (bundle / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=r"is not a model bundle: missing tokenizer.json"):
        Predictor(bundle)


def test_max_length_over_the_position_limit(tiny_onnx_dir):
    with pytest.raises(ConfigError, match=r"max_length 1000 is longer than the model's position limit 128"):
        Predictor(tiny_onnx_dir, max_length=1000)


def test_predictor_never_imports_torch_or_transformers(tiny_onnx_dir):
    script = (
        "import sys\n"
        "sys.modules['torch'] = None; sys.modules['transformers'] = None  # importing either now fails\n"
        "from edgepress.cli.app import main\n"
        f"sys.argv = ['edgepress', 'predict', {str(tiny_onnx_dir)!r}, 'a gorgeous, moving film', '--json']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.strip())
    expected = Predictor(tiny_onnx_dir).predict(["a gorgeous, moving film"])[0]
    assert line["text"] == "a gorgeous, moving film"
    assert line["label"] == expected.label and abs(line["score"] - expected.score) < 1e-6


PEER_PYTHON = Path(__file__).resolve().parents[1] / ".venv-peer" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not PEER_PYTHON.exists(), reason="optimum lives in .venv-peer: make peer-env (make test-slow does)")
def test_bundle_loads_in_optimum(tiny_onnx_dir, movie_data):
    """An ONNX dir edgepress wrote (transformers 5) loads in optimum's ORTModelForSequenceClassification, in the
    peer's own environment (transformers 4.57), and gives edgepress's logits."""
    texts = list(movie_data.test.texts[:8])
    script = (
        "import json, sys\n"
        "from optimum.onnxruntime import ORTModelForSequenceClassification\n"
        "from transformers import AutoTokenizer\n"
        "path, texts = sys.argv[1], json.loads(sys.argv[2])\n"
        "model = ORTModelForSequenceClassification.from_pretrained(path, provider='CPUExecutionProvider')\n"
        "tokenizer = AutoTokenizer.from_pretrained(path)\n"
        "print(json.dumps(model(**tokenizer(texts, padding=True, return_tensors='np')).logits.tolist()))\n"
    )
    done = subprocess.run([str(PEER_PYTHON), "-c", script, str(tiny_onnx_dir), json.dumps(texts)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(theirs, Predictor(tiny_onnx_dir).logits(texts), atol=1e-5)


def test_bench_command_prints_both_shapes(tiny_onnx_dir):
    result = runner.invoke(app, ["bench", str(tiny_onnx_dir), "--threads", "1", "--runs", "5", "--warmup", "1",
                                 "--seq-len", "32"])
    assert result.exit_code == 0, result.output
    assert "1 x 32" in result.output and "1 x natural" in result.output and "CPUExecutionProvider" in result.output
    assert "onnxruntime 1." in result.output


def test_bench_times_the_torch_model_too(tiny_model_dir):
    result = runner.invoke(app, ["bench", str(tiny_model_dir), "--threads", "1", "--runs", "3", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert "torch-cpu" in result.output


def test_bench_rejects_a_too_long_sequence(tiny_onnx_dir):
    result = runner.invoke(app, ["bench", str(tiny_onnx_dir), "--seq-len", "512"])
    assert result.exit_code == 2
    assert "longer than the model's position limit 128" in result.output


def test_predict_command_with_an_unknown_provider_exits_2(tiny_onnx_dir):
    result = runner.invoke(app, ["predict", str(tiny_onnx_dir), "hello", "--provider", "tpu"])
    assert result.exit_code == 2


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_predict_on_cuda_without_a_gpu_exits_2(tiny_onnx_dir):
    result = runner.invoke(app, ["predict", str(tiny_onnx_dir), "hello", "--provider", "cuda"])
    assert result.exit_code == 2
    assert "the CUDA execution provider is not usable" in result.output


@pytest.mark.cuda
@cuda
def test_cuda_fp32_and_fp16_with_iobinding(tiny_onnx_dir, tmp_path, movie_data):
    from edgepress.export.optimize import Fp16Config, fp16_onnx
    from edgepress.pipeline.latency import measure_latency

    session = open_session(tiny_onnx_dir / "model.onnx", SessionConfig(providers=("cuda",)))
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    fp16 = fp16_onnx(tiny_onnx_dir, tmp_path / "fp16", movie_data.validation.texts, Fp16Config())
    assert fp16["parity"]["agreement"] >= 0.99
    for artifact in (tiny_onnx_dir, tmp_path / "fp16"):
        result = measure_latency(artifact, movie_data.test.texts, "cuda", None, LatencyConfig(runs=20, warmup=5))
        assert result["providers_used"][0] == "CUDAExecutionProvider" and result["fixed"]["p50_ms"] > 0


def test_device_side_packages_import_without_torch_or_transformers():
    script = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import edgepress.device, edgepress.runtime, edgepress.deploy\n"
        "for package in (edgepress.device, edgepress.runtime, edgepress.deploy):\n"
        "    for module in pkgutil.iter_modules(package.__path__):\n"
        "        importlib.import_module(f'{package.__name__}.{module.name}')\n"
        "        print(module.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {"predictor", "sessions", "cli", "session", "latency", "bundle", "targets"} <= set(done.stdout.split())


def test_compare_latency_makes_each_candidate_ready_once_and_times_them_in_turn(monkeypatch, tiny_onnx_dir,
                                                                               tiny_model_dir, movie_data):
    """Each candidate's session is opened (a torch model loaded) once; then short rounds, each timing every
    candidate in turn, and every natural-length sentence timed once in each SHORT_ROUNDS rounds; the torch model
    alone idles after its turn."""
    import itertools

    import torch

    from edgepress.device import timing
    from edgepress.pipeline import latency

    made, calls = [], []
    real = latency.prepared

    def recording(artifact, *args):
        ready = real(artifact, *args)
        made.append(artifact)
        return dataclasses.replace(ready, run=lambda feeds: calls.append((artifact, feeds)) or ready.run(feeds))

    monkeypatch.setattr(latency, "prepared", recording)
    pauses = []
    monkeypatch.setattr(timing.time, "sleep", pauses.append)
    before = torch.get_num_threads()
    texts = movie_data.test.texts[:20]
    result = latency.compare_latency({"onnx": tiny_onnx_dir, "torch": tiny_model_dir}, texts, threads=1, rounds=2,
                                     cfg=LatencyConfig(runs=10, warmup=1))
    assert made == [tiny_onnx_dir, tiny_model_dir] and torch.get_num_threads() == before
    turns = [artifact for artifact, _ in itertools.groupby(calls, key=lambda call: call[0])]
    assert turns == [tiny_onnx_dir, tiny_model_dir] * (1 + 2 * latency.SHORT_ROUNDS)  # warm-ups, then the rounds
    assert pauses == [0.0, latency.TORCH_IDLE_S] * (2 * latency.SHORT_ROUNDS)
    for artifact in (tiny_onnx_dir, tiny_model_dir):
        timed = [feeds for who, feeds in calls if who == artifact][1:]  # after the warm-up call (the fixed shape)
        sentences = [f["input_ids"].shape[1] for f in timed if f["input_ids"].shape[1] != 128]
        assert len(timed) - len(sentences) == 2 * 10 and len(sentences) == 2 * len(texts)  # each sentence twice
    assert set(result) == {"onnx", "torch"} and result["onnx"]["providers_used"] == ["CPUExecutionProvider"]
    assert result["torch"]["providers_used"] == ["torch-cpu"]
    assert all(r["fixed_p50_ms"] > 0 and r["natural_p50_ms"] > 0 for r in result.values())


def test_natural_lengths_are_the_texts_as_the_run_reads_them(tiny_onnx_dir, tiny_model_dir, tmp_path, movie_data):
    """Timed at natural lengths, a text is cut where the run's data.max_length (or a bundle's own) cuts it, not at
    the model's position limit: a long text is timed as the bundle will read it."""
    from edgepress.pipeline import latency

    long = tuple(" ".join(movie_data.test.texts[i:i + 8]) for i in range(0, 160, 8))  # about 200 tokens each
    cfg, cut = LatencyConfig(runs=3, warmup=0), 24
    whole = latency.measure_latency(tiny_onnx_dir, long, "cpu", 1, cfg)["natural"]["mean_tokens"]
    assert whole > 100
    for artifact in (tiny_onnx_dir, tiny_model_dir):  # ONNX and torch
        assert latency.measure_latency(artifact, long, "cpu", 1, cfg, max_length=cut)["natural"]["mean_tokens"] == cut
    timed = latency.compare_latency({"a": tiny_onnx_dir}, long, 1, rounds=1, cfg=cfg, max_length=cut)
    assert timed["a"]["natural_mean_tokens"] == cut
    bundle = shutil.copytree(tiny_onnx_dir, tmp_path / "bundle")  # a bundle reads with its manifest's max_length
    (bundle / "edgepress.json").write_text(json.dumps({"max_length": cut, "files": {}}))
    assert latency.measure_latency(bundle, long, "cpu", 1, cfg)["natural"]["mean_tokens"] == cut


def test_worker_threads_spin_within_a_run_and_are_parked_when_it_returns():
    """Every session (edgepress's and predict.py's): workers spin between a run's operators, as torch's OpenMP
    threads do, and `session.force_spinning_stop` parks them as the run returns; `spinning` keeps them spinning."""
    from edgepress.device.sessions import session_options

    parked = session_options(2)
    assert parked.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert parked.get_session_config_entry("session.force_spinning_stop") == "1"
    assert session_options(2, spinning=True).get_session_config_entry("session.force_spinning_stop") == "0"
