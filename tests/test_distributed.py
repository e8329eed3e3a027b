"""One config on one process or several: a distill stage trained by 2 processes under `accelerate launch` (gloo, on
CPUs) ends with the weights one process gets, because `batch_size` is the global batch (train.py, `_accelerator`).

The launch is `--multi_gpu` with ACCELERATE_USE_CPU=1, not `--cpu --num_processes 2`: accelerate's `--cpu` launcher
starts several processes only through mpirun (`--mpirun_hostfile`); without it, it starts one, which believes it is
alone. `--multi_gpu` starts them through torchrun, and ACCELERATE_USE_CPU=1 puts them on the CPU with gloo (without
it, on a machine without a GPU, each runs on its own: the case `train_classifier` refuses, tested below).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgepress.errors import ConfigError
from edgepress.models.train import TrainConfig, train_classifier
from edgepress.tasks import CLASSIFICATION
from tests.conftest import save, tiny_bert
from tests.distributed_job import distill_job

JOB = Path(__file__).with_name("distributed_job.py")
TRAIN, BATCH = 128, 16  # 8 whole global batches an epoch: no last batch to top up (see `_accelerator`)

# Largest |one process - two processes| over every weight, measured on this 2-epoch job: 0.8e-7 to 1.2e-7, float32
# rounding (one mean over 16 examples against the all-reduced mean of two means over 8, each padded to its own longest
# sentence). Training amplifies such gaps, the more the longer and faster it moves (at learning rate 3e-2: 2.7e-4),
# so this tolerance is for this job. 1e-5 leaves 100x room for another CPU, BLAS or thread count, and is 1000x below
# what a change of the training gives: global batch 8 or 32, or seed 14, moves weights by 1.1e-2 to 1.6e-2. A last
# batch topped up with repeated examples (120 sentences) gives 1.3e-3; dropout on (masks drawn per process) 1.7e-2.
TOLERANCE = 1e-5


def _env(tmp_path: Path) -> dict:
    """The test's environment (its EDGEPRESS_CACHE, where movie_data has put the data) with no network, no GPU (the
    one-process run is on the CPU too), one thread per process, and no user accelerate config (HF_HOME) to change
    the launch."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
            "HF_HOME": str(tmp_path / "hf-home")}


def _ranks(out: Path) -> list[dict]:
    """Every process's rank<i>.json, by rank."""
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _one_process(teacher: Path, out: Path, *more: str) -> dict:
    """The job as one plain process."""
    (result,) = _run([sys.executable], teacher, out, more=more)
    return result


def _two_processes(teacher: Path, out: Path, *more: str) -> list[dict]:
    """The job under `accelerate launch`, 2 processes."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", "0"]  # 0: a free one
    return _run(launch, teacher, out, more=more)


def _run(launcher: list[str], teacher: Path, out: Path, timeout: int = 300, more=()) -> list[dict]:
    """Every process's rank<i>.json, by rank. A hang (a collective some process never joins) fails."""
    args = [*launcher, str(JOB), str(teacher), str(out), "--train", str(TRAIN), "--batch-size", str(BATCH), *more]
    with subprocess.Popen(args, env=_env(out.parent), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the workers it started
            log, _ = proc.communicate()
            pytest.fail(f"no end after {timeout} s: {' '.join(args)}\n{log[-3000:]}")
    assert proc.returncode == 0, log[-3000:]
    return _ranks(out)


def _max_diff(a: Path, b: Path) -> tuple[float, str]:
    """(largest |a - b| over every tensor of two saved students, the tensor's name)."""
    from safetensors.torch import load_file

    left, right = load_file(a / "student" / "model.safetensors"), load_file(b / "student" / "model.safetensors")
    assert left.keys() == right.keys()
    return max(((left[k] - right[k]).abs().max().item(), k) for k in left)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, movie_data):
    """A 2-layer tiny teacher without dropout (masks drawn per process would differ: see TOLERANCE), and the 1-layer
    student distilled from it by one process. movie_data has put the demo data in the cache the job reads."""
    root = tmp_path_factory.mktemp("distributed")
    teacher = save(tiny_bert(tokenizer, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), tokenizer,
                   root / "teacher")
    return teacher, _one_process(teacher, root / "one"), root


def test_two_processes_train_the_weights_of_one(runs):
    teacher, one, root = runs
    ranks = _two_processes(teacher, root / "two")
    assert [(r["num_processes"], r["distributed_type"]) for r in ranks] == [(2, "DistributedType.MULTI_CPU")] * 2
    # the same steps: each process takes its half of the one-process batch, the two halves make it whole
    assert len(one["steps"]) == len(ranks[0]["steps"]) == len(ranks[1]["steps"]) == 2 * TRAIN // BATCH
    for whole, first, second in zip(one["steps"], ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert len(first) == len(second) == BATCH // 2 and sorted(first + second) == sorted(whole)
    # every process evaluated the same weights and kept the same epoch; the loss is the mean over both
    for rank in ranks:
        assert rank["best_epoch"] == one["best_epoch"]
        assert [h["val_accuracy"] for h in rank["history"]] == [h["val_accuracy"] for h in one["history"]]
        assert [h["train_loss"] for h in rank["history"]] == pytest.approx(
            [h["train_loss"] for h in one["history"]], abs=TOLERANCE)
    diff, name = _max_diff(root / "one", root / "two")
    assert diff <= TOLERANCE, f"{name} differs by {diff:.2e}"


def test_two_processes_draw_a_transfer_set_as_one_does(runs):
    """A transfer set (`EpochDraw`: 64 labelled sentences and 32 of 64 transfer ones drawn each epoch, in batches of
    like lengths) under 2 processes: the same draws, each process half of every batch, the weights of one."""
    teacher, _, root = runs
    one = _one_process(teacher, root / "draw-one", "--per-epoch", "32")
    ranks = _two_processes(teacher, root / "draw-two", "--per-epoch", "32")
    assert len(one["steps"]) == len(ranks[0]["steps"]) == 2 * (64 + 32) // BATCH
    for whole, first, second in zip(one["steps"], ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert sorted(first + second) == sorted(whole)
    epochs = [{i for step in one["steps"][k * 6:(k + 1) * 6] for i in step} for k in range(2)]
    assert all(set(range(64)) < e and len(e) == 96 for e in epochs) and epochs[0] != epochs[1]  # drawn afresh
    diff, name = _max_diff(root / "draw-one", root / "draw-two")
    assert diff <= TOLERANCE, f"{name} differs by {diff:.2e}"


def test_another_global_batch_trains_other_weights(runs):
    """The comparison above can fail: a global batch of 32 is what 2 processes trained when `batch_size` was per
    process (their weights and these agree to 1.5e-8; both are 1.1e-2 from the batch-16 ones)."""
    teacher, _, root = runs
    distill_job(teacher, root / "batch32", TRAIN, 2 * BATCH)  # in this process, on any device: it has to land far
    diff, name = _max_diff(root / "one", root / "batch32")
    assert diff > 100 * TOLERANCE, f"{name} differs by only {diff:.2e}"


def test_processes_that_found_no_device_are_refused(monkeypatch, tokenizer, movie_data, tmp_path):
    """torchrun (or accelerate launch --multi_gpu) without a GPU and without ACCELERATE_USE_CPU=1: the processes
    would each train alone on all the data and write the same files."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"launched as 2 processes, .* Fix: on CPUs, set ACCELERATE_USE_CPU=1"):
        train_classifier(tiny_bert(tokenizer), tokenizer, movie_data.train.take(8),
                         TrainConfig(epochs=1, batch_size=8), tmp_path / "out",
                         score=CLASSIFICATION.training_score(tokenizer, movie_data.validation.take(8), 128))


LAUNCH = (f"{sys.executable} -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 "
          "--mixed_precision no --dynamo_backend no --main_process_port 0")


def _splits_dir(path: Path, movie_data) -> Path:
    """A data dir with its own splits: 128 train sentences (whole global batches of 16), 64 validation, 64 test."""
    import csv

    path.mkdir()
    for name, part, n in (("train", movie_data.train, TRAIN), ("validation", movie_data.validation, 64),
                          ("test", movie_data.test, 64)):
        with (path / f"{name}.csv").open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows((part.texts[i], movie_data.id2label[int(part.labels[i])]) for i in range(n))
    return path


def _pipeline(tmp_path: Path, teacher: Path, data: Path, stage: dict, launch: str | None) -> Path:
    import yaml

    runtime = {"threads": 1, "latency": {"warmup": 1, "runs": 3}, **({"launch": launch} if launch else {})}
    config = {"model": str(teacher), "data": {"source": str(data), "max_length": 48}, "runtime": runtime,
              "stages": [stage]}
    path = tmp_path / f"{'launched' if launch else 'one'}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


DISTILL = {"name": "distill", "method": "distill",
           "params": {"student_layers": 1, "epochs": 2, "batch_size": BATCH, "learning_rate": 2e-3,
                      "warmup_ratio": 0.25}}


def test_edgepress_run_with_runtime_launch_trains_its_stages_on_two_processes_to_the_weights_of_one(
        runs, movie_data, tmp_path, monkeypatch):
    """The same config, `runtime.launch` added: the training stage runs under the launcher, the runner measures,
    gates and reports as ever, and the artifact is the one-process one (TOLERANCE)."""
    from safetensors.torch import load_file

    from edgepress.pipeline.config import load_config
    from edgepress.pipeline.runner import run_pipeline

    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    teacher, _, _ = runs
    data = _splits_dir(tmp_path / "data", movie_data)
    one = run_pipeline(load_config(_pipeline(tmp_path, teacher, data, DISTILL, None)), tmp_path / "run-one")
    two = run_pipeline(load_config(_pipeline(tmp_path, teacher, data, DISTILL, LAUNCH)), tmp_path / "run-two")
    assert one["status"] == two["status"] == "passed"
    stage = two["stages"][0]
    assert stage["details"]["launch"] == LAUNCH and "launch" not in one["stages"][0]["details"]
    assert (tmp_path / "run-two" / "stages" / "01-distill" / "launch-distill.log").is_file()
    left, right = (load_file(Path(r["stages"][0]["artifact"]) / "model.safetensors") for r in (one, two))
    assert max((left[k] - right[k]).abs().max().item() for k in left) <= TOLERANCE
    assert stage["metrics"]["accuracy"] == one["stages"][0]["metrics"]["accuracy"]


def test_a_launched_methods_error_comes_back_as_itself_and_only_an_installed_launcher_is_taken(
        runs, movie_data, tmp_path, monkeypatch):
    from edgepress.pipeline.config import load_config
    from edgepress.pipeline.runner import run_pipeline

    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    teacher, _, _ = runs
    data = _splits_dir(tmp_path / "data", movie_data)
    lottery = {"name": "ticket", "method": "lottery",
               "params": {"rewind": "step", "rewind_step": 99, "epochs": 1, "batch_size": BATCH}}
    with pytest.raises(ConfigError, match=r"stage 'ticket' failed: rewind_step 99 is past the 8 optimizer steps"):
        run_pipeline(load_config(_pipeline(tmp_path, teacher, data, lottery, LAUNCH)), tmp_path / "run")
    for launch, message in (("sh -c 'echo hi'", "must start accelerate's or torch's launcher"),
                            ("accelerate launch 'oops", "does not parse"),
                            ("torchrun-nowhere/torchrun -n 2", "is not on PATH")):
        with pytest.raises(ConfigError, match=message):  # refused by validate, before anything is written
            load_config(_pipeline(tmp_path, teacher, data, DISTILL, launch))
