"""Training stages on several processes, GPUs or machines: with `runtime.launch` set (e.g. `accelerate launch
--multi_gpu --num_processes 8`), the runner starts each training method as `<launch> -m edgepress.pipeline.launch
JOB.json` and waits for it. Every process reads the same data split (checked against the run's sha256) and calls
the method; the training loop shares each global batch among them (models/train.py) and only rank 0 writes the
artifact (files.artifact_dir), then its details go back to the runner in a JSON file. Measuring, gating and the
report stay in the runner's one process: the same config gives the same run, on one process or many."""

import logging
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from edgepress import errors
from edgepress.errors import ConfigError, DataError, EdgepressError
from edgepress.files import read_json, write_json, writes_artifacts

log = logging.getLogger(__name__)
SHOWN_LINES = 20  # of the launch's output, in the error when it fails


def launched(launch: str, method: str, src: Path, dst: Path, params: dict, job: dict, log_file: Path) -> dict:
    """Run `method` on `src` into `dst` under the launcher command `launch`; returns the method's details. The
    processes' output goes to `log_file`; a method's EdgepressError comes back as itself."""
    with tempfile.TemporaryDirectory(prefix="edgepress-launch-") as tmp:
        spec, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        write_json(spec, {**job, "method": method, "src": str(src), "dst": str(dst), "params": params,
                          "result": str(result)})
        command = [*shlex.split(launch), "-m", "edgepress.pipeline.launch", str(spec)]
        log.info("%s: launched as %s (output: %s)", method, shlex.join(command), log_file)
        with log_file.open("w", encoding="utf-8") as out:
            try:
                code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL).returncode
            except OSError as e:
                raise ConfigError(f"runtime.launch {launch!r} cannot be started: {e}. Fix: a launcher command on "
                                  f"PATH, e.g. `accelerate launch --multi_gpu --num_processes 2`") from None
        return _outcome(result, code, log_file)


def _outcome(result: Path, code: int, log_file: Path) -> dict:
    if result.is_file():
        answer = read_json(result)
        if "error" not in answer:
            return answer["details"]
        raise getattr(errors, answer["type"], EdgepressError)(answer["error"])
    tail = "\n".join(log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-SHOWN_LINES:])
    raise EdgepressError(f"the launched processes exited with {code} and no result; the end of {log_file}:\n{tail}")


def _run_job(job: dict) -> dict:
    from edgepress.data import DataConfig, load_data
    from edgepress.registry import METHODS

    data = load_data(DataConfig.model_validate(job["data"]), job["label2id"])
    if data.manifest()["sha256"] != job["split_sha256"]:
        raise DataError(f"the launched processes read another split of {data.source} than the run did. Fix: keep "
                        f"the data source unchanged while the run goes on")
    spec = METHODS[job["method"]]
    return spec.run(Path(job["src"]), Path(job["dst"]), data, spec.config.model_validate(job["params"]))


def main(argv: list[str]) -> int:
    """One process of a launched method: its details (or its error) in the job's result file, from rank 0."""
    job = read_json(Path(argv[0]))
    try:
        answer = {"details": _run_job(job)}
    except EdgepressError as e:
        answer = {"error": str(e), "type": type(e).__name__}
    if writes_artifacts():
        write_json(Path(job["result"]), answer)
    return 0 if "details" in answer else 2


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main(sys.argv[1:]))
