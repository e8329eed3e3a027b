"""The `lowrank` method: chosen Linears of every layer (the FFN's two projections by default) replaced by two thinner
ones from their truncated SVD at a `keep` fraction of their rank, and with `words` the word table by a thin table and
a Linear (`models.lowrank`), then recovered by distillation from the model before the cut (or a `teacher`), as the
structured methods recover (`structured.recover`).

Fewer multiply-adds are not a faster graph: a (batch x sequence) x in x out MatMul split into two at a small batch
and short sequences often runs no faster in ONNX Runtime, whose kernels are tuned for the whole. So, unless told
otherwise (`only_where_faster: false`), each Linear shape is timed before anything is cut, whole and factored, as
one-Linear ONNX graphs at the run's latency shape and threads, side by side in interleaved rounds, int8-dynamic
quantized when an int8 stage follows (as it will ship), and only the shapes that run faster factored are factored
(the word table, factored for size, is not timed).
The timings are in the stage's details; where no shape is faster, the model is kept whole (no recovery runs) and the
log says so.
"""

import logging
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from edgepress.compress.structured import Cut, Recovery, check_structured, fill_teacher, recover
from edgepress.configs import Threads
from edgepress.data import DataSplits
from edgepress.deploy.targets import INT8_METHODS
from edgepress.errors import ConfigError
from edgepress.models.lowrank import WORDS, factorable, factorize
from edgepress.models.sentence import encoder_of
from edgepress.runtime.latency import LatencyConfig

log = logging.getLogger(__name__)

Part = Literal["ffn_in", "ffn_out", "attn_out", "words"]


class LowRankConfig(Recovery):
    """The `lowrank` method: the Linears at `parts` of every layer factored at `keep` of their rank, where that runs
    faster; then the recovery fine-tune. `threads`, `latency` and `int8` are what a run fills in from its runtime
    section and the stages after it."""

    keep: float = Field(0.25, gt=0, le=1, description="fraction of each factored Linear's rank, min(in, out), kept")
    parts: tuple[Part, ...] = Field(("ffn_in", "ffn_out"), min_length=1, description="what may be factored: the "
                                    "Linears of every layer at ffn_in, ffn_out (the FFN's), attn_out (the "
                                    "attention's output), never Q, K and V, whose MatMuls the Attention fusion takes "
                                    "whole; words: the word table (ALBERT's factorized embedding, for size: always "
                                    "factored, not timed)")
    only_where_faster: bool = Field(True, description="factor a Linear shape only where ONNX Runtime runs it faster "
                                    "factored, timed at the run's shape; false: every Linear at parts")
    threads: Threads | None = Field(None, description="auto: the intra-op threads the shapes are timed on")
    latency: LatencyConfig = Field(LatencyConfig(), description="auto: the shape, warm-up and runs of the timing")
    int8: bool = Field(False, description="auto: time the shapes int8-dynamic quantized (a run sets it when an int8 "
                                          "stage follows)")


def factored_parts(params: dict) -> tuple[str, ...]:
    """The parts a `lowrank` stage's params name (`parts`, or its default); other values name none here (the params'
    own check refuses them)."""
    named = params.get("parts", LowRankConfig.model_fields["parts"].default)
    return tuple(named) if isinstance(named, list | tuple) else ()


def later_int8(params: dict, run) -> dict:
    """What a `lowrank` stage takes from the stages after it (`RunContext.later`): whether an int8 stage follows, so
    that its shapes are timed as they will ship. Part of the stage's reuse key too."""
    return {"int8": any(method in INT8_METHODS for method, _ in run.later)}


def fill_lowrank(params: dict, run) -> dict:
    """The run's threads and latency shape, whether int8 follows, and `teacher: baseline`'s dir."""
    return fill_teacher({"threads": run.threads, "latency": run.latency, **later_int8(params, run), **params}, run)


def check_lowrank(model, tokenizer, cfg: LowRankConfig, task) -> None:
    """The pre-run check of `lowrank`: the structured methods' (`check_structured`), and a Linear to factor."""
    check_structured(model, tokenizer, cfg, task)
    _to_factor(model, cfg)


def _to_factor(model, cfg: LowRankConfig) -> dict[str, tuple[int, int]]:
    """`factorable`'s shapes of the model of a task at `cfg.parts`; none (factored by a lowrank before) is a
    ConfigError."""
    shapes = factorable(encoder_of(model), cfg.parts)
    if not shapes:
        raise ConfigError(f"lowrank: the model has no whole Linear at {', '.join(cfg.parts)} left to factor (a "
                          f"lowrank before factored them). Fix: name other parts, or remove the stage")
    return shapes


def ranks_of(shapes: dict[str, tuple[int, int]], keep: float) -> dict[str, int]:
    """{name: rank kept} of Linears of shapes {name: (in, out)}: `keep` of min(in, out), at least 1."""
    return {name: max(1, round(keep * min(shape))) for name, shape in shapes.items()}


def _linear_graph(path: Path, batch: int, sequence: int, in_features: int, out_features: int,
                  rank: int | None) -> None:
    """One Linear as an ONNX graph at the timing shape: x (batch, sequence, in) -> MatMul (whole: W; factored: D
    then U), then Add of the bias; random weights (the kernels' speed does not depend on them)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, *dims: int):
        return numpy_helper.from_array((rng.standard_normal(dims) * 0.02).astype(np.float32), name)

    if rank is None:
        weights, nodes = [weight("w", in_features, out_features)], [helper.make_node("MatMul", ["x", "w"], ["h"])]
    else:
        weights = [weight("d", in_features, rank), weight("u", rank, out_features)]
        nodes = [helper.make_node("MatMul", ["x", "d"], ["t"]), helper.make_node("MatMul", ["t", "u"], ["h"])]
    graph = helper.make_graph(
        [*nodes, helper.make_node("Add", ["h", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sequence, in_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, sequence, out_features])],
        [*weights, weight("b", out_features)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


def time_linears(shapes: set[tuple[int, int, int]], cfg: LowRankConfig) -> dict[str, dict]:
    """Per Linear shape (in, out, rank), named "in x out, rank r": the p50 ms of each timing round of the whole
    Linear and of its two factors (`_linear_graph`, int8-dynamic quantized with `cfg.int8`), in interleaved rounds
    (`device.timing.interleaved`), and whether the factors were faster (their median p50 below the whole's)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgepress.device.sessions import session_options
    from edgepress.device.timing import interleaved, time_runner

    batch, sequence = cfg.latency.batch_size, cfg.latency.sequence_length
    runners, feeds = {}, {}
    with tempfile.TemporaryDirectory(prefix="edgepress-lowrank-") as scratch:
        for in_features, out_features, rank in sorted(shapes):
            for form, factored in (("whole", None), ("factored", rank)):
                path = Path(scratch) / f"{in_features}-{out_features}-{rank}-{form}.onnx"
                _linear_graph(path, batch, sequence, in_features, out_features, factored)
                if cfg.int8:
                    quantize_dynamic(path, path.with_suffix(".int8.onnx"), weight_type=QuantType.QInt8)
                    path = path.with_suffix(".int8.onnx")
                session = ort.InferenceSession(str(path), session_options(cfg.threads, "all", False),
                                               providers=["CPUExecutionProvider"])
                runners[(in_features, out_features, rank, form)] = lambda f, s=session: s.run(None, f)
            x = np.random.default_rng(1).standard_normal((batch, sequence, in_features)).astype(np.float32)
            feeds[in_features] = [{"x": x}]
        timings = interleaved({key: lambda _, run=run, key=key: time_runner(run, feeds[key[0]], cfg.latency.warmup,
                                                                           cfg.latency.runs)["p50_ms"]
                               for key, run in runners.items()})
    table = {}
    for in_features, out_features, rank in sorted(shapes):
        whole, factored = (timings[(in_features, out_features, rank, form)] for form in ("whole", "factored"))
        table[shape_name(in_features, out_features, rank)] = {
            "whole_p50_ms": whole, "factored_p50_ms": factored,
            "faster": bool(np.median(factored) < np.median(whole))}
    return table


def shape_name(in_features: int, out_features: int, rank: int) -> str:
    return f"{in_features} x {out_features}, rank {rank}"


def lowrank(src: Path, out: Path, data: DataSplits, cfg: LowRankConfig = LowRankConfig(), task=None) -> dict:
    """Factor the Linears at `cfg.parts` of the model in `src` where that runs faster (all of them without
    `only_where_faster`), recover it by distillation, save to `out`; where none is faster, `src` as it was."""
    timing, ranks = {}, {}

    def plan(model, src: Path) -> bool:
        shapes, table = _to_factor(model, cfg), factorable(encoder_of(model), (WORDS,))
        ranks.update(ranks_of(shapes, cfg.keep))
        if cfg.only_where_faster:  # the Linears; the word table is factored for size
            linears = {name: rank for name, rank in ranks.items() if name not in table}
            timing.update(time_linears({(*shapes[name], rank) for name, rank in linears.items()}, cfg)
                          if linears else {})
            for name in linears:
                if not timing[shape_name(*shapes[name], linears[name])]["faster"]:
                    del ranks[name]
            log.info("lowrank: timed whole and factored at b%d x s%d%s (median p50 ms): %s", cfg.latency.batch_size,
                     cfg.latency.sequence_length, ", int8" if cfg.int8 else "",
                     "; ".join(f"{name}: {np.median(t['whole_p50_ms']):.3f} -> {np.median(t['factored_p50_ms']):.3f}"
                               for name, t in timing.items()))
        if not ranks:
            log.info("lowrank: no Linear at %s runs faster factored at this shape", ", ".join(cfg.parts))
        return bool(ranks)

    def apply(model, tokenizer, data: DataSplits, cfg: LowRankConfig, loss_of) -> dict:
        factorize(encoder_of(model), ranks)
        return {"factored": ranks}

    return {"factored": {}, **recover(src, out, data, cfg, Cut("lowrank", plan, apply), task), "timing": timing}
