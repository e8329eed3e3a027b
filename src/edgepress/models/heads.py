"""Attention heads removed from a BERT-style encoder, and the record of it a model dir carries.

transformers 5 dropped `PreTrainedModel.prune_heads` and the loading of `config.pruned_heads`, but its attention
still reshapes to `(batch, seq, -1, head_size)`: a layer runs with whatever number of heads its Q/K/V matrices
hold. So edgepress shrinks those matrices itself (`prune_linear_layer`), records the removed heads in
`config.json` as `pruned_heads` (`{"layer": [head, ...]}`, the original numbering, as transformers 4 wrote it),
and rebuilds the shapes from that record before loading weights (`models.loading.load_classifier`)."""

from edgepress.errors import ModelError


def encoder_layers(model) -> list:
    """The encoder layers of a BERT-style classifier (bert, roberta, MiniLM), or [] for other architectures."""
    base = getattr(model, model.base_model_prefix, None)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    return list(layers) if layers is not None and hasattr(layers[0], "attention") else []


def keep_heads(attention, kept: list[int]) -> None:
    """Shrink one layer's attention (`layer.attention`) to the heads `kept` (indices among its current heads)."""
    import torch
    from transformers.pytorch_utils import prune_linear_layer

    self_attention = attention.self
    size = self_attention.attention_head_size
    index = torch.tensor([head * size + j for head in kept for j in range(size)], dtype=torch.long)
    for name in ("query", "key", "value"):
        setattr(self_attention, name, prune_linear_layer(getattr(self_attention, name), index, dim=0))
    attention.output.dense = prune_linear_layer(attention.output.dense, index, dim=1)
    self_attention.num_attention_heads = len(kept)
    self_attention.all_head_size = len(kept) * size


def pruned_heads(config) -> dict[int, list[int]]:
    """`config.pruned_heads` ({layer: removed heads}, JSON keys as ints), without layers that lost nothing; a record
    that does not fit the model is a ModelError."""
    record = getattr(config, "pruned_heads", None) or {}
    heads, layers = config.num_attention_heads, config.num_hidden_layers
    try:
        pruned = {int(layer): sorted({int(h) for h in removed}) for layer, removed in record.items() if removed}
    except (AttributeError, TypeError, ValueError):
        pruned = None
    if pruned is None or any(not 0 <= layer < layers or not set(removed) < set(range(heads))
                             for layer, removed in pruned.items()):
        raise ModelError(f"config.json: pruned_heads must map layer numbers 0..{layers - 1} to lists of head numbers "
                         f"0..{heads - 1}, leaving at least one head in each layer; got {record!r}. Fix: save the "
                         f"model again with edgepress (or transformers 4's prune_heads)")
    return pruned


def remove_heads(model, removed: dict[int, list[int]]) -> None:
    """Remove `removed[layer]` (original head numbers) from a model whose layers still have all their heads, and
    record them in `config.pruned_heads`."""
    heads = model.config.num_attention_heads
    layers = encoder_layers(model)
    for layer, gone in removed.items():
        if layers[layer].attention.self.num_attention_heads != heads:
            raise ModelError(f"layer {layer} already lost heads; edgepress prunes heads once per model")
        keep_heads(layers[layer].attention, [h for h in range(heads) if h not in gone])
    model.config.pruned_heads = {layer: sorted(gone) for layer, gone in removed.items() if gone}
