"""HF model dir -> ONNX dir (model.onnx + config + tokenizer) through `torch.onnx.export`, then the hard parity
check against the torch model on real sentences.

The exporter is the TorchScript one (`dynamo=False`) over eager attention: its graph matches torch to a few 1e-6 on
padded batches and ONNX Runtime's BERT optimizer fuses all of it (Attention, EmbedLayerNormalization, ...). The
dynamo exporter and `sdpa` attention were measured against it
(benchmarks/exporters.py, retired after commit e7d753d: `git show e7d753d:benchmarks/exporters.py`; README): see
there."""

import copy
import logging
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edgepress.configs import Tokens
from edgepress.export.parity import (
    ONNX_FILE,
    PARITY_LENGTH,
    ParityConfig,
    check_onnx_file,
    check_parity,
    input_names,
    ort_runner,
    real_feeds,
)
from edgepress.files import atomic_dir, read_onnx
from edgepress.logs import parity_text
from edgepress.runtime.session import SessionConfig, open_session

log = logging.getLogger(__name__)


class ExportConfig(BaseModel):
    """The `export` method: opset, the length parity sentences are cut to, and the parity tolerances."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    opset: int = Field(18, ge=14, le=21, description="ONNX opset of the exported graph")
    max_length: Tokens = Field(128, description=PARITY_LENGTH)
    parity: ParityConfig = Field(ParityConfig(), description="how close ONNX Runtime's logits must be to torch's")


def torch_runner(model):
    """A parity/latency runner over a torch model: numpy feeds in, numpy logits (a sentence encoder: its
    embeddings) out."""
    import torch

    def run(feeds):
        with torch.inference_mode():
            out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
            return getattr(out, "logits", out).float().numpy()

    return run


def model_inputs(model, tokenizer) -> tuple[str, ...]:
    """The tokenizer's outputs that the model takes, in its forward's order (BERT: ids, mask, token types;
    RoBERTa and DistilBERT: ids, mask): the ONNX graph's inputs."""
    from edgepress.models.evaluate import accepted_inputs

    gives = set(tokenizer.model_input_names)
    return tuple(name for name in accepted_inputs(model) if name in gives)


# Two sentences of different lengths: the example batch is padded, so no exporter can drop the attention mask as a
# no-op (the dynamo exporter does, from an unpadded example: benchmarks/results/exporters.json).
EXAMPLE = ("a", "the film is a gorgeous, moving piece of work")


def write_onnx(model, tokenizer, path: Path, opset: int, *, task, dynamo: bool = False, attention: str = "eager",
               example_texts: tuple[str, ...] = EXAMPLE) -> None:
    """`model` (a model of `task`, edgepress.tasks) -> ONNX file `path`: inputs as `model_inputs`, the task's output
    (`logits`; a sentence encoder's `sentence_embedding`, with the token vectors its pooling reads named
    `token_embeddings` inside the graph) with the task's dynamic axes, the inputs' batch and sequence axes dynamic.
    Exported with eager attention (the graph ONNX Runtime fuses); `dynamo=True` (torch's newer exporter), other
    attentions and other example batches are what
    benchmarks/exporters.py (retired after commit e7d753d: `git show e7d753d:benchmarks/exporters.py`) compares it
    with."""
    import torch

    names, output = model_inputs(model, tokenizer), task.output
    example = tokenizer(list(example_texts), padding=True, return_tensors="pt")
    feeds = {name: example[name] for name in names}
    traced, extra = task.traced(model)

    before = model.config._attn_implementation
    model.set_attn_implementation(attention)
    if dynamo:
        shapes = {"dynamic_shapes": {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
                                     for name in names}}
    else:
        axes = {name: {0: "batch_size", 1: "sequence_length"} for name in (*names, *extra)} | \
            {output: dict(task.output_axes)}
        shapes = {"dynamic_axes": axes, "do_constant_folding": True}
    try:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice; tracer warnings
            torch.onnx.export(traced.eval(), (), str(path), kwargs=feeds, input_names=list(names),
                              output_names=[output, *extra], opset_version=opset, dynamo=dynamo, **shapes)
    finally:
        model.set_attn_implementation(before)
    if extra:
        keep_outputs(path, (output,))


def keep_outputs(path: Path, outputs: tuple[str, ...]) -> None:
    """The graph at `path` with only `outputs` as its outputs (the tensors of the others stay, by their names,
    where something inside the graph reads them); external weights are left where they are."""
    import onnx

    model = read_onnx(path, external_data=False)
    for i in reversed(range(len(model.graph.output))):
        if model.graph.output[i].name not in outputs:
            del model.graph.output[i]
    onnx.save(model, str(path))


def pin_head_counts(path: Path) -> int:
    """Write each layer's head count into its Q/K/V reshapes, where transformers 5 leaves `-1` (`view(batch, seq,
    -1, head_size)`): ONNX Runtime's attention fusion reads the count from there, and a head-pruned model has a
    different count in each layer. Returns how many reshapes were pinned."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = read_onnx(path)
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    initializer = {tensor.name: tensor for tensor in graph.initializer}

    def constant(name):
        if name in initializer:
            return numpy_helper.to_array(initializer[name])
        node = producer.get(name)
        return numpy_helper.to_array(node.attribute[0].t) if node is not None and node.op_type == "Constant" \
            else None

    def width(name):  # the output width of the MatMul (+ bias) that makes `name`
        node = producer.get(name)
        if node is not None and node.op_type == "Add":
            node = next((producer[i] for i in node.input if i in producer and producer[i].op_type == "MatMul"), None)
        weight = constant(node.input[1]) if node is not None and node.op_type == "MatMul" else None
        return None if weight is None else weight.shape[-1]

    nodes, pinned = [], 0
    for node in graph.node:
        concat = producer.get(node.input[1]) if node.op_type == "Reshape" else None
        if concat is not None and concat.op_type == "Concat" and len(concat.input) == 4:
            heads, size, out = constant(concat.input[2]), constant(concat.input[3]), width(node.input[0])
            if heads is not None and size is not None and out is not None and heads.ravel().tolist() == [-1]:
                # a shape of this reshape's own: one Concat may serve several layers (the dynamo exporter shares)
                name = f"{node.name or node.output[0]}/shape"
                count = np.array([out // int(size.ravel()[0])], np.int64)
                graph.initializer.append(numpy_helper.from_array(count, f"{name}/heads"))
                nodes.append(onnx.helper.make_node("Concat", [*concat.input[:2], f"{name}/heads", concat.input[3]],
                                                   [name], name=name, axis=0))
                node.input[1] = name
                pinned += 1
        nodes.append(node)
    nodes = [copy.deepcopy(node) for node in nodes]  # detached from the field they are about to leave
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(path))
    return pinned


def export_model_object(model, tokenizer, out_dir: Path, texts: tuple[str, ...], cfg: ExportConfig, what: str, *,
                        task) -> dict:
    """Export an in-memory model of `task` (any per-layer shape) to `out_dir` and check it against torch on `texts`;
    {"parity", "attention"}: the attention the graph was traced with, and the one the model loads with where they
    differ (sdpa, flex or a kernel's attention is switched to eager for the export, then back)."""
    loaded_with = model.config._attn_implementation
    with atomic_dir(Path(out_dir)) as tmp:
        write_onnx(model, tokenizer, tmp / ONNX_FILE, cfg.opset, task=task)
        pin_head_counts(tmp / ONNX_FILE)
        task.save_config(model, tmp)
        tokenizer.save_pretrained(tmp)
        check_onnx_file(tmp / ONNX_FILE)
        session = open_session(tmp / ONNX_FILE, SessionConfig(providers=("cpu",), optimization="disable"))
        feeds = real_feeds(tmp, texts, cfg.max_length, input_names(session), cfg.parity)
        parity = check_parity(torch_runner(model), ort_runner(session), feeds, cfg.parity, what, task.output)
    log.info("export: %s; parity: %s", what, parity_text(parity))
    attention = {"exported_with": "eager", **({"switched_from": loaded_with} if loaded_with != "eager" else {})}
    if loaded_with != "eager":
        log.info("export: traced with eager attention, the graph ONNX Runtime's fusions know (the model loads with "
                 "%s, and keeps it after)", loaded_with)
    return {"parity": parity, "attention": attention}


def export_onnx(model_dir: Path, out_dir: Path, texts: tuple[str, ...], cfg: ExportConfig = ExportConfig(),
                task=None) -> dict:
    """Export `model_dir` to `out_dir`/model.onnx (+ config.json, tokenizer) and check it against torch on real
    `texts`; returns {"parity": numbers, "attention"}. Nothing is left in `out_dir` when a check fails. `task`: the
    run's (edgepress.tasks); None: the model dir's own (`task_of`)."""
    from edgepress.tasks import task_of

    task = task or task_of(model_dir)
    model, tokenizer = task.load_model(model_dir)
    return export_model_object(model, tokenizer, out_dir, texts, cfg, f"ONNX export of {model_dir}", task=task)
