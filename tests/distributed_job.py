"""The training of one distill stage of a tiny model, for tests/test_distributed.py: run it as a plain process, or
under `accelerate launch` on several. Every process writes OUT/rank<i>.json: the processes it ran among, the example
indices of each of its steps, and its TrainResult; the main process saves the student to OUT/student.

    python tests/distributed_job.py TEACHER OUT --train 128 --batch-size 16
    accelerate launch --multi_gpu --num_processes 2 ... tests/distributed_job.py TEACHER OUT --train 128 ...

It trains the way `distill()` does (a 1-layer student from the teacher, teacher logits computed once, the hinton loss
looked up by `index`), through `train_classifier`. It does not call `distill()`: under several processes, every
process wraps the training in its own `atomic_dir(out)`, and only the main one has a saved model in it to read back.
"""

import argparse
import dataclasses
from pathlib import Path


def distill_job(teacher: Path, out: Path, n_train: int, batch_size: int, epochs: int = 2, seed: int = 13,
                per_epoch: int | None = None) -> None:
    """Distill `teacher` into a 1-layer student on the first `n_train` train sentences (hinton, as `distill()`); with
    `per_epoch`, as a transfer set: the second half of them transfer texts, `per_epoch` of which each epoch draws
    (`EpochDraw`)."""
    import torch
    from accelerate import PartialState

    from edgepress.compress.distill import DistillConfig, distillation_loss, make_student
    from edgepress.data import DataConfig, load_data
    from edgepress.data.dataset import EpochDraw
    from edgepress.files import write_json
    from edgepress.models.evaluate import predict_logits
    from edgepress.models.loading import load_classifier
    from edgepress.models.train import train_classifier
    from edgepress.tasks import CLASSIFICATION

    data = load_data(DataConfig())
    train, validation = data.train.take(n_train), data.validation.take(200)
    if per_epoch is not None:
        train = dataclasses.replace(train, draw=EpochDraw(labelled=n_train // 2, per_epoch=per_epoch))
    cfg = DistillConfig(student_layers=1, style="hinton", epochs=epochs, batch_size=batch_size, learning_rate=2e-3,
                        warmup_ratio=0.25, max_length=48, seed=seed)
    model, tokenizer = load_classifier(teacher)
    student, _ = make_student(model, cfg)
    train_logits = torch.from_numpy(predict_logits(model, tokenizer, train.texts, cfg.max_length))
    hinton = distillation_loss(model.eval(), train_logits, cfg)
    steps = []

    def loss_fn(outputs, batch):
        steps.append(batch["index"].tolist())  # the examples this process took in this step
        return hinton(outputs, batch)

    result = train_classifier(student, tokenizer, train, cfg, out / "student", loss_fn=loss_fn,
                              score=CLASSIFICATION.training_score(tokenizer, validation, cfg.max_length))
    state = PartialState()
    write_json(out / f"rank{state.process_index}.json",
               {"num_processes": state.num_processes, "distributed_type": str(state.distributed_type),
                "steps": steps, **dataclasses.asdict(result)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("teacher", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, required=True, help="the first N train sentences")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--per-epoch", type=int, default=None)
    args = parser.parse_args()
    distill_job(args.teacher, args.out, args.train, args.batch_size, args.epochs, args.seed, args.per_epoch)


if __name__ == "__main__":
    main()
