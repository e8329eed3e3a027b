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


@pytest.mark.parametrize("style", ["distilbert", "tinybert"])
def test_hidden_state_styles_train_and_save(style, trained_teacher, tmp_path, movie_data):
    details = distill(trained_teacher, tmp_path / "s", small(movie_data),
                      DistillConfig(student_layers=1, style=style, epochs=1, max_length=32))
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
