"""`width`: the hidden state narrowed to its most important dimensions (models/width.py, compress/structured.py).
The support matrix runs the method on every family and exports, fuses and quantizes the result
(tests/test_matrix.py); these check what it promises on its own: nothing changes when every dimension is kept, a
narrowed model loads back from its record, the importance is the loss's, and what it refuses."""

import json

import numpy as np
import pytest

from edgepress.errors import ModelError
from tests.conftest import FAMILIES


def _logits(model, words, texts):
    from edgepress.models.evaluate import predict_logits

    return predict_logits(model, words, texts, 48)


@pytest.mark.parametrize("family", FAMILIES)
def test_keeping_every_dimension_changes_nothing_and_half_of_them_narrows_every_part(family, family_model,
                                                                                       movie_data):
    from edgepress.models.arch import part
    from edgepress.models.loading import load_classifier
    from edgepress.models.width import RECORD, hidden_parts, narrow

    texts = movie_data.validation.texts[:40]
    model, words = load_classifier(family_model(family))
    before = _logits(model, words, texts)
    narrow(model, list(range(32)))
    np.testing.assert_array_equal(_logits(model, words, texts), before)
    assert getattr(model.config, RECORD, None) is None
    parts = hidden_parts(model)
    narrow(model, list(range(0, 32, 2)))
    sizes = {name: (lambda m: m.in_features if how == "in" else m.out_features if how == "out" else
                    m.normalized_shape[0] if how == "norm" else m.embedding_dim)(part(model, name))
             for name, how in parts}
    assert set(sizes.values()) == {16} and getattr(model.config, RECORD) == 16
    assert {how for _, how in parts} >= {"in", "out", "norm"}
    assert _logits(model, words, texts).shape == before.shape


def test_a_narrowed_model_loads_back_from_its_record(family_model, movie_data, tmp_path):
    """MPNet with a head pruned in layer 0 (its shared position bias sliced by a hook), then narrowed to 11: both
    records rebuilt by the loader, the same logits."""
    from edgepress.compress.structured import prune_heads
    from edgepress.models.loading import load_classifier, with_new_head
    from edgepress.models.width import narrow

    texts = movie_data.validation.texts[:40]
    model, words = load_classifier(family_model("mpnet"))
    prune_heads(model, [[1], [0, 1]])
    narrow(model, list(range(1, 32, 3)))
    model.save_pretrained(tmp_path, safe_serialization=True)
    words.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["pruned_hidden_size"] == 11
    again, _ = load_classifier(tmp_path)
    np.testing.assert_allclose(_logits(again, words, texts), _logits(model, words, texts), atol=1e-6)
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    fresh, _ = with_new_head(tmp_path, "AutoModelForSequenceClassification", {0: "a", 1: "b", 2: "c"}, seed=0)
    assert fresh.classifier.out_proj.out_features == 3 and fresh.classifier.dense.in_features == 11
    np.testing.assert_array_equal(fresh.mpnet.embeddings.word_embeddings.weight.detach(),
                                  again.mpnet.embeddings.word_embeddings.weight.detach())


def test_a_module_width_cannot_narrow_is_refused_before_anything_runs(tokenizer):
    """DeBERTa-v2's convolution (conv_kernel_size, as deberta-v2-xlarge has) carries the hidden state: width's
    pre-run check refuses the model, naming it."""
    from edgepress.compress.structured import WidthConfig, check_width
    from edgepress.tasks import CLASSIFICATION
    from tests.conftest import tiny_encoder

    model = tiny_encoder("deberta-v2", tokenizer, conv_kernel_size=3)
    with pytest.raises(ModelError, match=r"encoder.conv.conv \(Conv1d\), which width cannot narrow"):
        check_width(model, tokenizer, WidthConfig(), CLASSIFICATION)


@pytest.mark.parametrize("record", [32, 0, "16", True, 40])
def test_a_record_that_does_not_fit_is_refused(record, family_model, tmp_path):
    import shutil

    from edgepress.models.loading import load_classifier

    shutil.copytree(family_model("bert"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "pruned_hidden_size": record}))
    with pytest.raises(ModelError, match=r"pruned_hidden_size must be a whole number of dimensions from 1 to 31 "
                                         r"\(below hidden_size 32\)"):
        load_classifier(tmp_path / "m")


def test_a_dimension_that_carries_nothing_has_no_importance_and_the_method_keeps_the_rest(family_model, small_data,
                                                                                          tmp_path):
    """Dimensions 0-3 zeroed in every weight that carries them: their Taylor importance (weight x gradient) is 0,
    every other one's is not; the method keeps a quarter (8), narrows the model and refuses to narrow it again."""
    import torch

    from edgepress.compress.structured import WidthConfig, width, width_importance
    from edgepress.models.arch import part
    from edgepress.models.loading import load_classifier
    from edgepress.models.width import AXIS, hidden_parts

    model, words = load_classifier(family_model("bert"))
    with torch.no_grad():
        for name, how in hidden_parts(model):
            module = part(model, name)
            for weight in (module.weight, getattr(module, "bias", None)):
                if weight is not None and weight.dim() > AXIS[how]:
                    weight.narrow(AXIS[how], 0, 4).zero_()
    cfg = WidthConfig(keep=0.25, epochs=1, importance_batches=4)
    scores = width_importance(model, words, small_data, cfg)
    assert scores.shape == (32,) and (scores[:4] == 0).all() and (scores[4:] > 0).all()
    details = width(family_model("bert"), tmp_path / "w", small_data, cfg)
    assert details["pruned"] == {"pruned_hidden_size": 8} and np.asarray(details["importance"]).shape == (1, 32)
    narrowed, _ = load_classifier(tmp_path / "w")
    assert narrowed.bert.embeddings.word_embeddings.weight.shape[1] == 8
    with pytest.raises(ModelError, match="narrowed already .hidden width 8 of 32.; width narrows a model of its full"):
        width(tmp_path / "w", tmp_path / "w2", small_data, cfg)
    assert not (tmp_path / "w2").exists()


def test_the_recovery_can_learn_the_teachers_hidden_states_through_a_projection(family_model, small_data, tmp_path):
    """hidden_weight: the narrowed model's hidden states, projected back to the full width, learn the model's own
    before the cut (TinyBERT's loss, beside the logits): the loss it trains on holds that term, and the projection
    is gone from what it saves. Refused, with the fix, where the task's recovery has no hidden states to learn."""
    from edgepress.compress.structured import WidthConfig, check_structured, width
    from edgepress.errors import ConfigError
    from edgepress.models.loading import load_classifier
    from edgepress.tasks import EMBEDDING, TASKS

    plain = width(family_model("bert"), tmp_path / "plain", small_data, WidthConfig(keep=0.5, epochs=1))
    hidden = width(family_model("bert"), tmp_path / "hidden", small_data,
                   WidthConfig(keep=0.5, epochs=1, hidden_weight=1.0))
    assert hidden["history"][0]["train_loss"] > plain["history"][0]["train_loss"]  # the hidden-state MSE on top
    saved = json.loads((tmp_path / "hidden" / "config.json").read_text())
    assert saved["pruned_hidden_size"] == 16 and not saved.get("output_hidden_states")
    model, _ = load_classifier(tmp_path / "hidden")
    assert not any("projection" in name for name in model.state_dict())
    for task in (EMBEDDING, TASKS["token-classification"]):
        with pytest.raises(ConfigError, match="hidden_weight: .* Fix: remove hidden_weight"):
            check_structured(model, None, WidthConfig(hidden_weight=0.5), task)
