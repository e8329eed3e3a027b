"""Latency of an artifact, ONNX (through runtime/) or torch, on the same real-token inputs and thread count."""

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgepress.device.bundle import MANIFEST, json_object, onnx_path
from edgepress.device.feeds import (
    NATURAL_SENTENCES,
    Feeds,
    bundle_tokenizer,
    fixed_shape_feeds,
    load_tokenizer,
    natural_feeds,
    position_limit,
)
from edgepress.device.timing import (
    ROUNDS,
    cpu_model,
    interleaved,
    seconds_of,
    summarize,
    time_natural,
    time_runner,
)
from edgepress.errors import ConfigError, ModelError
from edgepress.models.loading import read_model_config
from edgepress.runtime.latency import LatencyConfig
from edgepress.runtime.session import SessionConfig, cuda_iobinding_runner, open_session

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
    """(runner, input names) of a torch model dir, eager with torch.inference_mode, on `threads` threads (set here:
    callers keep torch's own count with `torch_threads_kept`)."""
    import torch

    from edgepress.export.onnx import torch_runner
    from edgepress.models.fakequant import load_for_inference
    from edgepress.tasks import task_of

    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_for_inference(model_dir, task_of(model_dir))
    return torch_runner(model), tuple(tokenizer.model_input_names)


@contextmanager
def torch_threads_kept():
    """torch's thread count as it was before, once the block ends: a torch model is timed on the run's `threads`;
    training afterwards gets torch's own count back. Nothing is imported when torch is not loaded (a bundle's
    timing)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        torch = sys.modules.get("torch")
        if torch is not None and before is not None:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class Timeable:
    """An artifact made ready to time: its runner, the fixed-shape feeds (one; a cascade's: several windows, each
    decided alone), the natural-length feeds (one sentence each; empty when natural lengths are not timed) and the
    providers it runs on. A cascade's feeds are pairs: each text as its student and as its fallback read it."""

    run: Callable[[Feeds], object]
    fixed: list[Feeds]
    lengths: list[Feeds]
    providers: list[str]
    deferred: float | None = None  # a cascade's: the share of the natural-length texts it gives its fallback

    def mean_tokens(self) -> float:
        first = [f[0] if isinstance(f, tuple) else f for f in self.lengths]  # a cascade's: as its student reads
        return float(sum(f["input_ids"].shape[1] for f in first) / len(first))


def prepared_cascade(artifact: Path, texts: tuple[str, ...], provider: str, threads: int | None,
                     cfg: LatencyConfig, natural: bool, max_length: int | None) -> Timeable:
    """A cascade made ready to time as a device meets it (`device.cascade.Cascade.run_pair`): each text, or
    fixed-shape window, through the student and, where the student is unsure, the fallback too."""
    from edgepress.device.cascade import FALLBACK, Cascade

    if provider != "cpu":
        raise ConfigError(f"{artifact} is a cascade; edgepress times cascades on cpu only. Fix: runtime.providers: "
                          f"[cpu]")
    cascade = Cascade(artifact, threads=threads, max_length=natural_cut(artifact, max_length))
    fixed = cascade.windows(texts, cfg.batch_size, cfg.sequence_length)
    lengths = cascade.pairs(texts[:NATURAL_SENTENCES]) if natural else []
    deferred = float(sum(cascade.run_pair(p) == FALLBACK for p in lengths) / len(lengths)) if lengths else None
    return Timeable(cascade.run_pair, fixed, lengths, cascade.student.session.get_providers(), deferred)


def prepared(artifact: Path, texts: tuple[str, ...], provider: str, threads: int | None, cfg: LatencyConfig,
             natural: bool, max_length: int | None) -> Timeable:
    """An ONNX artifact's session opened (a torch model dir: its model loaded, on `threads`) and its feeds made:
    what `measure_latency` times once and `compare_latency` times in many short rounds."""
    from edgepress.device.cascade import is_cascade
    from edgepress.export.parity import ort_runner

    if not Path(artifact).exists():
        raise ModelError(f"{artifact} does not exist. Fix: check the path")
    if is_cascade(artifact):
        return prepared_cascade(Path(artifact), texts, provider, threads, cfg, natural, max_length)
    path, model_dir = onnx_path(artifact), model_dir_of(artifact)
    if path is None:
        if provider != "cpu":
            raise ConfigError(f"{artifact} is a torch model; edgepress times torch models on cpu only")
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
    return Timeable(run, [fixed], lengths, providers)


def measure_latency(artifact: Path, texts: tuple[str, ...], provider: str = "cpu", threads: int | None = None,
                    cfg: LatencyConfig = LatencyConfig(), natural: bool = True, max_length: int | None = None) -> dict:
    """{"fixed": {p50_ms, ...}, "natural": {...}, "providers_used"} of an ONNX artifact or a torch model dir
    (`natural=False`: the fixed shape alone); natural lengths are the texts as `max_length` cuts them
    (`natural_cut`)."""
    import onnxruntime

    with torch_threads_kept():
        ready = prepared(artifact, texts, provider, threads, cfg, natural, max_length)
        timed = {"fixed": {**time_runner(ready.run, ready.fixed, cfg.warmup, cfg.runs),
                           "batch_size": cfg.batch_size, "sequence_length": cfg.sequence_length}}
        if natural:
            timed["natural"] = {**time_natural(ready.run, ready.lengths, cfg.warmup, cfg.runs),
                                "mean_tokens": ready.mean_tokens()}
    return {
        **timed,
        **({"deferred": ready.deferred} if ready.deferred is not None else {}),
        "providers_used": ready.providers,
        "threads": threads,
        "cpu": cpu_model(),
        "onnxruntime": onnxruntime.__version__,
    }


def latency_metrics(artifact: Path, texts: tuple[str, ...], provider: str, threads: int | None,
                    cfg: LatencyConfig, max_length: int | None = None) -> dict:
    """The report's `latency.<provider>` entry: the fixed shape's numbers at the top level, natural lengths nested."""
    result = measure_latency(artifact, texts, provider, threads, cfg, max_length=max_length)
    return {**result["fixed"], "providers_used": result["providers_used"], "threads": threads,
            "natural": {**result["natural"], **({"deferred": result["deferred"]} if "deferred" in result else {})}}


SHORT_ROUNDS = 10  # `compare_latency`: each of its rounds is this many short interleaved ones
TORCH_IDLE_S = 0.05  # after a torch model's turn: libgomp's workers spin 300,000 times (milliseconds) before sleeping


def compare_latency(artifacts: dict[str, Path], texts: tuple[str, ...], threads: int | None, rounds: int = ROUNDS,
                    cfg: LatencyConfig = LatencyConfig(warmup=20, runs=100), natural: bool = True,
                    max_length: int | None = None) -> dict[str, dict]:
    """Candidates timed side by side on CPU. Each is made ready once (`prepared`: its session opened, its feeds made)
    and warmed up once; then `rounds` × `SHORT_ROUNDS` short rounds, interleaved (`device.timing.interleaved`), each
    timing every candidate on a share of `cfg.runs` fixed-shape calls and of the natural-length sentences (texts
    cut at `max_length`: `natural_cut`), so that the machine's drift falls on all of them alike. A session opened
    anew for each round strayed up to 16% from itself
    (benchmarks/session_noise.py, retired after commit e7d753d: `git show e7d753d:benchmarks/session_noise.py`).
    Per name: the fixed-shape p50, p90, p99 and mean (`fixed_p50_ms`, ...) and (unless `natural=False`) the
    natural-length ones (`natural_p50_ms`, ...) over all its timed calls, natural_mean_tokens; providers_used; a
    cascade's deferred share."""
    with torch_threads_kept():
        ready = {name: prepared(Path(artifact), texts, "cpu", threads, cfg, natural, max_length)
                 for name, artifact in artifacts.items()}
        for one in ready.values():
            seconds_of(one.run, [*one.fixed, *one.lengths], cfg.warmup, 0)
        short = rounds * SHORT_ROUNDS
        fixed_calls = -(-cfg.runs // SHORT_ROUNDS)

        def measure(one: Timeable) -> Callable[[int], tuple[list[float], list[float]]]:
            share = -(-len(one.lengths) // SHORT_ROUNDS)

            def timed(index: int) -> tuple[list[float], list[float]]:
                start = index % SHORT_ROUNDS * share  # every sentence once in each SHORT_ROUNDS rounds
                sentences = one.lengths[start:start + share]
                return seconds_of(one.run, one.fixed, 0, fixed_calls), seconds_of(one.run, sentences, 0,
                                                                                     len(sentences))

            return timed

        # ONNX Runtime parks its workers as a run returns; torch's OpenMP threads spin on a while: let them idle
        idle = {name: TORCH_IDLE_S for name, one in ready.items() if one.providers == ["torch-cpu"]}
        runs = interleaved({name: measure(one) for name, one in ready.items()}, short, idle)

    def figures(one: Timeable, results: list[tuple[list[float], list[float]]]) -> dict:
        shapes = {"fixed": summarize([s for f, _ in results for s in f])}
        if natural:
            shapes["natural"] = summarize([s for _, n in results for s in n])
        out = {f"{shape}_{stat}": timed[stat] for shape, timed in shapes.items()
               for stat in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")}
        out["providers_used"] = one.providers
        if natural:
            out["natural_mean_tokens"] = one.mean_tokens()
        if one.deferred is not None:
            out["deferred"] = one.deferred
        return out

    return {name: figures(ready[name], results) for name, results in runs.items()}


def speed_statistic(artifact: Path) -> str:
    """What a speedup gate divides: the p50 of a model, whose every call costs about the same; the mean of a
    cascade, whose deferred texts cost both models (a p50 would not see them while fewer than half are deferred)."""
    from edgepress.device.cascade import is_cascade

    return "mean" if is_cascade(Path(artifact)) else "p50"


def side_by_side_speedup(baseline: Path, artifact: Path, texts: tuple[str, ...], threads: int | None,
                         cfg: LatencyConfig, rounds: int = ROUNDS, natural: bool = False,
                         max_length: int | None = None) -> dict:
    """The baseline's CPU p50 over the artifact's (a cascade's: the means, `speed_statistic`) at the fixed shape
    (`natural`: at the texts' natural lengths, one a call), the two timed in turn (`compare_latency`) so that a load
    on the machine falls on both: what a speedup gate judges. Timed apart, minutes apart, one busy minute under the
    baseline's timing would pass any stage."""
    timed = compare_latency({"baseline": baseline, "stage": artifact}, texts, threads, rounds, cfg, natural=natural,
                            max_length=max_length)
    statistic = speed_statistic(artifact)
    key = f"{'natural' if natural else 'fixed'}_{statistic}_ms"
    base, now = timed["baseline"][key], timed["stage"][key]
    return {"speedup": base / now, f"baseline_{statistic}_ms": base, f"{statistic}_ms": now, "rounds": rounds,
            "turns": rounds * SHORT_ROUNDS, **({"statistic": statistic} if statistic != "p50" else {}),
            **({"deferred": timed["stage"]["deferred"]} if "deferred" in timed["stage"] else {}),
            **({"natural": True} if natural else {})}
