"""The recovery kit: what every method that trains from a teacher's outputs shares (distill, heads and ffn's
recovery, magnitude and lottery's fine-tune, qat).

- `KdLoss` and `hinton`: the soft-target loss (Hinton et al. 2015), a token classifier's per word.
- `transfer_set`: the examples a distillation trains on (the train split, augment's copies, data.unlabeled's
  texts) and the teacher's outputs for them, built once per content in the cache.
- `kd_training` / `load_with_kd_targets`: a fine-tune distilled from the model as it is before it is pruned or
  quantized; `vector_training` the same for a sentence encoder.
- `training_score`: what a training run keeps its best epoch by (the task's primary metric on the validation split).

No recipe imports another recipe's module: what two of them share lives here.
"""

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.cache import built_array, built_once
from edgepress.data import DataSplits
from edgepress.data.augment import VERSION as AUGMENT_VERSION
from edgepress.data.augment import AugmentConfig, augment_texts
from edgepress.data.dataset import EpochDraw, TextSet, text_key
from edgepress.data.tagged import IGNORED, TaggedSet
from edgepress.errors import ConfigError
from edgepress.files import tree_sha256
from edgepress.tasks import NEIGHBOURS, ONLY_TAGGED_WORDS

log = logging.getLogger(__name__)
TARGETS_PRECISION = ("the precision the teacher computes its targets in (its outputs on the train split and the "
                     "transfer texts, once, kept in the cache; with a hidden-state style, its hidden states alongside "
                     "the student at every step): bf16 (torch's autocast) labelled 3x as fast as fp32 on a CPU with "
                     "AMX; it needs hardware that computes bf16 (AMX or AVX-512 BF16, a recent GPU) and may be slower "
                     "than fp32 elsewhere; its logits differ from fp32's by a few hundredths")


class KdLoss(BaseModel):
    """The soft-target loss every distilling method shares (Hinton et al. 2015)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = Field(2.0, gt=0, le=100, description="softens the teacher's and the student's logits before "
                                                      "their KL divergence (the loss is scaled by its square)")
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the soft (teacher) loss against the labels "
                                                     "(transfer examples have the soft loss alone)")
    augment: AugmentConfig | None = Field(None, description="transfer data: perturbed copies of the train texts, "
                                          "labelled by the teacher's soft logits, trained on beside the train split")
    targets_precision: Literal["fp32", "bf16"] = Field("fp32", description=TARGETS_PRECISION)


def hinton(student_logits, teacher_logits, labels, cfg: KdLoss, labelled=None):
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
        return hinton(student_logits[chosen], teacher_logits[chosen], labels[chosen], cfg, gold)
    t = cfg.temperature
    soft = F.kl_div(F.log_softmax(student_logits / t, -1), F.softmax(teacher_logits / t, -1),
                    reduction="none").sum(-1) * t * t  # (batch,)
    hard = F.cross_entropy(student_logits, labels, reduction="none")  # (batch,)
    mixed = (1 - cfg.alpha) * hard + cfg.alpha * soft
    return (mixed if labelled is None else mixed.where(labelled, soft)).mean()


def at_positions(word_logits, word_index):
    """A token classifier's per-word logits (batch, words, labels) placed at the positions that start each word
    (`word_index`, (batch, sequence), -1 elsewhere): (batch, sequence, labels), NaN at the other positions."""
    import torch

    placed = torch.gather(word_logits, 1, word_index.clamp(min=0)[..., None].expand(-1, -1, word_logits.shape[-1]))
    return placed.masked_fill((word_index < 0)[..., None], float("nan"))


def texts_sha256(texts) -> str:
    """What a cache key says of a list of texts."""
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
        key = {"model": model_sha, "texts": texts_sha256(train.texts), "augment": cfg.augment.model_dump(),
               "version": AUGMENT_VERSION}
        copies = built_once("transfer", key, lambda: augment_texts(train.texts, tokenizer, embeddings, cfg.augment))
        held = {text_key(t) for t in data.validation.texts + data.test.texts}  # judged on: never trained on
        copies = [[c for c in made if text_key(c) not in held] for made in copies]
        ids += [f"{i}~{k}" for i, made in zip(train.ids, copies, strict=True) for k in range(len(made))]
        texts += [text for made in copies for text in made]
    ids += [f"unlabeled:{i}" for i in range(len(data.unlabeled))]
    texts += data.unlabeled
    everything = train.texts + tuple(texts)
    key = {"model": model_sha, "texts": texts_sha256(everything), "max_length": cfg.max_length,
           "torch": torch.__version__} | precision_key(cfg)
    with on_accelerator(model, cfg.targets_precision):
        targets = built_array("targets", key, len(everything), lambda start, stop, progress: predict_outputs(
            model, tokenizer, everything[start:stop], cfg.max_length, progress=progress), what="teacher targets")
    labels = np.concatenate([train.labels, argmax_rows(targets[len(train):])]).astype(np.int64)
    log.info("distillation targets: %d train examples, %d perturbed copies, %d unlabeled texts", len(train),
             len(texts) - len(data.unlabeled), len(data.unlabeled))
    draw = EpochDraw(len(train), data.per_epoch) if data.unlabeled else None
    return TextSet(train.ids + tuple(ids), everything, labels, draw=draw), Rows(targets)


def precision_key(cfg) -> dict:
    """What a targets' cache key says of their precision: nothing for fp32 (the key targets had before bf16)."""
    return {} if cfg.targets_precision == "fp32" else {"precision": cfg.targets_precision}


def argmax_rows(rows: np.ndarray, chunk: int = 65536) -> np.ndarray:
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
    guessed = argmax_rows(targets.array[len(data.train):])  # a word cut off: tag 0
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

    def rows(start: int, stop: int, progress) -> np.ndarray:
        out = np.full((stop - start, width, labels), np.nan, np.float32)
        for i, row in enumerate(predict_word_logits(model, tokenizer, texts[start:stop], cfg.max_length,
                                                    progress=progress)):
            out[i, :len(row)] = row.reshape(-1, labels)
        return out

    key = {"model": model_sha, "texts": texts_sha256(texts), "max_length": cfg.max_length, "per": "word",
           "torch": torch.__version__} | precision_key(cfg)
    with on_accelerator(model, cfg.targets_precision):
        targets = built_array("targets", key, len(texts), rows, what="teacher targets")
    log.info("distillation targets: the logits of %d words of %d sentences", sum(map(len, train.words)), len(texts))
    return Rows(targets)


def kd_training(src: Path, model, tokenizer, data: DataSplits, cfg) -> tuple[DataSplits, object]:
    """What a fine-tune distilled from `model` as it is now (before it is pruned or quantized) trains on: `data`
    with the transfer set (`transfer_set`) as its train split, and the hinton loss on `model`'s logits."""
    train, targets = transfer_set(src, model, tokenizer, data, cfg)
    return dataclasses.replace(data, train=train), soft_target_loss(targets, cfg, labelled=len(data.train))


def soft_target_loss(train_logits, cfg: KdLoss, labelled: int = 0):
    """A `loss_fn` for the training loop: `hinton` on `train_logits` (indexed by the batch's `index`; a token
    classifier's per word, `word_targets`, placed where each word starts). Examples from index `labelled` on (when
    > 0) are transfer examples: soft loss only."""

    def loss(outputs, batch):
        labels = batch["labels"]
        gold = (batch["index"] < labelled).to(labels.device) if labelled else None
        cached = train_logits[batch["index"].cpu()].to(outputs.logits.device)
        if "word_index" in batch:  # a token classifier's: per word, placed where each word starts
            cached = at_positions(cached, batch["word_index"].to(cached.device))
        return hinton(outputs.logits, cached, labels, cfg, gold)

    return loss



def load_with_kd_targets(src: Path, data: DataSplits, cfg, task):
    """The model of `task` in `src`, its tokenizer, the splits its fine-tune trains on (train: the transfer set),
    the loss on the unpruned model's outputs (the recovery's distillation targets, as `task.targets` says: logits by
    the hinton loss, a sentence encoder's vectors by `vector_loss`) and what the training loop takes besides (the
    score it keeps an epoch by: the task's primary metric on the validation split, a sentence encoder's neighbour
    overlap with the unpruned vectors, and its save)."""
    import dataclasses

    model, tokenizer = task.load_model(src)
    if task.targets == "vectors":
        train, targets = transfer_set(src, model, tokenizer, data, cfg)
        scoring = vector_scoring(validation_vectors(model, tokenizer, data, cfg), tokenizer, data, cfg)
        return model, tokenizer, dataclasses.replace(data, train=train), vector_loss(targets), scoring
    return model, tokenizer, *kd_training(src, model, tokenizer, data, cfg), \
        {"score": task.training_score(tokenizer, data.validation, cfg.max_length)}


def vector_loss(targets):
    """A `loss_fn` for a sentence-embedding student: 1 - cosine to the teacher's vectors `targets` (indexed by the
    batch's `index`), plus their mean squared error (what a model that does not normalize also needs matched)."""
    import torch.nn.functional as F

    def loss(outputs, batch):
        wanted = targets[batch["index"].cpu()].to(outputs.device)  # (batch, dim)
        return (1 - F.cosine_similarity(outputs, wanted, dim=-1)).mean() + F.mse_loss(outputs, wanted)

    return loss


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
        return train_classifier(model, tokenizer, train, cfg, tmp, loss_fn=vector_loss(targets),
                                **vector_scoring(reference, tokenizer, data, cfg))


def vector_scoring(reference, tokenizer, data: DataSplits, cfg) -> dict:
    """What the training loop takes besides for a sentence encoder: its validation `score`, the share of the 10
    nearest neighbours the vectors `reference` find (`validation_vectors`) that its vectors find, and `save`, as a
    sentence-transformers dir."""
    from edgepress.data.metrics import embedding_metrics
    from edgepress.models.evaluate import predict_outputs
    from edgepress.models.sentence import save_sentence_encoder

    texts = data.validation.texts
    k = min(NEIGHBOURS, len(texts) - 1)

    def overlap(trained) -> float:
        return embedding_metrics(reference, predict_outputs(trained, tokenizer, texts, cfg.max_length), k)[
            "neighbour_overlap"]

    return {"score": ("neighbour_overlap", overlap), "save": save_sentence_encoder}
