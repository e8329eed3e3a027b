"""ONNX Runtime sessions whose providers are checked: a provider that was asked for and is not running is an
error, never a silent CPU run (onnxruntime-gpu on a machine without a GPU lists CUDA as available, logs an error and
falls back to CPU; only `session.get_providers()` tells the truth)."""

import contextlib
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edgepress.errors import ConfigError, ModelError, ProviderUnavailable

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
Provider = Literal["cpu", "cuda"]
LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}


class SessionConfig(BaseModel):
    """How an ONNX model is run: providers in order of preference, threads, graph optimization level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    providers: tuple[Provider, ...] = Field(("cpu",), min_length=1)
    threads: int | None = Field(None, ge=1, le=1024, description="intra-op threads; None lets ONNX Runtime choose")
    optimization: Literal["disable", "basic", "extended", "all"] = "all"
    spinning: bool = Field(False, description="let idle worker threads spin (faster alone, unfair side by side)")


def provider_names(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """ORT provider names for edgepress' short names; an unknown name is a ConfigError naming the choices."""
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        raise ConfigError(f"unknown provider {', '.join(map(repr, unknown))}: choose from {', '.join(PROVIDERS)}")
    return tuple(PROVIDERS[n] for n in names)


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 (ONNX Runtime logs provider failures there), then replay it."""
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


def _options(cfg: SessionConfig):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[cfg.optimization])
    if cfg.threads:
        options.intra_op_num_threads = cfg.threads
        options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if cfg.spinning else "0")
    return options


def _load(path: Path, cfg: SessionConfig):
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        Fail,
        InvalidArgument,
        InvalidGraph,
        InvalidProtobuf,
        NoSuchFile,
    )

    if not path.is_file():
        raise ModelError(f"{path} does not exist. Fix: export the model first (edgepress export stage)")
    with _captured_stderr() as logged:
        try:
            session = ort.InferenceSession(str(path), _options(cfg), providers=list(provider_names(cfg.providers)))
        except (InvalidProtobuf, InvalidGraph, InvalidArgument, NoSuchFile, Fail) as e:  # e.g. an empty file
            raise ModelError(
                f"{path} is not a loadable ONNX model (truncated or corrupt?): {str(e).strip()[:300]}. "
                f"Fix: export it again"
            ) from e
    return session, logged


def open_session(path: str | Path, cfg: SessionConfig = SessionConfig()):
    """An `onnxruntime.InferenceSession` running on exactly the providers asked for (CPU may be added after CUDA by
    ONNX Runtime for the ops CUDA lacks); raises ProviderUnavailable with ONNX Runtime's reason otherwise."""
    session, logged = _load(Path(path), cfg)
    _require(cfg.providers, session.get_providers(), logged)
    check_io(session, Path(path))
    return session


def session_op_counts(path: str | Path, cfg: SessionConfig = SessionConfig()) -> dict[str, int]:
    """Op counts of the graph ONNX Runtime actually runs, after its own optimizations (it writes that graph out):
    which integer kernels a quantized model ends up on, say, rather than what the file asks for."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edgepress-optimized-") as scratch:
        optimized = Path(scratch) / "optimized.onnx"
        options = _options(cfg)
        options.optimized_model_filepath = str(optimized)
        options.log_severity_level = 3  # not the warning that such a graph is for this machine only: it is not kept
        ort.InferenceSession(str(path), options, providers=list(provider_names(cfg.providers)))
        counts = Counter(node.op_type for node in onnx.load(str(optimized), load_external_data=False).graph.node)
    return dict(sorted(counts.items()))


def _require(asked: tuple[str, ...], in_use: list[str], logged: list[str]) -> None:
    if "cuda" in asked and PROVIDERS["cuda"] not in in_use:
        raise ProviderUnavailable(
            f"the CUDA execution provider is not usable: {_cuda_reason(logged)}. ONNX Runtime is running on "
            f"{', '.join(in_use)} instead. Fix: run on a machine with an NVIDIA GPU and onnxruntime-gpu, or measure on "
            f"the CPU (runtime.providers: [cpu] in a config, --provider cpu, or no --device cuda)"
        )


def check_providers(providers: tuple[str, ...]) -> None:
    """Every provider in `providers` really runs here: a one-node graph is opened on each before a run starts, so a
    missing GPU is reported before minutes of baseline and export, not after."""
    accelerators = [p for p in providers if p != "cpu"]
    if not accelerators:
        return
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    for provider in accelerators:
        with _captured_stderr() as logged:
            session = ort.InferenceSession(probe, providers=list(provider_names((provider, "cpu"))))
        _require((provider,), session.get_providers(), logged)


def check_io(session, path: Path) -> None:
    """The session must take the classifier inputs edgepress feeds and return `logits`."""
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    problems = []
    if not {"input_ids", "attention_mask"} <= set(inputs) or not set(inputs) <= set(MODEL_INPUTS):
        problems.append(f"inputs are {', '.join(inputs)}; expected input_ids, attention_mask[, token_type_ids]")
    if "logits" not in outputs:
        problems.append(f"outputs are {', '.join(outputs)}; expected logits")
    if problems:
        raise ModelError(f"{path} is not a text-classifier graph: {'; '.join(problems)}. "
                         f"Fix: export a sequence-classification model with edgepress or optimum")


def cuda_iobinding_runner(session, feeds: list[dict]):
    """A runner whose inputs already live on the GPU (bound once per feed) and whose logits stay there: what a
    CUDA deployment pays per call, without host-to-device copies of the inputs."""
    import onnxruntime as ort

    bindings = {}
    for batch in feeds:
        binding = session.io_binding()
        for name in (i.name for i in session.get_inputs()):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(batch[name], "cuda", 0))
        binding.bind_output("logits", "cuda")
        bindings[id(batch)] = binding

    def run(batch):
        binding = bindings[id(batch)]
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return binding

    return run
