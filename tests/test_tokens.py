"""Token classifiers (NER) through a run: a tiny BERT token classifier trained on real CoNLL-2003 sentences, its data
read from files, predictions read per word, exported and quantized with entity-level F1 gates."""

import json

import numpy as np
import pytest
import yaml

from edgepress.errors import ConfigError, DataError
from tests.conftest import conll_text
from tests.test_bundle import chromium, open_page, transformers_js, web

FAST = {"providers": ["cpu"], "threads": 1, "latency": {"warmup": 2, "runs": 5}}


@pytest.fixture(scope="session")
def ner_dir(tmp_path_factory, conll):
    """A data directory as a user gives it: train and dev CoNLL files, the test split as JSON lines."""
    path = tmp_path_factory.mktemp("ner-data")
    (path / "train.conll").write_text(conll_text(conll["train"]))
    (path / "dev.txt").write_text("-DOCSTART- -X- -X- O\n\n" + conll_text(conll["validation"]))
    (path / "test.jsonl").write_text("".join(json.dumps({"tokens": w, "tags": t}) + "\n" for w, t in conll["test"]))
    return path


def run_config(tmp_path, model, data, stages, **data_fields):
    from edgepress.pipeline.config import load_config

    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"model": str(model), "data": {"source": str(data), "max_length": 64,
                                                                    **data_fields},
                                      "runtime": FAST, "stages": stages}))
    return load_config(config)


def test_a_token_classifier_dir_is_its_own_task_with_the_models_tags(token_model, tmp_path):
    from edgepress.tasks import task_of

    task = task_of(token_model)
    assert task.name == "token-classification" and task.primary == "f1" and task.scheme == "IOB2"
    assert task.tags[:3] == ("O", "B-PER", "I-PER")
    with pytest.raises(ConfigError, match=r"task: classification, but the model .* is a token classifier .*Fix: "
                                          r"task: token-classification"):
        task_of(token_model, "classification")
    config = json.loads((token_model / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, "id2label": {"0": "O", "1": "PERSON"},
                                                 "label2id": {"O": 0, "PERSON": 1}}))
    with pytest.raises(DataError, match=r"id2label: the tags 'PERSON' are not O or B-/I-/E-/S-TYPE"):
        task_of(bad)


def test_tagged_splits_are_read_from_a_directory_and_checked_against_the_model(ner_dir, conll, tmp_path):
    from edgepress.data import DataConfig
    from edgepress.data.conll import TAGS
    from edgepress.data.tagged import TaggedSet, load_tagged

    label2id = {t: i for i, t in enumerate(TAGS)}
    data = load_tagged(DataConfig(source=str(ner_dir)), label2id)
    assert (len(data.train), len(data.validation), len(data.test)) == (600, 120, 150) and not data.note
    assert isinstance(data.test, TaggedSet) and list(data.test.words[0]) == conll["test"][0][0]
    assert [TAGS[t] for t in data.test.tags[0]] == conll["test"][0][1]
    manifest = data.manifest()
    assert manifest["class_counts"]["test"]["B-PER"] == sum(t.count("B-PER") for _, t in conll["test"])
    # the tags are part of what a stage's result depends on
    relabelled = load_tagged(DataConfig(source=str(ner_dir)), {t: (i + 1) % 9 for i, t in enumerate(TAGS)})
    assert relabelled.content_sha256() != data.content_sha256()
    # the typos copy keeps the words apart and the true tags
    typos = data.scored()["typos"]
    assert isinstance(typos, TaggedSet) and [len(w) for w in typos.words] == [len(w) for w in data.test.words]
    with pytest.raises(DataError, match=r"the model has no tag 'B-MISC', 'I-MISC'; its tags are: O, B-PER"):
        load_tagged(DataConfig(source=str(ner_dir)), {t: i for i, t in enumerate(TAGS[:7])})
    with pytest.raises(DataError, match=r"data.fidelity_sets not built for token classifiers yet"):
        load_tagged(DataConfig(source=str(ner_dir), fidelity_sets={"mine": str(ner_dir / "train.conll")}), label2id)
    (tmp_path / "test.csv").write_text("text,label\n")
    with pytest.raises(DataError, match=r"has no train file of a token classifier's data"):
        load_tagged(DataConfig(source=str(tmp_path)), label2id)
    one = tmp_path / "all.jsonl"
    one.write_text(json.dumps({"tokens": ["New York"], "tags": ["B-LOC"]}) + "\n")
    with pytest.raises(DataError, match=r"sentence 1 has the word 'New York', empty or holding white space"):
        load_tagged(DataConfig(source=str(one)), label2id)


def test_torch_and_onnx_read_the_same_tag_for_every_word(token_model, ner_dir, tmp_path):
    from edgepress.data import DataConfig
    from edgepress.data.tagged import load_tagged
    from edgepress.device.predictor import Predictor
    from edgepress.export.onnx import export_onnx
    from edgepress.models.loading import label2id_of, load_classifier
    from edgepress.tasks import task_of

    task = task_of(token_model)
    data = load_tagged(DataConfig(source=str(ner_dir)), label2id_of(token_model))
    model, tokenizer = load_classifier(token_model)
    torch_tags = task.torch_predictions(model, tokenizer, data.test.texts, 64)
    assert torch_tags.shape == (150, max(len(w) for w in data.test.words))
    assert all((row[len(w):] == -1).all() and (row[:len(w)] >= 0).all()
               for row, w in zip(torch_tags, data.test.words, strict=True))
    assert task.scores(data.test, torch_tags)["f1"] > 0.2  # trained: far above what random tags find
    export_onnx(token_model, tmp_path / "onnx", data.validation.texts)
    predictor = Predictor(tmp_path / "onnx", max_length=64)
    assert np.array_equal(task.onnx_predictions(predictor, data.test.texts, "tags"), torch_tags)
    # a word cut off by max_length is read as O, never dropped
    short = Predictor(tmp_path / "onnx", max_length=8)
    logits = short.word_logits(list(data.test.words[1]) * 3)
    assert np.isnan(logits[-1]).all() and not np.isnan(logits[0]).any()
    with pytest.raises(Exception, match="is a token classifier: it tags each word"):
        predictor.predict(["EU rejects German call"])


def test_parity_of_token_logits_reads_the_real_tokens_alone():
    from edgepress.errors import ExportParityError
    from edgepress.export.parity import ParityConfig, check_parity

    feeds = [{"input_ids": np.ones((2, 4), np.int64), "attention_mask": np.array([[1, 1, 1, 1], [1, 1, 0, 0]])}]
    logits = np.random.default_rng(0).normal(size=(2, 4, 3)).astype(np.float32)
    padded_differs = logits.copy()
    padded_differs[1, 2:] += 5  # what a runtime leaves in padding is no prediction
    result = check_parity(lambda f: logits, lambda f: padded_differs, feeds, ParityConfig(), "graph")
    assert result["n_examples"] == 6 and result["examples"] == "tokens" and result["max_abs_diff"] == 0
    real_differs = logits.copy()
    real_differs[1, 1] += 5
    with pytest.raises(ExportParityError, match=r"on 6 real tokens"):
        check_parity(lambda f: logits, lambda f: real_differs, feeds, ParityConfig(), "graph")


def test_a_token_run_is_gated_on_entity_f1_and_reports_each_type(token_model, ner_dir, tmp_path):
    from edgepress.pipeline import runner

    stages = [{"name": "export", "method": "export"}, {"name": "fuse", "method": "optimize"},
              {"name": "int8", "method": "int8-dynamic", "params": {"per_channel": True},
               "gates": {"accuracy": {"max_drop": 0.05, "strict": True}}}]
    out = tmp_path / "run"
    report = runner.run_pipeline(run_config(tmp_path, token_model, ner_dir, stages), out)
    base = report["baseline"]["metrics"]
    assert base["primary_metric"] == "f1" and base["f1"] > 0.2 and base["n_entities"] > 200
    assert set(base["per_type"]) == {"PER", "ORG", "LOC", "MISC"}
    export, _, int8 = (s["metrics"] for s in report["stages"])
    assert export["f1"] == base["f1"] and export["agreement"] == 1 and export["f1_drop_ci95"] == [0.0, 0.0]
    assert report["stages"][0]["details"]["parity"]["examples"] == "tokens"
    lo, hi = int8["f1_drop_ci95"]
    assert lo <= base["f1"] - int8["f1"] <= hi and 0.5 < int8["agreement"] <= 1
    gate = next(g for g in report["stages"][2]["gates"] if g["kind"] == "accuracy")
    assert gate["metric"] == "f1" and gate["strict"] and gate["value"] == pytest.approx(hi)
    assert "f1" in int8["sets"]["typos"] and "agreement" in int8["sets"]["typos"]
    markdown = (out / "report.md").read_text()
    assert "| stage | status | f1 [95% CI] | agreement [95% CI] |" in markdown
    assert "## Entities" in markdown and "| stage | LOC | MISC | ORG | PER |" in markdown
    assert "test 150 sentences; tags: " in markdown
    assert "F1 per entity type" in (out / "report.html").read_text()
    manifest = json.loads((out / "final" / "edgepress.json").read_text())  # what a device reads of the bundle
    assert manifest["task"] == "token-classification" and manifest["labels"]["1"] == "B-PER"
    from typer.testing import CliRunner

    from edgepress.cli.app import app

    result = CliRunner().invoke(app, ["evaluate", str(out), "--data", str(ner_dir)])  # at the bundle's max_length
    assert result.exit_code == 0 and f"entity F1 {int8['f1']:.4f}" in result.output, result.output
    # --resume reuses every stage, the tags read back from predictions.json
    again = runner.run_pipeline(run_config(tmp_path, token_model, ner_dir, stages), out, resume=True)
    assert again["stages"][2]["metrics"]["f1"] == int8["f1"] and "int8: reused" in (out / "run.log").read_text()


@pytest.mark.parametrize("stages", [["export", "int8-static"], ["export", "int4"], ["export", "fp16"],
                                    ["vocab", "export"]], ids=lambda s: "-".join(s))
def test_the_methods_that_need_no_training_run_on_a_token_classifier(token_model, ner_dir, tmp_path, stages):
    from edgepress.pipeline import runner

    config = [{"name": method, "method": method} for method in stages]
    config[-1] |= {"params": {"providers": ["cpu"]}} if stages[-1] == "fp16" else {}  # checked on the CPU here
    config[-1]["gates"] = {"accuracy": {"max_drop": 0.1}}
    report = runner.run_pipeline(run_config(tmp_path, token_model, ner_dir, config), tmp_path / "run")
    assert all(s["status"] == "passed" for s in report["stages"]) and report["stages"][-1]["metrics"]["f1"] > 0.15
    if stages[0] == "vocab":  # the rows the train split's words never use are gone
        vocab = report["stages"][0]["metrics"]
        assert vocab["params"] < 0.5 * report["baseline"]["metrics"]["params"] and vocab["agreement"] > 0.5


def test_a_token_run_refuses_what_is_not_built_for_it_yet(token_model, ner_dir, tmp_path):
    from edgepress.pipeline.inputs import check_inputs

    cfg = run_config(tmp_path, token_model, ner_dir, [{"name": "d", "method": "distill", "params": {
        "augment": {"factor": 1}}}])
    with pytest.raises(ConfigError, match=r"stage 'd' \(distill\): augment makes perturbed copies .* not built for "
                                          r"token classifiers. Fix: remove augment"):
        check_inputs(cfg)
    cfg = run_config(tmp_path, token_model, ner_dir, [{"name": "export", "method": "export", "gates": {
        "accuracy": {"max_drop": 0.1, "metric": "accuracy"}}}])
    with pytest.raises(ConfigError, match=r"accuracy.metric accuracy is not measured on token-classification models"):
        check_inputs(cfg)


@pytest.fixture(scope="module")
def token_onnx(tmp_path_factory, token_model, conll):
    from edgepress.export.onnx import export_onnx

    out = tmp_path_factory.mktemp("token-onnx") / "model"
    export_onnx(token_model, out, tuple(" ".join(w) for w, _ in conll["validation"]))
    return out


@pytest.mark.parametrize("aggregation", ["simple", "first", "max", "average"])
def test_the_entities_in_raw_text_are_transformers_pipelines(token_model, token_onnx, conll, aggregation):
    import warnings

    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    from edgepress.device.predictor import Predictor

    predictor = Predictor(token_onnx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = pipeline("token-classification", model=AutoModelForTokenClassification.from_pretrained(token_model),
                             tokenizer=AutoTokenizer.from_pretrained(token_model), aggregation_strategy=aggregation)
    texts = [" ".join(words) for words, _ in conll["test"][:40]] + ["Peter Blackburn flew to Zwolle, then New York."]
    found = 0
    for text in texts:
        theirs, ours = reference(text), predictor.entities(text, aggregation)
        assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in theirs] == \
            [(e["entity_group"], e["word"], e["start"], e["end"]) for e in ours], text
        assert [float(e["score"]) for e in theirs] == pytest.approx([e["score"] for e in ours], abs=1e-4)
        found += len(ours)
    assert found > 20  # the comparison saw entities, not empty lists


def test_predict_py_and_edgepress_predict_print_the_entities(token_onnx, tmp_path):
    import subprocess
    import sys

    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.predictor import Predictor
    from tests.test_trust import invoke

    out = tmp_path / "bundle"
    bundle_model(token_onnx, out)
    text = "EU rejects German call to boycott British lamb ."
    expected = Predictor(token_onnx).entities(text, "first")
    done = subprocess.run([sys.executable, str(out / "predict.py"), text, "--aggregation", "first", "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {"text": text, "entities": expected}
    printed = invoke("predict", str(out), text, "--aggregation", "first").output
    assert printed.splitlines()[0] == text and len(printed.splitlines()) == 1 + len(expected)
    with pytest.raises(Exception, match="unknown aggregation 'all'"):
        Predictor(token_onnx).entities(text, "all")


@web
@pytest.mark.parametrize("graph", ["fp32", "int8"])
def test_transformers_js_under_node_tags_every_token_as_the_predictor_does(token_onnx, conll, tmp_path, graph):
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.predictor import Predictor

    source = token_onnx
    if graph == "int8":  # 7-bit weights per channel: as a run ships int8 for x86 without VNNI
        int8_dynamic(token_onnx, tmp_path / "int8", tuple(" ".join(w) for w, _ in conll["validation"][:64]),
                     Int8DynamicConfig(per_channel=True, reduce_range=True))
        source = tmp_path / "int8"
    out = bundle_model(source, tmp_path / "site", "web")
    assert json.loads((out / "edgepress.json").read_text())["web"]["pipeline"] == "token-classification"
    texts = [" ".join(words) for words, _ in conll["test"][:60]]
    result = transformers_js(out, texts, tmp_path, "tag.mjs")
    assert result["dtype"] == {"fp32": "fp32", "int8": "q8"}[graph]
    predictor = Predictor(out)
    tagged = 0
    for text, theirs, entities in zip(texts, result["tokens"], result["entities"], strict=True):
        ours = predictor.entities(text, "none")
        # the same graph file on ONNX Runtime's native CPU kernels (onnxruntime-node there, onnxruntime here): the
        # same tag at every token, its probability to float32 rounding (softmax in float32 there, float64 here)
        assert [(t["entity"], t["index"]) for t in theirs] == [(t["entity"], t["index"]) for t in ours], text
        assert [t["score"] for t in theirs] == pytest.approx([t["score"] for t in ours], abs=1e-5)
        # transformers.js leaves O out before it joins tags, transformers after: the entities are the same unless an
        # O lies between two tags of one type
        if not _o_between(ours):
            grouped = predictor.entities(text, "simple")
            assert [(e["entity_group"], e["word"]) for e in entities] == \
                [(e["entity_group"], e["word"]) for e in grouped], text
        tagged += len(ours)
    assert tagged > 50


def _o_between(tokens: list[dict]) -> bool:
    """Two tagged tokens of one type with an untagged (O) token between them: where transformers.js joins what
    transformers keeps apart."""
    return any(b["index"] - a["index"] > 1 and a["entity"][2:] == b["entity"][2:] and b["entity"].startswith("I-")
               for a, b in zip(tokens, tokens[1:], strict=False))


@web
@chromium
def test_the_page_shows_the_entities_of_a_sentence_in_headless_chromium(token_onnx, tmp_path):
    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.predictor import Predictor

    out = bundle_model(token_onnx, tmp_path / "site", "web")
    text = "EU rejects German call to boycott British lamb ."
    result = open_page(out, text, tmp_path / "page.png")
    found = json.loads(result["result"])
    expected = Predictor(out).entities(text, "simple")
    assert [(e["entity_group"], e["word"]) for e in found] == [(e["entity_group"], e["word"]) for e in expected]
    assert result["shown"] == (f"{len(found)} entities" if found else "no entity")
    assert all(url.startswith("http://127.0.0.1:") for url in result["requests"])


def test_a_token_classifier_bundles_for_mobile_as_a_classifier_does(token_onnx, tmp_path):
    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.sessions import load_session

    out = bundle_model(token_onnx, tmp_path / "mobile", "mobile")
    mobile = json.loads((out / "edgepress.json").read_text())["mobile"]
    assert mobile["ort_vs_onnx_max_abs_diff"] < 1e-4  # every token's logits, checked at bundling
    session = load_session(out / mobile["ort_model"])
    assert [o.shape for o in session.get_outputs()] == [["batch_size", "sequence_length", 9]]


def test_every_training_method_learns_each_words_tag(token_model, ner_dir, conll, tmp_path):
    """distill (TinyBERT's losses beside the per-word soft targets) -> heads -> ffn -> magnitude -> lottery (against
    its random control) -> qat -> its export: each stage trained on the tagged words, kept by validation F1, and
    measured on the test split's entities."""
    from edgepress.pipeline import runner

    train = {"epochs": 1, "batch_size": 16, "learning_rate": 1e-3}
    stages = [{"name": "distill", "method": "distill", "params": {"student_layers": 1, "style": "tinybert", **train}},
              {"name": "heads", "method": "heads", "params": {"keep": 0.5, "importance_batches": 4, **train}},
              {"name": "ffn", "method": "ffn", "params": {"keep": 0.5, "importance_batches": 4, "teacher": "baseline",
                                                          **train}},
              {"name": "magnitude", "method": "magnitude", "params": {"sparsity": 0.3, **train}},
              {"name": "lottery", "method": "lottery", "params": {"sparsity": 0.4, "rounds": 1, "control": "random",
                                                                  **train}},
              {"name": "qat", "method": "qat", "params": {"reduce_range": True, **train}},
              {"name": "export", "method": "export"}]
    for stage in stages:
        stage["gates"] = {"accuracy": {"max_drop": 0.5}}
    from edgepress.data.conll import conll2003

    # transfer data: raw sentences the teacher tags, one of them a test sentence (left out: judged on)
    raw = [" ".join(words) for words, _ in conll2003("train")[600:680]] + ["Japan 's " + "Nikkei rose ."]
    (tmp_path / "raw.txt").write_text("\n".join([*raw, " ".join(conll["test"][0][0])]) + "\n")
    config = run_config(tmp_path, token_model, ner_dir, stages, unlabeled=str(tmp_path / "raw.txt"))
    report = runner.run_pipeline(config, tmp_path / "run")
    assert [s["status"] for s in report["stages"]] == ["passed"] * len(stages)
    held = {" ".join(words) for part in ("validation", "test") for words, _ in conll[part]}
    kept = [text for text in raw if text not in held]
    assert f"{len(raw) + 1 - len(kept)} unlabeled texts also in the validation or test split" in report["data"]["note"]
    details = {s["name"]: s["details"] for s in report["stages"]}
    assert details["distill"]["transfer_examples"] == len(kept) > 70
    for name in ("distill", "heads", "ffn", "magnitude", "qat"):
        assert 0 < details[name]["val_f1"] <= 1 and [h["val_f1"] for h in details[name]["history"]]
    assert details["distill"]["layer_map"] == [0] and details["heads"]["pruned"]
    assert details["ffn"]["recovered_from"] != details["heads"]["recovered_from"]  # the baseline taught it
    control = details["lottery"]["control_test"]
    assert details["lottery"]["score"] == "f1" and 0 <= control["f1"] <= 1
    assert len(control["ticket_minus_control_ci95"]) == 2
    assert details["magnitude"]["sparsity"]["pruned_weights_sparsity"] >= 0.3
    assert report["stages"][-1]["details"]["parity"]["examples"] == "tokens"
    assert all(s["metrics"]["f1"] > 0.05 for s in report["stages"])
    assert "Ticket against its random control, validation f1" in (tmp_path / "run" / "report.md").read_text()


def test_a_search_on_a_token_classifier_is_judged_on_entity_f1(token_model, ner_dir, tmp_path):
    """The search on a token classifier: each trial's student learns every word's tag, the constraint and the
    agreement are the task's (entity F1, against the teacher's tags), and best.yaml's run is a token run; augment
    (perturbed copies, whose words would lose their tags) is refused before anything trains."""
    from tests.test_search import SPACE, search_config
    from tests.test_trust import invoke

    config = search_config(tmp_path / "search.yaml", token_model, ner_dir,
                           constraints={"accuracy": {"max_drop": 0.9}},
                           space={**SPACE, "heads_keep": [1.0], "quantization": ["int8-dynamic"]})
    result = invoke("search", config, "--out", tmp_path / "out", "--trials", 1)
    assert result.exit_code == 0, result.output
    assert "trial 0: passed" in result.output and "f1 0." in result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    trial, teacher = report["trials"][0], report["finalists"]["teacher"]
    assert report["metric"] == "f1" and trial["stop"] == "passed" and 0 < trial["agreement"] <= 1
    assert 0 < teacher["accuracy"] < 1 and teacher["accuracy_ci95"][0] < teacher["accuracy"]
    run = json.loads((tmp_path / "out" / "best" / "report.json").read_text())
    assert run["baseline"]["metrics"]["task"] == "token-classification" and report["best"]["reproduced"]
    assert run["stages"][-1]["metrics"]["f1"] == report["best"]["accuracy"]
    assert "| model | test f1 |" in (tmp_path / "out" / "report.md").read_text()

    body = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**body, "augment": {"factor": 1}}))
    refused = invoke("search", config, "--out", tmp_path / "out2", "--trials", 1)
    assert refused.exit_code == 2 and "augment makes perturbed copies" in refused.output
    assert not (tmp_path / "out2").exists()


def test_a_training_batch_labels_each_words_first_sub_word_and_knows_its_word(tokenizer):
    """The loop's batches of tagged sentences: each word's tag at its first sub-word, IGNORED at the rest and the
    padding, and the number of the word each position starts (what a per-word distillation target is placed by)."""
    from edgepress.data.tagged import IGNORED, TaggedSet
    from edgepress.models.train import TrainConfig, train_loader

    words = [("Tokyo", "unbelievably", "rains", "."), ("Hi",)]
    part = TaggedSet.of(["a", "b"], words, [[5, 0, 0, 0], [1]])
    (batch,) = train_loader(tokenizer, part, TrainConfig(batch_size=2, seed=0))
    for row, i in enumerate(batch["index"].tolist()):
        encoding = tokenizer(list(words[i]), is_split_into_words=True)
        width = len(encoding["input_ids"])
        starts = [p for p, w in enumerate(encoding.word_ids()) if w is not None and w != encoding.word_ids()[p - 1]]
        expected = np.full(batch["input_ids"].shape[1], IGNORED)
        expected[starts] = part.tags[i]
        assert batch["labels"][row].tolist() == expected.tolist()
        index = np.full(batch["input_ids"].shape[1], -1)
        index[starts] = range(len(words[i]))
        assert batch["word_index"][row].tolist() == index.tolist() and batch["attention_mask"][row].sum() == width
    assert tokenizer.tokenize("unbelievably") != ["unbelievably"]  # a word of several sub-words is in the case


def test_the_per_word_soft_targets_are_read_at_each_words_first_sub_word():
    """The hinton loss of a token classifier: at the labelled positions only, a word the teacher has no logits for
    (NaN: cut off in its tokens) left out; the mean over the words equals the sentence-level loss on those rows."""
    import torch

    from edgepress.compress.distill import DistillConfig
    from edgepress.compress.kd import at_positions, hinton

    torch.manual_seed(0)
    cfg = DistillConfig(temperature=2.0, alpha=0.5)
    words = torch.randn(2, 3, 4)  # (sentences, words, labels): the cached teacher targets
    words[1, 2] = float("nan")  # sentence 1 has 2 words, or its third was cut off
    word_index = torch.tensor([[-1, 0, -1, 1, 2, -1], [-1, 0, 1, 2, -1, -1]])
    labels = torch.tensor([[-100, 1, -100, 0, 3, -100], [-100, 2, 2, 1, -100, -100]])
    placed = at_positions(words, word_index)
    assert torch.equal(placed[0, 3], words[0, 1]) and placed[0, 0].isnan().all() and placed[1, 3].isnan().all()
    student = torch.randn(2, 6, 4)
    rows = [(0, 1), (0, 3), (0, 4), (1, 1), (1, 2)]  # labelled, with a teacher row
    expected = hinton(torch.stack([student[r] for r in rows]), torch.stack([placed[r] for r in rows]),
                       torch.stack([labels[r] for r in rows]), cfg)
    assert torch.allclose(hinton(student, placed, labels, cfg), expected)
    gold = torch.tensor([True, False])  # sentence 1 a transfer example: its words have the soft loss alone
    soft = DistillConfig(temperature=2.0, alpha=1.0)
    mixed = torch.stack([hinton(student[r][None], placed[r][None], labels[r][None], cfg if r[0] == 0 else soft)
                         for r in rows]).mean()
    assert torch.allclose(hinton(student, placed, labels, cfg, gold), mixed)
    assert hinton(student, placed, torch.full_like(labels, -100), cfg) == 0  # no word: no loss, and no NaN


def test_evaluate_scores_a_token_classifier_on_every_split(token_model, ner_dir, conll):
    """`edgepress evaluate` on tagged data: entity F1 with its CI, the split asked for; `--split all` every
    sentence of the three files with its tags."""
    from typer.testing import CliRunner

    from edgepress.cli.app import app
    from edgepress.data import DataConfig
    from edgepress.pipeline.evaluate import evaluate_model

    every = evaluate_model(str(token_model), DataConfig(source=str(ner_dir), max_length=64), "all")
    test = evaluate_model(str(token_model), DataConfig(source=str(ner_dir), max_length=64), "test")
    assert every["n_test"] == sum(len(s) for s in conll.values()) and test["n_test"] == len(conll["test"])
    assert every["n_entities"] > test["n_entities"] and 0.15 < test["f1"] <= 1
    result = CliRunner().invoke(app, ["evaluate", str(token_model), "--data", str(ner_dir), "--max-length", "64"])
    assert result.exit_code == 0, result.output
    assert f"entity F1 {test['f1']:.4f}" in result.output and f"sentences={len(conll['test'])} (test)" in result.output


def test_a_quantized_token_graph_is_checked_loosely_per_token_only_where_parity_is_left_at_its_default(
        token_onnx, conll, tmp_path, monkeypatch):
    """Over every token of the parity sentences, the largest logit move of a good int8 graph exceeds a classifier's
    loose default: left at the default, a token graph is held to TOKEN_LOOSE_DIFF; a `parity` the user sets is
    kept as set."""
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.errors import ExportParityError
    from edgepress.export import parity
    from edgepress.pipeline.attempt import _parity_gates

    checked = []
    original = parity.check_parity
    monkeypatch.setattr(parity, "check_parity", lambda *a, **k: checked.append(a[3]) or original(*a, **k))
    texts = tuple(" ".join(w) for w, _ in conll["validation"])
    done = int8_dynamic(token_onnx, tmp_path / "default", texts, Int8DynamicConfig(max_length=64))
    assert done["parity"]["examples"] == "tokens"
    assert checked[-1].max_abs_diff == parity.TOKEN_LOOSE_DIFF and checked[-1].min_agreement == 0.9
    tight = {"max_abs_diff": done["parity"]["max_abs_diff"] / 2, "min_agreement": 0.5}
    with pytest.raises(ExportParityError, match=r"max \|Δlogit\|") as missed:
        int8_dynamic(token_onnx, tmp_path / "set", texts, Int8DynamicConfig(max_length=64, parity=tight))
    assert checked[-1].max_abs_diff == tight["max_abs_diff"] == missed.value.limits.max_abs_diff
    # a miss of the loose default is recorded with the limit the check applied, not the method's configured one
    loose = ExportParityError("missed", missed.value.result, checked[0])
    recorded = {gate["rule"]: gate["limit"] for gate in _parity_gates(loose, Int8DynamicConfig())}
    assert recorded == {"max_abs_diff": parity.TOKEN_LOOSE_DIFF, "min_agreement": 0.9}


def test_init_starts_a_token_classifier_on_its_tagged_data(token_model, ner_dir, tmp_path):
    from edgepress.tasks import resolvable_drop
    from tests.test_trust import invoke

    result = invoke("init", token_model, ner_dir, "--out", tmp_path / "p.yaml")
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert [s["name"] for s in config["stages"]] == ["distill", "heads", "ffn", "export", "fuse", "int8"]
    assert config["stages"][-1]["gates"]["accuracy"] == {"max_drop": resolvable_drop(150)}  # what validate asks
    said = " ".join(line[2:] for line in (tmp_path / "p.yaml").read_text().splitlines() if line.startswith("# "))
    assert "BertForTokenClassification, 2 layers" in said and "9 tags (O, B-PER, I-PER" in said
    assert "train 600, validation 120, test 150 examples" in said and "entity-level F1" in said
    assert "vocab left out: a token classifier meets names its train split never had" in said
    checked = invoke("validate", tmp_path / "p.yaml")
    assert checked.exit_code == 0 and "inside the noise" not in checked.output


@pytest.fixture(scope="module")
def token_cascade(tmp_path_factory, token_model, ner_dir):
    from edgepress.pipeline import runner

    root = tmp_path_factory.mktemp("token-cascade")
    stages = [{"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"},
              {"name": "cascade", "method": "cascade",
               "params": {"fallback_precision": "fp32", "min_agreement": 0.99, "confidence": "margin"}}]
    return root / "run", runner.run_pipeline(run_config(root, token_model, ner_dir, stages), root / "run")


def test_a_token_classifiers_cascade_decides_once_a_sentence_by_its_least_sure_token(token_cascade, conll):
    from edgepress.device.cascade import FALLBACK, STUDENT, Cascade
    from edgepress.device.predictor import Predictor

    run, report = token_cascade
    stage = report["stages"][-1]
    assert stage["status"] == "passed" and stage["details"]["cascade"]["validation"]["agreement"] >= 0.99
    assert 0 < stage["metrics"]["deferred"] < 1  # whole sentences go to the fallback, not tokens
    bundle = run / "final"
    cascade, own = Cascade(bundle), {STUDENT: Predictor(bundle), FALLBACK: Predictor(bundle / FALLBACK)}
    for words, _ in conll["test"][:40]:
        text = " ".join(words)
        answer = cascade.answer(text)
        assert cascade.entities(text) == own[answer.model].entities(text)
        assert np.array_equal(cascade.word_logits(words), own[cascade.answer(list(words), True).model]
                              .word_logits(words), equal_nan=True)


@web
def test_a_token_classifiers_cascade_on_the_web_routes_each_sentence_as_predict_py(token_cascade, conll, tmp_path):
    from edgepress.deploy.bundle import bundle_model
    from edgepress.device.cascade import FALLBACK, STUDENT, Cascade
    from edgepress.device.predictor import Predictor

    run, _ = token_cascade
    out = bundle_model(run, tmp_path / "site", "web")
    cascade = Cascade(out)
    texts = [" ".join(words) for words, _ in conll["test"][:60]]
    routes = [cascade.answer(text).model for text in texts]
    assert set(routes) == {STUDENT, FALLBACK}
    result = transformers_js(out, texts, tmp_path, "tag.mjs")
    assert result["models"] == routes
    np.testing.assert_allclose(result["confidences"], [cascade.answer(text).confidence for text in texts], atol=1e-5)
    own = {STUDENT: Predictor(out), FALLBACK: Predictor(out / FALLBACK)}
    for text, route, theirs in zip(texts, routes, result["tokens"], strict=True):
        if len(cascade.student.tokenizer.encode(text).ids) >= cascade.max_length:
            continue  # transformers.js's pipeline cuts a long text's [SEP] off (cascade.mjs decides without it)
        ours = own[route].entities(text, "none")
        assert [(t["entity"], t["index"]) for t in theirs] == [(t["entity"], t["index"]) for t in ours], text
