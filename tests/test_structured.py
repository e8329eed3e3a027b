import pytest
import torch

from edgepress.compress.structured import FfnConfig, HeadsConfig, ffn, heads
from edgepress.data.dataset import DataSplits
from edgepress.errors import ConfigError
from edgepress.models.introspect import param_counts
from edgepress.models.loading import load_classifier
from tests.conftest import save, tiny_bert, tiny_distilbert


@pytest.fixture(scope="module")
def small_data(movie_data) -> DataSplits:
    return DataSplits(movie_data.train.take(320), movie_data.validation.take(64), movie_data.test.take(64),
                      movie_data.id2label, movie_data.source)


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
    src = save(tiny_distilbert(tokenizer), tokenizer, tmp_path / "d")
    with pytest.raises(ConfigError, match=r"structured pruning supports BERT-style encoders .* got distilbert"):
        heads(src, tmp_path / "out", small_data, HeadsConfig(epochs=1))
    assert not (tmp_path / "out").exists()
