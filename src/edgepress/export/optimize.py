"""Graph fusion with ONNX Runtime's transformer optimizer (Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization, ...), and fp16 conversion for CUDA. Each result is parity-checked against its input.

Which fusions make a graph faster depends on the CPU and on what follows (on one machine of this project's kind
SkipLayerNormalization made the int8 teacher 20% slower, on another slightly faster), so `fusions: auto` times the
candidate sets on this machine, side by side, and keeps the fastest: at the run's latency shape, or, when a later
stage's speed gate judges natural lengths, at the texts' own lengths one a call (`natural`), where the winner can
differ (all-MiniLM-L6-v2's int8 graph at 27 tokens, 2 threads: ORT's SkipLayerNormalization kernel, a scalar loop,
takes 3x the time of Add + LayerNormalization). When `int8-dynamic` follows (the one quantizer that takes a fused
graph; `int8-static` and `int4` take the unfused one and ONNX Runtime fuses what it can when their session starts), a
run fills in `quantized_with` and every candidate is timed as it will ship: quantized, with the nodes its
`keep_float` names kept float (a set that fuses one of them away is left out: the int8 stage would refuse it).

Every family is fused with the optimizer's `bert` model type: onnxruntime 1.31 has none for DeBERTa or ModernBERT,
and on their graphs `bert` fuses the layer norms (SkipLayerNormalization) but no attention (disentangled attention;
rotary embeddings with local windows). The stage then says so (`unfused_attention` in its details).
"""

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgepress.configs import Threads, Tokens
from edgepress.device.feeds import (
    NATURAL_SENTENCES,
    bundle_tokenizer,
    fixed_shape_feeds,
    load_tokenizer,
    natural_feeds,
    position_limit,
)
from edgepress.device.sessions import SESSION_FILE
from edgepress.device.timing import interleaved, time_natural, time_runner
from edgepress.errors import ConfigError
from edgepress.export.parity import (
    ONNX_FILE,
    PARITY_LENGTH,
    ParityConfig,
    check_graph_change,
    copy_side_files,
    ort_runner,
)
from edgepress.files import atomic_dir, read_onnx, write_json
from edgepress.logs import parity_text, readable, step
from edgepress.models.loading import read_model_config
from edgepress.runtime.latency import LatencyConfig
from edgepress.runtime.session import SessionConfig, open_session

log = logging.getLogger(__name__)

# FusionOptions switches, by the names a config uses.
Fusion = Literal["attention", "skip_layer_norm", "bias_skip_layer_norm", "embed_layer_norm", "bias_gelu", "gelu",
                 "layer_norm"]
FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization",
             "LayerNormalization", "BiasGelu", "FastGelu", "Gelu")
ALL_FUSIONS: tuple[str, ...] = get_args(Fusion)
# auto's candidates: everything, everything but one of the fusions that change the big kernels, nothing
LEFT_OUT_ONE_AT_A_TIME = ("attention", "skip_layer_norm", "bias_gelu", "embed_layer_norm")
# The ONNX Runtime optimizers that would apply a left-out fusion again when a session starts (names checked against
# onnxruntime 1.31's graph transformers): recorded beside the graph (SESSION_FILE) so that every session honours it.
RUNTIME_OPTIMIZERS = {"attention": ("AttentionFusion",), "skip_layer_norm": ("SkipLayerNormFusion",),
                      "bias_skip_layer_norm": ("SkipLayerNormFusion",), "embed_layer_norm": ("EmbedLayerNormFusion",),
                      "bias_gelu": ("BiasGeluFusion",), "gelu": ("GeluFusion",), "layer_norm": ("LayerNormFusion",)}
class OptimizeConfig(BaseModel):
    """The `optimize` method: which fusions (chosen by timing, or all), which never, and the parity tolerance of
    the fused graph. `threads`, `latency` and `quantized_with` are what a run fills in from its runtime section and
    the stage that follows."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fusions: Literal["auto", "all"] = Field("auto", description="auto: time the candidate sets, keep the fastest")
    disable: tuple[Fusion, ...] = Field((), description="fusions never used, e.g. [skip_layer_norm]")
    max_length: Tokens = Field(128, description=PARITY_LENGTH)
    parity: ParityConfig = Field(ParityConfig(max_abs_diff=1e-3), description="how close the fused graph's logits "
                                                                              "must be to the unfused graph's")
    threads: Threads | None = Field(None, description="auto: the intra-op threads the candidates are timed on")
    latency: LatencyConfig = Field(LatencyConfig(), description="auto: the shape, warm-up and runs of the timing")
    natural: bool = Field(False, description="auto: time the candidates at the texts' natural lengths, one a call, "
                                             "not at latency's shape (a run sets it when a later stage gates "
                                             "min_natural_speedup)")
    quantized_with: dict | None = Field(None, description="auto: the params of the int8-dynamic stage each "
                                        "candidate is timed after (a run fills in the next stage's)")


# The runner's "timed as shipped" service as `fusions: auto` meets it: the params of the pass that follows
# (`quantized_with`) -> `ship(candidate_dir, dst_dir, texts)`, the candidate as that pass would ship it (a ConfigError
# where the pass would refuse it). The registry gives optimize int8-dynamic's (`int8_dynamic_as_shipped`).
AsShipped = Callable[[dict], Callable[[Path, Path, tuple[str, ...]], Path]]


def check_optimize(model, tokenizer, cfg: OptimizeConfig, task, as_shipped: AsShipped | None = None) -> None:
    """The pre-run check of `optimize`: a `quantized_with` a config writes must be params the pass that quantizes the
    candidates (`as_shipped`) takes."""
    if cfg.quantized_with is not None and as_shipped is not None:
        as_shipped(cfg.quantized_with)


def later_params(params: dict, run) -> dict:
    """What an `optimize` stage that times its fusions takes from the stages after it (`RunContext.later`): the next
    stage's int8-dynamic params with the target's defaults (`quantized_with`), and `natural` when a later stage's
    speed gate judges natural lengths (the candidates are then timed there). Part of the stage's reuse key too:
    timings made for another quantization or shape are not reused."""
    if params.get("fusions") == "all":
        return {}
    return {**({"natural": True} if run.natural_later else {}),
            **({"quantized_with": run.later[0][1]} if run.later and run.later[0][0] == "int8-dynamic" else {})}


def fill_optimize(params: dict, run) -> dict:
    """fusions: auto times what ships: on the run's threads and latency shape, quantized as the next stage will."""
    return {"threads": run.threads, "latency": run.latency, "quantized_with": None, **later_params(params, run),
            **params}


class Fp16Config(BaseModel):
    """The `fp16` method (for CUDA): float16 weights and compute; inputs stay int64 and logits float32."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_length: Tokens = Field(128, description=PARITY_LENGTH)
    parity: ParityConfig = Field(ParityConfig(max_abs_diff=5e-2, min_agreement=0.99), description="how close the "
                                 "fp16 graph's logits must be to the fp32 graph's")
    providers: tuple[Literal["cpu", "cuda"], ...] = Field(("cuda",), min_length=1,
                                                          description="where the fp16 graph is checked")


def check_fp16(model, tokenizer, cfg: Fp16Config, task=None) -> None:
    """The pre-run check of `fp16`: every provider it checks its graph on runs on this machine."""
    from edgepress.runtime.session import check_providers

    check_providers(cfg.providers)


def _fusion_options(disable: tuple[str, ...]):
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    for name in disable:
        setattr(options, f"enable_{name}", False)
    return options


def _fuse(src: Path, dst: Path, disable: tuple[str, ...]) -> dict:
    """`src` fused into `dst` (model.onnx, and SESSION_FILE keeping ORT from applying the left-out fusions when a
    session starts); returns the fused op counts. Run after copy_side_files: it replaces an inherited SESSION_FILE."""
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(src), model_type="bert", optimization_options=_fusion_options(disable), opt_level=0)
    fused.save_model_to_file(str(dst / ONNX_FILE))
    optimizers = sorted({name for fusion in disable for name in RUNTIME_OPTIMIZERS[fusion]})
    (dst / SESSION_FILE).unlink(missing_ok=True)
    if optimizers:
        write_json(dst / SESSION_FILE, {"disabled_optimizers": optimizers, "left_out_fusions": sorted(disable)})
    return {op: n for op, n in fused.get_fused_operator_statistics().items() if n and op in FUSED_OPS}


def candidate_sets(disable: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """auto's candidates, by name -> the fusions each leaves out (always including `disable`)."""
    sets = {"all": disable, **{f"no {name}": (*disable, name) for name in LEFT_OUT_ONE_AT_A_TIME
                               if name not in disable}, "none": ALL_FUSIONS}
    return {name: tuple(sorted(set(off))) for name, off in sets.items()}


def _time_side_by_side(graphs: dict[str, Path], texts: tuple[str, ...], cfg: OptimizeConfig) -> dict[str, list]:
    """p50 ms of each graph at the fixed latency shape (`cfg.natural`: over NATURAL_SENTENCES texts at their own
    lengths, one a call), in interleaved rounds (`device.timing.interleaved`)."""
    any_dir = next(iter(graphs.values())).parent
    limit = position_limit(read_model_config(any_dir))
    sessions = {name: open_session(path, SessionConfig(threads=cfg.threads)) for name, path in graphs.items()}
    runners = {name: ort_runner(session) for name, session in sessions.items()}
    names = tuple(i.name for i in next(iter(sessions.values())).get_inputs())
    tokenizer = load_tokenizer(any_dir, limit)
    if cfg.natural:  # the texts as the run reads them: cut at its max_length
        feeds = natural_feeds(bundle_tokenizer(any_dir, limit, cfg.max_length), texts[:NATURAL_SENTENCES], names)
        timed = time_natural
    else:
        feeds = [fixed_shape_feeds(tokenizer, texts, cfg.latency.batch_size, cfg.latency.sequence_length, names,
                                   limit)]
        timed = time_runner
    return interleaved({name: lambda _, run=run: timed(run, feeds, cfg.latency.warmup, cfg.latency.runs)["p50_ms"]
                        for name, run in runners.items()})


def _timing_copy(src_dir: Path, dst: Path, off: tuple[str, ...], texts: tuple[str, ...],
                 ship: Callable[[Path, Path, tuple[str, ...]], Path] | None) -> tuple[dict, Path | None, str | None]:
    """`src_dir`'s graph fused without `off` into `dst`, and with `ship` as the next pass will ship it; returns (its
    fused op counts, the graph to time, or None and why the next pass would refuse it: int8-dynamic's keep_float
    names a node the set fuses away)."""
    dst.mkdir()
    copy_side_files(src_dir, dst)
    ops = _fuse(src_dir / ONNX_FILE, dst, off)
    if ship is None:
        return ops, dst / ONNX_FILE, None
    try:
        return ops, ship(dst, dst.with_name(f"{dst.name}-shipped"), texts), None
    except ConfigError as e:
        return ops, None, str(e)


def _choose(src_dir: Path, texts: tuple[str, ...], cfg: OptimizeConfig,
            as_shipped: AsShipped | None) -> tuple[tuple[str, ...], dict]:
    """The fastest candidate's left-out fusions, and every candidate's timings (or why it was not timed)."""
    if cfg.quantized_with is not None and as_shipped is None:
        raise ValueError("optimize: quantized_with needs as_shipped, the pass that quantizes the candidates")
    ship = None if cfg.quantized_with is None else as_shipped({**cfg.quantized_with, "max_length": cfg.max_length})
    sets = candidate_sets(cfg.disable)
    with tempfile.TemporaryDirectory(prefix="edgepress-fusions-") as scratch, \
            step(f"optimize: {len(sets)} fusion sets{' quantized' if cfg.quantized_with else ''} and timed side by "
                 f"side", log):
        made = {name: _timing_copy(Path(src_dir), Path(scratch) / str(k), off, texts, ship)
                for k, (name, off) in enumerate(sets.items())}
        refused = {name: why for name, (_, graph, why) in made.items() if graph is None}
        if len(refused) == len(sets):
            raise ConfigError(f"optimize: the next stage fits none of the {len(sets)} fusion sets (it would refuse "
                              f"each); with every fusion: {refused['all']}")
        timings = _time_side_by_side({name: graph for name, (_, graph, _) in made.items() if graph}, texts, cfg)
    medians = {name: float(np.median(t)) for name, t in timings.items()}
    best = min(medians, key=medians.get)
    table = {}
    for name, (ops, _, why) in made.items():
        table[name] = {"left_out": list(sets[name]), "fused_ops": ops}
        table[name].update({"unusable": why} if why else {"p50_ms": timings[name], "median_p50_ms": medians[name]})
    log.info("optimize: fusions timed (median p50 ms%s): %s; keeping '%s'",
             ", int8" if cfg.quantized_with is not None else "",
             ", ".join(f"{n} {m:.2f}" for n, m in medians.items()), best)
    if refused:
        log.info("optimize: not timed, as they fuse away a node the int8 stage's keep_float names: %s",
                 ", ".join(refused))
    return sets[best], {"chosen": best, "candidates": table, "timed_int8": cfg.quantized_with is not None,
                        "shape": "natural" if cfg.natural else [cfg.latency.batch_size, cfg.latency.sequence_length],
                        "threads": cfg.threads}


def optimize_onnx(src_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: OptimizeConfig = OptimizeConfig(),
                  as_shipped: AsShipped | None = None) -> dict:
    """Fuse `src_dir`/model.onnx into `out_dir` (with `fusions: auto`, the fastest candidate set, each timed as
    `as_shipped` ships it when `cfg.quantized_with` is set); returns {"fused_ops": {op: count}, "disabled": [...],
    "parity", and with auto "timing"}."""
    off, timing = _choose(Path(src_dir), texts, cfg, as_shipped) if cfg.fusions == "auto" else (cfg.disable, None)
    with atomic_dir(Path(out_dir)) as tmp:
        copy_side_files(Path(src_dir), tmp)
        ops = _fuse(Path(src_dir) / ONNX_FILE, tmp, off)
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the fused graph",
                                    SessionConfig(optimization="disable"))
    log.info("optimize: fused %s (left out: %s); parity: %s", readable(ops), readable(list(off)),
             parity_text(parity))
    details = {"fused_ops": ops, "disabled": list(off), "parity": parity, **({"timing": timing} if timing else {})}
    # every fusion set that let attention fuse (with auto, the candidates; the chosen one may have left it out)
    tried = [c["fused_ops"] for c in (timing or {}).get("candidates", {}).values() if "attention" not in c["left_out"]]
    tried += [ops] if "attention" not in off else []
    if tried and not any({"Attention", "MultiHeadAttention"} & set(fused) for fused in tried):
        family = read_model_config(Path(src_dir)).get("model_type", "this")
        details["unfused_attention"] = (f"ONNX Runtime's optimizer fuses no attention in {family} graphs: "
                                        f"attention runs as separate MatMul and Softmax ops")
        log.info("optimize: %s", details["unfused_attention"])
    return details


def fp16_onnx(src_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: Fp16Config = Fp16Config()) -> dict:
    """Convert `src_dir`/model.onnx to float16 (int64 inputs, float32 logits), checked on `cfg.providers`."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    with atomic_dir(Path(out_dir)) as tmp:
        model = OnnxModel(read_onnx(Path(src_dir) / ONNX_FILE))
        model.convert_float_to_float16(keep_io_types=True)
        model.save_model_to_file(str(tmp / ONNX_FILE))
        copy_side_files(Path(src_dir), tmp)
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the fp16 graph",
                          SessionConfig(providers=cfg.providers))
    log.info("fp16: %s converted; parity: %s", src_dir, parity_text(parity))
    return {"parity": parity}
