"""Latency of an artifact, ONNX (through runtime/) or torch, on the same real-token inputs and thread count."""

from pathlib import Path

from edgepress.device.bundle import MANIFEST, json_object, model_file
from edgepress.device.feeds import (
    NATURAL_SENTENCES,
    bundle_tokenizer,
    fixed_shape_feeds,
    load_tokenizer,
    natural_feeds,
    position_limit,
)
from edgepress.device.timing import ROUNDS, cpu_model, interleaved, time_natural, time_runner
from edgepress.errors import ConfigError, ModelError
from edgepress.models.loading import read_model_config
from edgepress.runtime.latency import LatencyConfig
from edgepress.runtime.session import SessionConfig, cuda_iobinding_runner, open_session


def onnx_path(artifact: Path) -> Path | None:
    """The .onnx file of an artifact (a file, a dir holding model.onnx, or a bundle whose manifest says where its
    graph is: a web bundle's onnx/), None for a torch model dir."""
    if artifact.suffix == ".onnx":
        return artifact
    manifest = artifact / MANIFEST
    graph = artifact / model_file(json_object(manifest) if manifest.is_file() else {})
    return graph if graph.is_file() else None


NATURAL_CUT = "data.max_length"  # where natural lengths end (before 2026-11-27: the model's position limit)


def natural_cut(artifact: Path, max_length: int | None) -> int | None:
    """Where natural lengths are cut: at `max_length` (the run's data.max_length, what its stages and bundle read
    with), else at a bundle's own (its manifest's max_length), else (None) at the model's position limit; never
    past it (`bundle_tokenizer`)."""
    manifest = Path(artifact) / MANIFEST
    if max_length is None and manifest.is_file():
        max_length = json_object(manifest).get("max_length")
    return max_length


def model_dir_of(artifact: Path) -> Path:
    """The dir holding an artifact's config and tokenizer: the artifact itself, or a .onnx file's folder."""
    return artifact.parent if artifact.suffix == ".onnx" else artifact


def torch_model_runner(model_dir: Path, threads: int | None):
    """(runner, input names) of a torch model dir, eager with torch.inference_mode, on `threads` threads."""
    import torch

    from edgepress.export.onnx import torch_runner
    from edgepress.models.fakequant import load_for_inference

    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_for_inference(model_dir)
    return torch_runner(model), tuple(tokenizer.model_input_names)


def measure_latency(artifact: Path, texts: tuple[str, ...], provider: str = "cpu", threads: int | None = None,
                    cfg: LatencyConfig = LatencyConfig(), natural: bool = True, max_length: int | None = None) -> dict:
    """{"fixed": {p50_ms, ...}, "natural": {...}, "providers_used"} of an ONNX artifact or a torch model dir
    (`natural=False`: the fixed shape alone); natural lengths are the texts as `max_length` cuts them
    (`natural_cut`)."""
    if not Path(artifact).exists():
        raise ModelError(f"{artifact} does not exist. Fix: check the path")
    path = onnx_path(artifact)
    if path is None:
        if provider != "cpu":
            raise ConfigError(f"{artifact} is a torch model; edgepress times torch models on cpu only")
        import torch

        before = torch.get_num_threads()
        try:  # timed on `threads`; training afterwards gets torch's own count back
            return _measure(artifact, None, texts, provider, threads, cfg, natural, max_length)
        finally:
            torch.set_num_threads(before)
    return _measure(artifact, path, texts, provider, threads, cfg, natural, max_length)


def _measure(artifact: Path, path: Path | None, texts: tuple[str, ...], provider: str, threads: int | None,
             cfg: LatencyConfig, natural: bool, max_length: int | None) -> dict:
    import onnxruntime

    from edgepress.export.parity import ort_runner

    model_dir = model_dir_of(artifact)
    if path is None:
        run, names = torch_model_runner(model_dir, threads)
        providers = ["torch-cpu"]
    else:
        session = open_session(path, SessionConfig(providers=(provider,), threads=threads))
        names, providers = tuple(i.name for i in session.get_inputs()), session.get_providers()
    limit = position_limit(read_model_config(model_dir))
    tokenizer = load_tokenizer(model_dir, limit)
    fixed = fixed_shape_feeds(tokenizer, texts, cfg.batch_size, cfg.sequence_length, names, limit)
    lengths = natural_feeds(bundle_tokenizer(model_dir, limit, natural_cut(artifact, max_length)),
                            texts[:NATURAL_SENTENCES], names) if natural else []
    if path is not None:
        run = cuda_iobinding_runner(session, [fixed, *lengths]) if provider == "cuda" else ort_runner(session)
    timed = {"fixed": {**time_runner(run, [fixed], cfg.warmup, cfg.runs), "batch_size": cfg.batch_size,
                       "sequence_length": cfg.sequence_length}}
    if natural:
        timed["natural"] = {**time_natural(run, lengths, cfg.warmup, cfg.runs),
                            "mean_tokens": float(sum(f["input_ids"].shape[1] for f in lengths) / len(lengths))}
    return {
        **timed,
        "providers_used": providers,
        "threads": threads,
        "cpu": cpu_model(),
        "onnxruntime": onnxruntime.__version__,
    }


def latency_metrics(artifact: Path, texts: tuple[str, ...], provider: str, threads: int | None,
                    cfg: LatencyConfig, max_length: int | None = None) -> dict:
    """The report's `latency.<provider>` entry: the fixed shape's numbers at the top level, natural lengths nested."""
    result = measure_latency(artifact, texts, provider, threads, cfg, max_length=max_length)
    return {**result["fixed"], "providers_used": result["providers_used"], "threads": threads,
            "natural": result["natural"]}


def compare_latency(artifacts: dict[str, Path], texts: tuple[str, ...], threads: int | None, rounds: int = ROUNDS,
                    cfg: LatencyConfig = LatencyConfig(warmup=20, runs=100), natural: bool = True,
                    max_length: int | None = None) -> dict[str, dict]:
    """Candidates timed side by side on CPU, in `rounds` interleaved rounds (`device.timing.interleaved`). Per
    name: the medians over rounds of the fixed-shape p50 and p90 and (unless `natural=False`) the natural-length p50
    (texts cut at `max_length`: `natural_cut`) and natural_mean_tokens; providers_used."""
    import numpy as np

    # a pause after each: torch's OpenMP threads spin a while after a run; let them idle before the next one
    runs = interleaved({name: lambda artifact=artifact: measure_latency(Path(artifact), texts, "cpu", threads, cfg,
                                                                        natural, max_length)
                        for name, artifact in artifacts.items()}, rounds, pause_s=0.2)

    def medians(results: list[dict]) -> dict:
        figures = {"fixed_p50_ms": float(np.median([r["fixed"]["p50_ms"] for r in results])),
                   "fixed_p90_ms": float(np.median([r["fixed"]["p90_ms"] for r in results])),
                   "providers_used": results[0]["providers_used"]}
        if natural:
            figures.update(natural_p50_ms=float(np.median([r["natural"]["p50_ms"] for r in results])),
                           natural_mean_tokens=results[0]["natural"]["mean_tokens"])
        return figures

    return {name: medians(results) for name, results in runs.items()}


def side_by_side_speedup(baseline: Path, artifact: Path, texts: tuple[str, ...], threads: int | None,
                         cfg: LatencyConfig, rounds: int = ROUNDS, natural: bool = False,
                         max_length: int | None = None) -> dict:
    """The baseline's CPU p50 over the artifact's at the fixed shape (`natural`: at the texts' natural lengths, one
    a call), the two timed in turn (`compare_latency`) so that a load on the machine falls on both: what a speedup
    gate judges. Timed apart, minutes apart, one busy minute under the baseline's timing would pass any stage."""
    timed = compare_latency({"baseline": baseline, "stage": artifact}, texts, threads, rounds, cfg, natural=natural,
                            max_length=max_length)
    key = "natural_p50_ms" if natural else "fixed_p50_ms"
    base, now = timed["baseline"][key], timed["stage"][key]
    return {"speedup": base / now, "baseline_p50_ms": base, "p50_ms": now, "rounds": rounds,
            **({"natural": True} if natural else {})}
