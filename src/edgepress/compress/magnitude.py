"""Unstructured pruning: single weights set to zero by magnitude, `magnitude` and `lottery`.

What is pruned: the Linear weights of every encoder layer (Q, K, V, attention output, both FFN matrices); the
embeddings, LayerNorm scales, pooler and classifier (DistilBERT's pre_classifier counts as classifier) only when
`include` names them. Biases never. Masks are re-applied after every optimizer step, so a pruned weight stays an exact
zero through training, and the saved dir is a plain Hugging Face model whose weights hold those zeros.

- `magnitude` (Zhu & Gupta 2017, "To prune, or not to prune"): `oneshot` prunes to `sparsity` before fine-tuning;
  `cubic` raises the sparsity s_t = s_f (1 - (1 - t/n)^3) over the first n = `prune_fraction` of the fine-tuning
  steps (their eq. 1, s_i = 0), recomputing the masks every `prune_every` steps; weights once pruned stay pruned.
  Fine-tuned with the hinton loss against the unpruned model, as the structured methods are.
- `lottery` (Frankle & Carbin 2019; Chen et al. 2020, "The Lottery Ticket Hypothesis for Pre-trained BERT
  Networks", section 3): iterative magnitude pruning with rewinding. Train; prune the same share of the surviving
  weights, globally by magnitude; reset the survivors to θ0 (the stage's input) or θk (after `rewind_step` steps of
  the first training); train again; `rounds` times, then the last ticket is trained and kept. `control: random`
  trains, each round, a ticket whose mask is random at the same sparsity, rewound the same way (the paper's control).

A sentence encoder (a sentence-transformers dir; `magnitude` so far) has its Transformer's encoder Linears pruned, and
its fine-tune learns the unpruned model's sentence vectors (`distill.vector_loss`), the epoch kept by validation
neighbour overlap.

ONNX Runtime runs zeros at dense speed: these methods buy a smaller compressed download (gzip), not latency.
"""

import copy
import logging
import math
import tempfile
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edgepress.compress.kd import KdLoss, load_with_kd_targets
from edgepress.configs import Epochs, TextCount, changed
from edgepress.data import DataSplits
from edgepress.errors import ConfigError
from edgepress.logs import words
from edgepress.models.arch import prunable_weights
from edgepress.models.sentence import encoder_of
from edgepress.models.train import TrainConfig

log = logging.getLogger(__name__)

Part = Literal["embeddings", "layernorm", "pooler", "classifier"]


class _Sparse(TrainConfig, KdLoss):
    """Fields both unstructured methods share: what is pruned and how far, and the recovery fine-tune (the
    training fields of `TrainConfig`, distilled from the unpruned model with `KdLoss`)."""

    sparsity: float = Field(0.5, ge=0, lt=1, description="fraction of the pruned weights set to zero")
    include: tuple[Part, ...] = Field((), description="pruned besides the encoder's Linear weights")

    @field_validator("sparsity")
    @classmethod
    def _prunes_something(cls, sparsity: float) -> float:
        if sparsity == 0:
            raise ValueError("sparsity 0 removes no weight: the stage would only fine-tune. Fix: a fraction in "
                             "(0, 1), e.g. 0.5, or remove the stage")
        return sparsity


class MagnitudeConfig(_Sparse):
    """The `magnitude` method: prune the smallest weights (over all pruned weights, or per matrix), fine-tune."""

    scope: Literal["global", "layer"] = Field("global", description="global: the smallest weights over all "
                                                     "matrices; layer: the same share of every matrix")
    schedule: Literal["oneshot", "cubic"] = Field("oneshot", description="oneshot: all zeros before the "
                                                          "fine-tune; cubic: grown on Zhu & Gupta's ramp")
    prune_fraction: float = Field(0.5, gt=0, le=1, description="share of the fine-tuning steps the cubic ramp takes")
    prune_every: TextCount = Field(10, description="optimizer steps between mask updates of the cubic ramp")

    @model_validator(mode="after")
    def _ramp_params_need_the_ramp(self) -> "MagnitudeConfig":
        ramp = changed(self, ("prune_fraction", "prune_every"))
        if self.schedule == "oneshot" and ramp:
            raise ValueError(f"{' and '.join(ramp)} shape(s) the cubic schedule; remove it or set schedule: cubic")
        return self


class LotteryConfig(_Sparse):
    """The `lottery` method: iterative magnitude pruning with rewinding; `epochs` is per training."""

    sparsity: float = Field(0.6, ge=0, lt=1, description="final fraction of the pruned weights set to zero")
    rounds: int = Field(3, ge=1, le=100, description="prunings; each removes the same share of the surviving weights")
    rewind: Literal["init", "step"] = Field("init", description="what survivors are rewound to each round: the "
                                                    "input's weights (init) or those after rewind_step steps")
    rewind_step: int = Field(0, ge=0, le=10**9, description="with rewind: step, the first training's step rewound to")
    control: Literal["none", "random"] = Field("none", description="random: also train a random mask at the "
                                                       "same sparsities, rewound the same way, and report both")
    epochs: Epochs = Field(1, description="epochs of each training (every round's and the last ticket's)")

    @model_validator(mode="after")
    def _rewind_fits(self) -> "LotteryConfig":
        if self.rewind == "step" and self.rewind_step < 1:
            raise ValueError("rewind: step needs rewind_step >= 1 (the optimizer step whose weights are rewound to)")
        if self.rewind == "init" and self.rewind_step:
            raise ValueError("rewind_step is used only with rewind: step; remove it or set rewind: step")
        return self


def lowest_masks(scores: dict, sparsity: float, scope: str = "global", keep: dict | None = None) -> dict:
    """Keep-masks (bool, one per tensor, on its device) that drop the `sparsity` share with the lowest scores, over
    all tensors together (`global`) or within each (`layer`); scores tied at the threshold go together. What `keep`
    already dropped is dropped first: what is dropped only grows."""
    import torch

    if keep is not None:  # scores are >= 0 (magnitudes, uniform noise): -1 ranks the pruned below every survivor
        scores = {n: s.masked_fill(~keep[n].to(s.device), -1.0) for n, s in scores.items()}
    groups = [list(scores)] if scope == "global" else [[n] for n in scores]
    masks = {}
    for names in groups:
        flat = torch.cat([scores[n].detach().flatten() for n in names])
        drop = round(sparsity * flat.numel())
        # kthvalue, not topk: a selection without the sort (BERT-base prunes 85M weights, every `prune_every` steps)
        mask = flat > torch.kthvalue(flat, drop).values if drop else torch.ones_like(flat, dtype=torch.bool)
        for name, part in zip(names, mask.split([scores[n].numel() for n in names]), strict=True):
            masks[name] = part.view(scores[name].shape)
    return masks


def magnitudes(weights: dict) -> dict:
    return {n: w.detach().abs() for n, w in weights.items()}


@dataclass
class Masks:
    """The keep-masks of the pruned weights; `apply` zeroes what they drop (after every optimizer step)."""

    weights: dict
    keep: dict

    def apply(self, *_) -> None:
        import torch

        with torch.no_grad():
            for name, weight in self.weights.items():
                if self.keep[name].device != weight.device:  # made before training moved the model to its device
                    self.keep[name] = self.keep[name].to(weight.device)
                weight.mul_(self.keep[name])


def cubic_sparsity(step: int, final: float, ramp: int) -> float:
    """Zhu & Gupta 2017, eq. 1 with s_i = 0 and t_0 = 0: s_f (1 - (1 - t/n)^3), s_f from step n on."""
    return final * (1 - (1 - min(step, ramp) / ramp) ** 3)


def _steps_per_epoch(data: DataSplits, cfg: TrainConfig) -> int:
    from edgepress.models.train import steps_per_epoch

    return steps_per_epoch(data.train, cfg.batch_size)


def _cubic_hook(masks: Masks, cfg: MagnitudeConfig, ramp: int):
    """After every step: on the schedule's steps, grow the masks to the scheduled sparsity; then apply them."""

    def on_step(model, step: int) -> None:
        if step <= ramp and (step % cfg.prune_every == 0 or step == ramp):
            masks.keep = lowest_masks(magnitudes(masks.weights), cubic_sparsity(step, cfg.sparsity, ramp),
                                      cfg.scope, masks.keep)
        masks.apply()

    return on_step


def _overall(model, weights: dict) -> dict:
    """Counts and sparsity over the weights the method prunes and over all parameters, from the weights themselves
    (exact zeros, whatever made them)."""
    from edgepress.models.introspect import param_counts

    total = sum(w.numel() for w in weights.values())
    nonzero = sum(int(w.count_nonzero()) for w in weights.values())
    counts = param_counts(model)
    return {"pruned_weights": total, "pruned_weights_nonzero": nonzero, "pruned_weights_sparsity": 1 - nonzero / total,
            "all_params": counts["params"], "all_params_nonzero": counts["nonzero_params"],
            "all_params_sparsity": counts["sparsity"]}


def magnitude(src: Path, out: Path, data: DataSplits, cfg: MagnitudeConfig = MagnitudeConfig(), task=None) -> dict:
    """Prune the smallest weights of the model in `src` to `cfg.sparsity`, fine-tune with the masks held, save to
    `out` (the zeros are in the saved weights). `task`: the run's (None: the model dir's own, `task_of`)."""
    from edgepress.files import artifact_dir
    from edgepress.models.train import train_classifier
    from edgepress.tasks import task_of

    model, tokenizer, data, loss, scoring = load_with_kd_targets(src, data, cfg, task or task_of(src))
    check_sparse(model, tokenizer, cfg, task)
    weights = prunable_weights(encoder_of(model), cfg.include)
    masks = Masks(weights, {n: w.new_ones(w.shape, dtype=bool) for n, w in weights.items()})
    per_epoch = _steps_per_epoch(data, cfg)
    ramp = max(1, round(cfg.prune_fraction * cfg.epochs * per_epoch))
    if cfg.schedule == "oneshot":
        masks.keep = lowest_masks(magnitudes(weights), cfg.sparsity, cfg.scope)
    masks.apply()
    on_step = masks.apply if cfg.schedule == "oneshot" else _cubic_hook(masks, cfg, ramp)
    # a cubic ramp still under way at an epoch's end: that epoch is trained but never kept
    first = 1 if cfg.schedule == "oneshot" else math.ceil(ramp / per_epoch)
    with artifact_dir(Path(out)) as tmp:
        result = train_classifier(model, tokenizer, data.train, cfg, tmp, loss_fn=loss,
                                  on_step=on_step, keep_from_epoch=first, **scoring)
    counts = _overall(model, weights)
    log.info("magnitude: %.1f%% of %d pruned weights zero (%.1f%% of all params), validation %s %.4f",
             100 * counts["pruned_weights_sparsity"], counts["pruned_weights"], 100 * counts["all_params_sparsity"],
             words(result.score), result.best_val_accuracy)
    return {"sparsity": counts, "pruned": sorted(weights), "schedule_steps": ramp if cfg.schedule == "cubic" else 0,
            **result.details()}


def round_sparsities(final: float, rounds: int) -> list[float]:
    """Sparsity after each round when every round prunes the same share of the survivors: 1 - (1 - s)^(r/R)."""
    return [1 - (1 - final) ** (r / rounds) for r in range(1, rounds + 1)]


def check_sparse(model, tokenizer, cfg: _Sparse, task=None) -> None:
    """The pre-run check of `magnitude` and `lottery`: the model has weights they prune, and every pruning (each of
    lottery's rounds) sets at least one more of them to zero. Run on the config's model, it can only pass what the
    stage's smaller input (after a distill or a structured prune) would refuse, never refuse what it would pass."""
    sizes = [w.numel() for w in prunable_weights(encoder_of(model), cfg.include).values()]
    groups = [sum(sizes)] if getattr(cfg, "scope", "global") == "global" else sizes
    targets = round_sparsities(cfg.sparsity, cfg.rounds) if isinstance(cfg, LotteryConfig) else [cfg.sparsity]
    for r, (before, after) in enumerate(pairwise([0.0, *targets]), start=1):
        if sum(round(after * n) - round(before * n) for n in groups) < 1:
            where = f" in round {r} of {len(targets)}" if len(targets) > 1 else ""
            raise ConfigError(f"sparsity {cfg.sparsity:g} sets none of the model's {sum(sizes):,} pruned weights to "
                              f"zero{where}. Fix: a higher sparsity{' or fewer rounds' if where else ''}")


def _train(model, tokenizer, data: DataSplits, cfg: LotteryConfig, loss, out_dir: Path | None, on_step=None):
    """`train_classifier` saving into `out_dir`, or into a throwaway dir (the trainings whose weights live on only
    in memory: the dense one, the tickets of earlier rounds, the controls); `loss`: (loss_fn, the score every
    training keeps its epoch by)."""
    from edgepress.models.train import train_classifier

    loss_fn, score = loss
    with tempfile.TemporaryDirectory(prefix="edgepress-lottery-") as scratch:
        return train_classifier(model, tokenizer, data.train, cfg, out_dir or Path(scratch), loss_fn=loss_fn,
                                on_step=on_step, score=score)


def _train_ticket(model, tokenizer, data: DataSplits, cfg: LotteryConfig, rewound: dict, keep: dict, loss,
                  out_dir: Path | None = None):
    """Rewind `model` to `rewound`, zero what `keep` drops, train with the mask held."""
    model.load_state_dict(rewound)
    masks = Masks(prunable_weights(model, cfg.include), keep)
    masks.apply()
    return _train(model, tokenizer, data, cfg, loss, out_dir, masks.apply)


def _first_training(model, tokenizer, data: DataSplits, cfg: LotteryConfig, loss):
    """The dense training whose weights choose the first mask; returns its result and the weights rewound to (θ0,
    the input, or θk, the weights after `rewind_step` optimizer steps of this training)."""
    rewound = {"state": copy.deepcopy(model.state_dict())}

    def snapshot(trained, step: int) -> None:
        if step == cfg.rewind_step:
            rewound["state"] = copy.deepcopy(trained.state_dict())

    result = _train(model, tokenizer, data, cfg, loss, None, snapshot if cfg.rewind == "step" else None)
    return result, rewound["state"]


def _random_scores(weights: dict, generator) -> dict:
    import torch

    return {n: torch.rand(w.shape, generator=generator) for n, w in weights.items()}


def _share_dropped(keep: dict) -> float:
    total = sum(k.numel() for k in keep.values())
    return 1 - sum(int(k.sum()) for k in keep.values()) / total


def lottery(src: Path, out: Path, data: DataSplits, cfg: LotteryConfig = LotteryConfig(), task=None) -> dict:
    """Find a lottery ticket of the model in `src` at `cfg.sparsity` by iterative magnitude pruning with
    rewinding; the last ticket, trained, goes to `out`. With `control: random`, random tickets at the same
    sparsities are trained alongside and recorded. `task`: the run's (None: the model dir's own, `task_of`)."""
    import torch

    from edgepress.files import artifact_dir
    from edgepress.tasks import task_of

    task = task or task_of(src)
    model, tokenizer, data, loss_fn, scoring = load_with_kd_targets(src, data, cfg, task)  # train: + transfer
    loss = (loss_fn, scoring["score"])
    steps = cfg.epochs * _steps_per_epoch(data, cfg)
    if cfg.rewind_step > steps:
        raise ConfigError(f"rewind_step {cfg.rewind_step} is past the {steps} optimizer steps of the first "
                          f"training ({cfg.epochs} epoch(s) of {len(data.train)} examples at batch "
                          f"{cfg.batch_size}). Fix: a rewind_step of at most {steps}")
    check_sparse(model, tokenizer, cfg, task)
    weights = prunable_weights(model, cfg.include)
    control = copy.deepcopy(model) if cfg.control == "random" else None
    generator = torch.Generator().manual_seed(cfg.seed)
    keep = random_keep = None
    rounds = []
    with artifact_dir(Path(out)) as tmp:
        dense, rewound = _first_training(model, tokenizer, data, cfg, loss)
        score = dense.score  # accuracy, or a token classifier's entity F1: what every training keeps its epoch by
        for r, sparsity in enumerate(round_sparsities(cfg.sparsity, cfg.rounds), start=1):
            keep = lowest_masks(magnitudes(weights), sparsity, "global", keep)  # from the last training's weights
            last = r == cfg.rounds
            ticket = _train_ticket(model, tokenizer, data, cfg, rewound, keep, loss, tmp if last else None)
            row = {"round": r, "sparsity": _share_dropped(keep), f"val_{score}": ticket.best_val_accuracy}
            if control is not None:
                random_keep = lowest_masks(_random_scores(weights, generator), sparsity, "global", random_keep)
                trained = _train_ticket(control, tokenizer, data, cfg, rewound, random_keep, loss)
                row[f"control_val_{score}"] = trained.best_val_accuracy
            log.info("lottery round %d/%d: sparsity %.3f, validation %s %.4f%s", r, cfg.rounds, row["sparsity"],
                     score, ticket.best_val_accuracy,
                     f" (random control {trained.best_val_accuracy:.4f})" if control is not None else "")
            rounds.append(row)
    details = {"sparsity": _overall(model, weights), "pruned": sorted(weights), "rounds": rounds,
               f"dense_val_{score}": dense.best_val_accuracy, "rewind": cfg.rewind,
               f"val_{score}": ticket.best_val_accuracy, "score": score}
    if control is not None:
        details["control_test"] = _beside(model, control, tokenizer, data, cfg.max_length, task)
    return details


def _beside(ticket, control, tokenizer, data: DataSplits, max_length: int, task) -> dict:
    """The random control on the test split, and the paired 95% CI of ticket minus control on the primary metric
    of `task` (accuracy, or a token classifier's entity F1)."""
    name = task.primary
    ticket_preds, control_preds = (task.torch_predictions(m, tokenizer, data.test.texts, max_length)
                                   for m in (ticket, control))
    figures = task.scores(data.test, control_preds)
    return {name: figures[name], f"{name}_ci95": figures[f"{name}_ci95"],
            "ticket_minus_control_ci95": task.versus(data.test, ticket_preds, control_preds)[f"{name}_drop_ci95"]}
