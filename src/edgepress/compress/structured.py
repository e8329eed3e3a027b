"""Structured pruning: whole attention heads (`heads`), FFN neurons (`ffn`) or hidden dimensions (`width`) removed,
so the matrices shrink and ONNX Runtime really runs faster (unstructured zeros do not speed it up, ARCHITECTURE.md),
in every encoder family `models.arch` describes (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, DeBERTa-v2, ModernBERT,
MPNet: fused QKV rows and GeGLU row pairs included). Each writes a Hugging Face dir: pruned heads are recorded in
`config.pruned_heads`, which edgepress's loader rebuilds (models/heads.py; plain transformers 5 `from_pretrained`
cannot); FFN pruning keeps the same number of neurons in every layer so that the config's FFN width
(`intermediate_size`, DistilBERT's `hidden_dim`) describes it (plain `from_pretrained` loads that); a narrowed hidden
width is recorded as `config.pruned_hidden_size` and rebuilt by the same loader (models/width.py). A sentence encoder
is not narrowed (its vectors would change size).

Importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", section 4.1): the expected
|d loss / d gate| of a gate multiplying each head's (or neuron's) output, accumulated over training batches. After
pruning, the model is fine-tuned with the hinton distillation loss against itself before pruning. A hidden
dimension's importance is the first-order change of the loss were it removed (Molchanov et al. 2019: |sum of
weight x gradient| over the weights that carry it), summed over batches as the gates' is (`width_importance`).

A sentence encoder (a sentence-transformers dir) has its Transformer module pruned: the loss is the distance of its
sentence vectors to the unpruned model's (or the `teacher`'s: `distill.vector_loss`), for the importance and for the
recovery, which keeps the epoch whose validation vectors find most of the teacher's neighbours.
"""

import copy
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np
from pydantic import Field, field_validator

from edgepress.compress.kd import KdLoss
from edgepress.compress.projected import (
    attach_projection,
    check_offsets,
    projected_hidden_loss,
    save_without_projection,
)
from edgepress.configs import PathName
from edgepress.data import DataSplits
from edgepress.errors import ConfigError, missing
from edgepress.models.arch import arch_of, keep_neurons, layer_list, neurons_of, part
from edgepress.models.evaluate import forward_inputs
from edgepress.models.heads import remove_heads
from edgepress.models.lowrank import PARTS, WORDS, factored_in
from edgepress.models.sentence import encoder_of
from edgepress.models.train import TrainConfig
from edgepress.models.width import AXIS, RECORD, narrow

log = logging.getLogger(__name__)


class Recovery(TrainConfig, KdLoss):
    """Fields shared by the methods that cut a model and recover it (`recover`): what they keep, and the recovery
    fine-tune (the training fields of `TrainConfig`, distilled from the uncut model with `KdLoss`)."""

    keep: float = Field(0.5, gt=0, le=1, description="fraction kept in every layer")
    hidden_weight: float = Field(0.0, ge=0, le=1000, description="weight of TinyBERT's hidden-state loss in the "
                                 "recovery (sequence classifiers): each layer's hidden states, through a projection "
                                 "to the teacher's width trained with the model and dropped when it is saved, learn "
                                 "the teacher's (layer m x L_t / L_s) by MSE; 0: the logits alone")
    teacher: PathName | None = Field(None, description="the model dir whose logits the recovery fine-tune learns, or "
                                 "`baseline`: the run's baseline (the teacher a student was distilled from: its "
                                 "labels are kept better, at the same training time); none: the stage's input as "
                                 "it was before pruning")

    @field_validator("keep")
    @classmethod
    def _removes_something(cls, keep: float) -> float:
        if keep == 1:
            raise ValueError("keep 1.0 removes nothing: the stage would only fine-tune. Fix: a fraction in (0, 1), "
                             "e.g. 0.5, or remove the stage")
        return keep


class _Pruning(Recovery):
    """The structured methods' fields: `Recovery`'s, and the importance pass."""

    importance_batches: int = Field(32, ge=1, le=10**5, description="train batches the importance is averaged over")


class HeadsConfig(_Pruning):
    """The `heads` method: keep the `keep` most important attention heads of every layer."""

    what: ClassVar[str] = "heads"


class FfnConfig(_Pruning):
    """The `ffn` method: keep the `keep` most important FFN neurons of every layer (the same number in each)."""

    what: ClassVar[str] = "ffn"


class WidthConfig(_Pruning):
    """The `width` method: keep the `keep` most important dimensions of the hidden state (the residual stream:
    embeddings, every layer's input and output projections and norms, the head's input), the heads and FFN as
    they are."""

    what: ClassVar[str] = "width"


BASELINE = "baseline"  # `teacher: baseline`: the run's baseline dir goes in its place (`fill_teacher`)


def fill_teacher(params: dict, run) -> dict:
    """`teacher: baseline` is the run's baseline model dir (`RunContext.baseline`)."""
    return {**params, "teacher": str(run.baseline)} if params.get("teacher") == BASELINE else params


# the parts lowrank may factor (`models.lowrank.PARTS`, `WORDS`) that each cut reshapes, so takes whole: heads
# the attention's output projection, ffn the FFN's two, width every one and the word table
CUT_PARTS = {"heads": ("attn_out",), "ffn": ("ffn_in", "ffn_out"), "width": (*PARTS, WORDS)}


def factored_fix(what: str, parts: list[str], stage: str = "lowrank") -> str:
    """How to let `what` cut a model whose `parts` a lowrank `stage` factored before it."""
    return f"Fix: put {stage} after {what}, or leave {', '.join(parts)} out of its parts"


def check_structured(model, tokenizer, cfg: Recovery, task) -> None:
    """The pre-run check of the methods that cut and recover (heads, ffn, width, lowrank): the model's layers are
    ones they can cut, a `teacher` dir exists and is one whose outputs can teach the model of `task`
    (`task.check_teacher`: a classifier's with its labels, a sentence encoder's), and a recovery the task's models
    take (`task.check_recovery`: its hidden-state loss); for heads, ffn and width, a model they can cut
    (`_prunable`: its Linears whole, its heads not pruned before)."""
    arch_of(encoder_of(model))
    task.check_recovery(cfg)
    if isinstance(cfg, _Pruning):
        _prunable(encoder_of(model), "the model", cfg.what)
    if cfg.teacher is None or str(cfg.teacher) == BASELINE:
        return
    if not cfg.teacher.exists():
        raise ConfigError(f"teacher {missing(cfg.teacher)}. Fix: the model dir the student was distilled from, or "
                          f"teacher: baseline (the run's model)")
    task.check_teacher(model, cfg.teacher)


def check_width(model, tokenizer, cfg: WidthConfig, task) -> None:
    """The pre-run check of `width`: `check_structured`'s, a model of its full width, and one whose hidden state
    width can narrow everywhere it is carried (`models.width.hidden_parts`)."""
    from edgepress.models.width import hidden_parts

    check_structured(model, tokenizer, cfg, task)
    hidden_parts(model)


def gate_gradients(model, tokenizer, data: DataSplits, cfg: _Pruning, what: str, loss_of=None
                   ) -> Iterator[np.ndarray]:
    """d loss / d gate (layers, units) of each of the first `importance_batches` train batches, with a gate of 1
    multiplying every head's output or every FFN neuron's output: the input of the layer's attention output
    projection (batch, seq, heads * head_size), or of its FFN output projection (batch, seq, neurons). The loss is
    the model's own (a classifier's, on the labels), or `loss_of(model, batch, index)`."""
    import torch

    from edgepress.models.arch import head_size, heads_of
    from edgepress.models.train import train_loader

    arch, layers = arch_of(encoder_of(model)), layer_list(encoder_of(model))
    if what == "heads":
        units, size, path = heads_of(arch, layers[0]), head_size(arch, layers[0]), arch.attn_out

        def gated(k, x):
            return (x.unflatten(-1, (units, size)) * gates[k][:, None]).flatten(-2)
    else:
        units, path = neurons_of(arch, layers[0]), arch.ffn_out

        def gated(k, x):
            return x * gates[k]
    gates = torch.ones(len(layers), units, requires_grad=True)
    hooks = [part(layer, path).register_forward_pre_hook(lambda m, args, k=k: (gated(k, args[0]), *args[1:]))
             for k, layer in enumerate(layers)]
    model.eval()
    try:
        for step, batch in enumerate(train_loader(tokenizer, data.train, cfg)):
            if step == cfg.importance_batches:
                break
            index = batch.pop("index")
            loss = model(**forward_inputs(model, batch)).loss if loss_of is None else loss_of(model, batch, index)
            (grad,) = torch.autograd.grad(loss, gates)
            yield grad.numpy()
    finally:
        for hook in hooks:
            hook.remove()


def _gated_importance(model, tokenizer, data: DataSplits, cfg: _Pruning, what: str, loss_of=None) -> np.ndarray:
    """(layers, units): sum over batches of |d loss / d gate|. The absolute value is taken per batch, as Michel et
    al. 2019 (eq. 2) do: signed gradients of opposite batches would cancel and make a head that matters a lot, in
    both directions, look unimportant. Of the hidden width (`width`): (1, hidden), `width_importance`."""
    if what == "width":
        return width_importance(model, tokenizer, data, cfg)[None]
    return sum(np.abs(grad) for grad in gate_gradients(model, tokenizer, data, cfg, what, loss_of))


def width_importance(model, tokenizer, data: DataSplits, cfg: _Pruning) -> np.ndarray:
    """(hidden,): per hidden dimension, the sum over the first `importance_batches` train batches of |sum of
    weight x d loss / d weight| over every weight that carries it (`models.width.hidden_parts`): the first-order
    change of the loss were the dimension removed (Molchanov et al. 2019's Taylor importance of a group), its absolute
    value per batch as the gates' is."""
    import torch

    from edgepress.models.train import train_loader
    from edgepress.models.width import hidden_parts, hidden_size

    carried = [(parameter, AXIS[how]) for name, how in hidden_parts(model)
               for parameter in (part(model, name).weight, getattr(part(model, name), "bias", None))
               if parameter is not None and parameter.dim() > AXIS[how]]  # an input Linear's bias: not carried
    total = np.zeros(hidden_size(model.config))
    model.eval()
    for step, batch in enumerate(train_loader(tokenizer, data.train, cfg)):
        if step == cfg.importance_batches:
            break
        batch.pop("index")
        loss = model(**forward_inputs(model, batch)).loss
        grads = torch.autograd.grad(loss, [p for p, _ in carried])
        taylor = sum((p * g).sum(dim=1 - axis) if p.dim() == 2 else p * g
                     for (p, axis), g in zip(carried, grads, strict=True))
        total += np.abs(taylor.detach().numpy())
    return total


def keep_top(scores: np.ndarray, keep: float) -> list[list[int]]:
    """Indices (sorted) of the round(keep * units) highest scores of every row, at least one."""
    k = max(1, round(keep * scores.shape[1]))
    return [sorted(np.argsort(-row, kind="stable")[:k].tolist()) for row in scores]


def prune_heads(model, keep: list[list[int]]) -> dict[int, list[int]]:
    """Remove every head not in `keep[layer]`; returns what was removed (also in config.pruned_heads)."""
    heads = getattr(model.config, arch_of(model).heads_key)
    removed = {i: [h for h in range(heads) if h not in kept] for i, kept in enumerate(keep)}
    remove_heads(model, removed)
    return removed


def prune_ffn(model, keep: list[list[int]]) -> int:
    """Keep the neurons `keep[layer]` of every FFN (the same count everywhere); returns the new width."""
    widths = {len(k) for k in keep}
    if len(widths) != 1:
        raise ValueError(f"every layer must keep the same number of FFN neurons, got {sorted(widths)}")
    arch = arch_of(model)
    for layer, kept in zip(layer_list(model), keep, strict=True):
        keep_neurons(arch, layer, kept)
    setattr(model.config, arch.ffn_key, widths.pop())
    return getattr(model.config, arch.ffn_key)


class Cut(NamedTuple):
    """What a method that cuts a model and recovers it removes (`recover`): its name; `plan(model, src)`, which raises,
    before any work, what it cannot cut in the model of the task, and says whether there is anything to cut (False:
    the model goes through as it was, not recovered); `apply(model, tokenizer, data, cfg, loss_of)`, which cuts it (a
    sentence encoder: its Transformer, judging by `loss_of`, the vector loss) and returns the record of what it
    removed."""

    what: str
    plan: Callable[..., bool]
    apply: Callable[..., dict]


def importance_cut(what: str) -> Cut:
    """`heads`, `ffn` or `width`: the units of the lowest importance removed."""
    def plan(model, src: Path) -> bool:
        _prunable(encoder_of(model), src, what)
        return True

    def apply(model, tokenizer, data: DataSplits, cfg: _Pruning, loss_of) -> dict:
        scores = _gated_importance(model, tokenizer, data, cfg, what, loss_of)
        return {"pruned": _prune(encoder_of(model), scores, cfg.keep, what), "importance": scores.round(6).tolist()}

    return Cut(what, plan, apply)


def _unchanged(src: Path, out: Path, what: str) -> dict:
    """`src` copied to `out` as it was: a cut that found nothing to cut (`Cut.plan`)."""
    from edgepress.files import artifact_dir

    log.info("%s: nothing to cut; the model goes through as it was, not recovered", what)
    with artifact_dir(Path(out)) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    return {}


def recover(src: Path, out: Path, data: DataSplits, cfg: Recovery, cut: Cut, task) -> dict:
    """Cut the model of `task` in `src` (`cut`) and recover it into `out` by distillation from itself before the cut
    (or `cfg.teacher`); None: the model dir's own task, `task_of`."""
    from edgepress.tasks import task_of

    task = task or task_of(src)
    if task.targets == "vectors":
        return _recover_embedder(src, out, data, cfg, cut)
    from edgepress.compress.kd import kd_training
    from edgepress.files import artifact_dir
    from edgepress.models.introspect import param_counts
    from edgepress.models.train import train_classifier

    model, tokenizer = task.load_model(src)
    if not cut.plan(model, src):
        return _unchanged(src, out, cut.what)
    before = param_counts(model)["params"]
    # the uncut model's logits (or the teacher's) are the distillation targets of the recovery fine-tune
    # (with its own tokenizer: a vocab stage before this one renumbered the student's tokens, not the teacher's)
    teacher, words = task.load_model(cfg.teacher) if cfg.teacher else (model, tokenizer)
    hidden = _hidden_state_loss(model, tokenizer, teacher, words, cfg) if cfg.hidden_weight else None
    recovery, loss = kd_training(cfg.teacher or src, teacher, words, data, cfg)
    del teacher, words
    removed = cut.apply(model, tokenizer, data, cfg, None)
    save = None
    if hidden:  # and the teacher's hidden states, through a projection trained with the model
        loss, save = hidden(recovery.train.texts, loss), save_without_projection
    with artifact_dir(Path(out)) as tmp:
        result = train_classifier(model, tokenizer, recovery.train, cfg, tmp, loss_fn=loss, save=save,
                                  score=task.training_score(tokenizer, data.validation, cfg.max_length))
    log.info("%s: kept %s, %d -> %d params, validation %s %.4f", cut.what, cfg.keep, before,
             param_counts(model)["params"], result.score, result.best_val_accuracy)
    return {**removed, "recovered_from": str(cfg.teacher or src), **result.details(),
            "transfer_examples": len(recovery.train) - len(data.train)}


def _hidden_state_loss(model, tokenizer, teacher, words, cfg: Recovery) -> Callable:
    """`hidden_weight`'s loss, made before the cut: (texts, soft loss) -> the loss with the teacher's hidden states
    learnt through a projection trained with the model (`compress.projected`; the teacher `model` itself: a copy of
    it before the cut), the model set to give its hidden states. They are compared where both tokenizers cut out the
    same characters."""
    check_offsets(tokenizer, words)
    teacher = copy.deepcopy(model) if teacher is model else teacher

    def loss(texts, soft_loss):
        model.config.output_hidden_states = True
        return projected_hidden_loss(teacher.eval(), words, tokenizer, texts, soft_loss,
                                     attach_projection(model, teacher), cfg)

    return loss


def _prunable(model, src: Path | str, what: str) -> None:
    """Refuse, before any work, an architecture edgepress cannot prune, heads pruned twice (a width narrowed twice:
    `models.width.hidden_parts`) and a model with a part this cut reshapes (`CUT_PARTS`) stored as factors."""
    arch_of(model)
    factored = sorted(set(CUT_PARTS[what]) & factored_in(model))
    if factored:
        raise ConfigError(f"{src} has {', '.join(factored)} factored by lowrank (config.json's lowrank_ranks), which "
                          f"{what} cuts whole. {factored_fix(what, factored)}")
    if what == "heads" and getattr(model.config, "pruned_heads", None):
        raise ConfigError(f"{src} already had heads pruned ({model.config.pruned_heads}); structured pruning "
                          f"takes a model with all its heads. Fix: run heads and ffn once each, on the distilled "
                          f"student")


def _prune(encoder, scores: np.ndarray, keep: float, what: str) -> dict:
    """Keep the `keep` highest-scored heads or neurons of every layer of the HF `encoder`; what was removed."""
    kept = keep_top(scores, keep)
    if what == "width":
        narrow(encoder, kept[0])
        return {RECORD: len(kept[0])}
    pruned = prune_heads(encoder, kept) if what == "heads" else {arch_of(encoder).ffn_key: prune_ffn(encoder, kept)}
    return {str(k): v for k, v in pruned.items()}


def _recover_embedder(src: Path, out: Path, data: DataSplits, cfg: Recovery, cut: Cut) -> dict:
    """`recover` for a sentence encoder: its Transformer cut (for `heads` and `ffn`, by the importance of the vector
    loss against the uncut model's vectors, or `cfg.teacher`'s, a sentence-transformers dir), then recovered to
    them (`distill.vector_training`)."""
    from edgepress.compress.kd import transfer_set, validation_vectors, vector_loss, vector_training
    from edgepress.models.introspect import param_counts
    from edgepress.models.sentence import load_sentence_encoder

    model, tokenizer = load_sentence_encoder(src)
    if not cut.plan(model, src):
        return _unchanged(src, out, cut.what)
    before = param_counts(model)["params"]
    teacher, words = load_sentence_encoder(cfg.teacher) if cfg.teacher else (model, tokenizer)
    train, targets = transfer_set(cfg.teacher or src, teacher, words, data, cfg)  # the vectors to keep
    reference, loss = validation_vectors(teacher, words, data, cfg), vector_loss(targets)  # before the cut
    del teacher, words

    def loss_of(encoder, batch, index):
        return loss(encoder(**forward_inputs(encoder, batch)), {**batch, "index": index})

    removed = cut.apply(model, tokenizer, data, cfg, loss_of)
    result = vector_training(model, tokenizer, train, targets, reference, data, cfg, Path(out))
    log.info("%s: kept %s, %d -> %d params, validation neighbour overlap %.4f", cut.what, cfg.keep, before,
             param_counts(model)["params"], result.best_val_accuracy)
    return {**removed, "recovered_from": str(cfg.teacher or src), **result.details(),
            "transfer_examples": len(train) - len(data.train)}


def heads(src: Path, out: Path, data: DataSplits, cfg: HeadsConfig = HeadsConfig(), task=None) -> dict:
    """Prune attention heads of the model in `src` by importance, fine-tune, save to `out`."""
    return recover(src, out, data, cfg, importance_cut("heads"), task)


def ffn(src: Path, out: Path, data: DataSplits, cfg: FfnConfig = FfnConfig(), task=None) -> dict:
    """Prune FFN neurons of the model in `src` by importance, fine-tune, save to `out`."""
    return recover(src, out, data, cfg, importance_cut("ffn"), task)


def width(src: Path, out: Path, data: DataSplits, cfg: WidthConfig = WidthConfig(), task=None) -> dict:
    """Narrow the hidden width of the model in `src` to its most important dimensions, fine-tune, save to `out`."""
    return recover(src, out, data, cfg, importance_cut("width"), task)
