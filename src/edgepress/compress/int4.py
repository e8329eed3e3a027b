"""Weight-only 4-bit quantization of an ONNX graph with onnxruntime's `MatMulNBitsQuantizer`.

Every weighted MatMul becomes `MatMulNBits` (4-bit weights in blocks of `block_size` along the input dimension, one
scale per block, activations stay float unless `accuracy_level: 4` quantizes them to int8 per block for integer dot
products); with `embeddings: true` the word-embedding Gather becomes `GatherBlockQuantized` (4-bit rows, blocks along
the hidden dimension; the position and token-type tables are small and stay float). The pooler and classifier are
Gemm nodes, which the quantizer leaves float.

`rtn` rounds each block to its min/max (ONNX Runtime's C++ quantizer); `hqq` (half-quadratic quantization, Badri &
Shaji 2023) optimizes each block's scale and zero point against the weights, asymmetric by construction.

It takes the unfused graph: on a fused one, Q, K and V sit inside `Attention` and the word embeddings inside
`EmbedLayerNormalization`, where the quantizer cannot reach them. ONNX Runtime fuses what it can of the 4-bit graph
when the session starts.
"""

import logging
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgepress.compress.quantize import (
    KEEP_FLOAT,
    KeepFloat,
    calibration_record,
    check_keep_float,
    float_matmuls,
    kept_float,
    low_bit_kernels,
    rank_sensitivity,
    require_unfused,
)
from edgepress.configs import Tokens, changed
from edgepress.errors import ConfigError
from edgepress.export.parity import (
    LOOSE_PARITY,
    ONNX_FILE,
    PARITY_LENGTH,
    ParityConfig,
    check_graph_change,
    copy_side_files,
)
from edgepress.files import atomic_dir, read_onnx
from edgepress.logs import parity_text, readable
from edgepress.runtime.session import SessionConfig

log = logging.getLogger(__name__)
INT4_OPS = ("MatMulNBits", "GatherBlockQuantized")
TORCH_ALGORITHMS = ("gptq", "awq")  # computed on the torch model the graph was exported from (`torch_model`)


class Int4Config(BaseModel):
    """The `int4` method (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    algorithm: Literal["rtn", "hqq", "gptq", "awq"] = Field("rtn", description="rtn: min/max per block; "
                                                                 "hqq: half-quadratic; gptq/awq: "
                                                                 "neural-compressor on the torch model")
    block_size: int = Field(32, ge=16, le=65536, description="weights per scale, along the input dimension (a power "
                                                             "of 2, >= 16)")
    symmetric: bool | None = Field(None, description="no zero points; default: true (hqq is asymmetric)")
    accuracy_level: Literal[0, 4] = Field(0, description="4: activations int8 per block, integer dot products")
    embeddings: bool = Field(False, description="the word embeddings to 4-bit too (GatherBlockQuantized)")
    keep_float: KeepFloat = KEEP_FLOAT
    calibration_size: int = Field(128, ge=8, le=10**6, description="gptq/awq: validation sentences they calibrate on")
    torch_model: Path | None = Field(None, description="gptq/awq: the torch model dir the graph was exported from "
                                                       "(a pipeline fills in the export stage's input)")
    max_length: Tokens = Field(128, description=PARITY_LENGTH)
    parity: ParityConfig = Field(ParityConfig(max_abs_diff=1.5, min_agreement=0.9), description=LOOSE_PARITY)

    @field_validator("block_size", mode="before")  # before the bounds: its own message says what they mean
    @classmethod
    def _power_of_two(cls, value):
        if isinstance(value, int) and not isinstance(value, bool) and (value < 16 or value & (value - 1)):
            raise ValueError("block_size must be a power of 2 of at least 16 (16, 32, 64, 128)")
        return value

    @model_validator(mode="after")
    def _fits_the_algorithm(self) -> "Int4Config":
        if self.algorithm == "hqq" and self.symmetric:
            raise ValueError("hqq fits a zero point per block: it is asymmetric. Fix: remove symmetric, or use "
                             "algorithm: rtn")
        unused = changed(self, ("torch_model", "calibration_size")) if self.algorithm not in TORCH_ALGORITHMS else []
        if unused:
            raise ValueError(f"{' and '.join(unused)} serve(s) gptq and awq only; remove it or set algorithm: gptq "
                             f"or awq")
        return self

    @property
    def is_symmetric(self) -> bool:
        return self.algorithm != "hqq" if self.symmetric is None else self.symmetric


def fill_int4(params: dict, run) -> dict:
    """A torch-side algorithm (gptq, awq) reads the torch model the graph was exported from: the run's
    (`RunContext.torch_source`), unless torch_model is given."""
    if "torch_model" in params or params.get("algorithm") not in TORCH_ALGORITHMS:
        return params
    return {**params, "torch_model": str(run.torch_source)}


def _word_gather(graph) -> str | None:
    """The Gather that looks the input ids up in the word-embedding table."""
    weights = {t.name for t in graph.initializer}
    return next((n.name for n in graph.node
                 if n.op_type == "Gather" and n.input[0] in weights and n.input[1] == "input_ids"), None)


def _matmuls(model, cfg: Int4Config, exclude: list[str], linears: dict | None):
    """`model` with its weighted MatMuls but those in `exclude` in 4 bits: by neural-compressor's integers
    (`linears`, gptq/awq), HQQ, or ONNX Runtime's min/max rounding (rtn)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer

    from edgepress.compress.gptq import write_nbits

    if linears is not None:
        return write_nbits(model, linears, exclude, cfg.accuracy_level, cfg.is_symmetric)
    if cfg.algorithm == "hqq":
        quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=exclude,
                                         algo_config=HQQWeightOnlyQuantConfig(block_size=cfg.block_size, bits=4))
    else:
        quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=cfg.block_size, is_symmetric=cfg.is_symmetric,
                                         accuracy_level=cfg.accuracy_level or None, nodes_to_exclude=exclude)
    quantizer.process()
    model = quantizer.model.model
    if cfg.algorithm == "hqq" and cfg.accuracy_level:  # HQQ writes no accuracy_level
        for node in model.graph.node:
            if node.op_type == "MatMulNBits":
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", cfg.accuracy_level))
    return model


def _word_table(model, cfg: Int4Config, exclude: list[str]):
    """`model` with the word-embedding Gather as GatherBlockQuantized (ONNX Runtime's min/max rounding, whatever
    the algorithm: it quantizes MatMuls only), unless it is in `exclude` with the other Gathers."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=cfg.block_size, is_symmetric=cfg.is_symmetric,
                                     nodes_to_exclude=exclude, op_types_to_quantize=("Gather",))
    quantizer.process()
    return quantizer.model.model


def _inc_linears(cfg: Int4Config, texts: tuple[str, ...]) -> dict:
    from edgepress.compress.gptq import calibration_batches, inc_quantize, quantized_linears

    if cfg.torch_model is None or not (cfg.torch_model / "config.json").is_file():
        what = "is not set" if cfg.torch_model is None else f"({cfg.torch_model}) is not a model dir"
        raise ConfigError(f"int4 {cfg.algorithm} quantizes the torch model the graph was exported from; torch_model "
                          f"{what}. Fix: set torch_model to that model dir (a pipeline sets it to the export "
                          f"stage's input)")
    batches = calibration_batches(cfg.torch_model, texts, cfg.calibration_size, cfg.max_length)
    original, quantized = inc_quantize(cfg.torch_model, cfg.algorithm, cfg.block_size, cfg.is_symmetric, batches)
    return quantized_linears(original, quantized)


def int4(src_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: Int4Config = Int4Config()) -> dict:
    """4-bit weights for the MatMuls (and with `embeddings`, the word embeddings) of `src_dir`/model.onnx, into
    `out_dir`; returns the 4-bit op counts, the nodes kept float and parity."""
    import onnx

    src = Path(src_dir) / ONNX_FILE
    graph = require_unfused(src, "int4").graph
    weights = {t.name for t in graph.initializer}
    word = _word_gather(graph)
    if cfg.embeddings and word is None:
        raise ConfigError(f"{src} has no Gather of input_ids from an embedding table to quantize. Fix: remove "
                          f"embeddings: true")
    # float: the small position / token-type tables, and a MatMul classifier (the head, as in int8-static)
    others = [n.name for n in graph.node if n.op_type == "Gather" and n.name != word] + float_matmuls(graph)
    candidates = [n.name for n in graph.node
                  if n.op_type == "MatMul" and any(i in weights for i in n.input) and n.name not in others]
    candidates += [word] if cfg.embeddings else []
    check_keep_float(cfg.keep_float, candidates)  # before neural-compressor's calibration, not after
    linears = _inc_linears(cfg, texts) if cfg.algorithm in TORCH_ALGORITHMS else None

    def quantize(out: Path, only: list[str] | None = None, exclude: tuple[str, ...] = ()) -> None:
        skip = [*others, *([n for n in candidates if n not in only] if only else exclude)]
        model = _matmuls(read_onnx(src), cfg, skip, linears)
        onnx.save_model(_word_table(model, cfg, skip) if cfg.embeddings else model, str(out))

    keep, ranking = kept_float(cfg.keep_float, candidates,
                               lambda: rank_sensitivity(Path(src_dir), candidates, quantize, texts, cfg.max_length))
    with atomic_dir(Path(out_dir)) as tmp:
        quantize(tmp / ONNX_FILE, exclude=tuple(keep))
        copy_side_files(Path(src_dir), tmp)
        counts = Counter(node.op_type for node in read_onnx(tmp / ONNX_FILE).graph.node)
        parity = check_graph_change(Path(src_dir), tmp, texts, cfg.max_length, cfg.parity, "the 4-bit graph",
                                    SessionConfig(), default="parity" not in cfg.model_fields_set)
        kernels = low_bit_kernels(tmp / ONNX_FILE)
    ops = {op: counts[op] for op in INT4_OPS if counts[op]}
    log.info("int4 (%s): %s; %d node(s) kept float; ONNX Runtime runs %s; parity: %s", cfg.algorithm, readable(ops),
             len(keep), readable(kernels), parity_text(parity))
    calibrated = {"calibration": calibration_record(cfg.calibration_size, texts[: cfg.calibration_size])} \
        if cfg.algorithm in TORCH_ALGORITHMS else {}
    return {"quantized_ops": ops, "ort_kernels": kernels, "kept_float": keep, "sensitivity": ranking,
            "symmetric": cfg.is_symmetric, "parity": parity, **calibrated}
