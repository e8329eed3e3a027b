"""Where each encoder family keeps what edgepress changes: its layers, their attention heads and FFN neurons, and the
config keys that count them. One frozen `Arch` per family, chosen once by `arch_of(model)`: every method finds the
parts through it, so that a family is supported by every method once it is described here.

Layouts (transformers 5):
- bert (also roberta, xlm-roberta, electra, camembert): `encoder.layer[i].attention.self.{query,key,value}`,
  `attention.output.dense`, `intermediate.dense`, `output.dense`.
- distilbert: `transformer.layer[i].attention.{q,k,v,out}_lin`, `ffn.lin1`, `ffn.lin2`; config `n_layers`,
  `n_heads`, `hidden_dim`.
- deberta-v2 (DeBERTa-v3 checkpoints): BERT's layout with `{query,key,value}_proj`, and, unless `share_att_key`,
  `pos_key_proj` / `pos_query_proj`, whose rows are per head as Q's and K's are.
- modernbert: `layers[i].attn.Wqkv` (one Linear, rows ordered (Q|K|V, head, dim)), `attn.Wo`; `mlp.Wi` holds both
  halves of the GeGLU (rows: input half, then gate half: a neuron is a pair of rows), `mlp.Wo`; no biases by default.
- mpnet: `encoder.layer[i].attention.attn.{q,k,v,o}`, `intermediate.dense`, `output.dense`. Its attention adds a
  relative-position bias (batch, heads, seq, seq) that the encoder computes once, from one table, for every layer
  (the third argument of `attention.attn`): a layer that lost heads takes its own heads' part of it
  (`head_bias_arg`, a forward pre-hook that `keep_heads` installs and the pruned-heads loader installs again).

Every attention here reshapes its projections to `(batch, seq, -1, head_size)`, so a layer runs with whatever number
of heads its matrices hold; the attributes that count heads are updated too where the forward reads them (DeBERTa's
`num_attention_heads`).
"""

from dataclasses import dataclass
from operator import attrgetter

from edgepress.errors import ConfigError


@dataclass(frozen=True)
class Arch:
    """One encoder family: paths are attribute paths, from the base model (`layers`) or from one layer (the rest)."""

    name: str
    layers: str
    depth_key: str  # config key: number of layers
    heads_key: str  # config key: attention heads per layer (before any pruning)
    ffn_key: str  # config key: FFN neurons per layer
    attention: str  # the module whose attributes count its heads (and hold its head size)
    qkv: tuple[str, ...]  # Linears whose output rows are grouped by head: Q, K, V, or one fused QKV
    attn_out: str  # the Linear that takes the heads' outputs (its input columns are grouped by head)
    ffn_in: str
    ffn_out: str
    head_rows: tuple[str, ...] = ()  # further Linears with rows per head, where the model has them
    fused_qkv: bool = False  # qkv is one Linear: rows (3, heads, head_size)
    gated_ffn: bool = False  # ffn_in rows: (2, neurons): GLU input half, then gate half
    first_layer_differs: bool = False  # layer 0 is built differently (ModernBERT: no attention norm)
    head_bias_arg: int | None = None  # the attention's argument holding a per-head bias shared by all layers (MPNet)


BERT = Arch("bert", "encoder.layer", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "attention.self", ("attention.self.query", "attention.self.key", "attention.self.value"),
            "attention.output.dense", "intermediate.dense", "output.dense")
DISTILBERT = Arch("distilbert", "transformer.layer", "n_layers", "n_heads", "hidden_dim", "attention",
                  ("attention.q_lin", "attention.k_lin", "attention.v_lin"), "attention.out_lin", "ffn.lin1",
                  "ffn.lin2")
DEBERTA_V2 = Arch("deberta-v2", "encoder.layer", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "attention.self", ("attention.self.query_proj", "attention.self.key_proj",
                                     "attention.self.value_proj"),
                  "attention.output.dense", "intermediate.dense", "output.dense",
                  head_rows=("attention.self.pos_key_proj", "attention.self.pos_query_proj"))
MODERNBERT = Arch("modernbert", "layers", "num_hidden_layers", "num_attention_heads", "intermediate_size", "attn",
                  ("attn.Wqkv",), "attn.Wo", "mlp.Wi", "mlp.Wo", fused_qkv=True, gated_ffn=True,
                  first_layer_differs=True)
MPNET = Arch("mpnet", "encoder.layer", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "attention.attn", ("attention.attn.q", "attention.attn.k", "attention.attn.v"), "attention.attn.o",
             "intermediate.dense", "output.dense", head_bias_arg=2)

ARCHS = {"bert": BERT, "roberta": BERT, "xlm-roberta": BERT, "electra": BERT, "camembert": BERT,
         "distilbert": DISTILBERT, "deberta-v2": DEBERTA_V2, "modernbert": MODERNBERT, "mpnet": MPNET}


def arch_for(model_type: str) -> Arch | None:
    """The family of a config's `model_type`, or None where edgepress does not know its layout."""
    return ARCHS.get(model_type)


def arch_of(model) -> Arch:
    """The family of a loaded model; a ConfigError naming the supported ones for any other."""
    arch = arch_for(model.config.model_type)
    if arch is None:
        raise ConfigError(f"edgepress does not know the layer layout of {model.config.model_type} models; it knows "
                          f"{', '.join(sorted(ARCHS))}. Fix: a model of one of those families, or only the ONNX "
                          f"stages (export, optimize, int8-dynamic, ...), which take any encoder")
    return arch


def part(module, path: str):
    """The submodule at a dotted attribute path, or None where the model has none (optional projections)."""
    try:
        return attrgetter(path)(module)
    except AttributeError:
        return None


def replace(module, path: str, new) -> None:
    owner, _, name = path.rpartition(".")
    setattr(part(module, owner) if owner else module, name, new)


def layer_list(model):
    """The model's `nn.ModuleList` of encoder layers."""
    return part(model.base_model, arch_of(model).layers)  # a bare encoder (AutoModel) is its own base model


def depth(model) -> int:
    return len(layer_list(model))


def head_size(arch: Arch, layer) -> int:
    attention = part(layer, arch.attention)
    return getattr(attention, "attention_head_size", None) or attention.head_dim


def heads_of(arch: Arch, layer) -> int:
    """The heads a layer has now (pruning may have left fewer than the config's count)."""
    return part(layer, arch.attn_out).in_features // head_size(arch, layer)


def neurons_of(arch: Arch, layer) -> int:
    return part(layer, arch.ffn_out).in_features


def _rows(unit: int, kept: list[int], parts: int, total: int) -> list[int]:
    """Row indices of the kept units (each `unit` rows wide) in a matrix of `parts` blocks of `total` units."""
    return [p * total * unit + k * unit + j for p in range(parts) for k in kept for j in range(unit)]


def _shrink(layer, path: str, index: list[int], dim: int) -> None:
    import torch
    from transformers.pytorch_utils import prune_linear_layer

    linear = part(layer, path)
    if linear is not None:
        replace(layer, path, prune_linear_layer(linear, torch.tensor(index, dtype=torch.long), dim=dim))


def keep_heads(arch: Arch, layer, kept: list[int]) -> None:
    """Shrink one layer's attention to the heads `kept` (indices among its current heads)."""
    size, heads = head_size(arch, layer), heads_of(arch, layer)
    for path in arch.qkv:
        _shrink(layer, path, _rows(size, kept, 3 if arch.fused_qkv else 1, heads), dim=0)
    for path in arch.head_rows:
        _shrink(layer, path, _rows(size, kept, 1, heads), dim=0)
    _shrink(layer, arch.attn_out, _rows(size, kept, 1, heads), dim=1)
    attention = part(layer, arch.attention)
    for name, value in (("num_attention_heads", len(kept)), ("n_heads", len(kept)),
                        ("all_head_size", len(kept) * size)):
        if hasattr(attention, name):
            setattr(attention, name, value)
    if arch.head_bias_arg is not None:
        attention.register_forward_pre_hook(_heads_of_shared_bias(arch.head_bias_arg, kept))


def _heads_of_shared_bias(index: int, kept: list[int]):
    """A forward pre-hook giving an attention that kept the heads `kept` (of all the layer had) only their part of
    the per-head bias in its argument `index` (batch, heads, seq, seq), which the encoder computed for all heads."""
    def take(module, args):
        if len(args) > index and args[index] is not None:
            return (*args[:index], args[index][:, kept], *args[index + 1:])
        return None

    return take


def keep_neurons(arch: Arch, layer, kept: list[int]) -> None:
    """Shrink one layer's FFN to the neurons `kept` (a GLU neuron is its input row and its gate row)."""
    total = neurons_of(arch, layer)
    _shrink(layer, arch.ffn_in, _rows(1, kept, 2 if arch.gated_ffn else 1, total), dim=0)
    _shrink(layer, arch.ffn_out, kept, dim=1)


def _part(module, in_encoder: bool, in_base: bool) -> str | None:
    import torch.nn as nn

    if isinstance(module, nn.LayerNorm):
        return "layernorm"
    if isinstance(module, nn.Embedding):
        return "embeddings"
    if isinstance(module, nn.Linear):
        return "encoder" if in_encoder else "pooler" if in_base else "classifier"
    return None


def prunable_weights(model, include: tuple[str, ...] = ()) -> dict:
    """name -> weight Parameter of everything the methods prune: the encoder layers' Linear weights, and the parts
    `include` names."""
    base = getattr(model, model.base_model_prefix, model)  # an encoder without a head (AutoModel) is its own base
    if arch_for(model.config.model_type) is None:
        raise ConfigError(f"unstructured pruning supports the encoder families edgepress knows "
                          f"({', '.join(sorted(ARCHS))}); got {model.config.model_type}. Fix: a model of one of "
                          f"those families")
    layers = layer_list(model)
    encoder = {id(m) for layer in layers for m in layer.modules()}
    inside = {id(m) for m in base.modules()}
    chosen = {}
    for name, module in model.named_modules():
        part = _part(module, id(module) in encoder, id(module) in inside)
        if part == "encoder" or (part is not None and part in include):
            chosen[f"{name}.weight"] = module.weight
    return chosen
