"""TinyBERT's hidden-state loss for a pretrained student of another width and tokenizer (issue 52): positions paired
by the characters they cover, the projection trained with the student and dropped when it ships."""

import pytest
import torch

from edgepress.compress.distill import DistillConfig, distill
from edgepress.compress.kd import soft_target_loss
from edgepress.compress.projected import PROJECTION, aligned, attach_projection, projected_hidden_loss
from edgepress.models.evaluate import forward_inputs
from edgepress.models.loading import load_classifier, with_new_head
from tests.conftest import save, tiny_encoder
from tests.test_distill import small


def test_positions_pair_where_both_tokenizers_cut_the_same_characters():
    # "a bc": the teacher cuts [CLS] a bc [SEP]; the student [CLS] a b c [SEP] [PAD]: "a" pairs, "bc" does not
    teacher = [[(0, 0), (0, 1), (2, 4), (0, 0)]]
    student = [[(0, 0), (0, 1), (2, 3), (3, 4), (0, 0), (0, 0)]]
    assert aligned(student, teacher, [[1, 1, 1, 1, 1, 0]], [[1, 1, 1, 1]]) == ([0, 0], [0, 1], [0, 1])
    same = [[(0, 0), (0, 1), (2, 4), (0, 0)], [(0, 0), (0, 3), (0, 0), (0, 0)]]
    assert aligned(same, same, [[1, 1, 1, 1], [1, 1, 1, 0]], [[1, 1, 1, 1], [1, 1, 1, 0]]) == (
        [0, 0, 0, 1, 1], [0, 1, 2, 0, 1], [0, 1, 2, 0, 1])
    # a student padded on the left: its sentence token is its first attended position, not position 0
    left = [[(0, 0), (0, 0), (0, 1), (2, 4), (0, 0)]]
    assert aligned(left, teacher, [[0, 1, 1, 1, 1]], [[1, 1, 1, 1]]) == ([0, 0, 0], [1, 2, 3], [0, 1, 2])
    # no sentence token in front (the first positions are words): only the words pair, each once
    bare = [[(0, 1), (2, 4)]]
    assert aligned(bare, teacher, [[1, 1]], [[1, 1, 1, 1]]) == ([0, 0], [0, 1], [1, 2])


@pytest.fixture(scope="module")
def narrow_student(tmp_path_factory, tokenizer):
    """A 1-layer BERT encoder of width 16 over the teacher's WordPiece vocabulary: another width, the same cuts."""
    bare = tiny_encoder("bert", tokenizer, layers=1, hidden_size=16, intermediate_size=32, seed=4).bert
    return save(bare, tokenizer, tmp_path_factory.mktemp("narrow") / "encoder")


def test_the_projected_hidden_loss_adds_to_the_soft_loss_and_trains_the_projection(family_model, narrow_student,
                                                                                   movie_data):
    from edgepress.tasks import CLASSIFICATION

    teacher, words = load_classifier(family_model("mpnet"))
    student, student_words = with_new_head(narrow_student, CLASSIFICATION.auto_class, teacher.config.id2label, 0)
    projection = attach_projection(student, teacher)
    assert {f"{PROJECTION}.layers.weight", f"{PROJECTION}.embeddings.weight"} <= {n for n, _ in
                                                                                 student.named_parameters()}
    texts = movie_data.train.texts[:8]
    batch = dict(student_words(list(texts), truncation=True, max_length=32, padding=True, return_tensors="pt"))
    batch |= {"labels": torch.tensor(movie_data.train.labels[:8]), "index": torch.arange(8)}
    logits = torch.randn(8, 2)
    student.config.output_hidden_states = True
    outputs = student(**forward_inputs(student, batch))
    soft = soft_target_loss(logits, DistillConfig())
    losses = {w: projected_hidden_loss(teacher, words, student_words, texts, soft, projection,
                                       DistillConfig(student="x", style="tinybert", hidden_weight=w, max_length=32))(
        outputs, batch) for w in (0.0, 1.0)}
    assert float(losses[0.0]) == pytest.approx(float(soft(outputs, batch)))
    assert float(losses[1.0]) > float(losses[0.0])
    half = projected_hidden_loss(teacher, words, student_words, texts, soft, projection, DistillConfig(
        student="x", style="tinybert", max_length=32, targets_precision="bf16"))(outputs, batch)
    assert half.dtype == torch.float32 and float(half) != float(losses[1.0])  # the teacher ran in bf16
    assert float(half) == pytest.approx(float(losses[1.0]), rel=0.05)
    assert next(teacher.parameters()).dtype == torch.float32
    losses[1.0].backward()
    assert projection["layers"].weight.grad.abs().sum() > 0 and projection["embeddings"].weight.grad.abs().sum() > 0


def test_a_narrower_pretrained_student_learns_the_teachers_hidden_states_and_ships_without_the_projection(
        family_model, narrow_student, movie_data, tmp_path):
    import safetensors.torch

    data = small(movie_data, 600)
    details = distill(family_model("mpnet"), tmp_path / "s", data,
                      DistillConfig(student=str(narrow_student), style="tinybert", epochs=1, learning_rate=2e-3,
                                    max_length=48))
    assert details["style"] == "tinybert" and details["student_model_type"] == "bert"
    weights = safetensors.torch.load_file(tmp_path / "s" / "model.safetensors")
    assert not [k for k in weights if PROJECTION in k] and weights["bert.embeddings.word_embeddings.weight"].shape[1] \
        == 16
    student, _ = load_classifier(tmp_path / "s")
    assert student.config.output_hidden_states is False and student.config.hidden_size == 16
