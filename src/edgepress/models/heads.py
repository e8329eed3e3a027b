"""Attention heads removed from an encoder (any family `models.arch` knows), and the record of it a model dir carries.

transformers 5 dropped `PreTrainedModel.prune_heads` and the loading of `config.pruned_heads`, but its attention
still reshapes to `(batch, seq, -1, head_size)`: a layer runs with whatever number of heads its Q/K/V matrices
hold. So edgepress shrinks those matrices itself (`prune_linear_layer`), records the removed heads in
`config.json` as `pruned_heads` (`{"layer": [head, ...]}`, the original numbering, as transformers 4 wrote it),
and rebuilds the shapes from that record before loading weights (`models.loading.load_classifier`)."""

from edgepress.device.bundle import whole
from edgepress.errors import ModelError
from edgepress.models.arch import ARCHS, arch_for, arch_of, heads_of, keep_heads, layer_list


def pruned_heads(config) -> dict[int, list[int]]:
    """`config.pruned_heads` ({layer: removed heads}, JSON keys as ints), without layers that lost nothing; a record
    that does not fit the model, or a model family edgepress cannot rebuild, is a ModelError."""
    record = getattr(config, "pruned_heads", None) or {}
    arch = arch_for(config.model_type)
    if arch is None:
        raise ModelError(f"config.json records pruned_heads, but edgepress rebuilds pruned heads only in the families "
                         f"it knows ({', '.join(sorted(ARCHS))}), not {config.model_type}. Fix: remove "
                         f"pruned_heads from config.json if no head was removed")
    heads, layers = getattr(config, arch.heads_key), getattr(config, arch.depth_key)

    def numbers(removed) -> list[int]:  # whole numbers in a list, as JSON writes them: no "12" read as 1 and 2
        if not isinstance(removed, list | tuple) or not all(map(whole, removed)):
            raise TypeError(removed)
        return sorted(set(removed))

    try:
        pruned = {int(layer): numbers(removed) for layer, removed in record.items() if removed not in ([], ())}
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
    arch = arch_of(model)
    heads = getattr(model.config, arch.heads_key)
    layers = layer_list(model)
    for layer, gone in removed.items():
        if heads_of(arch, layers[layer]) != heads:
            raise ModelError(f"layer {layer} already lost heads; edgepress prunes heads once per model")
        keep_heads(arch, layers[layer], [h for h in range(heads) if h not in gone])
    model.config.pruned_heads = {layer: sorted(gone) for layer, gone in removed.items() if gone}
