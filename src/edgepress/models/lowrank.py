"""Low-rank factorization of an encoder's Linears: a chosen Linear (in -> out) replaced by two thinner ones from its
truncated SVD, W ~ (U_r sqrt(S_r)) (sqrt(S_r) V_r^T): `down` (in -> rank, no bias), then `up` (rank -> out, the
bias), in any family `models.arch` knows. At rank r it costs r (in + out) multiply-adds a token where W cost
in x out: fewer only below in x out / (in + out), and faster in ONNX Runtime only where its kernels say so (the
method times both at the run's shape: `compress.lowrank`).

Which Linears (`PARTS`): every layer's FFN input and output projections, and the attention's output projection. Not
Q, K and V: ONNX Runtime's Attention fusion takes their MatMuls as they are, and factored ones would leave the
attention unfused (slower, whatever the rank).

The word table too (`WORDS`, ALBERT's factorized embedding, Lan et al. 2020): (vocab, hidden) stored as a
(vocab, rank) table and a (rank -> hidden) Linear, a lookup then one small MatMul a token. That is for size (the table
is half of a MiniLM's weights, and int8-dynamic leaves it float), not speed.

The model dir records {module name in the base model: rank} as `config.lowrank_ranks`; edgepress's loader builds
the model from its config, puts the factored Linears in place at those ranks (`rebuild`), and loads the weights, as
it does for pruned heads and a narrowed width (`models.loading`).
"""

import functools

from edgepress.errors import ModelError
from edgepress.models.arch import arch_of, layer_list, part, replace

RECORD = "lowrank_ranks"  # config.json: {module name: rank} of the Linears stored as two factors
PARTS = ("ffn_in", "ffn_out", "attn_out")  # the Arch paths a layer's factorable Linears are found at
WORDS = "words"  # the part that names the word-embedding table


@functools.cache
def _factored_class():  # built once, on first use: torch is imported late, as everywhere in edgepress
    import torch.nn as nn

    class LowRankLinear(nn.Module):
        """A Linear (in_features -> out_features) stored as two: `down` (in -> rank, no bias), `up` (rank -> out,
        the bias). It keeps a Linear's `in_features` and `out_features`, which the arch seam reads."""

        def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
            super().__init__()
            self.in_features, self.out_features, self.rank = in_features, out_features, rank
            self.down = nn.Linear(in_features, rank, bias=False)
            self.up = nn.Linear(rank, out_features, bias=bias)

        def forward(self, x):
            return self.up(self.down(x))

    class LowRankEmbedding(nn.Module):
        """A word table (num_embeddings x embedding_dim) stored as two: `table` (num_embeddings x rank), `up` (rank
        -> embedding_dim, no bias). It keeps an Embedding's `num_embeddings`, `embedding_dim`, `padding_idx`, and a
        `weight` (the product, computed) for what reads the table (transfer data's perturbed copies)."""

        def __init__(self, num_embeddings: int, embedding_dim: int, rank: int, padding_idx: int | None) -> None:
            super().__init__()
            self.num_embeddings, self.embedding_dim, self.rank = num_embeddings, embedding_dim, rank
            self.padding_idx = padding_idx
            self.table = nn.Embedding(num_embeddings, rank, padding_idx=padding_idx)
            self.up = nn.Linear(rank, embedding_dim, bias=False)

        @property
        def weight(self):
            return self.up(self.table.weight)

        def forward(self, ids):
            return self.up(self.table(ids))

    return LowRankLinear, LowRankEmbedding


def low_rank_linear(in_features: int, out_features: int, rank: int, bias: bool = True):
    return _factored_class()[0](in_features, out_features, rank, bias)


def is_factored_table(module) -> bool:
    return isinstance(module, _factored_class()[1])


def factored_in(model) -> set[str]:
    """The parts (`PARTS`, `WORDS`) `model` stores as factors in any layer."""
    arch, factored = arch_of(model), _factored_class()[0]
    found = {WORDS} if is_factored_table(model.get_input_embeddings()) else set()
    for layer in layer_list(model):
        found |= {name for name in PARTS if isinstance(part(layer, getattr(arch, name)), factored)}
    return found


def factorable(model, parts: tuple[str, ...] = PARTS) -> dict[str, tuple[int, int]]:
    """{module name in `model`'s base model: (in_features, out_features)} of the plain Linears at `parts` (`PARTS`'
    names) in every layer, in layer order, and with `WORDS` among `parts`, of the word table, (rows, width) where it
    is a plain Embedding: names a classifier and its bare encoder share."""
    import torch.nn as nn

    arch, names = arch_of(model), {id(m): name for name, m in model.base_model.named_modules()}
    found = {}
    table = model.get_input_embeddings()
    if WORDS in parts and isinstance(table, nn.Embedding):
        found[names[id(table)]] = (table.num_embeddings, table.embedding_dim)
    for layer in layer_list(model):
        for name in parts:
            module = part(layer, getattr(arch, name)) if name != WORDS else None
            if isinstance(module, nn.Linear):
                found[names[id(module)]] = (module.in_features, module.out_features)
    return found


def recorded_ranks(config) -> dict[str, int]:
    """`config.lowrank_ranks`, checked: {module name: rank}, each rank a whole number of at least 1; {} where the
    model was not factored. A record that does not fit is a ModelError."""
    ranks = getattr(config, RECORD, None)
    if ranks is None:
        return {}
    if not isinstance(ranks, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                              and v >= 1 for k, v in ranks.items()):
        raise ModelError(f"config.json: {RECORD} must map module names to whole-number ranks of at least 1; got "
                         f"{ranks!r}. Fix: save the model again with edgepress")
    return ranks


def factorize(model, ranks: dict[str, int]) -> None:
    """Replace each Linear named in `ranks` (in the base model: `factorable`'s names) by its truncated SVD at that
    rank (`LowRankLinear`), the word table likewise (`LowRankEmbedding`), and record the ranks in its config
    (`lowrank_ranks`, added to any recorded before). At the full rank, min(in, out), the factors multiply back to the
    weight (to float rounding)."""
    import torch
    import torch.nn as nn

    for name, rank in ranks.items():
        module = part(model.base_model, name)
        weight = module.weight.detach().float()  # a Linear's (out, in); a table's (rows, width)
        u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        left, right = u[:, :rank] * s[:rank].sqrt(), s[:rank].sqrt()[:, None] * vh[:rank]  # weight ~ left @ right
        if isinstance(module, nn.Embedding):
            new = _factored_class()[1](module.num_embeddings, module.embedding_dim, rank, module.padding_idx)
            factors = ((new.table.weight, left), (new.up.weight, right.T))
        else:
            new = low_rank_linear(module.in_features, module.out_features, rank, module.bias is not None)
            factors = ((new.down.weight, right), (new.up.weight, left))
            if module.bias is not None:
                factors += ((new.up.bias, module.bias.detach()),)
        with torch.no_grad():
            for target, value in factors:
                target.copy_(value)
        replace(model.base_model, name, new.to(device=module.weight.device, dtype=module.weight.dtype))
    if ranks:
        setattr(model.config, RECORD, {**recorded_ranks(model.config), **ranks})


def rebuild(model, ranks: dict[str, int]) -> None:
    """Put factored Linears and a factored word table of the recorded shapes in place (weights to be loaded next):
    what the loader does for a model dir with `lowrank_ranks`. A name that is no plain Linear or Embedding of the
    model is a ModelError."""
    import torch.nn as nn

    for name, rank in ranks.items():
        module = part(model.base_model, name)
        full = min(module.weight.shape) if isinstance(module, nn.Embedding | nn.Linear) else None
        if full is not None and rank > full:
            raise ModelError(f"config.json: {RECORD} gives {name} rank {rank}, above its full rank {full}. Fix: save "
                             f"the model again with edgepress")
        if isinstance(module, nn.Embedding):
            new = _factored_class()[1](module.num_embeddings, module.embedding_dim, rank, module.padding_idx)
        elif isinstance(module, nn.Linear):
            new = low_rank_linear(module.in_features, module.out_features, rank, module.bias is not None)
        else:
            raise ModelError(f"config.json: {RECORD} names {name}, which is not a Linear or an embedding table of "
                             f"this model. Fix: save the model again with edgepress")
        replace(model.base_model, name, new)
