"""Knowledge distillation of a BERT-family classifier into a shallower student of the same width.

The student copies the teacher's config with fewer layers and is initialised from it: embeddings, pooler and
classifier as they are, encoder layer i from teacher layer `layer_map[i]` (by default evenly spaced: 6 -> 3 takes
layers 0, 2, 4; DistilBERT, Sanh et al. 2019, section 3). It is then trained with the project's one training loop on
the train split, with one of three losses:

- `hinton`: (1 - alpha) * CE(student, labels) + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))
  (Hinton et al. 2015). Teacher logits are computed once for the whole train split.
- `distilbert`: the hinton loss + a cosine loss between student and teacher last hidden states (Sanh et al. 2019,
  section 2: L_ce + L_cos; no MLM term for a classifier).
- `tinybert`: the hinton loss + MSE between student layer i's hidden states and teacher layer g(i) = i * L_t / L_s
  for every layer including the embeddings, + the MSE between the mapped layers' attention scores (Jiao et al.
  2020, section 3.1, uniform mapping, eq. 7). The teacher runs alongside the student every step.

TinyBERT fits the *unnormalised* scores Q K^T / sqrt(d) (their section 3.1: faster convergence than the softmax),
which no attention implementation returns (eager returns probabilities, SDPA nothing). Forward hooks on the Q and K
projections record their outputs, and the scores are formed from those: the same numbers whatever implementation
runs the attention itself, and gradients reach the student's Q and K through them.
"""

import logging
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from edgepress.compress.kd import (
    KdLoss,
    hinton,
    soft_target_loss,
    transfer_set,
    validation_vectors,
    vector_training,
)
from edgepress.compress.projected import (
    attach_projection,
    check_offsets,
    projected_hidden_loss,
    save_without_projection,
)
from edgepress.configs import Epochs, LayerIndex, Layers, PathName, changed
from edgepress.data import DataSplits
from edgepress.errors import ConfigError
from edgepress.models.arch import arch_of, depth, head_size, layer_list, part
from edgepress.models.evaluate import forward_inputs, in_precision
from edgepress.models.train import EPOCHS, TrainConfig

log = logging.getLogger(__name__)


class DistillConfig(TrainConfig, KdLoss):
    """The `distill` method: the student's shape and loss, and the training fields of `TrainConfig`."""

    student_layers: Layers = Field(3, description="encoder layers of the student (fewer than the teacher's), "
                                                    "each initialised from a teacher layer")
    style: Literal["hinton", "distilbert", "tinybert"] = Field("hinton", description="hinton: soft targets; "
                                                               "distilbert: + cosine loss on the last hidden "
                                                               "states; tinybert: + every mapped layer's hidden "
                                                               "states and attention scores")
    layer_map: tuple[LayerIndex, ...] | None = Field(None, description="teacher layer each student layer starts "
                                                     "from (the tinybert and distilbert losses map layers uniformly, "
                                                     "whatever it is)")
    hidden_weight: float = Field(1.0, ge=0, le=1000, description="weight of the hidden-state loss (distilbert, "
                                                                 "tinybert)")
    attention_weight: float = Field(1.0, ge=0, le=1000, description="weight of the attention-score loss (tinybert)")
    student: PathName | None = Field(None, description="a pretrained encoder to train into the student instead of "
                                     "cutting the teacher's layers (a model dir, or demo:minilm): it reads the text "
                                     "with its own tokenizer, gets a fresh classification head named like the "
                                     "teacher's, and learns the teacher's logits (style hinton; style tinybert: "
                                     "and the teacher's hidden states through a learned projection, on the tokens "
                                     "both tokenizers cut alike); its bundle ships its tokenizer. student_layers and "
                                     "layer_map do not apply")
    epochs: Epochs = Field(4, description=EPOCHS)

    @model_validator(mode="after")
    def _map_fits(self) -> "DistillConfig":
        if self.layer_map is not None and len(self.layer_map) != self.student_layers:
            raise ValueError(f"layer_map has {len(self.layer_map)} entries; student_layers is {self.student_layers}")
        return self

    @model_validator(mode="after")
    def _student_of_its_own(self) -> "DistillConfig":
        if self.student is not None:
            shaped = changed(self, ("student_layers", "layer_map"))
            if shaped:
                raise ValueError(f"{' and '.join(shaped)} shape a student cut from the teacher's layers; student "
                                 f"names a pretrained encoder of its own: leave {' and '.join(shaped)} out")
            if self.style == "distilbert":
                raise ValueError("style distilbert compares last hidden states of one width; a pretrained student "
                                 "learns the teacher's logits (style hinton) or its hidden states through a learned "
                                 "projection (style tinybert)")
            if self.style == "tinybert" and changed(self, ("attention_weight",)):
                raise ValueError("a pretrained student attends over its own tokens: tinybert compares its hidden "
                                 "states only (through a learned projection), not attention scores; leave "
                                 "attention_weight out")
        return self

    @model_validator(mode="after")
    def _weights_fit_the_style(self) -> "DistillConfig":
        used = {"hinton": (), "distilbert": ("hidden_weight",), "tinybert": ("hidden_weight", "attention_weight")}
        ignored = [n for n in changed(self, ("hidden_weight", "attention_weight")) if n not in used[self.style]]
        if ignored:
            raise ValueError(f"{' and '.join(ignored)} weigh(s) a loss style {self.style} does not have; remove "
                             f"it or choose a style that has it (distilbert: hidden_weight; tinybert: both)")
        return self


def default_layer_map(teacher_layers: int, student_layers: int) -> tuple[int, ...]:
    """Evenly spaced teacher layers, starting at the first: 6 -> 3 gives (0, 2, 4)."""
    return tuple(int(i * teacher_layers / student_layers) for i in range(student_layers))


def check_student(teacher, tokenizer, cfg: DistillConfig, task) -> None:
    """The pre-run check of `distill` (`validate` runs it on the model the config names): the style is one built for
    `task`'s students, and the student fits the teacher (`student_layers`) or, a pretrained one, its dir is whole
    and its tokenizer reads the task's texts (and gives offsets, for tinybert)."""
    from edgepress.models.sentence import encoder_of

    task.check_distill(cfg)
    if cfg.student is not None:
        from edgepress.errors import ModelError
        from edgepress.models.loading import load_hf_tokenizer

        path = student_dir(cfg.student)
        try:
            words = load_hf_tokenizer(path)
        except ModelError as e:
            raise ModelError(f"distill's student: {e}") from None
        task.check_student_words(words)
        if cfg.style == "tinybert":
            check_offsets(tokenizer, words)
        return
    student_layers(encoder_of(teacher), cfg)


def student_dir(spec: Path) -> Path:
    """The pretrained encoder dir `student` names (a demo name resolved), checked whole (config, weights, tokenizer):
    a ModelError naming the fix where it is not one."""
    from edgepress.errors import ModelError
    from edgepress.models.loading import check_model_dir
    from edgepress.teacher import resolve_model

    try:
        path = resolve_model(str(spec))
        check_model_dir(path)
    except ModelError as e:
        raise ModelError(f"distill's student: {e}") from None
    return path


def student_layers(teacher, cfg: DistillConfig) -> tuple[int, ...]:
    """The layers of `teacher` (an encoder) the student starts from; a ConfigError when the student does not fit
    it."""
    arch = arch_of(teacher)
    teacher_layers = depth(teacher)
    mapping = cfg.layer_map or default_layer_map(teacher_layers, cfg.student_layers)
    if cfg.student_layers >= teacher_layers or max(mapping) >= teacher_layers or min(mapping) < 0:
        raise ConfigError(f"a {cfg.student_layers}-layer student from layers {list(mapping)} does not fit a "
                          f"{teacher_layers}-layer teacher. Fix: student_layers below {teacher_layers}, layer_map "
                          f"within 0..{teacher_layers - 1}")
    if arch.first_layer_differs and mapping[0] != 0:
        raise ConfigError(f"a {arch.name} model's first layer differs from the others (no attention norm): the "
                          f"student's first layer must be the teacher's layer 0, not {mapping[0]}. Fix: a layer_map "
                          f"starting at 0 (the default)")
    if cfg.style == "tinybert" and arch.fused_qkv:
        raise ConfigError(f"the tinybert style fits attention scores from separate Q and K projections; {arch.name} "
                          f"computes Q, K and V in one matrix and rotates Q and K after it. Fix: style hinton or "
                          f"distilbert")
    return mapping


def make_student(teacher, cfg: DistillConfig):
    """A shallower copy of `teacher`, initialised from its layers `cfg.layer_map`."""
    import copy

    mapping = student_layers(teacher, cfg)
    student = copy.deepcopy(teacher)
    keep_layers(student, mapping)
    return student, mapping


def keep_layers(model, mapping: tuple[int, ...]) -> None:
    """`model` (a Hugging Face encoder model) cut, in place, to its layers `mapping`, in that order, with what its
    config records per layer (heads removed, Linears factored, ModernBERT's attention kinds) renumbered to match:
    a student cut from a head-pruned or factored model loads as it was saved."""
    from edgepress.models.heads import pruned_heads
    from edgepress.models.lowrank import RECORD as RANKS
    from edgepress.models.lowrank import recorded_ranks

    layers = layer_list(model)
    removed = pruned_heads(model.config) if getattr(model.config, "pruned_heads", None) else {}
    factored = {id(part(model.base_model, name)): rank for name, rank in recorded_ranks(model.config).items()}
    kept = [layers[i] for i in mapping]
    for i in reversed(range(len(layers))):
        del layers[i]
    layers.extend(kept)
    setattr(model.config, arch_of(model).depth_key, len(mapping))
    if isinstance(getattr(model.config, "layer_types", None), list):  # ModernBERT: local or global attention
        model.config.layer_types = [model.config.layer_types[i] for i in mapping]
    if removed:
        model.config.pruned_heads = {new: removed[old] for new, old in enumerate(mapping) if old in removed}
    if factored:  # the factored modules kept, by their names in the cut model
        setattr(model.config, RANKS, {name: factored[id(module)] for name, module
                                      in model.base_model.named_modules(remove_duplicate=False)
                                      if id(module) in factored})


def _hidden_loss(student_states, teacher_states, mask, cfg: DistillConfig):
    """distilbert: cosine of the last hidden states; tinybert: MSE of every mapped layer. Padding is masked out."""
    import torch
    import torch.nn.functional as F

    keep = mask.bool()  # (batch, seq)
    if cfg.style == "distilbert":
        s, t = student_states[-1][keep], teacher_states[-1][keep]  # (tokens, hidden)
        return F.cosine_embedding_loss(s, t, torch.ones(s.shape[0], device=s.device))
    step = (len(teacher_states) - 1) // (len(student_states) - 1)
    pairs = [(student_states[i], teacher_states[i * step]) for i in range(len(student_states))]
    return sum(F.mse_loss(s[keep], t[keep]) for s, t in pairs) / len(pairs)


class AttentionScores:
    """Records the outputs of every encoder layer's Q and K projections on each forward, and turns them into the
    layers' attention scores Q K^T / sqrt(d), (batch, heads, seq, seq), before the mask and the softmax."""

    def __init__(self, model):
        arch = arch_of(model)
        self.layers = [(part(layer, arch.qkv[0]), part(layer, arch.qkv[1]), head_size(arch, layer))
                       for layer in layer_list(model)]
        self.outputs: dict = {}
        self.hooks = [module.register_forward_hook(lambda m, i, out, key=(k, which): self.outputs.__setitem__(key, out))
                      for k, (query, key, _) in enumerate(self.layers)
                      for which, module in (("q", query), ("k", key))]

    def scores(self) -> list:
        result = []
        for k, (_, _, size) in enumerate(self.layers):
            q, key = (self.outputs[(k, w)].float().unflatten(-1, (-1, size)).transpose(1, 2) for w in ("q", "k"))
            result.append(q @ key.transpose(-1, -2) * size ** -0.5)  # (batch, heads, seq, seq)
        return result

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def _attention_loss(student_scores: list, teacher_scores: list, mask) -> object:
    """Jiao et al. 2020, eq. 7: MSE of the attention scores, averaged over heads and the mapped layers; student
    layer j (from 0) learns teacher layer (j + 1) * L_t / L_s - 1, as the hidden states map. Pairs with a padding
    query or key are left out (TinyBERT's code zeroes them)."""
    import torch.nn.functional as F

    keep = mask.bool()
    pairs = keep[:, None, :, None] & keep[:, None, None, :]  # (batch, 1, seq, seq), broadcast over heads
    step = len(teacher_scores) // len(student_scores)
    losses = []
    for j, s in enumerate(student_scores):
        t = teacher_scores[(j + 1) * step - 1]
        if s.shape != t.shape:
            raise ConfigError(f"student layer {j} has attention scores {tuple(s.shape)}, its teacher layer "
                              f"{tuple(t.shape)}: the tinybert attention loss needs the same heads. Fix: "
                              f"attention_weight: 0, or distill before pruning heads")
        losses.append(F.mse_loss(s.masked_select(pairs), t.masked_select(pairs)))
    return sum(losses) / len(losses)


def distill_into(src: Path, out: Path, data: DataSplits, cfg: DistillConfig, task) -> dict:
    """Train the pretrained encoder `cfg.student`, with a fresh head named like the teacher's, into `out` on the
    teacher's logits (hinton): each model reads the texts with its own tokenizer, the teacher once for the transfer
    set, the student every step; the student's tokenizer is saved with it. Style tinybert adds the teacher's hidden
    states through a learned projection (`compress.projected`), the teacher running alongside."""
    from edgepress.files import artifact_dir
    from edgepress.models.introspect import param_counts
    from edgepress.models.loading import with_new_head
    from edgepress.models.train import train_classifier

    teacher, tokenizer = task.load_model(src)
    train, train_logits = transfer_set(src, teacher, tokenizer, data, cfg)
    student, words = with_new_head(student_dir(cfg.student), task.auto_class, teacher.config.id2label, cfg.seed)
    loss, save = soft_target_loss(train_logits, cfg, len(data.train)), None
    if cfg.style == "tinybert":  # and the hidden states, through a projection trained with the student
        loss = projected_hidden_loss(teacher.eval(), tokenizer, words, train.texts, loss,
                                     attach_projection(student, teacher), cfg)
        student.config.output_hidden_states, save = True, save_without_projection
    with artifact_dir(Path(out)) as tmp:
        result = train_classifier(student, words, train, cfg, tmp, loss_fn=loss, save=save,
                                  score=task.training_score(words, data.validation, cfg.max_length))
    log.info("distill: %s (%s, %.1fM parameters) from the teacher's logits, best epoch %d, validation %s %.4f",
             cfg.student, student.config.model_type, param_counts(student)["params"] / 1e6, result.best_epoch,
             result.score, result.best_val_accuracy)
    return {"student": str(cfg.student), "student_model_type": student.config.model_type, "style": cfg.style,
            "student_params": param_counts(student)["params"], "best_epoch": result.best_epoch, **result.details(),
            "transfer_examples": len(train) - len(data.train)}


def distillation_loss(teacher, train_logits, cfg: DistillConfig, scores: tuple | None = None, labelled: int = 0):
    """A `loss_fn` for the training loop: hinton on `train_logits` (indexed by the batch's `index`; a token
    classifier's per word, `word_targets`), or with the teacher run alongside for the hidden-state styles; `scores`
    (student's, teacher's `AttentionScores`) adds TinyBERT's attention loss. Examples from index `labelled` on
    (when > 0) are transfer examples: soft loss only."""
    import torch

    if cfg.style == "hinton":
        return soft_target_loss(train_logits, cfg, labelled)

    def loss(outputs, batch):
        labels = batch["labels"]
        gold = (batch["index"] < labelled).to(labels.device) if labelled else None
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "index", "word_index")}
        teacher.to(labels.device)  # a no-op after the first step; the loop moved the student, not the teacher
        with torch.no_grad(), in_precision(labels.device, cfg.targets_precision):
            taught = teacher(**forward_inputs(teacher, inputs), output_hidden_states=True)
        states = [state.float() for state in taught.hidden_states]
        hidden = _hidden_loss(outputs.hidden_states, states, inputs["attention_mask"], cfg)
        total = hinton(outputs.logits, taught.logits.float(), labels, cfg, gold) + cfg.hidden_weight * hidden
        if scores is not None:
            student, teacher_scores = (s.scores() for s in scores)
            total = total + cfg.attention_weight * _attention_loss(student, teacher_scores, inputs["attention_mask"])
        return total

    return loss


def distill_embeddings(src: Path, out: Path, data: DataSplits, cfg: DistillConfig, task) -> dict:
    """A `cfg.student_layers`-layer student of the sentence encoder in `src`, its vectors trained to the teacher's
    (`vector_training`) on the train texts and any transfer texts (augment's copies, data.unlabeled: an embedder
    needs no labels)."""
    from edgepress.models.sentence import sentence_encoder

    teacher, tokenizer = task.load_model(src)
    check_student(teacher, tokenizer, cfg, task)  # the style
    transformer, mapping = make_student(teacher.transformer, cfg)
    student = sentence_encoder(transformer, teacher.layout)
    train, targets = transfer_set(src, teacher, tokenizer, data, cfg)  # targets: the teacher's vectors
    reference = validation_vectors(teacher, tokenizer, data, cfg)
    result = vector_training(student, tokenizer, train, targets, reference, data, cfg, Path(out))
    log.info("distill: %d -> %d layers (from %s), best epoch %d, validation neighbour overlap %.4f",
             depth(teacher.transformer), cfg.student_layers, list(mapping), result.best_epoch,
             result.best_val_accuracy)
    return {"layer_map": list(mapping), "best_epoch": result.best_epoch, **result.details(),
            "transfer_examples": len(train) - len(data.train)}


def distill(src: Path, out: Path, data: DataSplits, cfg: DistillConfig = DistillConfig(), task=None) -> dict:
    """Train a `cfg.student_layers`-layer student of the model of `task` in `src` into `out` (save_pretrained) on
    the teacher's logits (a token classifier's: per word); of a sentence encoder, on its vectors
    (`distill_embeddings`). `task`: the run's (None: the model dir's own, `task_of`)."""
    from edgepress.files import artifact_dir
    from edgepress.models.train import train_classifier
    from edgepress.tasks import task_of

    task = task or task_of(src)
    if task.targets == "vectors":
        return distill_embeddings(src, out, data, cfg, task)
    if cfg.student is not None:
        return distill_into(src, out, data, cfg, task)

    teacher, tokenizer = task.load_model(src)
    student, mapping = make_student(teacher, cfg)
    train, train_logits = transfer_set(src, teacher, tokenizer, data, cfg)
    scores = (AttentionScores(student), AttentionScores(teacher)) if cfg.style == "tinybert" and \
        cfg.attention_weight > 0 else None
    with artifact_dir(Path(out)) as tmp:
        student.config.output_hidden_states = cfg.style != "hinton"
        try:
            result = train_classifier(student, tokenizer, train, cfg, tmp,
                                      loss_fn=distillation_loss(teacher.eval(), train_logits, cfg, scores,
                                                                len(data.train)),
                                      score=task.training_score(tokenizer, data.validation, cfg.max_length))
        finally:
            for recorder in scores or ():
                recorder.remove()
        student.config.output_hidden_states = False  # training needed them; inference and export do not
        student.config.save_pretrained(tmp)
    log.info("distill: %d -> %d layers (from %s), best epoch %d, validation %s %.4f",
             depth(teacher), cfg.student_layers, list(mapping), result.best_epoch, result.score,
             result.best_val_accuracy)
    return {"layer_map": list(mapping), "best_epoch": result.best_epoch, **result.details(),
            "transfer_examples": len(train) - len(data.train)}
