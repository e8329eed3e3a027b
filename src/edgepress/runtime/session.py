"""ONNX Runtime sessions from edgepress' validated configs, on checked providers (the session code itself is the
torch-free predictor's, which a bundle carries): a provider that was asked for and is not running is an error, never
a silent CPU run. Plus what only edgepress needs: the kernels ORT really runs, the provider probe, IOBinding."""

import tempfile
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edgepress.device.sessions import (
    captured_stderr,
    disabled_optimizers,
    load_session,
    output_name,
    provider_names,
    require_providers,
    session_options,
)
from edgepress.files import read_onnx

Provider = Literal["cpu", "cuda"]


class SessionConfig(BaseModel):
    """How an ONNX model is run: providers in order of preference, threads, graph optimization level."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    providers: tuple[Provider, ...] = Field(("cpu",), min_length=1)
    threads: int | None = Field(None, ge=1, le=1024, description="intra-op threads; None lets ONNX Runtime choose")
    optimization: Literal["disable", "basic", "extended", "all"] = "all"
    spinning: bool = Field(False, description="let worker threads go on spinning after a run returns (faster "
                           "alone, unfair side by side); within a run they always spin")


def _options(cfg: SessionConfig):
    return session_options(cfg.threads, cfg.optimization, cfg.spinning)


def open_session(path: str | Path, cfg: SessionConfig = SessionConfig()):
    """An `onnxruntime.InferenceSession` running on exactly the providers asked for (CPU may be added after CUDA by
    ONNX Runtime for the ops CUDA lacks); raises ProviderUnavailable with ONNX Runtime's reason otherwise."""
    return load_session(path, cfg.providers, _options(cfg))


def session_op_counts(path: str | Path, cfg: SessionConfig = SessionConfig()) -> dict[str, int]:
    """Op counts of the graph ONNX Runtime actually runs, after its own optimizations (it writes that graph out):
    which integer kernels a quantized model ends up on, say, rather than what the file asks for."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edgepress-optimized-") as scratch:
        optimized = Path(scratch) / "optimized.onnx"
        options = _options(cfg)
        options.optimized_model_filepath = str(optimized)
        options.log_severity_level = 3  # not the warning that such a graph is for this machine only: it is not kept
        ort.InferenceSession(str(path), options, providers=list(provider_names(cfg.providers)),
                             disabled_optimizers=disabled_optimizers(Path(path)))
        counts = Counter(node.op_type for node in read_onnx(optimized, external_data=False).graph.node)
    return dict(sorted(counts.items()))


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
        with captured_stderr() as logged:
            session = ort.InferenceSession(probe, providers=list(provider_names((provider, "cpu"))))
        require_providers((provider,), session.get_providers(), logged)


def cuda_iobinding_runner(session, feeds: list[dict]):
    """A runner whose inputs already live on the GPU (bound once per feed) and whose logits stay there: what a
    CUDA deployment pays per call, without host-to-device copies of the inputs."""
    import onnxruntime as ort

    bindings = {}
    for batch in feeds:
        binding = session.io_binding()
        for name in (i.name for i in session.get_inputs()):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(batch[name], "cuda", 0))
        binding.bind_output(output_name(session), "cuda")
        bindings[id(batch)] = binding

    def run(batch):
        binding = bindings[id(batch)]
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return binding

    return run
