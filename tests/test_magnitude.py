import pytest
import torch
from safetensors.torch import load_file

import edgepress.models.train as train_module
from edgepress.compress.magnitude import (
    LotteryConfig,
    MagnitudeConfig,
    cubic_sparsity,
    lottery,
    lowest_masks,
    magnitude,
    magnitudes,
    prunable_weights,
    round_sparsities,
)
from edgepress.configs import build
from edgepress.errors import ConfigError
from edgepress.models.introspect import size_metrics
from tests.conftest import save, tiny_bert, tiny_distilbert

ENCODER = {"query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"}


@pytest.fixture
def model_dir(tmp_path, tokenizer):
    return save(tiny_bert(tokenizer, seed=4), tokenizer, tmp_path / "dense")


def _zeros(path, names) -> dict:
    weights = load_file(path / "model.safetensors")
    return {n: weights[n] == 0 for n in names}


def test_prunable_weights_are_the_encoder_linears_unless_include_names_more(tokenizer):
    model = tiny_bert(tokenizer)
    names = prunable_weights(model)
    assert len(names) == 2 * 6 and all(n.startswith("bert.encoder.layer.") and n.endswith(".weight") for n in names)
    everything = prunable_weights(model, ("embeddings", "layernorm", "pooler", "classifier"))
    assert {"bert.embeddings.word_embeddings.weight", "bert.pooler.dense.weight", "classifier.weight",
            "bert.embeddings.LayerNorm.weight"} <= set(everything)
    assert not any(n.endswith(".bias") for n in everything)
    distil = prunable_weights(tiny_distilbert(tokenizer), ("classifier",))
    assert "pre_classifier.weight" in distil and "distilbert.transformer.layer.1.ffn.lin2.weight" in distil


def test_lowest_masks_drop_the_exact_share_globally_or_per_matrix_and_only_grow():
    g = torch.Generator().manual_seed(0)
    scores = {"a": torch.rand(10, 10, generator=g), "b": torch.rand(50, generator=g) * 0.1}
    glob = lowest_masks(scores, 0.4)
    assert sum(int((~m).sum()) for m in glob.values()) == 60
    assert int((~glob["b"]).sum()) == 50  # globally, the small-valued tensor goes first
    layer = lowest_masks(scores, 0.4, "layer")
    assert int((~layer["a"]).sum()) == 40 and int((~layer["b"]).sum()) == 20
    grown = lowest_masks({"a": torch.rand(10, 10, generator=g), "b": torch.rand(50, generator=g)}, 0.7, keep=glob)
    assert all(bool((grown[n] <= glob[n]).all()) for n in scores)  # nothing dropped comes back
    assert sum(int((~m).sum()) for m in grown.values()) == 105


def test_the_cubic_schedule_rises_fast_then_flattens_and_stops_at_the_final_sparsity():
    values = [cubic_sparsity(t, 0.8, 100) for t in range(0, 151)]
    assert values[0] == 0 and values[100] == pytest.approx(0.8) and values[150] == pytest.approx(0.8)
    assert values[50] == pytest.approx(0.8 * (1 - 0.5 ** 3))
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))


def test_oneshot_magnitude_zeros_stay_zero_through_training_and_load_in_plain_transformers(
        model_dir, tmp_path, small_data):
    from transformers import AutoModelForSequenceClassification

    from edgepress.models.loading import load_classifier

    dense, _ = load_classifier(model_dir)
    weights = prunable_weights(dense)
    expected = {n: ~m for n, m in lowest_masks(magnitudes(weights), 0.5).items()}  # what one shot prunes
    details = magnitude(model_dir, tmp_path / "out", small_data, MagnitudeConfig(sparsity=0.5, epochs=2))
    zeros = _zeros(tmp_path / "out", weights)
    assert all(bool(zeros[n][expected[n]].all()) for n in weights)  # every pruned weight is still exactly 0
    trained = load_file(tmp_path / "out" / "model.safetensors")
    assert not torch.equal(trained["bert.encoder.layer.0.attention.self.query.weight"], weights[
        "bert.encoder.layer.0.attention.self.query.weight"])  # it did train
    assert details["sparsity"]["pruned_weights_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert 0 < details["sparsity"]["all_params_sparsity"] < 0.05  # the embeddings hold most of a tiny model
    embeddings = dense.bert.embeddings.word_embeddings.weight  # not pruned: its only zeros are the [PAD] row's
    assert torch.equal(trained["bert.embeddings.word_embeddings.weight"] == 0, embeddings == 0)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out")
    assert float((plain.bert.encoder.layer[1].output.dense.weight == 0).float().mean()) > 0.3


def test_cubic_magnitude_reaches_the_final_sparsity_and_keeps_an_epoch_from_after_the_ramp(
        model_dir, tmp_path, small_data, monkeypatch):
    seen = []
    real = train_module.train_classifier

    def spy(*args, **kwargs):
        seen.append(kwargs["keep_from_epoch"])
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_classifier", spy)
    cfg = MagnitudeConfig(sparsity=0.7, schedule="cubic", scope="layer", prune_fraction=0.5, prune_every=2, epochs=3)
    details = magnitude(model_dir, tmp_path / "out", small_data, cfg)
    assert details["schedule_steps"] == 15 and seen == [2]  # 3 epochs x 10 steps; the ramp ends in epoch 2
    assert all(row["epoch"] >= 1 for row in details["history"])
    zeros = _zeros(tmp_path / "out", _names(model_dir))
    assert all(float(z.float().mean()) == pytest.approx(0.7, abs=0.01) for z in zeros.values())  # every matrix


def test_magnitude_with_the_embeddings_included_shrinks_the_compressed_download(model_dir, tmp_path, small_data):
    cfg = MagnitudeConfig(sparsity=0.9, include=("embeddings",), epochs=1)
    details = magnitude(model_dir, tmp_path / "out", small_data, cfg)
    assert details["sparsity"]["all_params_sparsity"] > 0.85
    dense, pruned = size_metrics(model_dir), size_metrics(tmp_path / "out")
    assert pruned["size_bytes"] == pytest.approx(dense["size_bytes"], rel=0.01)  # zeros are stored all the same
    assert pruned["size_gzip_bytes"] < 0.4 * dense["size_gzip_bytes"]


def _spy(monkeypatch, starts: list, snapshot_step: int = 0, snapshots: list | None = None) -> None:
    """Record the model's weights as each training starts; in the first, also those after `snapshot_step`."""
    real = train_module.train_classifier

    def spy(model, *args, **kwargs):
        starts.append({k: v.clone() for k, v in model.state_dict().items()})
        inner = kwargs.get("on_step")

        def on_step(m, step):
            if inner is not None:
                inner(m, step)
            if len(starts) == 1 and step == snapshot_step:
                snapshots.append({k: v.clone() for k, v in m.state_dict().items()})

        return real(model, *args, **{**kwargs, "on_step": on_step})

    monkeypatch.setattr(train_module, "train_classifier", spy)


def _names(model_dir) -> set[str]:
    from edgepress.models.loading import load_classifier

    return set(prunable_weights(load_classifier(model_dir)[0]))


@pytest.mark.parametrize("rewind", ["init", "step"])
def test_every_lottery_round_starts_from_the_rewound_weights_with_only_the_mask_applied(
        rewind, model_dir, tmp_path, small_data, monkeypatch):
    from edgepress.models.loading import load_classifier

    starts, snapshots = [], []
    _spy(monkeypatch, starts, 3, snapshots)
    cfg = LotteryConfig(sparsity=0.75, rounds=2, epochs=1, rewind=rewind, rewind_step=3 if rewind == "step" else 0)
    details = lottery(model_dir, tmp_path / "out", small_data, cfg)
    theta = snapshots[0] if rewind == "step" else load_classifier(model_dir)[0].state_dict()  # θk or θ0
    names = _names(model_dir)
    assert len(starts) == 3  # the dense training, then one per round
    for start in starts[1:]:
        for key, value in start.items():
            if key in names:
                survivors = value != 0
                assert torch.equal(value[survivors], theta[key][survivors])
                assert float(survivors.float().mean()) < 0.75  # a mask applied
            else:  # biases, LayerNorms, embeddings, classifier: rewound as they are
                assert torch.equal(value, theta[key]), key
    assert not torch.equal(starts[1]["classifier.weight"], starts[0]["classifier.weight"]) or rewind == "init"
    assert [r["sparsity"] for r in details["rounds"]] == pytest.approx(round_sparsities(0.75, 2), abs=1e-4)
    zeros = _zeros(tmp_path / "out", names)
    assert sum(int(z.sum()) for z in zeros.values()) / sum(z.numel() for z in zeros.values()) >= 0.75 - 1e-4


def test_lottery_with_a_random_control_records_it_beside_the_ticket(model_dir, tmp_path, small_data):
    cfg = LotteryConfig(sparsity=0.5, rounds=1, epochs=1, control="random")
    details = lottery(model_dir, tmp_path / "out", small_data, cfg)
    (row,) = details["rounds"]
    assert set(row) == {"round", "sparsity", "val_accuracy", "control_val_accuracy"}
    control = details["control_test"]
    assert 0 <= control["accuracy"] <= 1 and len(control["ticket_minus_control_ci95"]) == 2


def test_lottery_config_errors_name_the_fix(model_dir, tmp_path, small_data):
    with pytest.raises(ConfigError, match="rewind: step needs rewind_step >= 1"):
        build(LotteryConfig, {"rewind": "step"})
    with pytest.raises(ConfigError, match="rewind_step is used only with rewind: step"):
        build(LotteryConfig, {"rewind_step": 5})
    with pytest.raises(ConfigError, match=r"sparsity: Input should be less than 1"):
        build(MagnitudeConfig, {"sparsity": 1.5})
    with pytest.raises(ConfigError, match=r"include.0: Input should be 'embeddings'"):
        build(MagnitudeConfig, {"include": ["attention"]})
    with pytest.raises(ConfigError, match=r"prune_every shape\(s\) the cubic schedule; remove it or set schedule"):
        build(MagnitudeConfig, {"prune_every": 5})
    cfg = LotteryConfig(rewind="step", rewind_step=11, epochs=1)
    with pytest.raises(ConfigError, match=r"rewind_step 11 is past the 10 optimizer steps .* at most 10"):
        lottery(model_dir, tmp_path / "out", small_data, cfg)
    assert not (tmp_path / "out").exists()


def test_an_architecture_without_bert_or_distilbert_layers_is_a_config_error(tmp_path, tokenizer, small_data):
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    src = save(AlbertForSequenceClassification(config), tokenizer, tmp_path / "albert")
    with pytest.raises(ConfigError, match=r"unstructured pruning supports the encoder families edgepress knows "
                                          r"\(bert, .*\); got albert"):
        magnitude(src, tmp_path / "out", small_data, MagnitudeConfig(epochs=1))
    assert not (tmp_path / "out").exists()
