"""Every encoder family edgepress knows (models/arch.py): structured pruning removes exactly what masking would
silence, the pruned model reloads through edgepress, and a student keeps its layers' own kinds."""

import pytest

from edgepress.compress.distill import DistillConfig, make_student
from edgepress.compress.structured import prune_ffn, prune_heads
from edgepress.errors import ConfigError
from edgepress.models.arch import arch_of, head_size, layer_list, part
from edgepress.models.evaluate import forward_inputs
from edgepress.models.loading import load_classifier
from tests.conftest import FAMILIES, save, tiny_encoder

KEEP_HEADS = [[0, 2], [1, 2, 3]]  # of 4 heads; the second layer loses one
KEEP_NEURONS = [[3, 7, 8, 20, 33, 40, 41, 63], [0, 1, 2, 10, 11, 30, 50, 62]]  # of 64


def _logits(model, tokenizer, texts):
    import torch

    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=48, return_tensors="pt")
    with torch.inference_mode():
        return model(**forward_inputs(model, batch)).logits


def _masked(model, heads: list[list[int]], neurons: list[list[int]]):
    """Hooks that zero every head and FFN neuron not kept, where they enter their output projections."""
    arch = arch_of(model)
    hooks = []
    for layer, kept_heads, kept_neurons in zip(layer_list(model), heads, neurons, strict=True):
        size = head_size(arch, layer)

        def zero_heads(m, args, kept=kept_heads, size=size):
            x = args[0].unflatten(-1, (-1, size)).clone()
            x[..., [h for h in range(x.shape[-2]) if h not in kept], :] = 0
            return (x.flatten(-2),)

        def zero_neurons(m, args, kept=kept_neurons):
            x = args[0].clone()
            x[..., [n for n in range(x.shape[-1]) if n not in kept]] = 0
            return (x,)
        hooks += [part(layer, arch.attn_out).register_forward_pre_hook(zero_heads),
                  part(layer, arch.ffn_out).register_forward_pre_hook(zero_neurons)]
    return hooks


CASES = [(family, {}) for family in FAMILIES] + [("deberta-v2", {"share_att_key": False})]  # + pos_{key,query}_proj


@pytest.mark.parametrize(("family", "overrides"), CASES, ids=[*FAMILIES, "deberta-v2-pos-proj"])
def test_pruning_heads_and_neurons_gives_the_logits_of_masking_them_and_reloads(family, overrides, tokenizer,
                                                                                movie_data, tmp_path):
    import torch

    model = tiny_encoder(family, tokenizer, heads=4, seed=2, **overrides)
    if overrides:
        assert part(layer_list(model)[0], "attention.self.pos_key_proj") is not None
    for weight in (p for p in model.parameters() if p.dim() == 2):  # large enough that every head moves the logits
        torch.nn.init.normal_(weight, std=0.3)
    texts = movie_data.validation.texts[:16]
    hooks = _masked(model, KEEP_HEADS, KEEP_NEURONS)
    expected = _logits(model, tokenizer, texts)
    for hook in hooks:
        hook.remove()
    assert (expected - _logits(model, tokenizer, texts)).abs().max() > 1e-2  # the masks change the logits

    assert prune_heads(model, KEEP_HEADS) == {0: [1, 3], 1: [0]}
    assert prune_ffn(model, KEEP_NEURONS) == 8
    pruned = _logits(model, tokenizer, texts)
    torch.testing.assert_close(pruned, expected, atol=1e-5, rtol=1e-4)

    reloaded, _ = load_classifier(save(model, tokenizer, tmp_path / family))
    torch.testing.assert_close(_logits(reloaded, tokenizer, texts), expected, atol=1e-5, rtol=1e-4)
    arch = arch_of(reloaded)
    assert [part(layer, arch.attn_out).in_features // head_size(arch, layer) for layer in layer_list(reloaded)] \
        == [2, 3]


def test_a_modernbert_student_keeps_the_attention_kind_of_each_layer_it_copies(tokenizer, movie_data, tmp_path):
    """ModernBERT alternates global and local (sliding-window) attention: a student of layers 0 and 3 of a
    4-layer teacher (global every 2nd: global, local, global, local) has global then local attention, in its
    modules and in the config it is reloaded from."""
    import torch

    teacher = tiny_encoder("modernbert", tokenizer, layers=4)
    student, mapping = make_student(teacher, DistillConfig(student_layers=2, layer_map=(0, 3)))
    assert student.config.layer_types == ["full_attention", "sliding_attention"]
    assert [layer.attention_type for layer in layer_list(student)] == ["full_attention", "sliding_attention"]
    long = [" ".join(movie_data.train.texts[:6])]  # more tokens than the local window
    reloaded, _ = load_classifier(save(student, tokenizer, tmp_path / "student"))
    torch.testing.assert_close(_logits(reloaded, tokenizer, long), _logits(student, tokenizer, long))
    with pytest.raises(ConfigError, match=r"first layer must be the teacher's layer 0, not 1\. Fix: a layer_map "):
        make_student(teacher, DistillConfig(student_layers=2, layer_map=(1, 3)))
    with pytest.raises(ConfigError, match=r"tinybert style .* modernbert computes Q, K and V in one matrix"):
        make_student(teacher, DistillConfig(student_layers=2, style="tinybert"))


def test_a_family_edgepress_does_not_know_is_named_with_the_ones_it_does(tokenizer):
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    with pytest.raises(ConfigError, match=r"does not know the layer layout of albert models; it knows bert, "
                                          r"camembert, deberta-v2, distilbert, electra, modernbert, mpnet, "
                                          r"roberta, xlm-roberta\. Fix: "):
        prune_heads(AlbertForSequenceClassification(config), [[0], [0]])
