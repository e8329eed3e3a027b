"""The hidden width of an encoder (the residual stream every layer reads and writes) narrowed to chosen dimensions, in
any family `models.arch` knows, and the record of it a model dir carries.

What carries the hidden dimension, found from the layout and one traced forward pass rather than listed per class:
- in every layer: the input columns of Q/K/V (or the fused QKV), of DeBERTa's position projections and of the FFN's
  input; the output rows of the attention output and FFN output projections; every LayerNorm;
- around the layers, in the base model: every embedding table and LayerNorm as wide as the hidden state (word,
  position and token-type tables; DeBERTa's relative-position table and its norm; ModernBERT's final norm), and
  ELECTRA's `embeddings_project` (its output rows, when its embeddings are narrower than the hidden state);
- after the layers: the first Linear that reads the last hidden state (BERT's pooler, the classification head's
  dense layer, a token classifier's classifier), its input columns; what it gives is the head's own space, kept.

The heads keep their number and size (Q/K/V still give heads x head_size): only what reads and writes the residual
stream narrows. transformers builds attention from `hidden_size / heads`, so the config keeps the original
`hidden_size` and records the kept width as `pruned_hidden_size`; edgepress's loader builds the model from the config,
narrows it to that width and loads the weights (`models.loading`), as it does for pruned heads. A sentence encoder is
not narrowed: its vectors would change size.
"""

from edgepress.errors import ModelError
from edgepress.models.arch import arch_of, layer_list, part, replace

RECORD = "pruned_hidden_size"  # config.json: the hidden width a narrowed model keeps
AXIS = {"in": 1, "table": 1, "out": 0, "norm": 0}  # the axis of a part's weight that runs along the hidden state


def full_width(config) -> int:
    """The hidden size a model of this config was built with (DistilBERT: `dim`), narrowed or not."""
    return getattr(config, "hidden_size", None) or config.dim


def hidden_size(config) -> int:
    """The width of the residual stream of a model with this config: the kept width of a narrowed one."""
    return recorded_width(config) or full_width(config)


def recorded_width(config) -> int | None:
    """`config.pruned_hidden_size`, checked: the kept width, below the config's hidden size; None where the model
    was not narrowed. A record that does not fit is a ModelError."""
    kept = getattr(config, RECORD, None)
    if kept is None:
        return None
    full = full_width(config)
    if isinstance(kept, bool) or not isinstance(kept, int) or not 0 < kept < full:
        raise ModelError(f"config.json: {RECORD} must be a whole number of dimensions from 1 to {full - 1} (below "
                         f"hidden_size {full}); got {kept!r}. Fix: save the model again with edgepress")
    return kept


def hidden_parts(model) -> list[tuple[str, str]]:
    """(module name in `model`, how it carries the hidden dimension) of every module that does, in a model of its
    full width (found by their sizes): "in" (a Linear's input columns), "out" (a Linear's output rows), "norm" (a
    LayerNorm), "table" (an embedding table's columns). One forward pass on a short dummy input finds which Linears
    around the layers read or write the stream. A module of another kind as wide as the hidden state (DeBERTa-v2's
    convolution, `conv_kernel_size`) is a ModelError: width cannot narrow it; so is a narrowed model (a second
    narrowing could not tell a narrowed stream from ELECTRA's embeddings of the same size)."""
    import torch.nn as nn

    if recorded_width(model.config) is not None:
        raise ModelError(f"{type(model).__name__} was narrowed already (hidden width {recorded_width(model.config)} "
                         f"of {full_width(model.config)}); width narrows a model of its full width, once. Fix: run "
                         f"width once, on the distilled student, with the keep you want in the end")
    width, arch = hidden_size(model.config), arch_of(model)
    known = (nn.Linear, nn.Embedding, nn.LayerNorm)
    other = [name for name, m in model.base_model.named_modules() if not isinstance(m, known)
             and any(width in p.shape for p in m.parameters(recurse=False))]
    if other:
        raise ModelError(f"{type(model).__name__} carries its hidden state through {', '.join(other[:3])} "
                         f"({type(part(model.base_model, other[0])).__name__}), which width cannot narrow. Fix: "
                         f"leave width out for this model (heads and ffn prune it)")
    layers = layer_list(model)
    names = {id(m): name for name, m in model.named_modules()}
    inside = {id(m) for layer in layers for m in layer.modules()}
    parts = []
    for layer in layers:
        for path, how in [*((p, "in") for p in (*arch.qkv, *arch.head_rows, arch.ffn_in)),
                          (arch.attn_out, "out"), (arch.ffn_out, "out")]:
            if part(layer, path) is not None:
                parts.append((names[id(part(layer, path))], how))
        parts += [(names[id(m)], "norm") for m in layer.modules() if _is_norm(m, width)]
    base = model.base_model
    for module in base.modules():
        if id(module) in inside:
            continue
        if isinstance(module, nn.Embedding) and module.embedding_dim == width:
            parts.append((names[id(module)], "table"))
        elif _is_norm(module, width):
            parts.append((names[id(module)], "norm"))
    before, after = _linears_around(model, layers, inside)
    parts += [(names[id(m)], "out") for m in before if m.out_features == width and m.in_features != width]
    reader = next((m for m in after if m.in_features == width), None)
    if reader is None:
        raise ModelError(f"{type(model).__name__}: no layer after the encoder reads its hidden state. Fix: width "
                         f"takes a classifier or a token classifier")
    return [*parts, (names[id(reader)], "in")]


def _is_norm(module, width: int) -> bool:
    import torch.nn as nn

    return isinstance(module, nn.LayerNorm) and tuple(module.normalized_shape) == (width,)


def _linears_around(model, layers, inside: set[int]) -> tuple[list, list]:
    """(Linears outside the layers called before the first layer, those called after the last), in call order, from
    one forward pass on a dummy input of four tokens."""
    import torch
    import torch.nn as nn

    calls, hooks = [], []
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module) not in inside:
            hooks.append(module.register_forward_pre_hook(lambda m, args: calls.append(m)))
    hooks.append(layers[0].register_forward_pre_hook(lambda m, args: calls.append("first")))
    hooks.append(layers[-1].register_forward_hook(lambda m, args, out: calls.append("last")))
    ids, training = torch.ones((1, 4), dtype=torch.long, device=next(model.parameters()).device), model.training
    try:
        with torch.no_grad():
            model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    first, last = calls.index("first"), len(calls) - 1 - calls[::-1].index("last")
    return calls[:first], [m for m in calls[last + 1:] if m not in ("first", "last")]


def narrow(model, kept: list[int]) -> None:
    """Keep the hidden dimensions `kept` (indices, sorted) everywhere the model carries them (`hidden_parts`), and
    record the width in its config (`pruned_hidden_size`; all of them kept: the model unchanged, nothing recorded)."""
    import torch
    import torch.nn as nn
    from transformers.pytorch_utils import prune_linear_layer

    index = torch.tensor(kept, dtype=torch.long)
    weight = next(model.parameters())
    for name, how in hidden_parts(model):
        module = part(model, name)
        if how in ("in", "out"):
            new = prune_linear_layer(module, index, dim=AXIS[how])
        elif how == "table":
            new = nn.Embedding(module.num_embeddings, len(kept), padding_idx=module.padding_idx)
            new.weight.data = module.weight.data[:, index].clone()
        else:
            new = nn.LayerNorm(len(kept), eps=module.eps, elementwise_affine=module.elementwise_affine,
                               bias=module.bias is not None)
            if module.elementwise_affine:
                new.weight.data = module.weight.data[index].clone()
                if module.bias is not None:
                    new.bias.data = module.bias.data[index].clone()
        replace(model, name, new.to(device=weight.device, dtype=weight.dtype))
    if len(kept) < full_width(model.config):
        setattr(model.config, RECORD, len(kept))
