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

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgepress.cache import built_array, built_once
from edgepress.configs import changed
from edgepress.data import DataSplits
from edgepress.data.augment import VERSION as AUGMENT_VERSION
from edgepress.data.augment import AugmentConfig, augment_texts
from edgepress.data.dataset import EpochDraw, TextSet, text_key
from edgepress.data.tagged import IGNORED, TaggedSet
from edgepress.errors import ConfigError
from edgepress.files import tree_sha256
from edgepress.models.arch import arch_of, depth, head_size, layer_list, part
from edgepress.models.evaluate import forward_inputs
from edgepress.models.train import EPOCHS, TrainConfig

log = logging.getLogger(__name__)


class KdLoss(BaseModel):
    """The soft-target loss every distilling method shares (Hinton et al. 2015)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = Field(2.0, gt=0, description="softens the teacher's and the student's logits before "
                                                      "their KL divergence (the loss is scaled by its square)")
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the soft (teacher) loss against the labels "
                                                     "(transfer examples have the soft loss alone)")
    augment: AugmentConfig | None = Field(None, description="transfer data: perturbed copies of the train texts, "
                                          "labelled by the teacher's soft logits, trained on beside the train split")


class DistillConfig(TrainConfig, KdLoss):
    """The `distill` method: the student's shape and loss, and the training fields of `TrainConfig`."""

    student_layers: int = Field(3, ge=1, description="encoder layers of the student (fewer than the teacher's), "
                                                    "each initialised from a teacher layer")
    style: Literal["hinton", "distilbert", "tinybert"] = Field("hinton", description="hinton: soft targets; "
                                                               "distilbert: + cosine loss on the last hidden "
                                                               "states; tinybert: + every mapped layer's hidden "
                                                               "states and attention scores")
    layer_map: tuple[int, ...] | None = Field(None, description="teacher layer each student layer starts from (the "
                                              "tinybert and distilbert losses map layers uniformly, whatever it is)")
    hidden_weight: float = Field(1.0, ge=0, description="weight of the hidden-state loss (distilbert, tinybert)")
    attention_weight: float = Field(1.0, ge=0, description="weight of the attention-score loss (tinybert)")
    epochs: int = Field(4, ge=1, description=EPOCHS)

    @model_validator(mode="after")
    def _map_fits(self) -> "DistillConfig":
        if self.layer_map is not None and len(self.layer_map) != self.student_layers:
            raise ValueError(f"layer_map has {len(self.layer_map)} entries; student_layers is {self.student_layers}")
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


def check_student(teacher, tokenizer, cfg: DistillConfig) -> tuple[int, ...]:
    """The teacher layers the student starts from; a ConfigError when the student does not fit the teacher (also
    the pre-run check of `distill`: `validate` runs it on the model the config names). A sentence encoder's student
    is trained on its vectors alone: the hidden-state styles are refused there."""
    from edgepress.models.sentence import is_sentence_encoder

    if is_sentence_encoder(teacher):
        if cfg.style != "hinton":
            raise ConfigError(f"a sentence-embedding student learns the teacher's sentence vectors (cosine + MSE); "
                              f"style {cfg.style} adds hidden-state losses not built for it yet. Fix: style hinton "
                              f"(the default)")
        teacher = teacher.transformer
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

    mapping = check_student(teacher, None, cfg)
    student = copy.deepcopy(teacher)
    layers = layer_list(student)
    kept = [layers[i] for i in mapping]
    for i in reversed(range(len(layers))):
        del layers[i]
    layers.extend(kept)
    setattr(student.config, arch_of(student).depth_key, cfg.student_layers)
    if isinstance(getattr(student.config, "layer_types", None), list):  # ModernBERT: local or global attention
        student.config.layer_types = [student.config.layer_types[i] for i in mapping]
    return student, mapping


def _hinton(student_logits, teacher_logits, labels, cfg: KdLoss, labelled=None):
    """The mean over the batch of (1 - alpha) * CE + alpha * T^2 * KL, and of T^2 * KL alone for the examples that
    `labelled` (bool, (batch,)) marks False: transfer examples, whose label is only the teacher's. A token
    classifier's logits (batch, sequence, labels) are compared at its labelled positions (each word's first
    sub-word), the mean taken over those words; a position the teacher has no logits for (NaN: its word was cut off
    in the teacher's tokens) is left out."""
    import torch.nn.functional as F

    if student_logits.ndim == 3:
        chosen = (labels != IGNORED) & teacher_logits.isfinite().all(-1)  # (batch, sequence)
        if not chosen.any():  # sentences without words: nothing to learn, and no NaN mean
            return student_logits.sum() * 0
        gold = None if labelled is None else labelled[:, None].expand_as(labels)[chosen]
        return _hinton(student_logits[chosen], teacher_logits[chosen], labels[chosen], cfg, gold)
    t = cfg.temperature
    soft = F.kl_div(F.log_softmax(student_logits / t, -1), F.softmax(teacher_logits / t, -1),
                    reduction="none").sum(-1) * t * t  # (batch,)
    hard = F.cross_entropy(student_logits, labels, reduction="none")  # (batch,)
    mixed = (1 - cfg.alpha) * hard + cfg.alpha * soft
    return (mixed if labelled is None else mixed.where(labelled, soft)).mean()


def _at_positions(word_logits, word_index):
    """A token classifier's per-word logits (batch, words, labels) placed at the positions that start each word
    (`word_index`, (batch, sequence), -1 elsewhere): (batch, sequence, labels), NaN at the other positions."""
    import torch

    placed = torch.gather(word_logits, 1, word_index.clamp(min=0)[..., None].expand(-1, -1, word_logits.shape[-1]))
    return placed.masked_fill((word_index < 0)[..., None], float("nan"))


def _texts_sha256(texts) -> str:
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode()).hexdigest()


class Rows:
    """The rows of a (memory-mapped) targets array, looked up by a batch's `index`: (batch, ...) float32 tensors. A
    transfer set's targets stay on disk; a batch reads its own rows."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index):
        import torch

        rows = np.array(self.array[np.asarray(index)], np.float32)
        return torch.from_numpy(rows)


def transfer_set(src: Path, model, tokenizer, data: DataSplits, cfg) -> tuple[TextSet, Rows]:
    """The examples a distilling method trains on and the outputs of `model` (loaded from `src`) for them: the train
    split, then, with `cfg.augment`, the perturbed copies of its texts (ids `<id>~<k>`), then the data's unlabeled
    texts (`unlabeled:<i>`); the transfer examples are labelled with `model`'s argmax, and the loss gives them the
    soft targets alone. The copies and the outputs are built once per content (the model's files, the texts, the
    settings) in the cache, the outputs chunk by chunk into a file read memory-mapped: every stage and trial asking
    for the same reuses them. With unlabeled texts, each epoch draws from them as `data.per_epoch` says
    (`EpochDraw`)."""
    import torch

    from edgepress.models.evaluate import on_accelerator, predict_outputs

    train, model_sha = data.train, tree_sha256(src)
    if isinstance(train, TaggedSet):
        return tagged_transfer_set(model_sha, model, tokenizer, data, cfg)
    ids, texts = [], []  # the transfer examples, after the train split's
    if cfg.augment is not None:
        embeddings = model.get_input_embeddings().weight.detach().float().cpu().numpy()  # (vocab, hidden)
        key = {"model": model_sha, "texts": _texts_sha256(train.texts), "augment": cfg.augment.model_dump(),
               "version": AUGMENT_VERSION}
        copies = built_once("transfer", key, lambda: augment_texts(train.texts, tokenizer, embeddings, cfg.augment))
        held = {text_key(t) for t in data.validation.texts + data.test.texts}  # judged on: never trained on
        copies = [[c for c in made if text_key(c) not in held] for made in copies]
        ids += [f"{i}~{k}" for i, made in zip(train.ids, copies, strict=True) for k in range(len(made))]
        texts += [text for made in copies for text in made]
    ids += [f"unlabeled:{i}" for i in range(len(data.unlabeled))]
    texts += data.unlabeled
    everything = train.texts + tuple(texts)
    key = {"model": model_sha, "texts": _texts_sha256(everything), "max_length": cfg.max_length,
           "torch": torch.__version__}
    with on_accelerator(model):
        targets = built_array("targets", key, len(everything), lambda start, stop: predict_outputs(
            model, tokenizer, everything[start:stop], cfg.max_length), what="teacher targets")
    labels = np.concatenate([train.labels, _argmax(targets[len(train):])]).astype(np.int64)
    log.info("distillation targets: %d train examples, %d perturbed copies, %d unlabeled texts", len(train),
             len(texts) - len(data.unlabeled), len(data.unlabeled))
    draw = EpochDraw(len(train), data.per_epoch) if data.unlabeled else None
    return TextSet(train.ids + tuple(ids), everything, labels, draw=draw), Rows(targets)


def _argmax(rows: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """The argmax over the last axis of (memory-mapped) `rows`, a chunk at a time; NaN (a word without logits) as
    -inf: (n,) or (n, words)."""
    parts = [np.nan_to_num(np.asarray(rows[i:i + chunk]), nan=-np.inf).argmax(-1) for i in range(0, len(rows), chunk)]
    return np.concatenate(parts) if parts else np.zeros(rows.shape[:-1], np.int64)


def tagged_transfer_set(model_sha: str, model, tokenizer, data: DataSplits, cfg) -> tuple[TaggedSet, Rows]:
    """`transfer_set` of a token classifier: the train split's tagged sentences, then data.unlabeled's texts split
    into words (`unlabeled:<i>`), each word of those tagged with the teacher's most likely tag (their loss is the soft
    targets alone); and the teacher's per-word logits of them all (`word_targets`)."""
    if cfg.augment is not None:
        raise ConfigError(ONLY_TAGGED_WORDS)
    words = [tuple(text.split()) for text in data.unlabeled]
    train = TaggedSet.joined([data.train, TaggedSet.of([f"unlabeled:{i}" for i in range(len(words))], words,
                                                       [np.zeros(len(w), np.int64) for w in words])])
    targets = word_targets(model_sha, model, tokenizer, train, cfg)
    guessed = _argmax(targets.array[len(data.train):])  # a word cut off: tag 0
    train = TaggedSet.of(train.ids, train.words, [*data.train.tags, *(row[:len(w)] for row, w in zip(
        guessed, words, strict=True))])
    if words:
        log.info("distillation transfer data: %d unlabeled texts, %d words, tagged by the teacher", len(words),
                 sum(map(len, words)))
        train = dataclasses.replace(train, draw=EpochDraw(len(data.train), data.per_epoch))
    return train, targets


def word_targets(model_sha: str, model, tokenizer, train: TaggedSet, cfg) -> Rows:
    """The token classifier `model`'s logits of each word of the tagged sentences `train` (read at its first
    sub-word), (sentences, most words, labels) with NaN past each sentence's words and for a word cut off by
    max_length: the targets of a distillation, built once per content in the cache, chunk by chunk."""
    import torch

    from edgepress.models.evaluate import on_accelerator, predict_word_logits

    texts, labels = train.texts, model.config.num_labels
    width = max((len(words) for words in train.words), default=0)

    def rows(start: int, stop: int) -> np.ndarray:
        out = np.full((stop - start, width, labels), np.nan, np.float32)
        for i, row in enumerate(predict_word_logits(model, tokenizer, texts[start:stop], cfg.max_length)):
            out[i, :len(row)] = row.reshape(-1, labels)
        return out

    key = {"model": model_sha, "texts": _texts_sha256(texts), "max_length": cfg.max_length, "per": "word",
           "torch": torch.__version__}
    with on_accelerator(model):
        targets = built_array("targets", key, len(texts), rows, what="teacher targets")
    log.info("distillation targets: the logits of %d words of %d sentences", sum(map(len, train.words)), len(texts))
    return Rows(targets)


ONLY_TAGGED_WORDS = ("augment makes perturbed copies of texts, whose words would no longer carry their tags: it is "
                     "not built for token classifiers. Fix: remove augment (a token classifier distils on the train "
                     "split's tagged sentences and data.unlabeled's texts, which the teacher tags)")


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
            q, key = (self.outputs[(k, w)].unflatten(-1, (-1, size)).transpose(1, 2) for w in ("q", "k"))
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


def kd_training(src: Path, model, tokenizer, data: DataSplits, cfg) -> tuple[DataSplits, object]:
    """What a fine-tune distilled from `model` as it is now (before it is pruned or quantized) trains on: `data`
    with the transfer set (`transfer_set`) as its train split, and the hinton loss on `model`'s logits."""
    train, targets = transfer_set(src, model, tokenizer, data, cfg)
    kd = DistillConfig(temperature=cfg.temperature, alpha=cfg.alpha, max_length=cfg.max_length)
    return dataclasses.replace(data, train=train), distillation_loss(None, targets, kd, labelled=len(data.train))


def distillation_loss(teacher, train_logits, cfg: DistillConfig, scores: tuple | None = None, labelled: int = 0):
    """A `loss_fn` for the training loop: hinton on `train_logits` (indexed by the batch's `index`; a token
    classifier's per word, `word_targets`), or with the teacher run alongside for the hidden-state styles; `scores`
    (student's, teacher's `AttentionScores`) adds TinyBERT's attention loss. Examples from index `labelled` on
    (when > 0) are transfer examples: soft loss only."""
    import torch

    def loss(outputs, batch):
        labels = batch["labels"]
        gold = (batch["index"] < labelled).to(labels.device) if labelled else None
        if cfg.style == "hinton":
            cached = train_logits[batch["index"].cpu()].to(outputs.logits.device)
            if "word_index" in batch:  # a token classifier's: per word, placed where each word starts
                cached = _at_positions(cached, batch["word_index"].to(cached.device))
            return _hinton(outputs.logits, cached, labels, cfg, gold)
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "index", "word_index")}
        teacher.to(labels.device)  # a no-op after the first step; the loop moved the student, not the teacher
        with torch.no_grad():
            taught = teacher(**forward_inputs(teacher, inputs), output_hidden_states=True)
        hidden = _hidden_loss(outputs.hidden_states, taught.hidden_states, inputs["attention_mask"], cfg)
        total = _hinton(outputs.logits, taught.logits, labels, cfg, gold) + cfg.hidden_weight * hidden
        if scores is not None:
            student, teacher_scores = (s.scores() for s in scores)
            total = total + cfg.attention_weight * _attention_loss(student, teacher_scores, inputs["attention_mask"])
        return total

    return loss


def vector_loss(targets):
    """A `loss_fn` for a sentence-embedding student: 1 - cosine to the teacher's vectors `targets` (indexed by the
    batch's `index`), plus their mean squared error (what a model that does not normalize also needs matched)."""
    import torch.nn.functional as F

    def loss(outputs, batch):
        wanted = targets[batch["index"].cpu()].to(outputs.device)  # (batch, dim)
        return (1 - F.cosine_similarity(outputs, wanted, dim=-1)).mean() + F.mse_loss(outputs, wanted)

    return loss


def distill_embeddings(src: Path, out: Path, data: DataSplits, cfg: DistillConfig) -> dict:
    """A `cfg.student_layers`-layer student of the sentence encoder in `src`, its vectors trained to the teacher's
    (`vector_training`) on the train texts and any transfer texts (augment's copies, data.unlabeled: an embedder
    needs no labels)."""
    from edgepress.models.sentence import load_sentence_encoder, sentence_encoder

    teacher, tokenizer = load_sentence_encoder(src)
    check_student(teacher, tokenizer, cfg)  # the style
    transformer, mapping = make_student(teacher.transformer, cfg)
    student = sentence_encoder(transformer, teacher.layout)
    train, targets = transfer_set(src, teacher, tokenizer, data, cfg)  # targets: the teacher's vectors
    reference = validation_vectors(teacher, tokenizer, data, cfg)
    result = vector_training(student, tokenizer, train, targets, reference, data, cfg, Path(out))
    log.info("distill: %d -> %d layers (from %s), best epoch %d, validation neighbour overlap %.4f",
             depth(teacher.transformer), cfg.student_layers, list(mapping), result.best_epoch,
             result.best_val_accuracy)
    return {"layer_map": list(mapping), "best_epoch": result.best_epoch,
            "val_neighbour_overlap": result.best_val_accuracy, "history": result.history,
            "train_seconds": round(result.seconds, 1), "transfer_examples": len(train) - len(data.train)}


def validation_vectors(teacher, tokenizer, data: DataSplits, cfg):
    """The sentence encoder `teacher`'s vectors of the validation texts: what `vector_training` keeps an epoch by."""
    from edgepress.models.evaluate import predict_outputs

    return predict_outputs(teacher, tokenizer, data.validation.texts, cfg.max_length)


def vector_training(model, tokenizer, train: TextSet, targets, reference, data: DataSplits, cfg, out: Path):
    """Train the sentence encoder `model` to the vectors `targets` of `train` (`vector_loss`), saved to `out` as a
    sentence-transformers dir; the epoch kept is the one whose validation vectors find most of the 10 nearest
    neighbours the vectors `reference` find (`validation_vectors`): what distill and the structured methods'
    recovery share."""
    from edgepress.files import artifact_dir
    from edgepress.models.train import train_classifier

    with artifact_dir(out) as tmp:
        return train_classifier(model, tokenizer, train, data.validation, cfg, tmp, loss_fn=vector_loss(targets),
                                **vector_scoring(reference, tokenizer, data, cfg))


def vector_scoring(reference, tokenizer, data: DataSplits, cfg) -> dict:
    """What the training loop takes besides for a sentence encoder: its validation `score`, the share of the 10
    nearest neighbours the vectors `reference` find (`validation_vectors`) that its vectors find, and `save`, as a
    sentence-transformers dir."""
    from edgepress.data.metrics import embedding_metrics
    from edgepress.models.evaluate import predict_outputs
    from edgepress.models.sentence import save_sentence_encoder
    from edgepress.tasks import NEIGHBOURS

    texts = data.validation.texts
    k = min(NEIGHBOURS, len(texts) - 1)

    def overlap(trained) -> float:
        return embedding_metrics(reference, predict_outputs(trained, tokenizer, texts, cfg.max_length), k)[
            "neighbour_overlap"]

    return {"score": ("neighbour_overlap", overlap), "save": save_sentence_encoder}


def distill(src: Path, out: Path, data: DataSplits, cfg: DistillConfig = DistillConfig()) -> dict:
    """Train a `cfg.student_layers`-layer student of the classifier in `src` into `out` (save_pretrained); of a
    sentence-transformers dir, `distill_embeddings`."""
    from edgepress.files import artifact_dir
    from edgepress.models.loading import load_classifier
    from edgepress.models.sentence import is_sentence_dir
    from edgepress.models.train import train_classifier

    if is_sentence_dir(src):
        return distill_embeddings(src, out, data, cfg)

    teacher, tokenizer = load_classifier(src)
    student, mapping = make_student(teacher, cfg)
    train, train_logits = transfer_set(src, teacher, tokenizer, data, cfg)
    scores = (AttentionScores(student), AttentionScores(teacher)) if cfg.style == "tinybert" and \
        cfg.attention_weight > 0 else None
    with artifact_dir(Path(out)) as tmp:
        student.config.output_hidden_states = cfg.style != "hinton"
        try:
            result = train_classifier(student, tokenizer, train, data.validation, cfg, tmp,
                                      loss_fn=distillation_loss(teacher.eval(), train_logits, cfg, scores,
                                                                len(data.train)))
        finally:
            for recorder in scores or ():
                recorder.remove()
        student.config.output_hidden_states = False  # training needed them; inference and export do not
        student.config.save_pretrained(tmp)
    log.info("distill: %d -> %d layers (from %s), best epoch %d, validation %s %.4f",
             depth(teacher), cfg.student_layers, list(mapping), result.best_epoch, result.score,
             result.best_val_accuracy)
    return {"layer_map": list(mapping), "best_epoch": result.best_epoch,
            f"val_{result.score}": result.best_val_accuracy,
            "history": result.history, "train_seconds": round(result.seconds, 1),
            **({} if isinstance(train, TaggedSet) else {"teacher_train_accuracy": float(np.mean(
                _argmax(train_logits.array[:len(data.train)]) == data.train.labels))}),
            "transfer_examples": len(train) - len(data.train)}
