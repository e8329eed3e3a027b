"""Sentence-transformers model dirs: read from their JSON files, computed in one torch module, exported with pooling
and normalization inside the graph; every vector checked against sentence-transformers' own `encode`."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgepress.errors import ConfigError, ExportParityError, ModelError
from edgepress.models.sentence import (
    TOKEN_OUTPUT,
    SentenceLayout,
    is_sentence_dir,
    load_sentence_encoder,
    read_layout,
)
from tests.test_bundle import chromium, open_page, transformers_js, web


def st_dir(path, tokenizer, pooling: str, normalize: bool, seed: int = 0, encoder=None):
    """A sentence-transformers dir written by sentence-transformers itself: a 2-layer, hidden-32 BERT over the
    real MiniLM vocabulary (or the encoder of the model dir `encoder`), then Pooling(`pooling`, "+"-joined modes)
    (+ Normalize)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    made = encoder is None
    if made:
        encoder = path / "encoder"
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
                  ).save_pretrained(encoder)
        tokenizer.save_pretrained(encoder)
    modes = tuple(pooling.split("+"))
    modules = [Transformer(str(encoder), max_seq_length=128), Pooling(32, pooling_mode=modes),
               *([Normalize()] if normalize else [])]
    SentenceTransformer(modules=modules, device="cpu").save(str(path / "model"))
    if made:
        shutil.rmtree(encoder)
    return path / "model"


def st_encode(model_dir, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu", local_files_only=True).encode(list(texts), batch_size=8)


@pytest.fixture(scope="module")
def sentence_dir(tmp_path_factory, tokenizer):
    """Mean pooling, normalized: all-MiniLM-L6-v2's layout, on a tiny encoder."""
    return st_dir(tmp_path_factory.mktemp("st"), tokenizer, "mean", True)


@pytest.fixture(scope="module")
def sentence_onnx(tmp_path_factory, sentence_dir, movie_data):
    from edgepress.export.onnx import export_onnx

    out = tmp_path_factory.mktemp("st-onnx") / "onnx"
    return out, export_onnx(sentence_dir, out, movie_data.validation.texts[:200])


def test_the_layout_is_read_from_what_sentence_transformers_wrote(sentence_dir):
    assert is_sentence_dir(sentence_dir)
    assert read_layout(sentence_dir) == SentenceLayout("", ("mean",), True)  # 6 keeps the length in the tokenizer


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", True), ("cls", False), ("max", True),
                                                    ("mean_sqrt_len_tokens", False), ("max+cls", True)])
def test_the_torch_sentence_encoder_gives_sentence_transformers_vectors(tmp_path, tokenizer, movie_data, pooling,
                                                                        normalize):
    import torch

    from edgepress.models.evaluate import forward_inputs

    model_dir = st_dir(tmp_path, tokenizer, pooling, normalize)
    texts = movie_data.test.texts[:24]  # padded batches of different lengths: the mask must keep padding out
    model, tok = load_sentence_encoder(model_dir)
    assert model.layout.pooling == tuple(pooling.split("+"))
    batch = tok(list(texts), padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        ours = model(**forward_inputs(model, batch)).numpy()
    reference = st_encode(model_dir, texts)
    assert ours.shape == reference.shape == (24, 32 * len(pooling.split("+")))
    assert np.abs(ours - reference).max() < 1e-5
    norms = np.linalg.norm(ours, axis=1)
    assert np.allclose(norms, 1, atol=1e-5) if normalize else not np.allclose(norms, 1, atol=1e-2)


def test_an_mpnet_sentence_encoder_gives_sentence_transformers_vectors_in_torch_and_exported(tmp_path, tokenizer,
                                                                                            movie_data):
    """all-mpnet-base-v2's kind of model (an MPNet encoder, mean pooling, normalized), tiny: edgepress's torch
    encoder and its exported graph give sentence-transformers' vectors (MPNet takes no token types, and numbers
    its positions from 2)."""
    import torch

    from edgepress.device.predictor import Predictor
    from edgepress.export.onnx import export_onnx
    from edgepress.models.evaluate import forward_inputs
    from tests.conftest import save, tiny_encoder

    encoder = save(tiny_encoder("mpnet", tokenizer, seed=4).mpnet, tokenizer, tmp_path / "mpnet")
    model_dir = st_dir(tmp_path, tokenizer, "mean", True, encoder=encoder)
    texts = movie_data.test.texts[:40]
    reference = st_encode(model_dir, texts)
    model, words = load_sentence_encoder(model_dir)
    batch = words(list(texts), padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        assert np.abs(model(**forward_inputs(model, batch)).numpy() - reference).max() < 1e-5
    details = export_onnx(model_dir, tmp_path / "onnx", movie_data.validation.texts[:200])
    assert details["parity"]["max_abs_diff"] < 1e-4
    assert np.abs(Predictor(tmp_path / "onnx").embed(texts) - reference).max() < 1e-5


def test_the_export_puts_pooling_and_normalization_in_the_graph(sentence_dir, sentence_onnx, movie_data):
    import onnx

    from edgepress.device.predictor import Predictor

    out, details = sentence_onnx
    graph = onnx.load(str(out / "model.onnx")).graph
    assert [o.name for o in graph.output] == ["sentence_embedding"]
    # the token vectors the pooling reads carry a name of their own (a web bundle gives them to transformers.js):
    # the last layer's norm makes them, mean pooling's product with the mask reads them
    assert [n.op_type for n in graph.node if TOKEN_OUTPUT in n.output] == ["LayerNormalization"]
    assert [n.op_type for n in graph.node if TOKEN_OUTPUT in n.input] == ["Mul"]
    assert details["parity"]["max_abs_diff"] < 1e-4 and details["parity"]["min_cosine"] > 0.9999
    assert details["parity"]["n_examples"] > 64  # the long passages too
    assert read_layout(out) == SentenceLayout("", ("mean",), True)  # the ONNX dir says how it pools
    texts = movie_data.test.texts[:40]
    vectors = Predictor(out).embed(texts)
    assert np.abs(vectors - st_encode(sentence_dir, texts)).max() < 1e-5


def test_an_embedding_bundle_gives_vectors_not_labels(sentence_onnx, tiny_onnx_dir):
    from edgepress.device.predictor import Predictor

    embedder = Predictor(sentence_onnx[0])
    with pytest.raises(ModelError, match="sentence-embedding model: it gives vectors, not labels"):
        embedder.predict(["a fine film"])
    with pytest.raises(ModelError, match="is a classifier: it gives labels, not sentence embeddings"):
        Predictor(tiny_onnx_dir).embed(["a fine film"])
    one = embedder.embed(["a fine film", "dull"])
    assert one.shape == (2, 32) and np.allclose(one[1], embedder.embed(["dull"])[0])


def test_what_edgepress_cannot_compute_exactly_is_refused_with_every_reason(sentence_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(sentence_dir, bad)
    modules = json.loads((bad / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    modules.append({"idx": 4, "name": "4", "path": "../elsewhere", "type": "my_package.Custom"})
    (bad / "modules.json").write_text(json.dumps(modules))
    pooling = json.loads((bad / "1_Pooling/config.json").read_text())
    (bad / "1_Pooling/config.json").write_text(json.dumps({**pooling, "pooling_mode": ["mean", "weightedmean"]}))
    (bad / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128,
                                                               "model_args": {"trust_remote_code": True}}))
    st_config = json.loads((bad / "config_sentence_transformers.json").read_text())
    (bad / "config_sentence_transformers.json").write_text(json.dumps(
        {**st_config, "default_prompt_name": "query", "prompts": {"query": "query: "}}))
    with pytest.raises(ModelError) as refused:
        load_sentence_encoder(bad)
    message = str(refused.value)
    for reason in ("'sentence_transformers.models.Dense' is not one edgepress computes",
                   "'my_package.Custom' is not one edgepress computes",
                   "path '../elsewhere' is not a folder inside the model dir",
                   "pooling weightedmean is not supported",
                   "model_args.trust_remote_code", "default_prompt_name 'query' puts 'query: ' before every text",
                   "Fix: give a sentence-transformers dir"):
        assert reason in message


def test_a_config_field_that_loads_code_is_refused_in_a_sentence_dir_too(sentence_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(sentence_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "evil.Model"}}))
    with pytest.raises(ModelError, match="config.json: auto_map"):
        load_sentence_encoder(bad)


def test_an_encoder_kept_in_a_subfolder_is_refused_by_every_command_with_its_fix(sentence_dir, tmp_path):
    """The older sentence-transformers layout (the encoder's files in 0_Transformer/, not beside modules.json):
    whatever command reads it says so, exit 2, no traceback."""
    import yaml
    from typer.testing import CliRunner

    from edgepress.cli.app import app

    old = tmp_path / "old"
    shutil.copytree(sentence_dir, old)
    modules = json.loads((old / "modules.json").read_text())
    encoder = old / "0_Transformer"
    encoder.mkdir()
    for file in old.iterdir():
        if file.is_file() and file.name != "modules.json":
            file.rename(encoder / file.name)
    (old / "modules.json").write_text(json.dumps([{**modules[0], "path": "0_Transformer"}, *modules[1:]]))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"model": str(old), "stages": [{"name": "e", "method": "export"}]}))
    for args in (["validate", tmp_path / "p.yaml"], ["export", old, "--out", tmp_path / "onnx"],
                 ["bench", old, "--runs", 2, "--warmup", 0]):
        result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
        assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit), \
            result.output
        assert "0_Transformer/" in result.output and "beside modules.json" in result.output, result.output
        assert "Fix: " in result.output, result.output
    assert not (tmp_path / "onnx").exists()
    shutil.copy(encoder / "config.json", old)  # a config.json beside modules.json too: modules.json still says where
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "p.yaml")], env={"COLUMNS": "400"})
    assert result.exit_code == 2 and "module is in 0_Transformer/" in result.output, result.output
    assert "SentenceTransformer(DIR).save(NEW_DIR)" in result.output, result.output


def test_embedding_parity_fails_on_vectors_that_turned(sentence_onnx, movie_data):
    from edgepress.export.parity import ParityConfig, check_parity, input_names, ort_runner, real_feeds
    from edgepress.runtime.session import SessionConfig, open_session

    out = sentence_onnx[0]
    session = open_session(out / "model.onnx", SessionConfig(optimization="disable"))
    run = ort_runner(session)
    feeds = real_feeds(out, movie_data.test.texts[:40], 64, input_names(session), ParityConfig(n_texts=8))
    exact = check_parity(run, run, feeds, ParityConfig(), "same", "sentence_embedding")
    assert exact["max_abs_diff"] == 0 and exact["min_cosine"] > 0.999999
    with pytest.raises(ExportParityError, match=r"cosine ≥ 0.95 on 0.0000 < 0.9 \(lowest cosine"):
        check_parity(run, lambda f: -run(f), feeds, ParityConfig(max_abs_diff=5, min_agreement=0.9), "flipped",
                     "sentence_embedding")


def test_embedding_metrics_on_known_cases():
    from edgepress.data.metrics import embedding_metrics

    rng = np.random.default_rng(0)
    reference = rng.normal(size=(60, 16))
    same = embedding_metrics(reference, reference * 3.0, k=10)  # scale changes no cosine and no neighbour
    assert same["cosine"] == pytest.approx(1) and same["neighbour_overlap"] == 1
    assert same["neighbour_overlap_ci95"] == [1, 1] and same["n_test"] == 60
    rotation, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    turned = embedding_metrics(reference, reference @ rotation, k=10)  # every vector moved, every neighbour kept
    assert turned["neighbour_overlap"] == 1 and turned["cosine"] < 0.5
    unrelated = embedding_metrics(reference, rng.normal(size=(60, 16)), k=10)  # chance: k / (n - 1)
    assert unrelated["neighbour_overlap"] < 0.3
    lo, hi = unrelated["neighbour_overlap_ci95"]
    assert lo < unrelated["neighbour_overlap"] < hi
    # four points on a line: each one's nearest neighbour by cosine, by hand
    line = np.array([[1, 0.0], [1, 0.1], [1, 0.3], [1, 0.6]])
    moved = np.array([[1, 0.0], [1, 0.25], [1, 0.3], [1, 0.6]])  # point 1 now nearer 2 than 0
    few = embedding_metrics(line, moved, k=1)
    assert few["neighbour_overlap"] == pytest.approx(3 / 4) and np.all(np.isfinite(few["neighbour_overlap_ci95"]))
    # another model's vectors, of another dimension (model2vec's 256 against 384): no cosine, the overlap alone
    projected = embedding_metrics(reference, reference @ rng.normal(size=(16, 32)), k=10)
    assert projected["cosine"] is None and projected["cosine_ci95"] is None and projected["n_test"] == 60
    assert 0.3 < projected["neighbour_overlap"] <= 1


FAST = {"providers": ["cpu"], "threads": 1, "latency": {"warmup": 2, "runs": 5}}


def test_an_embedding_run_is_gated_on_the_baselines_neighbours_and_bundles_vectors(tmp_path, sentence_dir):
    import subprocess
    import sys

    import yaml

    from edgepress.errors import GateFailed
    from edgepress.pipeline import runner
    from edgepress.pipeline.config import load_config

    stages = [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize"},
              {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True},
               "gates": {"accuracy": {"max_drop": 0.5}, "fidelity": {"min_agreement": 0.3, "on": ["typos"]}}}]
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"model": str(sentence_dir), "runtime": FAST, "stages": stages}))
    out = tmp_path / "run"
    report = runner.run_pipeline(load_config(config), out)
    base = report["baseline"]["metrics"]
    assert base["primary_metric"] == "neighbour_overlap" and base["neighbour_overlap"] == 1 and base["cosine"] == 1
    export, _, int8 = (s["metrics"] for s in report["stages"])
    assert export["neighbour_overlap"] > 0.99 and export["cosine"] > 0.9999  # the graph is the torch model
    # pooling and normalization leave ONNX Runtime's shape inference intact: attention fuses as in a classifier
    assert report["stages"][1]["details"]["timing"]["candidates"]["all"]["fused_ops"]["Attention"] == 2
    assert 0.5 <= int8["neighbour_overlap"] < 1 and int8["cosine"] < export["cosine"]
    lo, hi = int8["neighbour_overlap_ci95"]
    assert int8["neighbour_overlap_drop_ci95"] == pytest.approx([1 - hi, 1 - lo])
    assert "accuracy" not in int8 and int8["sets"]["typos"]["agreement"] > 0.3
    gates = {(g["kind"], g["rule"]): g for g in report["stages"][2]["gates"]}
    assert gates["accuracy", "max_drop"]["metric"] == "neighbour_overlap"
    assert gates["accuracy", "max_drop"]["value"] == pytest.approx(1 - int8["neighbour_overlap"])
    # the vectors are kept beside predictions.json, read back without pickle
    stage = out / "stages" / "03-int8"
    assert json.loads((stage / "predictions.json").read_text())["vectors"] == "predictions.npz"
    markdown = (out / "report.md").read_text()
    assert "| stage | status | neighbour overlap [95% CI] | cosine [95% CI] |" in markdown
    assert "accuracy.max_drop (neighbour_overlap)" in markdown
    # --resume reuses every stage, vectors and all
    again = runner.run_pipeline(load_config(config), out, resume=True)
    assert again["stages"][2]["metrics"]["neighbour_overlap"] == int8["neighbour_overlap"]
    assert "int8: reused" in (out / "run.log").read_text()
    # the bundle gives vectors, one JSON object a text, and says what the run measured
    manifest = json.loads((out / "final" / "edgepress.json").read_text())
    assert manifest["task"] == "embedding" and "labels" not in manifest
    assert manifest["metrics"]["neighbour_overlap"] == int8["neighbour_overlap"]
    shown = subprocess.run([sys.executable, str(out / "final" / "predict.py"), "a gripping film", "dull"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    vectors = [json.loads(line) for line in shown]
    assert [v["text"] for v in vectors] == ["a gripping film", "dull"] and len(vectors[0]["embedding"]) == 32
    from typer.testing import CliRunner

    from edgepress.cli.app import app

    cli = CliRunner().invoke(app, ["predict", str(out / "final"), "a gripping film", "dull"])
    assert cli.exit_code == 0 and [json.loads(line) for line in cli.stdout.splitlines()] == vectors
    # predict.py similar: the corpus's nearest texts by cosine, the query itself first
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["dull", "a gripping film", "", "the plot drags", "a moving, gripping story"]) + "\n")
    found = subprocess.run([sys.executable, str(out / "final" / "predict.py"), "similar", "a gripping film",
                            "--corpus", str(corpus), "--top", "3", "--json"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    hits = [json.loads(line) for line in found]
    assert [h["rank"] for h in hits] == [1, 2, 3] and hits[0]["text"] == "a gripping film"
    assert hits[0]["score"] == pytest.approx(1, abs=1e-5) and hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    cli = CliRunner().invoke(app, ["predict", str(out / "final"), "a gripping film", "--corpus", str(corpus),
                                   "--top", "3", "--json"])
    assert cli.exit_code == 0 and [json.loads(line) for line in cli.stdout.splitlines()] == hits
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    refused = subprocess.run([sys.executable, str(out / "final" / "predict.py"), "similar", "x", "--corpus",
                              str(empty)], capture_output=True, text=True)
    assert refused.returncode == 2 and "holds no text. Fix: one text a line" in refused.stderr
    # a gate the neighbours miss stops the run (exit 3)
    stages[2]["gates"] = {"accuracy": {"min": 0.999}}
    config.write_text(yaml.safe_dump({"model": str(sentence_dir), "runtime": FAST, "stages": stages}))
    with pytest.raises(GateFailed, match=r"accuracy.min \(neighbour_overlap\)"):
        runner.run_pipeline(load_config(config), out, resume=True)


def sts_csv(path, n: int):
    """The STS Benchmark's first `n` test pairs as a data.pairs file."""
    from edgepress.data.sts import sts_pairs
    from tests.test_data import write_csv

    return write_csv(path, [{"sentence1": a, "sentence2": b, "score": score} for a, b, score in sts_pairs("test")[:n]])


def test_an_embedding_run_measures_and_gates_the_spearman_of_scored_pairs(tmp_path, sentence_dir):
    """data.pairs: every stage's Spearman correlation of pair cosines with people's scores, its CI and the paired CI
    of its drop, gated by `accuracy: {metric: spearman}`, reported, and reused with the run's other sets."""
    import yaml

    from edgepress.pipeline import runner
    from edgepress.pipeline.config import load_config
    from tests.test_data import write_csv

    pairs = sts_csv(tmp_path / "pairs.csv", 80)
    stages = [{"name": "export", "method": "export"},
              {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True},
               "gates": {"accuracy": {"max_drop": 0.5, "strict": True, "metric": "spearman"}}}]
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"model": str(sentence_dir), "data": {"pairs": str(pairs)}, "runtime": FAST,
                                      "stages": stages}))
    out = tmp_path / "run"
    report = runner.run_pipeline(load_config(config), out)
    base = report["baseline"]["metrics"]["sets"]["pairs"]
    assert base["n"] == 160 and base["n_pairs"] == 80 and base["spearman_ci95"][0] < base["spearman"] < \
        base["spearman_ci95"][1]
    export, int8 = (s["metrics"]["sets"]["pairs"] for s in report["stages"])
    assert export["spearman"] == pytest.approx(base["spearman"], abs=1e-3)  # the graph is the torch model
    drop = base["spearman"] - int8["spearman"]
    lo, hi = int8["spearman_drop_ci95"]
    assert lo <= drop <= hi and lo < hi
    gate = report["stages"][1]["gates"][0]
    assert gate["metric"] == "spearman" and gate["value"] == hi and gate["point_estimate"] == pytest.approx(drop)
    assert report["data"]["sizes"]["pairs"] == 80
    manifest = json.loads((out / "final" / "edgepress.json").read_text())
    assert manifest["metrics"]["spearman"] == int8["spearman"] and manifest["metrics"]["n_pairs"] == 80
    markdown = (out / "report.md").read_text()
    assert f"(Spearman {base['spearman']:.4f} [" in markdown and "accuracy.max_drop (spearman)" in markdown
    assert "Spearman correlation of each pair's cosine" in (out / "report.html").read_text()
    again = runner.run_pipeline(load_config(config), out, resume=True)
    assert again["stages"][1]["metrics"]["sets"]["pairs"]["spearman"] == int8["spearman"]
    assert all("reused_from" in s for s in again["stages"])
    # other scores are other data: nothing measured on the old ones is reused
    import csv

    rows = list(csv.DictReader(pairs.open()))
    write_csv(pairs, [{**row, "score": 5 - float(row["score"])} for row in rows])
    third = runner.run_pipeline(load_config(config), out, resume=True)
    assert not any("reused_from" in s for s in third["stages"])
    assert third["baseline"]["metrics"]["sets"]["pairs"]["spearman"] == pytest.approx(-base["spearman"])


def test_scored_pairs_that_cannot_be_read_or_gated_are_refused_with_their_fix(tmp_path, sentence_dir,
                                                                              tiny_model_dir):
    import yaml

    from edgepress.errors import DataError
    from edgepress.pipeline.config import load_config
    from edgepress.pipeline.inputs import check_inputs
    from tests.test_data import write_csv

    def refused(pairs, model=sentence_dir, gates=None, error=DataError) -> str:
        stages = [{"name": "export", "method": "export", **({"gates": gates} if gates else {})}]
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(
            {"model": str(model), "data": {"pairs": str(pairs)} if pairs else {}, "stages": stages}))
        with pytest.raises(error) as e:
            check_inputs(load_config(tmp_path / "p.yaml"), build_teacher=False)
        return str(e.value)

    good = sts_csv(tmp_path / "good.csv", 30)
    rows = [{"sentence1": "a", "sentence2": "b", "similarity": 1.0}] * 30
    assert "has no score column; its columns are: sentence1, sentence2, similarity. Fix: name the columns " \
        "sentence1, sentence2, score" in refused(write_csv(tmp_path / "col.csv", rows))
    rows = [{"sentence1": f"a {i}", "sentence2": "b", "score": "high" if i == 3 else i} for i in range(30)]
    assert "column 'score' must hold a number; row 4 does not (first: 'high')" in refused(
        write_csv(tmp_path / "nan.csv", rows))
    assert "has too few pairs (5)" in refused(sts_csv(tmp_path / "few.csv", 5)) and "at least 20" in refused(
        sts_csv(tmp_path / "few.csv", 5))
    rows = [{"sentence1": f"a {i}", "sentence2": "b", "score": 3} for i in range(30)]
    assert "every pair has the score 3" in refused(write_csv(tmp_path / "same.csv", rows))
    assert "is not a .csv or .jsonl file" in refused(tmp_path)
    message = refused(good, model=tiny_model_dir, error=ConfigError)
    assert "scores sentence vectors, and this is a classification model. Fix: remove data.pairs" in message
    message = refused(None, gates={"accuracy": {"max_drop": 0.02, "metric": "spearman"}}, error=ConfigError)
    assert "stage 'export': accuracy.metric spearman is measured on scored sentence pairs, and data.pairs names " \
        "none. Fix: set data.pairs" in message
    message = refused(good, gates={"accuracy": {"max_drop": 0.02, "metric": "accuracy"}}, error=ConfigError)
    assert "accuracy.metric accuracy is not measured on embedding models. Fix: metric: neighbour_overlap or " \
        "spearman, or leave metric out (neighbour_overlap)" in message
    # an empty file, a header alone, a line of JSON that is no object: each said so, with its fix
    (tmp_path / "empty.csv").write_text("")
    assert "holds no pairs (no row below a header)" in refused(tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("sentence1,sentence2,score\n")
    assert "holds no pairs (no row below a header)" in refused(tmp_path / "header.csv")
    (tmp_path / "list.jsonl").write_text('{"sentence1": "a", "sentence2": "b", "score": 1}\n[1, 2]\n')
    assert "line 2 is a JSON list, not an object. Fix: one JSON object per line" in refused(tmp_path / "list.jsonl")
    # a run never replaces the pairs it reads
    out = tmp_path / "run"
    (out / "stages").mkdir(parents=True)
    inside = sts_csv(out / "stages" / "pairs.csv", 30)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"model": str(sentence_dir), "data": {"pairs": str(inside)},
                                                     "stages": [{"name": "export", "method": "export"}]}))
    with pytest.raises(ConfigError, match=r"holds data.pairs .*which this command reads and would replace"):
        check_inputs(load_config(tmp_path / "p.yaml"), out, build_teacher=False)


def test_an_embedding_run_refuses_what_is_not_built_for_it_yet(tmp_path, sentence_dir, tiny_model_dir):
    import yaml

    from edgepress.errors import ConfigError
    from edgepress.pipeline.config import load_config
    from edgepress.pipeline.inputs import check_inputs

    def refused(config: dict) -> str:
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(config))
        with pytest.raises(ConfigError) as e:
            check_inputs(load_config(tmp_path / "p.yaml"), build_teacher=False)
        return str(e.value)

    message = refused({"model": str(sentence_dir), "stages": [{"name": "l", "method": "lottery"},
                                                               {"name": "export", "method": "export"}]})
    assert "not built for embedding models yet" in message and "stage 'l': lottery" in message
    assert "export" not in message.split("\n")[1]
    assert "Fix: use distill, heads, ffn, lowrank, vocab, magnitude, export, optimize" in message
    message = refused({"model": str(sentence_dir), "stages": [{"name": "export", "method": "export"},
                                                               {"name": "c", "method": "cascade"}]})
    assert "stage 'c': cascade (a cascade defers a text by its student's confidence in a label" in message
    message = refused({"model": str(sentence_dir), "stages": [
        {"name": "h", "method": "heads", "params": {"teacher": str(tiny_model_dir)}}]})
    assert "is not a sentence-transformers dir (no modules.json): a sentence encoder's recovery" in message
    message = refused({"model": str(sentence_dir), "task": "classification", "stages": []})
    assert "is a sentence-transformers dir (it has modules.json), so its task is embedding" in message
    message = refused({"model": str(tiny_model_dir), "task": "embedding", "stages": []})
    assert "is a sequence classifier (no modules.json" in message
    from edgepress.data import DataConfig
    from edgepress.pipeline.evaluate import evaluate_model

    with pytest.raises(ConfigError, match="is a sentence-embedding model: its vectors are scored against another"):
        evaluate_model(str(sentence_dir), DataConfig())
    concatenated = pooled_with(sentence_dir, ["mean", "cls"], tmp_path / "mean-cls")
    message = refused({"model": str(concatenated), "runtime": {"target": "web"}, "stages": [
        {"name": "export", "method": "export"}]})
    assert (f"target web: {concatenated} pools its token vectors with mean + cls, and transformers.js's "
            f"feature-extraction pipeline pools with mean or cls only. Fix: another target (x86-vnni, x86-avx2, "
            f"arm64, mobile, cuda: their predict.py pools inside the graph)") in message


@web
def test_an_embedding_run_for_the_web_ends_in_a_feature_extraction_bundle(tmp_path, sentence_dir):
    import onnx

    from edgepress.pipeline import runner
    from edgepress.pipeline.config import PipelineConfig

    cfg = PipelineConfig.model_validate({"model": str(sentence_dir), "runtime": {**FAST, "target": "web"},
                                         "stages": [{"name": "export", "method": "export"}]})
    runner.run_pipeline(cfg, tmp_path / "run")
    final = tmp_path / "run" / "final"
    manifest = json.loads((final / "edgepress.json").read_text())
    assert manifest["target"]["name"] == "web" and manifest["task"] == "embedding"
    assert manifest["web"]["pipeline"] == "feature-extraction" and read_layout(final) == read_layout(sentence_dir)
    outputs = onnx.load(str(final / manifest["model_file"])).graph.output
    assert [o.name for o in outputs] == ["sentence_embedding", TOKEN_OUTPUT]
    stage = onnx.load(str(tmp_path / "run" / "stages" / "01-export" / "model" / "model.onnx")).graph.output
    assert [o.name for o in stage] == ["sentence_embedding"]  # the run's own graph is left as it was


def pooled_with(model_dir, modes, out):
    """A copy of the sentence-transformers (or exported) dir `model_dir` whose Pooling config says `modes`."""
    shutil.copytree(model_dir, out)
    config = json.loads((out / "1_Pooling/config.json").read_text())
    (out / "1_Pooling/config.json").write_text(json.dumps({**config, "pooling_mode": modes}))
    return out


@pytest.mark.parametrize("target", ["mobile", "arm64", "x86-avx2", pytest.param("web", marks=web)])
def test_an_embedding_bundle_is_built_for_each_device_target(sentence_onnx, movie_data, tmp_path, target):
    import onnx

    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.predictor import Predictor

    out = bundle_model(sentence_onnx[0], tmp_path / target, target)
    manifest = json.loads((out / "edgepress.json").read_text())
    assert manifest["target"]["name"] == target and (out / "modules.json").is_file()
    assert read_layout(out) == read_layout(sentence_onnx[0])  # how it pools travels with it (1_Pooling/)
    exported = json.loads((sentence_onnx[0] / "config.json").read_text())
    assert json.loads((out / "config.json").read_text()).get("id2label") == exported.get("id2label")  # none invented
    texts = movie_data.test.texts[:16]
    assert np.abs(Predictor(out).embed(texts) - Predictor(sentence_onnx[0]).embed(texts)).max() < 1e-6
    if target == "mobile":  # the .ort file computes the graph's vectors
        assert manifest["mobile"]["ort_vs_onnx_max_abs_diff"] < 1e-4
    if target == "web":  # the token vectors too, and how transformers.js is to pool them as the model does
        assert manifest["web"]["pipeline"] == "feature-extraction" and manifest["model_file"] == "onnx/model.onnx"
        assert manifest["web"]["options"] == {"pooling": "mean", "normalize": True}
        assert {"domain": "ai.onnx", "op_type": "Cast"} in manifest["operators"]  # the bundled graph's own facts
        again = bundle_model(out, tmp_path / "again", "web")  # a web bundle bundled again gives them once
        for site in (out, again):
            outputs = onnx.load(str(site / manifest["model_file"])).graph.output
            assert [o.name for o in outputs] == ["sentence_embedding", TOKEN_OUTPUT]
        assert np.abs(Predictor(again).embed(texts) - Predictor(out).embed(texts)).max() == 0


@web
@pytest.mark.parametrize("graph", ["fp32", "int8"])
def test_transformers_js_under_node_gives_the_predictors_vectors(sentence_onnx, movie_data, tmp_path, graph):
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.predictor import Predictor
    from edgepress.export.optimize import OptimizeConfig, optimize_onnx

    source = sentence_onnx[0]
    if graph == "int8":  # fused, then int8 with 7-bit weights per channel: as a run ships it for x86 without VNNI
        calibration = movie_data.validation.texts[:64]
        optimize_onnx(source, tmp_path / "fused", calibration, OptimizeConfig(fusions="all"))
        int8_dynamic(tmp_path / "fused", tmp_path / "int8", calibration,
                     Int8DynamicConfig(per_channel=True, reduce_range=True))
        source = tmp_path / "int8"
    out = bundle_model(source, tmp_path / "site", "web")
    texts = list(movie_data.test.texts[:200])
    result = transformers_js(out, texts, tmp_path, "embed.mjs")
    assert result["dtype"] == {"fp32": "fp32", "int8": "q8"}[graph]
    assert result["options"] == {"pooling": "mean", "normalize": True}
    vectors, expected = np.array(result["vectors"], dtype=np.float32), Predictor(out).embed(texts)
    # Both run the same graph file on ONNX Runtime's native CPU kernels (onnxruntime-node under node, onnxruntime
    # here), so the token vectors agree to float32 rounding, the int8 graph's too (measured: identical with cls
    # pooling). What differs is the pooling: inside the graph in float32 for predict.py, in JavaScript in float64
    # for transformers.js. Measured on these 200 sentences: max |Δ| 1.2e-7 (fp32) and 1.5e-7 (int8), float32
    # rounding of unit vectors whose components average 0.14 in size; 1e-5 leaves room for other CPUs' kernels,
    # and a vector pooled otherwise is far outside it (cls for mean: max |Δ| 0.19 or more on every sentence).
    assert vectors.shape == expected.shape == (200, 32) and np.abs(vectors - expected).max() < 1e-5


@web
@chromium
def test_the_page_ranks_lines_by_the_cosine_of_their_vectors_in_headless_chromium(sentence_onnx, tmp_path):
    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.predictor import Predictor

    out = bundle_model(sentence_onnx[0], tmp_path / "site", "web")
    query = "a gripping, funny and beautifully acted film"
    result = open_page(out, query, tmp_path / "page.png")
    ranked = json.loads(result["result"])  # the page's own lines, nearest the query first
    scores = np.array([r["score"] for r in ranked])
    python = Predictor(out)
    vectors, wanted = python.embed([r["text"] for r in ranked]), python.embed([query])[0]
    cosines = vectors @ wanted / np.linalg.norm(vectors, axis=1) / np.linalg.norm(wanted)
    # onnxruntime-web's WebAssembly kernels against native ones on an fp32 graph: float32 summation order only
    # (measured max |Δ| 1.2e-7 on these 5 cosines)
    assert len(ranked) == 5 and np.abs(scores - cosines).max() < 1e-5 and (np.diff(scores) <= 0).all()
    assert result["shown"] == f"nearest: {ranked[0]['text']}"
    assert all(url.startswith("http://127.0.0.1:") for url in result["requests"])  # nothing from the network
    assert (tmp_path / "page.png").stat().st_size > 1000


def test_a_pooling_transformers_js_lacks_is_refused_for_the_web_before_anything_is_written(sentence_onnx,
                                                                                          tmp_path):
    from typer.testing import CliRunner

    from edgepress.cli.app import app

    maxed = pooled_with(sentence_onnx[0], "max", tmp_path / "max")
    site = tmp_path / "site"
    result = CliRunner().invoke(app, ["bundle", str(maxed), "--out", str(site), "--target", "web"])
    assert result.exit_code == 2 and not site.exists()
    assert (f"target web: {maxed} pools its token vectors with max, and transformers.js's feature-extraction "
            f"pipeline pools with mean or cls only. Fix: another target") in " ".join(result.output.split())


@web
def test_a_graph_that_does_not_name_its_token_vectors_is_refused_for_the_web(sentence_onnx, tmp_path):
    import onnx

    from edgepress.deploy.bundle import bundle_model

    older = tmp_path / "older"  # as an export before the name: the last layer norm's tensor named by the exporter
    shutil.copytree(sentence_onnx[0], older)
    model = onnx.load(str(older / "model.onnx"))
    for node in model.graph.node:
        node.input[:] = ["hidden" if name == TOKEN_OUTPUT else name for name in node.input]
        node.output[:] = ["hidden" if name == TOKEN_OUTPUT else name for name in node.output]
    onnx.save(model, str(older / "model.onnx"))
    with pytest.raises(ModelError, match=r"has no tensor named token_embeddings .* Fix: export the model again"):
        bundle_model(older, tmp_path / "site", "web")
    assert not (tmp_path / "site").exists()


def test_init_writes_an_embedding_pipeline_of_the_methods_built_for_it(sentence_dir, movie_data, tmp_path):
    import csv

    import yaml

    from edgepress.data import DataConfig
    from edgepress.pipeline.init import write_starter

    data = tmp_path / "texts.csv"
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows((text, int(label)) for text, label in zip(movie_data.train.texts[:300],
                                                                   movie_data.train.labels[:300], strict=True))
    text = write_starter(str(sentence_dir), DataConfig(source=str(data)), tmp_path / "init.yaml")  # validated
    config = yaml.safe_load(text)
    assert [s["method"] for s in config["stages"]] == ["distill", "heads", "ffn", "vocab", "export", "optimize",
                                                        "int8-dynamic"]
    assert config["stages"][-1]["gates"]["accuracy"] == {"max_drop": 0.2}
    assert config["stages"][-1]["params"] == {"per_channel": True, "smooth": 0.85}
    said = " ".join(line.removeprefix("# ") for line in text.splitlines() if line.startswith("# "))  # unwrapped
    assert "sentence vectors (mean pooling, normalized)" in said and "neighbour overlap 0.8)" in said
    assert "left out" not in said


def test_distill_trains_a_shallower_sentence_encoder_to_the_teachers_vectors(trained_teacher, tokenizer, small_data,
                                                                            tmp_path):
    from edgepress.compress.distill import DistillConfig, check_student, distill
    from edgepress.data.metrics import embedding_metrics
    from edgepress.models.evaluate import predict_outputs
    from edgepress.models.sentence import sentence_encoder
    from edgepress.tasks import EMBEDDING

    # an encoder that learned something from real sentences: its second layer matters to its vectors
    sentence_dir = st_dir(tmp_path, tokenizer, "mean", True, encoder=trained_teacher)
    cfg = DistillConfig(student_layers=1, epochs=2, learning_rate=1e-3, max_length=64)
    details = distill(sentence_dir, tmp_path / "student", small_data, cfg)
    assert is_sentence_dir(tmp_path / "student") and details["layer_map"] == [0]
    assert [h["epoch"] for h in details["history"]] == [1, 2] and "val_neighbour_overlap" in details["history"][0]
    teacher, tokenizer = load_sentence_encoder(sentence_dir)
    student, _ = load_sentence_encoder(tmp_path / "student")
    assert student.config.num_hidden_layers == 1 and student.layout == teacher.layout
    texts = small_data.test.texts
    reference = predict_outputs(teacher, tokenizer, texts, 64)
    untrained = sentence_encoder(copy_first_layer(teacher), teacher.layout)  # where the student started
    learned = embedding_metrics(reference, predict_outputs(student, tokenizer, texts, 64))
    started = embedding_metrics(reference, predict_outputs(untrained, tokenizer, texts, 64))
    # 2 epochs on 320 texts: its vectors turn toward the teacher's (measured: cosine 0.82 -> 0.93), and find most of
    # the teacher's neighbours (0.71; chance is 10 of 63)
    assert learned["cosine"] > started["cosine"] + 0.05 and learned["neighbour_overlap"] > 0.5
    with pytest.raises(ConfigError, match="style tinybert adds hidden-state losses not built for it yet"):
        check_student(teacher, tokenizer, DistillConfig(student_layers=1, style="tinybert"), EMBEDDING)


def copy_first_layer(teacher):
    """The teacher's encoder cut to its first layer: a 1-layer student before any training."""
    import copy

    from edgepress.models.arch import layer_list

    transformer = copy.deepcopy(teacher.transformer)
    del layer_list(transformer)[1:]
    transformer.config.num_hidden_layers = 1
    return transformer


def test_an_embedding_run_distills_then_exports_the_student(tmp_path, sentence_dir):
    import yaml

    from edgepress.pipeline import runner
    from edgepress.pipeline.config import load_config

    stages = [{"name": "distill", "method": "distill", "params": {"student_layers": 1, "epochs": 1},
               "gates": {"accuracy": {"max_drop": 0.9}}}, {"name": "export", "method": "export"}]
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"model": str(sentence_dir), "runtime": FAST, "stages": stages,
                                      "data": {"max_length": 64}}))
    report = runner.run_pipeline(load_config(config), tmp_path / "run")
    distilled, exported = (s["metrics"] for s in report["stages"])
    assert report["stages"][0]["details"]["layer_map"] == [0] and "val_neighbour_overlap" in \
        report["stages"][0]["details"]
    assert distilled["params"] < report["baseline"]["metrics"]["params"]  # one layer fewer
    assert exported["neighbour_overlap"] == pytest.approx(distilled["neighbour_overlap"], abs=0.01)  # the graph is it


def test_the_embedding_demo_runs_on_a_sentence_encoder(monkeypatch, tmp_path, sentence_dir):
    """`edgepress demo --task embedding` runs demo-embedding.yaml (on all-MiniLM-L6-v2, `demo:minilm`): here on the
    tiny encoder, its latency gate left to benchmarks/ (a tiny model's speed says nothing); the CLI's summary prints
    the neighbour overlap, not an accuracy the run has not got."""
    from typer.testing import CliRunner

    from edgepress.cli.app import app
    from edgepress.pipeline import demo
    from edgepress.pipeline.config import RuntimeConfig
    from edgepress.tasks import EMBEDDING, task_of
    from edgepress.teacher import ENCODER, encoder_dir, resolve_model

    cfg = demo.demo_config("embedding")
    assert cfg.model == ENCODER and resolve_model(ENCODER) == encoder_dir() and task_of(encoder_dir()) is EMBEDDING
    int8 = cfg.stages[-1]
    assert int8.params["smooth"] == 0.85 and int8.params["gptq"] and int8.gates.latency.min_natural_speedup == 4
    tiny = cfg.model_copy(update={"model": str(sentence_dir), "runtime": RuntimeConfig.model_validate(FAST),
                                  "stages": [*cfg.stages[:-1], int8.model_copy(update={"gates": int8.gates.model_copy(
                                      update={"latency": None})})]})
    monkeypatch.setattr(demo, "demo_config", lambda task: tiny if task == "embedding" else cfg)
    result = CliRunner().invoke(app, ["demo", "--task", "embedding", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "neighbour overlap 1.0000" in result.output and "accuracy nan" not in result.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == ["export", "fuse", "int8"]
    details = report["stages"][-1]["details"]
    assert details["smooth"]["alpha"] == 0.85 and details["gptq"]["weights"] == 2 * 4
    # the STS Benchmark's test pairs: every stage's Spearman, the float graphs' the torch model's
    assert report["data"]["sizes"]["pairs"] == 1379
    spearman = [s["metrics"]["sets"]["pairs"]["spearman"] for s in [report["baseline"], *report["stages"]]]
    assert spearman[1] == pytest.approx(spearman[0], abs=1e-3) and all(-1 <= s <= 1 for s in spearman)
    bad = CliRunner().invoke(app, ["demo", "--task", "ner", "--out", str(tmp_path / "other")])
    assert bad.exit_code == 2 and not (tmp_path / "other").exists()


@pytest.mark.parametrize("method", ["heads", "ffn", "lowrank"])
def test_structured_pruning_keeps_a_sentence_encoders_neighbours(trained_teacher, tokenizer, small_data, tmp_path,
                                                                  method):
    """heads / ffn on a sentence-transformers dir: its Transformer loses half of every layer's heads or FFN neurons,
    ranked by the importance of the vector loss, and the recovery learns the unpruned model's vectors back; lowrank
    factors its FFN at half the rank, and recovers the same way."""
    from edgepress.compress.lowrank import LowRankConfig, lowrank
    from edgepress.compress.structured import FfnConfig, HeadsConfig, ffn, heads
    from edgepress.data.metrics import embedding_metrics
    from edgepress.models.evaluate import predict_outputs

    sentence_dir = st_dir(tmp_path, tokenizer, "mean", True, encoder=trained_teacher)
    train = {"keep": 0.5, "epochs": 2, "learning_rate": 1e-3, "max_length": 64}
    prune, cfg = {"heads": (heads, HeadsConfig(**train, importance_batches=4)),
                  "ffn": (ffn, FfnConfig(**train, importance_batches=4)),
                  "lowrank": (lowrank, LowRankConfig(**train, only_where_faster=False))}[method]
    details = prune(sentence_dir, tmp_path / "pruned", small_data, cfg)
    teacher, words = load_sentence_encoder(sentence_dir)
    pruned, _ = load_sentence_encoder(tmp_path / "pruned")
    assert is_sentence_dir(tmp_path / "pruned") and pruned.layout == teacher.layout
    if method == "lowrank":
        assert details["factored"] == {f"encoder.layer.{i}.{p}.dense": 16 for i in range(2)
                                       for p in ("intermediate", "output")}
        assert pruned.transformer.encoder.layer[1].output.dense.rank == 16
    else:
        assert np.array(details["importance"]).shape == (2, 2 if method == "heads" else 64)
    if method == "heads":
        assert {len(v) for v in pruned.config.pruned_heads.values()} == {1}  # one of the two heads of each layer
    elif method == "ffn":
        assert pruned.config.intermediate_size == teacher.config.intermediate_size // 2
    texts = small_data.test.texts
    kept = embedding_metrics(predict_outputs(teacher, words, texts, 64), predict_outputs(pruned, words, texts, 64))
    # chance is 10 of 63; measured 0.84 (heads) and 0.87 (ffn) after 2 epochs on 320 texts
    assert kept["neighbour_overlap"] > 0.5 and details["val_neighbour_overlap"] > 0.5


def test_a_search_on_a_sentence_encoder_is_judged_on_neighbour_overlap(sentence_dir, movie_data, tmp_path):
    """The search on a sentence encoder: its shapes are the encoder's, each trial's student learns the teacher's
    vectors, the constraint judges neighbour overlap with the teacher's (the teacher's own is 1), and the finalists'
    test figures and best.yaml's run are the task's; a point the task's methods refuse (qat) is named at once."""
    import yaml

    from edgepress.search.config import load_search
    from edgepress.search.prepare import check_search
    from tests.test_search import SPACE, search_config
    from tests.test_stagecache import _csv
    from tests.test_trust import invoke

    data = _csv(tmp_path / "d.csv", movie_data)
    config = search_config(tmp_path / "search.yaml", sentence_dir, data,
                           constraints={"accuracy": {"max_drop": 0.9}, "fidelity": {"min_agreement": 0.05}},
                           space={**SPACE, "heads_keep": [1.0], "quantization": ["int8-dynamic"]})
    result = invoke("search", config, "--out", tmp_path / "out", "--trials", 1)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["metric"] == "neighbour_overlap" and report["required_accuracy"] == pytest.approx(0.1)
    trial = report["trials"][0]
    assert trial["stop"] == "passed" and 0 < trial["accuracy"] <= 1 and trial["agreement"] == trial["accuracy"]
    assert report["finalists"]["teacher"]["accuracy"] == 1.0
    finalist = report["finalists"][str(trial["number"])]
    assert 0 < finalist["accuracy"] <= 1 and len(finalist["drop_ci95"]) == 2
    best = report["best"]
    assert best["reproduced"] and best["passed"] and is_sentence_dir(Path(best["bundle"]))
    run = json.loads((tmp_path / "out" / "best" / "report.json").read_text())
    assert run["stages"][0]["method"] == "distill" and run["baseline"]["metrics"]["task"] == "embedding"
    assert "test neighbour overlap" in (tmp_path / "out" / "report.md").read_text()

    body = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**body, "space": {**body["space"], "quantization": ["int8-dynamic", "qat"]}}))
    with pytest.raises(ConfigError, match=r"(?s)point\(s\) of the space cannot run:.*these methods are not built for "
                                          r"embedding models yet") as refused:
        check_search(load_search(config), build_teacher=False)
    assert "quantization qat" in str(refused.value) and "None" not in str(refused.value)  # a point's fields set


def test_vocab_shrinks_a_sentence_encoders_word_table_and_keeps_its_vectors(sentence_dir, movie_data, tmp_path):
    """vocab on a sentence-transformers dir: its Transformer's word table loses the rows the train split never uses,
    the dir stays a sentence-transformers dir, and a text whose pieces were all kept gets the very same vector."""
    from edgepress.compress.vocab import VocabConfig, encode_ids, tokenizer_spec, vocab_prune
    from edgepress.models.evaluate import predict_outputs

    details = vocab_prune(sentence_dir, tmp_path / "vocab", movie_data, VocabConfig())
    before, words = load_sentence_encoder(sentence_dir)
    after, pruned_words = load_sentence_encoder(tmp_path / "vocab")
    assert is_sentence_dir(tmp_path / "vocab") and after.layout == before.layout
    assert details["rows_after"] == after.transformer.get_input_embeddings().num_embeddings < details["rows_before"]
    spec, vocab = tokenizer_spec(words, sentence_dir), set(pruned_words.get_vocab())
    texts, tokens = movie_data.test.texts[:300], {i: t for t, i in words.get_vocab().items()}
    whole = [t for t, ids in zip(texts, encode_ids(spec, texts), strict=True) if all(tokens[i] in vocab for i in ids)]
    assert len(whole) > 100
    np.testing.assert_allclose(predict_outputs(after, pruned_words, whole, 64),
                               predict_outputs(before, words, whole, 64), atol=1e-5)


def test_magnitude_zeroes_a_sentence_encoders_weights_and_recovers_its_neighbours(trained_teacher, tokenizer,
                                                                                   small_data, tmp_path):
    """magnitude on a sentence-transformers dir: half of its encoder Linears' weights exact zeros in the saved
    Transformer, the fine-tune learning the unpruned model's vectors, the epoch kept by validation neighbour overlap."""
    from edgepress.compress.magnitude import MagnitudeConfig, magnitude
    from edgepress.data.metrics import embedding_metrics
    from edgepress.models.evaluate import predict_outputs

    sentence_dir = st_dir(tmp_path, tokenizer, "mean", True, encoder=trained_teacher)
    cfg = MagnitudeConfig(sparsity=0.5, epochs=1, learning_rate=1e-3, max_length=64)
    details = magnitude(sentence_dir, tmp_path / "sparse", small_data, cfg)
    assert details["sparsity"]["pruned_weights_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert "val_neighbour_overlap" in details and "val_accuracy" not in details
    teacher, words = load_sentence_encoder(sentence_dir)
    sparse, _ = load_sentence_encoder(tmp_path / "sparse")
    assert is_sentence_dir(tmp_path / "sparse") and sparse.layout == teacher.layout
    query = sparse.transformer.encoder.layer[0].attention.self.query.weight
    assert 0.4 < float((query == 0).float().mean()) < 0.6  # global magnitude: about half of each matrix
    texts = small_data.test.texts
    kept = embedding_metrics(predict_outputs(teacher, words, texts, 64), predict_outputs(sparse, words, texts, 64))
    assert kept["neighbour_overlap"] > 0.5  # chance is 10 of 63; measured 0.92 after 1 epoch on 320 texts
