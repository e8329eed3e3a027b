import pytest
import torch

from edgepress.compress.distill import (
    AttentionScores,
    DistillConfig,
    _attention_loss,
    _hidden_loss,
    default_layer_map,
    distill,
    make_student,
)
from edgepress.data.dataset import DataSplits
from edgepress.errors import ConfigError
from edgepress.models.evaluate import evaluate_classifier
from edgepress.models.loading import load_classifier
from tests.conftest import tiny_bert, tiny_distilbert


def small(data, n_train=300) -> DataSplits:
    return DataSplits(data.train.take(n_train), data.validation.take(100), data.test.take(300), data.id2label,
                      data.source)


def test_default_layer_map_spreads_from_the_bottom():
    assert default_layer_map(6, 3) == (0, 2, 4)
    assert default_layer_map(12, 4) == (0, 3, 6, 9)
    assert default_layer_map(4, 1) == (0,)


@pytest.mark.parametrize("builder", [tiny_bert, tiny_distilbert], ids=["bert", "distilbert"])
def test_student_is_initialised_from_the_mapped_teacher_layers(builder, tokenizer):
    teacher = builder(tokenizer, n_layers=4) if builder is tiny_distilbert else builder(tokenizer, num_hidden_layers=4)
    student, mapping = make_student(teacher, DistillConfig(student_layers=2, layer_map=(1, 3)))
    assert mapping == (1, 3)
    t_state, s_state = teacher.state_dict(), student.state_dict()
    layers = "bert.encoder.layer" if builder is tiny_bert else "distilbert.transformer.layer"
    for i, j in enumerate(mapping):
        for key in (k for k in t_state if k.startswith(f"{layers}.{j}.")):
            assert torch.equal(s_state[key.replace(f"{layers}.{j}.", f"{layers}.{i}.")], t_state[key])
    assert not any(k.startswith(f"{layers}.2.") for k in s_state)
    assert all(torch.equal(s_state[k], v) for k, v in t_state.items() if "embeddings" in k or "classifier" in k)


def test_student_must_be_smaller_than_the_teacher(tokenizer):
    with pytest.raises(ConfigError, match=r"a 2-layer student from layers \[0, 1\] does not fit a 2-layer teacher"):
        make_student(tiny_bert(tokenizer), DistillConfig(student_layers=2))
    with pytest.raises(ValueError, match=r"layer_map has 1 entries; student_layers is 2"):
        DistillConfig(student_layers=2, layer_map=(0,))
    with pytest.raises(ValueError, match=r"attention_weight weigh\(s\) a loss style hinton does not have"):
        DistillConfig(attention_weight=2.0)
    assert DistillConfig(style="tinybert", attention_weight=2.0).attention_weight == 2.0


def test_hidden_losses_ignore_padding():
    states = [torch.randn(2, 5, 8) for _ in range(3)]
    other = [s.clone() for s in states]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    for s in other:
        s[0, 3:] += 10  # padding positions differ
    student = [states[0], states[2]]  # 1-layer student: embeddings and its one layer vs teacher 0 and 2
    for style in ("tinybert", "distilbert"):
        assert _hidden_loss(student, other, mask, DistillConfig(style=style)) == pytest.approx(0, abs=1e-6)
    other[2][1, 0] += 1.0
    assert _hidden_loss(student, other, mask, DistillConfig(style="tinybert")) > 0


def test_hinton_student_keeps_what_the_teacher_learned(trained_teacher, tmp_path, movie_data):
    data = small(movie_data, n_train=3000)
    details = distill(trained_teacher, tmp_path / "s", data,
                      DistillConfig(student_layers=1, epochs=2, learning_rate=1e-3, max_length=48))
    student, tokenizer = load_classifier(tmp_path / "s")
    assert student.config.num_hidden_layers == 1 and student.config.output_hidden_states is False
    teacher, _ = load_classifier(trained_teacher)
    taught, _ = evaluate_classifier(teacher, tokenizer, data.test, 48)
    learned, _ = evaluate_classifier(student, tokenizer, data.test, 48)
    assert taught["accuracy"] > 0.58  # 300 test examples: chance + 3 standard errors is ~0.59
    assert learned["accuracy"] > taught["accuracy"] - 0.08
    assert details["layer_map"] == [0] and len(details["history"]) == 2


@pytest.mark.parametrize("style,precision", [("distilbert", "fp32"), ("tinybert", "fp32"), ("tinybert", "bf16")])
def test_hidden_state_styles_train_and_save(style, precision, trained_teacher, tmp_path, movie_data):
    details = distill(trained_teacher, tmp_path / "s", small(movie_data), DistillConfig(
        student_layers=1, style=style, epochs=1, max_length=32, targets_precision=precision,
        train_precision=precision))
    assert all(torch.isfinite(torch.tensor(h["train_loss"])) for h in details["history"])
    assert load_classifier(tmp_path / "s")[0].config.num_hidden_layers == 1


@pytest.mark.parametrize("builder", [tiny_bert, tiny_distilbert], ids=["bert", "distilbert"])
def test_recorded_attention_scores_are_what_eager_attention_takes_the_softmax_of(builder, tokenizer, movie_data):
    """The scores come from hooks on Q and K; eager attention's probabilities are their masked softmax."""
    model = builder(tokenizer)
    model.set_attn_implementation("eager")
    recorder = AttentionScores(model)
    batch = tokenizer(list(movie_data.test.texts[:4]), padding=True, return_tensors="pt")
    inputs = {k: v for k, v in batch.items() if builder is tiny_bert or k != "token_type_ids"}
    with torch.no_grad():
        probabilities = model(**inputs, output_attentions=True).attentions
    recorder.remove()
    padding = ~batch["attention_mask"].bool()[:, None, None, :]  # (batch, 1, 1, keys)
    for scores, expected in zip(recorder.scores(), probabilities, strict=True):
        assert scores.shape == expected.shape  # (batch, heads, seq, seq)
        assert torch.allclose(scores.masked_fill(padding, float("-inf")).softmax(-1), expected, atol=1e-6)


def test_the_attention_loss_maps_layers_uniformly_and_ignores_padding():
    teacher = [torch.randn(2, 2, 5, 5) for _ in range(4)]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    student = [teacher[1].clone(), teacher[3].clone()]  # 4 -> 2 layers: student 0 <-> teacher 1, 1 <-> 3
    student[0][0, :, 3:, :] += 5  # a padding query
    student[1][0, :, :, 4] -= 5  # a padding key
    assert _attention_loss(student, teacher, mask) == pytest.approx(0, abs=1e-7)
    student[1][1, 0, 4, 4] += 2.0  # a real pair: 2^2 over 2 heads x 25 pairs + 2 heads x 9 pairs, half the layers
    assert float(_attention_loss(student, teacher, mask)) == pytest.approx(4 / (2 * 25 + 2 * 9) / 2)
    with pytest.raises(ConfigError, match="needs the same heads"):
        _attention_loss([torch.randn(2, 1, 5, 5)], teacher[:1], mask)


def test_a_pretrained_student_of_another_family_and_tokenizer_learns_the_teachers_logits(trained_teacher, bpe_tokenizer,
                                                                                         movie_data, tmp_path):
    """`student: DIR`: a RoBERTa encoder over its own byte-level BPE (no head) is trained on the WordPiece BERT
    teacher's logits; it keeps its family and tokenizer, takes the teacher's label names, and agrees with the
    teacher far above its untrained self. Run, exported and bundled, its bundle reads texts with the student's
    tokenizer and gives the run's predictions."""
    import json

    import numpy as np
    import yaml

    from edgepress.device.predictor import Predictor
    from tests.conftest import save, tiny_encoder
    from tests.test_trust import FAST_RUNTIME, invoke

    bare = tiny_encoder("roberta", bpe_tokenizer, seed=3).roberta
    bare.config.id2label, bare.config.label2id = {0: "LABEL_0", 1: "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}
    encoder = save(bare, bpe_tokenizer, tmp_path / "encoder")  # an encoder as pretrained ones ship: no label names
    data = small(movie_data, 3000)
    details = distill(trained_teacher, tmp_path / "student", data,
                      DistillConfig(student=str(encoder), epochs=2, learning_rate=2e-3, max_length=48, seed=0))
    assert details["student_model_type"] == "roberta" and details["student"] == str(encoder)
    student, words = load_classifier(tmp_path / "student")
    teacher, teacher_words = load_classifier(trained_teacher)
    assert student.config.model_type == "roberta" and len(words) == len(bpe_tokenizer) != len(teacher_words)
    assert student.config.id2label == teacher.config.id2label
    taught = evaluate_classifier(teacher, teacher_words, data.test, 64)[1]
    learned = evaluate_classifier(student, words, data.test, 64)[1]
    untrained = evaluate_classifier(tiny_encoder("roberta", bpe_tokenizer, seed=3), bpe_tokenizer, data.test, 64)[1]
    # a tiny RoBERTa from scratch on 3,000 sentences: 0.74 of the teacher's labels on the test split (its untrained
    # self: 0.50, one label for all)
    assert np.mean(taught == learned) >= np.mean(taught == untrained) + 0.15

    config = tmp_path / "p.yaml"
    (tmp_path / "d.csv").write_text("text,label\n" + "".join(
        f'"{t.replace(chr(34), chr(39))}",{int(y)}\n' for t, y in zip(movie_data.train.texts[:600],
                                                                      movie_data.train.labels[:600], strict=True)))
    config.write_text(yaml.safe_dump({
        "model": str(trained_teacher), "data": {"source": str(tmp_path / "d.csv"), "max_length": 64},
        "runtime": FAST_RUNTIME, "stages": [{"name": "student", "method": "distill",
                                             "params": {"student": str(encoder), "epochs": 1}},
                                            {"name": "export", "method": "export"}]}))
    result = invoke("run", str(config), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    bundle = tmp_path / "bundle"
    assert invoke("bundle", str(tmp_path / "run"), "--out", str(bundle)).exit_code == 0
    assert json.loads((bundle / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    run = json.loads((tmp_path / "run" / "stages" / "02-export" / "predictions.json").read_text())
    # the bundle's labels on the run's test texts are the run's export stage's predictions
    from edgepress.data import DataConfig, load_data

    predictor = Predictor(bundle)
    ids = {label: i for i, label in predictor.id2label.items()}
    split = load_data(DataConfig(source=str(tmp_path / "d.csv"), max_length=64)).test
    assert list(split.ids) == run["ids"]
    assert [ids[p.label] for p in predictor.predict_each(split.texts)] == run["predictions"]


def test_a_pretrained_student_is_refused_where_it_cannot_work(tokenizer, tmp_path):
    from edgepress.compress.distill import check_student
    from edgepress.errors import ModelError
    from edgepress.tasks import CLASSIFICATION, EMBEDDING, TASKS

    with pytest.raises(ValueError, match=r"style distilbert compares last hidden states of one width"):
        DistillConfig(student="demo:minilm", style="distilbert")
    with pytest.raises(ValueError, match=r"tinybert compares its hidden states only .* leave attention_weight out"):
        DistillConfig(student="demo:minilm", style="tinybert", attention_weight=0.5)
    assert DistillConfig(student="demo:minilm", style="tinybert").hidden_weight == 1.0
    with pytest.raises(ValueError, match=r"student_layers shape a student cut from the teacher's layers"):
        DistillConfig(student="demo:minilm", student_layers=2)
    teacher = tiny_bert(tokenizer)
    with pytest.raises(ModelError, match=r"does not exist"):
        check_student(teacher, tokenizer, DistillConfig(student=str(tmp_path / "nowhere")), CLASSIFICATION)
    with pytest.raises(ConfigError, match="projected to the teacher's.*Fix: leave student out"):
        check_student(teacher, tokenizer, DistillConfig(student="demo:minilm"), EMBEDDING)
    tagging = TASKS["token-classification"]  # its words' logits, yes (tests/test_token_student.py); hidden states, no
    check_student(teacher, tokenizer, DistillConfig(student="demo:minilm"), tagging)
    with pytest.raises(ConfigError, match="style tinybert .* is built for sequence classifiers. Fix: style hinton"):
        check_student(teacher, tokenizer, DistillConfig(student="demo:minilm", style="tinybert"), tagging)
