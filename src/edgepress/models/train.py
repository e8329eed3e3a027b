"""The one training loop of edgepress, on accelerate: the same code runs on a CPU, one GPU, or under
`accelerate launch` / torchrun on several. Seeded, deterministic on CPU, evaluated every epoch, best kept.

Later stages (distillation, pruning fine-tunes, QAT) pass their own `loss_fn(outputs, batch) -> loss`; every batch
carries `index` (positions in the train set) so that a loss can look up per-example targets such as teacher logits.
`on_step(model, step)` runs after every optimizer step (step counts from 1): where pruning re-applies its masks,
lottery tickets take their rewind snapshot, or a schedule moves on. A watcher set with `watch_epochs(fn)` sees
every training run's history after each epoch, `fn(history, epochs)`, and may stop the run by raising (what a search
does with a trial that cannot meet its accuracy constraint).

`TrainConfig` is also the base of every training method's config (distill, heads, ffn, ...): the training fields are
declared once, and a method's config is passed to the loop as it is.
"""

import contextlib
import contextvars
import copy
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.configs import Epochs, Seed
from edgepress.data.dataset import EpochDraw, TextSet
from edgepress.data.tagged import IGNORED
from edgepress.errors import ConfigError, ModelError
from edgepress.interrupt import check as check_interrupt
from edgepress.logs import Pace, words
from edgepress.models.evaluate import forward_inputs, in_precision

EPOCHS = "passes over the train split; the epoch with the best validation accuracy is kept"
MAX_LENGTH = "tokens per example after truncation (in a pipeline: data.max_length unless set)"
TRAIN_PRECISION = ("the precision the model being trained computes its forward pass and loss in: bf16 runs them under "
                   "torch's bf16 autocast (the weights, their gradients, the optimizer and every validation stay "
                   "float32): MPNet-base cut to 6 layers trained twice as fast as in fp32 on a CPU with AMX "
                   "(benchmarks/results/train_precision.json); it needs hardware that computes bf16 (AMX or "
                   "AVX-512 BF16, a recent GPU) and may be slower than fp32 elsewhere; the trained model differs from "
                   "fp32's within the noise (docs/methods.md)")


class TrainConfig(BaseModel):
    """Fine-tuning hyper-parameters (AdamW, linear warm-up then decay). In a pipeline, `max_length` defaults to the
    run's `data.max_length`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    epochs: Epochs = Field(2, description=EPOCHS)
    batch_size: int = Field(32, ge=1, le=65536, description="examples per optimizer step (the global batch under "
                                                  "runtime.launch)")
    learning_rate: float = Field(5e-5, gt=0, lt=1, description="AdamW's peak learning rate")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW's weight decay")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of the steps the learning rate warms up "
                                                                "over, linearly, before it decays to 0")
    max_length: int = Field(64, ge=8, le=8192, description=MAX_LENGTH)
    seed: Seed = Field(13, description="seeds the initialisation, the batch order and dropout")
    train_precision: Literal["fp32", "bf16"] = Field("fp32", description=TRAIN_PRECISION)


@dataclass
class TrainResult:
    """What a training run did: the epoch kept, its validation score (`score` names it: accuracy, a token
    classifier's entity F1, a sentence encoder's neighbour overlap), and every epoch's numbers."""

    best_epoch: int
    best_val_accuracy: float
    seconds: float
    history: list[dict] = field(default_factory=list)
    score: str = "accuracy"

    def details(self) -> dict:
        """What a method records of its training: the kept epoch's validation score (`val_` + the metric that chose
        it), every epoch's numbers, and the seconds it took."""
        return {f"val_{self.score}": self.best_val_accuracy, "history": self.history,
                "train_seconds": round(self.seconds, 1)}


LossFn = Callable[[object, dict], object]
Score = tuple[str, Callable[[object], float]]  # (name, a model's validation score: higher is better)
StepHook = Callable[[object, int], None]
EpochWatch = Callable[[list[dict], int], None]
log = logging.getLogger(__name__)
_watch: contextvars.ContextVar[EpochWatch | None] = contextvars.ContextVar("epoch_watch", default=None)


@contextlib.contextmanager
def watch_epochs(watch: EpochWatch) -> Iterator[None]:
    """Within the block, `watch(history, epochs)` runs after every epoch of every training run that could be kept
    (history: those epochs so far, each with its validation accuracy); whatever it raises ends that training run."""
    token = _watch.set(watch)
    try:
        yield
    finally:
        _watch.reset(token)


def _default_loss(outputs, batch):
    return outputs.loss


PADDED = {"labels": IGNORED, "word_index": -1}  # a tagged sentence's per-position fields, and what pads them


def train_loader(tokenizer, examples: TextSet, cfg: TrainConfig):
    """Seeded shuffled batches of `examples`, padded to the longest in each (the per-position fields of tagged
    sentences too, on the tokenizer's padding side). A transfer set (`examples.draw`) is drawn from as its draw says
    (`DrawnBatches`) and tokenized a batch at a time: its texts may be hundreds of thousands."""
    import torch
    from torch.utils.data import DataLoader

    def collate(rows: list[dict]) -> dict:
        tokens = [{k: v for k, v in row.items() if k not in (*PADDED, "index")} for row in rows]
        batch = dict(tokenizer.pad(tokens, return_tensors="pt"))  # dynamic padding to the longest in the batch
        width = batch["input_ids"].shape[1]
        for key, fill in PADDED.items():
            if key in rows[0] and not isinstance(rows[0][key], int):
                padding = [[fill] * (width - len(row[key])) for row in rows]
                batch[key] = torch.tensor([pad + row[key] if tokenizer.padding_side == "left" else row[key] + pad
                                           for row, pad in zip(rows, padding, strict=True)])
            elif key in rows[0]:
                batch[key] = torch.tensor([row[key] for row in rows])
        batch["index"] = torch.tensor([row["index"] for row in rows])
        return batch

    if examples.draw is None:
        rows = examples.training_rows(tokenizer, cfg.max_length)
        generator = torch.Generator().manual_seed(cfg.seed)
        return DataLoader(rows, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate, generator=generator)

    def tokenized(indices: list[int]) -> dict:
        rows = examples.select(indices).training_rows(tokenizer, cfg.max_length)
        return collate([{**row, "index": i} for row, i in zip(rows, indices, strict=True)])

    lengths = np.fromiter(map(len, examples.texts), np.int64, len(examples))  # characters: the batches' bucket key
    return DataLoader(range(len(examples)), batch_sampler=DrawnBatches(lengths, examples.draw, cfg.batch_size,
                                                                       cfg.seed), collate_fn=tokenized)


class DrawnBatches:
    """The batches of a training run over a transfer set, as its `EpochDraw` says. Each pass (an epoch): every
    labelled example and `per_epoch` of the transfer examples (all when None), drawn afresh by a generator seeded
    with (seed, epoch); shuffled, cut into windows of `WINDOW` batches, each window sorted by length and cut into
    batches (few padding tokens), and the batches shuffled, a short one last (accelerate's split_batches tops up a
    short last batch and drops a short one anywhere else). Every process of a launched run draws the same."""

    WINDOW = 64

    def __init__(self, lengths: np.ndarray, draw: EpochDraw, batch_size: int, seed: int) -> None:
        self.lengths, self.draw, self.batch_size, self.seed, self.epoch = lengths, draw, batch_size, seed, 0

    def __len__(self) -> int:
        return math.ceil(drawn_per_epoch(len(self.lengths), self.draw) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        rng, self.epoch = np.random.default_rng([self.seed % 2**32, self.epoch]), self.epoch + 1
        transfer = np.arange(self.draw.labelled, len(self.lengths))
        if self.draw.per_epoch is not None:
            transfer = rng.choice(transfer, min(self.draw.per_epoch, len(transfer)), replace=False)
        chosen = rng.permutation(np.concatenate([np.arange(self.draw.labelled), transfer]))
        span, batches = self.batch_size * self.WINDOW, []
        for start in range(0, len(chosen), span):
            window = chosen[start:start + span]
            window = window[np.argsort(self.lengths[window], kind="stable")]
            batches += [window[i:i + self.batch_size].tolist() for i in range(0, len(window), self.batch_size)]
        short = [batches.pop()] if batches and len(batches[-1]) < self.batch_size else []  # a launcher tops it up
        for i in rng.permutation(len(batches)):
            yield batches[i]
        yield from short


def drawn_per_epoch(n: int, draw: EpochDraw | None) -> int:
    """How many of a set's `n` examples an epoch trains on."""
    if draw is None or draw.per_epoch is None:
        return n
    return draw.labelled + min(draw.per_epoch, n - draw.labelled)


def steps_per_epoch(examples: TextSet, batch_size: int) -> int:
    """Optimizer steps in an epoch over `examples` (a transfer set's: as its draw says)."""
    return math.ceil(drawn_per_epoch(len(examples), examples.draw) / batch_size)


def _optimizer(model, cfg: TrainConfig, steps: int):
    import torch
    from transformers import get_linear_schedule_with_warmup

    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim <= 1]  # biases, LayerNorm
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate)
    return optimizer, get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * steps), steps)


def train_classifier(model, tokenizer, train: TextSet, cfg: TrainConfig, out_dir: Path, *, score: Score,
                     loss_fn: LossFn = _default_loss, on_step: StepHook | None = None, keep_from_epoch: int = 1,
                     save: Callable[[object, Path], None] | None = None) -> TrainResult:
    """Fine-tune `model` on `train`; the epoch with the best validation `score` (the caller's task's: a
    classifier's accuracy, a token classifier's entity F1, a sentence encoder's neighbour overlap; best_val_accuracy
    holds it) is saved to `out_dir` (with the tokenizer; by
    `save(model, dir)` for a model that is not a transformers one) and loaded back into `model`. `on_step(unwrapped
    model, step)` runs after every optimizer step. Epochs before `keep_from_epoch` are trained and evaluated but
    never kept (a pruning schedule still under way)."""
    from accelerate.utils import set_seed
    from rich.console import Console
    from rich.progress import Progress

    set_seed(cfg.seed)
    accelerator = _accelerator(cfg)
    loader = train_loader(tokenizer, train, cfg)
    optimizer, scheduler = _optimizer(model, cfg, cfg.epochs * len(loader))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    best, start, history = None, time.perf_counter(), []
    counter = _Steps(on_step, accelerator.unwrap_model(model))
    console = Console(stderr=True)  # beside the log; drawn only on a terminal (a file would keep blank lines)
    with Progress(console=console, disable=not (accelerator.is_local_main_process and console.is_terminal),
                  transient=True) as progress:
        for epoch in range(1, cfg.epochs + 1):
            pace = Pace(f"epoch {epoch}/{cfg.epochs}", len(loader) * cfg.batch_size)
            loss = _epoch(model, loader, optimizer, scheduler, accelerator, loss_fn, progress, epoch, counter, pace,
                          cfg.train_precision)
            rate = pace.rate(len(loader) * cfg.batch_size)
            name, value = score[0], float(score[1](accelerator.unwrap_model(model)))
            history.append({"epoch": epoch, "train_loss": loss, f"val_{name}": value})
            log.info("epoch %d/%d: train loss %.4f, validation %s %.4f (%s texts/s)", epoch, cfg.epochs, loss,
                     words(name), value, f"{rate:,.0f}")
            if _watch.get() is not None and epoch >= keep_from_epoch:  # a schedule under way is not judged
                _watch.get()(history[keep_from_epoch - 1:], cfg.epochs)
            if epoch >= keep_from_epoch and (best is None or value > best[1]):
                state = copy.deepcopy(accelerator.unwrap_model(model).state_dict())
                best = (epoch, value, state)
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.load_state_dict(best[2])
    if accelerator.is_main_process:
        if save is None:
            unwrapped.save_pretrained(out_dir, safe_serialization=True)
        else:
            save(unwrapped, out_dir)
        tokenizer.save_pretrained(out_dir)
    accelerator.wait_for_everyone()
    return TrainResult(best[0], best[1], time.perf_counter() - start, history, name)


def _accelerator(cfg: TrainConfig):
    """The run's Accelerator. split_batches: `batch_size` is the global batch; each of N processes takes its 1/N slice
    of every batch of the one seeded shuffle, so N processes take the same optimizer and scheduler steps as one, and
    DDP's mean of their gradients is the one-process gradient. (A last batch short of `batch_size` is topped up with
    the epoch's first examples, so that every process gets a whole slice.)"""
    import os

    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, split_batches=True))
    launched, n = int(os.environ.get("WORLD_SIZE", "1")), accelerator.num_processes
    if n == 1 and launched > 1:  # e.g. `accelerate launch --multi_gpu` or torchrun on a machine without a GPU
        raise ConfigError(f"launched as {launched} processes, but accelerate found no GPU for them and runs each on "
                          f"its own: each would train on all the data and write the same files. Fix: on CPUs, set "
                          f"ACCELERATE_USE_CPU=1 (accelerate launch --multi_gpu, torchrun)")
    if accelerator.distributed_type.value in ("DEEPSPEED", "FSDP", "MEGATRON_LM"):
        raise ConfigError(f"accelerate is set up for {accelerator.distributed_type.value}; edgepress trains with "
                          f"plain data parallelism (pruning masks and hooks hold whole parameters). Fix: "
                          f"`accelerate config` without it, or launch with --multi_gpu")
    if cfg.batch_size % n:
        raise ConfigError(f"batch_size {cfg.batch_size} is the global batch, shared equally by {n} processes. "
                          f"Fix: a multiple of {n}")
    return accelerator


@dataclass
class _Steps:
    """The optimizer-step counter of one training run, and the hook called after each step."""

    hook: StepHook | None
    model: object
    done: int = 0

    def after_step(self) -> None:
        self.done += 1
        if self.hook is not None:
            self.hook(self.model, self.done)


def _epoch(model, loader, optimizer, scheduler, accelerator, loss_fn: LossFn, progress, epoch: int,
           counter: _Steps, pace: Pace, precision: str) -> float:
    """One pass over `loader`; returns the mean training loss. `pace` says how far it is, in the log. The forward
    pass and the loss are computed in `precision` (`in_precision`), the model's outputs handed to the loss as float32
    (as accelerate's mixed precision hands them); the backward pass and the step as the weights are."""
    import torch
    from accelerate.utils import convert_to_fp32

    model.train()
    task = progress.add_task(f"epoch {epoch}", total=len(loader))
    total, steps = 0.0, 0
    for batch in loader:
        check_interrupt()
        index = batch.pop("index")
        with in_precision(accelerator.device, precision):
            outputs = model(**forward_inputs(accelerator.unwrap_model(model), batch))  # DDP hides the signature
            loss = loss_fn(convert_to_fp32(outputs), {**batch, "index": index})
        if not torch.isfinite(loss.detach()).all():  # one NaN step fills every weight with NaN through the optimizer
            raise ModelError(f"training diverged: the loss is {float(loss.detach())} at step {counter.done + 1} "
                             f"(epoch {epoch}). Fix: a lower learning_rate or weight_decay, or check the input "
                             f"model's weights for NaN")
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        counter.after_step()
        total, steps = total + float(loss.detach()), steps + 1
        progress.update(task, advance=1, description=f"epoch {epoch} loss {total / steps:.3f}")
        if accelerator.is_main_process:
            pace.advance(steps * accelerator.num_processes * len(index))
    progress.remove_task(task)
    mean = total / max(steps, 1)  # over this process's slices of the batches: the epoch's is the mean over processes
    if accelerator.num_processes == 1:
        return mean
    return float(accelerator.reduce(torch.tensor(mean, dtype=torch.float64, device=accelerator.device), "mean"))
