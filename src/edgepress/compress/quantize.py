"""Post-training int8 quantization of an ONNX graph with `onnxruntime.quantization`.

`int8-static`: weights and activations int8, activation ranges calibrated on real sentences, written as QDQ.
MatMuls whose two inputs are both activations (attention scores, context) and the classification head (pooler and
classifier Gemms, or a MatMul classifier) stay float: quantizing them collapses accuracy (ARCHITECTURE.md), and the
head is a (batch, hidden) product whose cost is negligible.

`int8-dynamic`: weights int8 ahead of time, activations quantized per call (DynamicQuantizeLinear + MatMulInteger,
QAttention on fused graphs). Weights stay signed: u8 activations x s8 weights take the fast integer kernels
(u8 x u8 runs ~10x slower on this class of CPU, ARCHITECTURE.md). On a fused graph ORT's quantizer cannot infer the
types of contrib ops, so `DefaultTensorType` says they are float.

`keep_float` (both methods): the N nodes whose quantization moves the logits most stay float. Each candidate node is
quantized alone and the mean |logit change| against the float graph is measured on validation sentences; the ranking
goes into the details. Or a list of node names, kept as given.
"""

import logging
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from edgepress.compress.gptq import gptq_rounding
from edgepress.compress.smooth import smooth_activations, text_feeds
from edgepress.configs import Tokens
from edgepress.device.feeds import encode, fixed_shape_feeds, load_tokenizer
from edgepress.errors import ConfigError
from edgepress.export.parity import (
    LOOSE_PARITY,
    ONNX_FILE,
    PARITY_LENGTH,
    UNCHECKED,
    ParityConfig,
    check_graph_change,
    copy_side_files,
    ort_runner,
    spread_by_length,
)
from edgepress.files import atomic_dir, graph_apart, read_onnx
from edgepress.logs import parity_text, quiet, readable
from edgepress.runtime.session import SessionConfig, open_session, session_op_counts

log = logging.getLogger(__name__)
INT8_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "QAttention", "DynamicQuantizeMatMul", "QGemm")


MAX_KEEP_FLOAT = 10**6  # nodes kept float: more than any graph has


def _keep_float(value):
    """A count (0, 1, 2, ...) or node names; one message for both (a union's own errors name its internals)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_KEEP_FLOAT:
        return value
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"keep_float takes a number of nodes (0, 1, 2, ...; 0 keeps none) or a non-empty list of node "
                     f"names (at most {MAX_KEEP_FLOAT:,} nodes)")


KeepFloat = Annotated[Annotated[int, Field(ge=0, le=MAX_KEEP_FLOAT)] | tuple[str, ...],
                      BeforeValidator(_keep_float)]
KEEP_FLOAT = Field(0, description="the N most sensitive nodes stay float (measured), or a list of node names")
SENSITIVITY_TEXTS = 64  # validation sentences each candidate is measured on


# op types of ONNX Runtime's integer and low-bit kernels, as they appear in the graph a session runs
LOW_BIT_KERNEL = re.compile(r"Integer|QLinear|QAttention|QGemm|QuantizeMatMul|MatMulNBits|BlockQuantized")


def low_bit_kernels(path: Path) -> dict[str, int]:
    """The integer / low-bit kernels ONNX Runtime runs for the graph at `path` on CPU (its optimized graph: QDQ
    pairs it fused into integer ops, or left as float work)."""
    return {op: n for op, n in session_op_counts(path).items() if LOW_BIT_KERNEL.search(op)}


def _weighted(graph, op_types: tuple[str, ...]) -> list[str]:
    """Names of the nodes of `op_types` that take a weight (an initializer): what a weight quantizer touches.
    A Gemm is named as quantize_dynamic renames it when it turns it into MatMul + Add."""
    weights = {t.name for t in graph.initializer}
    return [f"{n.name}_MatMul" if n.op_type == "Gemm" else n.name for n in graph.node
            if n.op_type in op_types and any(i in weights for i in n.input)]


def int8_dynamic_nodes(path: Path) -> list[str]:
    """The nodes of the graph at `path` that `int8-dynamic` quantizes: what its `keep_float` may name."""

    return _weighted(read_onnx(path, external_data=False).graph,
                     ("MatMul", "Gemm", "Attention", "Gather", "EmbedLayerNormalization"))


def _logits(path: Path, feeds: list[dict]) -> np.ndarray:
    run = ort_runner(open_session(path, SessionConfig()))
    return np.concatenate([run(f) for f in feeds]).astype(np.float64)


def rank_sensitivity(src_dir: Path, candidates: list[str], quantize_only: Callable[[Path, list[str]], None],
                     texts: tuple[str, ...], max_length: int) -> list[dict]:
    """Each candidate quantized alone (`quantize_only(out_path, [name])`), most sensitive first: mean and max
    |logit change| against the float graph and argmax agreement on validation sentences (batches of 8)."""
    src = Path(src_dir) / ONNX_FILE
    names = tuple(i.name for i in open_session(src, SessionConfig()).get_inputs())
    tokenizer = load_tokenizer(src_dir, max_length)
    picked = spread_by_length(texts, SENSITIVITY_TEXTS)
    feeds = [encode(tokenizer, picked[i : i + 8], names) for i in range(0, len(picked), 8)]
    reference = _logits(src, feeds)
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgepress-sensitivity-") as scratch:
        for name in candidates:
            out = Path(scratch) / f"{len(rows)}.onnx"
            quantize_only(out, [name])
            logits = _logits(out, feeds)
            change = np.abs(logits - reference)
            agreement = float(np.mean(logits.argmax(-1) == reference.argmax(-1)))
            rows.append({"node": name, "mean_abs_diff": float(change.mean()), "max_abs_diff": float(change.max()),
                         "agreement": agreement})
            out.unlink()
    return sorted(rows, key=lambda r: -r["mean_abs_diff"])


def check_keep_float(keep: KeepFloat, candidates: list[str]) -> None:
    """`keep` must leave something to quantize and name only nodes the method quantizes."""
    if isinstance(keep, int) and keep >= len(candidates):
        raise ConfigError(f"keep_float {keep} would keep all {len(candidates)} nodes this method quantizes float. "
                          f"Fix: keep_float of at most {len(candidates) - 1}")
    unknown = [] if isinstance(keep, int) else [n for n in keep if n not in candidates]
    if unknown or (not isinstance(keep, int) and len(set(keep)) >= len(candidates)):
        raise ConfigError(f"keep_float names nodes this method does not quantize, or all of them: "
                          f"{', '.join(unknown) or 'all'}. Fix: name some of the nodes of the graph among: "
                          f"{', '.join(candidates[:12])}{' ...' if len(candidates) > 12 else ''}")


def kept_float(keep: KeepFloat, candidates: list[str], rank: Callable[[], list[dict]]) -> tuple[list[str], list]:
    """(node names to keep float, the sensitivity ranking or [] when none was measured)."""
    check_keep_float(keep, candidates)
    if isinstance(keep, int):
        ranking = rank() if keep else []
        return [r["node"] for r in ranking[:keep]], ranking
    return list(keep), []


class Int8DynamicConfig(BaseModel):
    """The `int8-dynamic` method. The parity check is loose on purpose: int8 moves logits; the accuracy gate
    decides whether the move costs predictions."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    per_channel: bool = Field(False, description="one scale per output channel of each weight")
    reduce_range: bool = Field(False, description="7-bit weights, for CPUs without VNNI that saturate otherwise")
    keep_float: KeepFloat = KEEP_FLOAT
    smooth: float | None = Field(None, gt=0, le=1, description="SmoothQuant's migration strength α: each weighted "
                                 "product's input channels divided by max|x|^α / max|W|^(1−α), measured on "
                                 "validation sentences, and its weight rows multiplied by it (the same function in "
                                 "float; the activations' outliers move into the per-channel weights). None: off")
    gptq: bool = Field(False, description="round the int8 weights by GPTQ (Frantar et al. 2023) on validation "
                       "sentences' activations instead of to nearest: each weight's rounding error compensated in "
                       "its rows not yet rounded, on the same scales (the same kernels and speed). Needs "
                       "neural-compressor (edgepress[int4])")
    max_length: Tokens = Field(128, description=PARITY_LENGTH)
    parity: ParityConfig = Field(ParityConfig(max_abs_diff=1.5, min_agreement=0.9), description=LOOSE_PARITY)


def int8_dynamic(src_dir: Path, out_dir: Path, texts: tuple[str, ...],
                 cfg: Int8DynamicConfig = Int8DynamicConfig()) -> dict:
    """Quantize `src_dir`/model.onnx dynamically to int8 into `out_dir` (smoothed first when `cfg.smooth`);
    returns the quantized op counts, the smoothing and parity against the graph as it came."""
    with graph_apart(Path(src_dir) / ONNX_FILE, Path(out_dir)) as src:
        smoothing = {}
        if cfg.smooth is not None:
            smoothing = smooth_activations(src, src.with_suffix(".smooth.onnx"), texts, cfg.smooth, cfg.max_length,
                                           fold_attention=cfg.per_channel)
            src = src.with_suffix(".smooth.onnx")
        return {**_int8_dynamic(src, Path(src_dir), Path(out_dir), texts, cfg),
                **({"smooth": smoothing} if smoothing else {})}


def int8_dynamic_as_shipped(params: dict) -> Callable[[Path, Path, tuple[str, ...]], Path]:
    """How a graph `int8-dynamic` would be given with `params` (a stage's, as a run fills them in) ships, for a
    timing: `ship(src_dir, dst_dir, texts)` writes the quantized copy into `dst_dir` and returns its graph, or raises
    the ConfigError this stage would (a node its keep_float names is not in the graph). A ConfigError here, before
    any copy, for params int8-dynamic does not take. The copy's parity is not judged (the int8 stage judges its own
    graph's parity and accuracy); GPTQ's rounding gives the same kernels at the same speed, and takes a while;
    keep_float's measured choice (a number) is left out."""
    from edgepress.configs import build

    cfg = build(Int8DynamicConfig, params,
                where="quantized_with (the params of the int8-dynamic stage each candidate is timed after)")

    def ship(src_dir: Path, dst_dir: Path, texts: tuple[str, ...]) -> Path:
        if isinstance(cfg.keep_float, tuple):
            check_keep_float(cfg.keep_float, int8_dynamic_nodes(Path(src_dir) / ONNX_FILE))
        timing = cfg.model_copy(update={"keep_float": cfg.keep_float if isinstance(cfg.keep_float, tuple) else 0,
                                        "parity": UNCHECKED, "gptq": False})
        with quiet("edgepress.compress.quantize"):  # one candidate among several, timed after
            int8_dynamic(src_dir, dst_dir, texts, timing)
        return Path(dst_dir) / ONNX_FILE

    return ship


def _int8_dynamic(src: Path, src_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: Int8DynamicConfig) -> dict:
    """`src` (the graph of `src_dir`, or its smoothed copy) quantized into `out_dir`; parity against `src_dir`'s."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def quantize(out: Path, only: list[str] | None = None, exclude: list[str] | None = None) -> None:
        quantize_dynamic(src, out, weight_type=QuantType.QInt8, per_channel=cfg.per_channel,
                         reduce_range=cfg.reduce_range, nodes_to_quantize=only, nodes_to_exclude=exclude,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})

    candidates = int8_dynamic_nodes(src)
    keep, ranking = kept_float(cfg.keep_float, candidates,
                               lambda: rank_sensitivity(src_dir, candidates, quantize, texts, cfg.max_length))
    with atomic_dir(out_dir) as tmp:
        quantize(tmp / ONNX_FILE, exclude=keep)
        rounding = gptq_rounding(src, tmp / ONNX_FILE, text_feeds(read_onnx(src, external_data=False),
                                                                  src_dir, texts, cfg.max_length),
                                 cfg.reduce_range) if cfg.gptq else None
        copy_side_files(src_dir, tmp)
        counts = Counter(node.op_type for node in read_onnx(tmp / ONNX_FILE).graph.node)
        ops = {op: counts[op] for op in INT8_OPS if counts[op]}
        parity = check_graph_change(src_dir, tmp, texts, cfg.max_length, cfg.parity, "the int8 graph",
                                    SessionConfig(), default="parity" not in cfg.model_fields_set)
        kernels = low_bit_kernels(tmp / ONNX_FILE)
    log.info("int8-dynamic: %s; %d node(s) kept float%s%s; ONNX Runtime runs %s; parity: %s", readable(ops),
             len(keep), f"; smoothed (α {cfg.smooth:g})" if cfg.smooth is not None else "",
             f"; GPTQ moved {rounding['moved']:.0%} of {rounding['weights']} weights' integers" if rounding else "",
             readable(kernels), parity_text(parity))
    return {"quantized_ops": ops, "ort_kernels": kernels, "kept_float": keep, "sensitivity": ranking,
            "parity": parity, **({"gptq": rounding} if rounding else {})}



class Int8StaticConfig(BaseModel):
    """The `int8-static` method: calibrated QDQ int8 for the encoder's weighted MatMuls (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    per_channel: bool = Field(True, description="one scale per output channel of each weight")
    reduce_range: bool = Field(False, description="7-bit weights, for CPUs without VNNI that saturate otherwise")
    calibration: Literal["minmax", "percentile", "entropy"] = Field("minmax", description="how activation "
                                                                           "ranges are chosen from the "
                                                                           "calibration sentences")
    calibration_size: int = Field(128, ge=8, le=10**6, description="real sentences the activation ranges come from")
    keep_float: KeepFloat = KEEP_FLOAT
    max_length: Tokens = Field(128, description=PARITY_LENGTH)
    parity: ParityConfig = Field(ParityConfig(max_abs_diff=1.5, min_agreement=0.9), description=LOOSE_PARITY)


class _Sentences:
    """An onnxruntime.quantization CalibrationDataReader over real sentences, one at a time (natural lengths)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def require_unfused(src: Path, method: str):
    """The graph at `src` (without its external data), refused when ONNX Runtime's fusions have run on it."""

    model = read_onnx(src, external_data=False)
    fused = sorted({n.op_type for n in model.graph.node if n.domain == "com.microsoft"})
    if fused:
        raise ConfigError(f"{method} needs the unfused graph of an export stage; {src} has fused ops "
                          f"({', '.join(fused)}). Fix: put {method} right after export (ONNX Runtime fuses the "
                          f"quantized graph itself when the session starts)")
    return model


def float_matmuls(graph) -> list[str]:
    """MatMul nodes to keep in float: activation x activation products, and a MatMul classifier (Gemm nodes are
    never quantized: `op_types_to_quantize` names MatMul only)."""
    weights = {t.name for t in graph.initializer}
    matmuls = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    keep = [n.name for n in matmuls if not any(i in weights for i in n.input)]
    producers = {o: n for n in graph.node for o in n.output}
    # a sentence embedder's graph has no classifier: its output is pooled from the last layer's residual stream
    frontier, seen = [o.name for o in graph.output if o.name == "logits"], set()
    while frontier:  # walk back from the logits to the first weighted MatMul/Gemm: the classifier
        node = producers.get(frontier.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node in matmuls:
            keep.append(node.name)
            continue
        frontier.extend(node.input)
    return keep


def packed_rows(tokenizer, texts: tuple[str, ...], names: tuple[str, ...], length: int) -> list[dict]:
    """Rows of `length` real tokens, the texts end to end without padding, one row a feed: ONNX Runtime's histogram
    calibrators (percentile, entropy) stack every feed's activations into one array, so they must share a shape
    (one sentence a feed at its natural length crashes them)."""
    total = sum(len(tokenizer.encode(t).ids) for t in texts)
    rows = fixed_shape_feeds(tokenizer, texts, max(1, total // length), length, names, length,
                             "the calibration sentences")
    return [{name: column[i : i + 1] for name, column in rows.items()} for i in range(len(rows["input_ids"]))]


def int8_static(src_dir: Path, out_dir: Path, texts: tuple[str, ...],
                cfg: Int8StaticConfig = Int8StaticConfig()) -> dict:
    """Calibrated QDQ int8 of `src_dir`/model.onnx into `out_dir`; calibrated on the first `calibration_size`
    `texts` (validation sentences in a pipeline, never the test split)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    src = Path(src_dir) / ONNX_FILE
    graph = require_unfused(src, "int8-static").graph
    initializers = {t.name for t in graph.initializer}
    names = tuple(i.name for i in graph.input if i.name not in initializers)
    tokenizer = load_tokenizer(src_dir, cfg.max_length)
    calibration = texts[: cfg.calibration_size]
    feeds = [encode(tokenizer, [t], names) for t in calibration] if cfg.calibration == "minmax" else \
        packed_rows(tokenizer, calibration, names, cfg.max_length)
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[cfg.calibration]
    excluded = float_matmuls(graph)
    candidates = [n for n in _weighted(graph, ("MatMul",)) if n not in excluded]
    with tempfile.TemporaryDirectory(prefix="edgepress-calibration-") as scratch, \
            graph_apart(src, Path(out_dir)) as src:
        cache = Path(scratch) / "ranges.json"  # calibrated once, by the first call; read back by the others

        def quantize(out: Path, only: list[str] | None = None, exclude: tuple[str, ...] = ()) -> None:
            quantize_static(src, out, _Sentences(list(feeds)), quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=["MatMul"], per_channel=cfg.per_channel,
                            reduce_range=cfg.reduce_range, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, nodes_to_quantize=only,
                            nodes_to_exclude=[*excluded, *exclude], calibrate_method=method,
                            calibration_cache_path=cache,
                            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})

        keep, ranking = kept_float(cfg.keep_float, candidates,
                                   lambda: rank_sensitivity(Path(src_dir), candidates, quantize, texts,
                                                            cfg.max_length))
        with atomic_dir(Path(out_dir)) as tmp:
            quantize(tmp / ONNX_FILE, exclude=tuple(keep))
            copy_side_files(Path(src_dir), tmp)
            counts = Counter(node.op_type for node in read_onnx(tmp / ONNX_FILE).graph.node)
            parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity,
                                        "the static int8 graph", SessionConfig(),
                                        default="parity" not in cfg.model_fields_set)
            kernels = low_bit_kernels(tmp / ONNX_FILE)
    ops = {"QuantizeLinear": counts["QuantizeLinear"], "DequantizeLinear": counts["DequantizeLinear"]}
    log.info("int8-static: %s; %d MatMul/Gemm kept float, %d more by keep_float; ONNX Runtime runs %s; parity: %s",
             readable(ops), len(excluded), len(keep), readable(kernels), parity_text(parity))
    return {"quantized_ops": ops, "ort_kernels": kernels, "float_matmuls": excluded, "kept_float": keep,
            "sensitivity": ranking, "parity": parity, "calibration": calibration_record(cfg.calibration_size, feeds)}


def calibration_record(asked: int, used: list) -> dict:
    """How many sentences calibrated, against how many were asked for (a split smaller than
    `calibration_size` gives all it has; the report says so)."""
    if len(used) < asked:
        log.warning("calibration_size %d: the validation split has %d sentences; all %d calibrate", asked,
                    len(used), len(used))
    return {"asked": asked, "used": len(used)}
