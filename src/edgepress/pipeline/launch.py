"""Training stages on several processes, GPUs or machines: with `runtime.launch` set (e.g. `accelerate launch
--multi_gpu --num_processes 8`), the runner starts each training method as `<launch> -m edgepress.pipeline.launch
JOB.json` and waits for it. Every process reads the same data split (checked against the run's sha256) and calls
the method; the training loop shares each global batch among them (models/train.py) and only rank 0 writes the
artifact (files.artifact_dir), then its details go back to the runner in a JSON file. Measuring, gating and the
report stay in the runner's one process: the same config gives the same run, on one process or many."""

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from edgepress import errors
from edgepress.errors import DataError, EdgepressError
from edgepress.files import read_json, write_json, writes_artifacts

log = logging.getLogger(__name__)
SHOWN_LINES = 20  # of the launch's output, in the error when it fails


MODULES = (["-m", "accelerate.commands.launch"], ["-m", "torch.distributed.run"])  # after a python program


def launch_command(launch: str) -> list[str]:
    """`launch` as an argument list, its program resolved (on PATH or beside this Python, i.e. in its venv). Only
    the launchers of accelerate and torch are taken: a YAML file must not run any command it likes."""
    try:
        words = shlex.split(launch)
    except ValueError as e:
        raise ValueError(f"runtime.launch {launch!r} does not parse ({e})") from None
    program = words[0] if words else ""
    name = Path(program).name
    if not ((name == "accelerate" and words[1:2] == ["launch"]) or name == "torchrun"
            or (name.startswith("python") and words[1:3] in MODULES)):
        raise ValueError(f"runtime.launch must start accelerate's or torch's launcher (accelerate launch ..., "
                         f"torchrun ..., python -m accelerate.commands.launch ...); got {launch!r}")
    beside = Path(sys.executable).parent / program  # this venv's launcher first: it has edgepress
    resolved = str(beside) if "/" not in program and beside.is_file() else shutil.which(program)
    if resolved is None:
        raise ValueError(f"runtime.launch: {program!r} is not on PATH nor in {beside.parent}. Fix: install "
                         f"accelerate in this environment, or give the launcher's full path")
    return [resolved, *words[1:]]


def launched(launch: str, method: str, src: Path, dst: Path, params: dict, job: dict, log_file: Path) -> dict:
    """Run `method` on `src` into `dst` under the launcher command `launch`; returns the method's details. The
    processes' output goes to `log_file`; a method's EdgepressError comes back as itself."""
    with tempfile.TemporaryDirectory(prefix="edgepress-launch-") as tmp:
        spec, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        write_json(spec, {**job, "method": method, "src": str(src), "dst": str(dst), "params": params,
                          "result": str(result)})
        command = [*launch_command(launch), "-m", "edgepress.pipeline.launch", str(spec)]
        log.info("%s: launched as %s (output: %s)", method, shlex.join(command), log_file)
        with log_file.open("w", encoding="utf-8") as out:
            code = _wait(command, out)
        return _outcome(result, code, log_file)


def _wait(command: list[str], out) -> int:
    """Run `command` in its own process group, which goes down with this process: killed if this one stops on an
    exception (Ctrl-C included), sent SIGTERM by the kernel if this one dies (Linux), so that no worker writes
    into the run dir after its runner is gone."""
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        return proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def _die_with_parent() -> None:
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _outcome(result: Path, code: int, log_file: Path) -> dict:
    answer = read_json(result) if result.is_file() else {}
    if "error" in answer:
        raise getattr(errors, answer["type"], EdgepressError)(answer["error"])
    if "details" in answer and code == 0:
        return answer["details"]
    tail = "\n".join(log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-SHOWN_LINES:])
    raise EdgepressError(f"the launched processes exited with {code}{' after rank 0 finished' if answer else ''}; "
                         f"the end of {log_file}:\n{tail}")


def _run_job(job: dict) -> dict:
    from edgepress.data import DataConfig
    from edgepress.registry import METHODS
    from edgepress.tasks import task_of

    # read as the run read it: by its task (a token classifier's tagged sentences, not a classifier's rows; its tags)
    task = task_of(Path(job["src"]), job["task"])
    data = task.load(DataConfig.model_validate(job["data"]), job["label2id"])
    if data.manifest()["content_sha256"] != job["data_sha256"]:
        raise DataError(f"the launched processes read another split of {data.source} than the run did. Fix: keep "
                        f"the data source unchanged while the run goes on")
    spec = METHODS[job["method"]]
    return spec.call("torch", Path(job["src"]), Path(job["dst"]), data, spec.config.model_validate(job["params"]),
                     task)


def main(argv: list[str]) -> int:
    """One process of a launched method: its details in the job's result file from rank 0, or its error from any
    rank that meets one."""
    job = read_json(Path(argv[0]))
    try:
        answer = {"details": _run_job(job)}
    except EdgepressError as e:
        answer = {"error": str(e), "type": type(e).__name__}
    # rank 0 writes the details; an error, any rank that meets it: the launcher stops the others as soon as one
    # process exits, so a rank 0 that raised the same error a moment later might be killed before it could write it
    if writes_artifacts() or "error" in answer:
        write_json(Path(job["result"]), answer)
    return 0 if "details" in answer else 2


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main(sys.argv[1:]))
