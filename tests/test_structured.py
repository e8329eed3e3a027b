import json

import pytest
import torch

from edgepress.compress.structured import FfnConfig, HeadsConfig, ffn, heads, prune_heads
from edgepress.errors import ConfigError, ModelError
from edgepress.models.introspect import param_counts
from edgepress.models.loading import load_classifier
from edgepress.tasks import CLASSIFICATION
from tests.conftest import save, tiny_bert


@pytest.fixture
def four_heads(tmp_path, tokenizer):
    """A tiny 2-layer, 4-head model whose head 2 of layer 0 outputs nothing (its value projection is zero)."""
    model = tiny_bert(tokenizer, seed=6, num_attention_heads=4)
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.value.weight[16:24] = 0  # head 2: dims 16..23 of hidden 32
        model.bert.encoder.layer[0].attention.self.value.bias[16:24] = 0
    return save(model, tokenizer, tmp_path / "model")


def test_heads_removes_the_least_important_heads(four_heads, tmp_path, small_data):
    details = heads(four_heads, tmp_path / "out", small_data, HeadsConfig(keep=0.75, epochs=1, importance_batches=4))
    assert details["importance"][0][2] == pytest.approx(0.0, abs=1e-9)  # a silent head cannot matter
    assert 2 in details["pruned"]["0"] and all(len(r) == 1 for r in details["pruned"].values())
    model, _ = load_classifier(tmp_path / "out")
    assert sorted(model.config.pruned_heads[0]) == details["pruned"]["0"]
    assert model.bert.encoder.layer[0].attention.self.query.out_features == 24  # 3 heads x 8 dims
    original, _ = load_classifier(four_heads)
    assert param_counts(model)["params"] < param_counts(original)["params"]


def test_ffn_keeps_the_same_width_in_every_layer(four_heads, tmp_path, small_data):
    details = ffn(four_heads, tmp_path / "out", small_data, FfnConfig(keep=0.25, epochs=1, importance_batches=4))
    assert details["pruned"] == {"intermediate_size": 16}
    model, _ = load_classifier(tmp_path / "out")
    assert model.config.intermediate_size == 16
    assert all(layer.intermediate.dense.out_features == 16 for layer in model.bert.encoder.layer)
    assert len(details["importance"]) == 2 and len(details["importance"][0]) == 64


def test_structured_pruning_names_the_architectures_it_supports(tmp_path, tokenizer, small_data):
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    src = save(AlbertForSequenceClassification(config), tokenizer, tmp_path / "albert")
    with pytest.raises(ConfigError, match=r"does not know the layer layout of albert models; it knows bert, .* Fix: "):
        heads(src, tmp_path / "out", small_data, HeadsConfig(epochs=1))
    assert not (tmp_path / "out").exists()


def test_a_head_pruned_dir_reloads_exactly_through_edgepress_and_not_through_plain_transformers(
        tmp_path, tokenizer, movie_data):
    """transformers 5 has no prune_heads: edgepress shrinks Q/K/V and the attention output itself, records the
    removed heads in config.json, and rebuilds those shapes before loading the weights."""
    from transformers import AutoModelForSequenceClassification

    model = tiny_bert(tokenizer, seed=3, num_attention_heads=4).eval()
    assert prune_heads(model, [[1, 3], [0, 1, 2]]) == {0: [0, 2], 1: [3]}
    src = save(model, tokenizer, tmp_path / "pruned")
    assert json.loads((src / "config.json").read_text())["pruned_heads"] == {"0": [0, 2], "1": [3]}
    feeds = tokenizer(list(movie_data.test.texts[:6]), padding=True, return_tensors="pt")
    reloaded, _ = load_classifier(src)
    with torch.no_grad():
        assert torch.equal(reloaded(**feeds).logits, model(**feeds).logits)
    assert [layer.attention.self.num_attention_heads for layer in reloaded.bert.encoder.layer] == [2, 3]
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # README: load it with edgepress
        AutoModelForSequenceClassification.from_pretrained(src)


@pytest.mark.parametrize("record", [{"2": [0]}, {"0": [0, 1, 2, 3]}, {"0": [7]}, {"0": "all"}, ["0"], {"0": "12"},
                                    {"0": [1.5]}, {"0": [True]}, {"0": 1}, {"0": None}])
def test_a_pruned_heads_record_that_does_not_fit_the_model_is_a_model_error(record, tmp_path, tokenizer):
    src = save(tiny_bert(tokenizer, num_attention_heads=4), tokenizer, tmp_path / "m")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(config | {"pruned_heads": record}))
    with pytest.raises(ModelError, match=r"pruned_heads must map layer numbers 0\.\.1 to lists of head numbers"):
        load_classifier(src)


def test_heads_are_pruned_once(tmp_path, tokenizer, small_data):
    model = tiny_bert(tokenizer, num_attention_heads=4)
    prune_heads(model, [[0, 1], [2, 3]])
    src = save(model, tokenizer, tmp_path / "pruned")
    with pytest.raises(ConfigError, match=r"already had heads pruned .* Fix: run heads and ffn once each"):
        heads(src, tmp_path / "out", small_data, HeadsConfig(epochs=1))
    ffn(src, tmp_path / "ffn", small_data, FfnConfig(keep=0.5, epochs=1, importance_batches=2))  # ffn after heads
    model, _ = load_classifier(tmp_path / "ffn")
    assert model.config.intermediate_size == 32 and model.bert.encoder.layer[1].attention.self.query.out_features == 16


def test_a_recovery_learns_the_given_teachers_logits(four_heads, tmp_path, small_data, tiny_model_dir, monkeypatch):
    """`teacher`: the recovery fine-tune's targets are that model's logits, not those of the stage's input."""
    from edgepress.compress import kd as kd_module

    real, seen = kd_module.kd_training, []

    def spy(src, model, *rest):
        seen.append((src, model))
        return real(src, model, *rest)

    monkeypatch.setattr(kd_module, "kd_training", spy)
    details = heads(four_heads, tmp_path / "out", small_data,
                    HeadsConfig(keep=0.75, epochs=1, importance_batches=4, teacher=tiny_model_dir))
    (src, model), = seen
    teacher, _ = load_classifier(tiny_model_dir)
    assert src == tiny_model_dir and details["recovered_from"] == str(tiny_model_dir)
    assert model.config.num_attention_heads == 2  # the teacher's, not the 4-head student's
    assert torch.equal(model.classifier.weight, teacher.classifier.weight)
    heads(four_heads, tmp_path / "own", small_data, HeadsConfig(keep=0.75, epochs=1, importance_batches=4))
    assert seen[1][0] == four_heads


def test_after_vocab_pruning_the_teacher_reads_the_texts_with_its_own_tokenizer(four_heads, tmp_path, small_data,
                                                                                  monkeypatch):
    from edgepress.compress import kd as kd_module
    from edgepress.compress.vocab import vocab_prune

    vocab_prune(four_heads, tmp_path / "small", small_data)
    real, seen = kd_module.kd_training, []
    monkeypatch.setattr(kd_module, "kd_training",
                        lambda src, model, words, *rest: seen.append(words) or real(src, model, words, *rest))
    heads(tmp_path / "small", tmp_path / "out", small_data,
          HeadsConfig(keep=0.75, epochs=1, importance_batches=4, teacher=four_heads))
    student_words, teacher_words = load_classifier(tmp_path / "small")[1], load_classifier(four_heads)[1]
    assert len(student_words) < len(teacher_words) == len(seen[0])  # renumbered ids would be other words


def test_a_teacher_that_is_missing_or_names_other_labels_is_refused_before_running(four_heads, tmp_path, tokenizer):
    from edgepress.compress.structured import check_structured

    model, _ = load_classifier(four_heads)
    check_structured(model, tokenizer, HeadsConfig(teacher="baseline"), CLASSIFICATION)  # filled in by the runner
    with pytest.raises(ConfigError, match=r"teacher .*nope does not exist\. Fix: the model dir the student was"):
        check_structured(model, tokenizer, HeadsConfig(teacher=tmp_path / "nope"), CLASSIFICATION)
    swapped = tiny_bert(tokenizer)
    swapped.config.id2label, swapped.config.label2id = {0: "positive", 1: "negative"}, {"positive": 0, "negative": 1}
    save(swapped, tokenizer, tmp_path / "swapped")
    with pytest.raises(ConfigError, match="its logits would teach the wrong classes"):
        check_structured(model, tokenizer, FfnConfig(teacher=tmp_path / "swapped"), CLASSIFICATION)


def test_teacher_baseline_is_the_runs_baseline(tmp_path, tiny_model_dir, movie_data):
    import yaml

    from edgepress.pipeline import runner
    from edgepress.pipeline.config import load_config
    from tests.test_data import write_csv

    rows = [{"text": t, "label": movie_data.id2label[int(y)]} for t, y in
            zip(movie_data.train.texts[:400], movie_data.train.labels[:400], strict=True)]

    stages = [{"name": "distill", "method": "distill", "params": {"student_layers": 1, "epochs": 1}},
              {"name": "ffn", "method": "ffn",
               "params": {"keep": 0.5, "epochs": 1, "importance_batches": 2, "teacher": "baseline"}}]
    data = {"source": str(write_csv(tmp_path / "d.csv", rows))}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "data": data, "runtime": {"threads": 1, "latency": {"runs": 5}},
        "stages": stages}))
    report = runner.run_pipeline(load_config(tmp_path / "p.yaml"), tmp_path / "run")
    assert report["stages"][1]["details"]["recovered_from"] == str(tiny_model_dir)
    config = json.loads((tmp_path / "run" / "stages" / "02-ffn" / "config.json").read_text())
    assert config["params"]["teacher"] == str(tiny_model_dir)
