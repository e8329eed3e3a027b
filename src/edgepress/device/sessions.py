"""ONNX Runtime sessions on the providers asked for: a provider asked for and not running is an error, never a
silent CPU run (onnxruntime-gpu on a machine without a GPU lists CUDA as available, logs an error and falls back to
CPU; only `session.get_providers()` tells the truth). The graph must be a classifier's, a token classifier's or a
sentence embedder's."""

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .bundle import EMBEDDING, TASK_OUTPUTS, TOKEN_CLASSIFICATION, json_object
from .errors import ConfigError, ModelError, ProviderUnavailable, access_denied

# Beside a graph: the ONNX Runtime optimizers its sessions are opened without. edgepress's optimize stage writes it
# when it left a fusion out because it measured the graph faster without it; ORT would otherwise fuse the same
# pattern again when the session starts (SkipLayerNormFusion does, on int8 graphs), and the choice would be lost.
SESSION_FILE = "ort_session.json"
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# A graph's output names the task it serves: a classifier's logits (batch, labels), a token classifier's (batch,
# sequence, labels), or a sentence embedder's vector (pooled, and normalized where the model normalizes, inside the
# graph)
OUTPUTS = ("logits", "sentence_embedding")
LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}


def provider_names(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """ORT provider names for edgepress' short names; an unknown name is a ConfigError naming the choices."""
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        raise ConfigError(f"unknown provider {', '.join(map(repr, unknown))}: choose from {', '.join(PROVIDERS)}")
    return tuple(PROVIDERS[n] for n in names)


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 (ONNX Runtime logs provider failures there)."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            lines.extend(line for line in text.splitlines() if line.strip())


def _clean(line: str) -> str:
    """An ORT log line without colour codes, timestamps and source locations."""
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    line = re.sub(r"^.*\] ", "", line)  # "2026-.. [E:onnxruntime:Default, file.cc:123 Func] message"
    return re.sub(r"^.*FAIL : ", "", line).strip()


def _cuda_reason(logged: list[str]) -> str:
    """Why CUDA is not running: the driver check, then what ONNX Runtime logged."""
    import ctypes

    reasons = []
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        reasons.append("no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)")
    reasons += [_clean(line) for line in logged if "CUDA" in line or "cuda" in line][:2]
    return " / ".join(reasons) or "ONNX Runtime did not say why (check the CUDA and cuDNN versions it needs)"


def require_providers(asked: tuple[str, ...], in_use: list[str], logged: list[str]) -> None:
    """ProviderUnavailable, with ONNX Runtime's reason, when CUDA was asked for and is not running."""
    if "cuda" in asked and PROVIDERS["cuda"] not in in_use:
        raise ProviderUnavailable(
            f"the CUDA execution provider is not usable: {_cuda_reason(logged)}. ONNX Runtime is running on "
            f"{', '.join(in_use)} instead. Fix: run on a machine with an NVIDIA GPU and onnxruntime-gpu, or measure on "
            f"the CPU (runtime.providers: [cpu] in a config, --provider cpu, or no --device cuda)"
        )


# How worker threads wait, part of what a cached latency was measured with (stagecache.machine_key)
SPINNING = "within a run"


def session_options(threads: int | None, optimization: str = "all", spinning: bool = False):
    """ORT session options: `threads` intra-op threads (one inter-op), the graph optimization level, and whether idle
    worker threads go on spinning after a run returns (faster alone, unfair to whatever runs beside them).

    Within a run the workers always spin between operators, as torch's OpenMP threads do: parked, every operator of
    a short text pays a thread wake-up (all-MiniLM-L6-v2 int8 at natural lengths, 2 threads: 3.20 -> 2.87 ms,
    `benchmarks/spinning.py` (retired after commit e7d753d: `git show e7d753d:benchmarks/spinning.py`)). Unless
    `spinning`, `session.force_spinning_stop` parks them as the run returns: no core is taken between calls, from a
    device's other work or from the next candidate timed side by side."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[optimization])
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "0" if spinning else "1")
    return options


def check_io(session, path: Path) -> None:
    """The session must take the encoder inputs edgepress feeds and return `logits` or `sentence_embedding`."""
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    problems = []
    if not {"input_ids", "attention_mask"} <= set(inputs) or not set(inputs) <= set(MODEL_INPUTS):
        problems.append(f"inputs are {', '.join(inputs)}; expected input_ids, attention_mask[, token_type_ids]")
    if not set(OUTPUTS) & set(outputs):
        problems.append(f"outputs are {', '.join(outputs)}; expected {' or '.join(OUTPUTS)}")
    if problems:
        raise ModelError(f"{path} is not a text-classifier, token-classifier or sentence-embedding graph: "
                         f"{'; '.join(problems)}. Fix: export a sequence- or token-classification model or a "
                         f"sentence-transformers model with edgepress")


def gives_token_logits(session) -> bool:
    """The graph is a token classifier's: its logits have a row per token, (batch, sequence, labels)."""
    return any(o.name == "logits" and len(o.shape) == 3 for o in session.get_outputs())


def task_output(session, task: str, where: Path) -> str:
    """The output the reader of `task` reads from the session's graph (`TASK_OUTPUTS`), in the task's form: a
    classifier's logits (batch, labels), a token classifier's (batch, sequence, labels), an embedder's
    sentence_embedding. A graph that gives another task's is a ModelError: what a bundle says it does and what its
    graph does must agree."""
    name = TASK_OUTPUTS[task]
    ranks = {o.name: len(o.shape) for o in session.get_outputs()}
    token_rows = ranks.get(name) == 3
    if name in ranks and (task == EMBEDDING or token_rows == (task == TOKEN_CLASSIFICATION)):
        return name
    gives = ("sentence vectors" if "sentence_embedding" in ranks else
             "a row of logits per token" if ranks.get("logits") == 3 else "logits per text")
    raise ModelError(f"{where} says its task is {task}, but its graph gives {gives}. Fix: bundle the model again "
                     f"(`edgepress bundle`) from the run or model dir it came from")


def output_name(session) -> str:
    """The graph's task output (`OUTPUTS`): logits, or sentence_embedding (`check_io` made sure it has one)."""
    names = {o.name for o in session.get_outputs()}
    return next(name for name in OUTPUTS if name in names)


def disabled_optimizers(path: Path) -> list[str]:
    """The optimizers `SESSION_FILE` beside the graph at `path` names ([] without one)."""
    side = Path(path).parent / SESSION_FILE
    if not side.is_file():
        return []
    names = json_object(side).get("disabled_optimizers")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ModelError(f"{side}: disabled_optimizers must be a list of ONNX Runtime optimizer names, got "
                         f"{names!r}. Fix: optimize the model again with edgepress, or delete the file")
    return names


def _system_errno(e: Exception) -> int | None:
    """The errno of a system error ONNX Runtime reports ("SystemError : 13", "system error number 13", under
    whichever of its classes), or None for any other error."""
    found = re.search(r"SystemError : (\d+)|system error number (\d+)", str(e))
    return int(found.group(1) or found.group(2)) if found else None


def load_session(path: str | Path, providers: tuple[str, ...] = ("cpu",), options=None):
    """An `onnxruntime.InferenceSession` of a classifier graph running on exactly the providers asked for (CPU may be
    added after CUDA by ONNX Runtime for the ops CUDA lacks)."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        Fail,
        InvalidArgument,
        InvalidGraph,
        InvalidProtobuf,
        NoSuchFile,
    )

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path} does not exist. Fix: export the model first (edgepress export stage)")
    with captured_stderr() as logged:
        try:
            session = ort.InferenceSession(str(path), options or session_options(None),
                                           providers=list(provider_names(providers)),
                                           disabled_optimizers=disabled_optimizers(path))
        except Exception as e:  # ORT's own classes: a file it could not read names its errno only
            if (number := _system_errno(e)) is not None:
                refused = OSError(number, os.strerror(number))
                what = f"{path} or a file beside it that it reads (its external data)"
                if isinstance(refused, PermissionError):
                    raise access_denied(refused, what) from None
                raise ModelError(f"{what} cannot be read ({refused.strerror}). Fix: export it again") from None
            if isinstance(e, InvalidProtobuf | InvalidGraph | InvalidArgument | NoSuchFile | Fail):  # an empty file
                raise ModelError(f"{path} is not a loadable ONNX model (truncated or corrupt?): "
                                 f"{str(e).strip()[:300]}. Fix: export it again") from e
            raise
    require_providers(providers, session.get_providers(), logged)
    check_io(session, path)
    return session
