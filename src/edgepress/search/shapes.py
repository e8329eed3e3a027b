"""Latency first: each architecture shape a search may train (depth, heads, FFN neurons, hidden width and FFN rank
kept), built from the
teacher's weights or a pretrained student's (timing does not depend on their values), exported, fused and quantized
as it would ship, and timed side by side on this machine before anything is trained. A shape slower and larger than
another is never worth training."""

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgepress.compress.distill import DistillConfig, keep_layers, student_dir, student_layers
from edgepress.compress.lowrank import LowRankConfig, ranks_of
from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic, int8_dynamic_as_shipped
from edgepress.compress.structured import prune_ffn, prune_heads
from edgepress.export.onnx import ExportConfig, export_model_object
from edgepress.export.optimize import OptimizeConfig, optimize_onnx
from edgepress.export.parity import ONNX_FILE, UNCHECKED
from edgepress.logs import quiet
from edgepress.models.arch import arch_of, depth
from edgepress.models.loading import with_new_head
from edgepress.models.lowrank import factorable, factorize
from edgepress.models.sentence import encoder_of
from edgepress.models.width import hidden_size, narrow
from edgepress.pipeline.latency import compare_latency
from edgepress.runtime.latency import LatencyConfig

# the shares a shape keeps, by the method that cuts each, in the order a pipeline runs them; the last two are in a
# search point only where they are below 1
CUTS = {"heads_keep": "heads", "ffn_keep": "ffn", "width_keep": "width", "rank_keep": "lowrank"}


@dataclass(frozen=True)
class Shape:
    """A student's architecture: `layers` of the teacher's, or the pretrained encoder `student` names (a model dir,
    at its own depth: `layers` None), and the share of heads and FFN neurons each layer keeps."""

    layers: int | None
    heads_keep: float = 1.0
    ffn_keep: float = 1.0
    student: str | None = None
    width_keep: float = 1.0  # the share of the hidden state's dimensions kept (`width`)
    rank_keep: float = 1.0  # the share of the rank of the FFN's Linears kept (`lowrank`; 1: whole)

    @property
    def name(self) -> str:
        body = f"heads {self.heads_keep:g}, ffn {self.ffn_keep:g}" + \
            (f", width {self.width_keep:g}" if self.width_keep < 1 else "") + \
            (f", rank {self.rank_keep:g}" if self.rank_keep < 1 else "")
        return f"{self.student}, {body}" if self.student else f"{self.layers} layers, {body}"

    def point(self) -> dict:
        """The fields of a search point that this shape sets: layers, heads_keep, ffn_keep; student (a pretrained
        student's dir), width_keep and rank_keep where they are not the default."""
        return {"layers": self.layers, **({"student": self.student} if self.student else {}),
                **{key: getattr(self, key) for key in CUTS
                   if key in ("heads_keep", "ffn_keep") or getattr(self, key) < 1}}


def build_shape(teacher, shape: Shape):
    """A copy of `teacher` (for a `student` shape: of the student) in `shape` (of a sentence encoder, its encoder in
    that shape): its layers where a distill would map others (timing only)."""
    model = copy.deepcopy(teacher)
    encoder = encoder_of(model)
    arch = arch_of(encoder)
    if shape.layers is not None and shape.layers < depth(encoder):
        keep_layers(encoder, student_layers(encoder, DistillConfig(student_layers=shape.layers)))
    heads, width = getattr(encoder.config, arch.heads_key), getattr(encoder.config, arch.ffn_key)
    kept_heads, kept_neurons = max(1, round(heads * shape.heads_keep)), max(1, round(width * shape.ffn_keep))
    if kept_heads < heads:
        prune_heads(encoder, [list(range(kept_heads))] * depth(encoder))
    if kept_neurons < width:
        prune_ffn(encoder, [list(range(kept_neurons))] * depth(encoder))
    if shape.width_keep < 1:
        narrow(model, list(range(max(1, round(hidden_size(model.config) * shape.width_keep)))))
    if shape.rank_keep < 1:  # every Linear lowrank would factor, whatever its own timing: the shape is timed whole
        factorize(encoder, ranks_of(factorable(encoder, LowRankConfig().parts), shape.rank_keep))
    return model


def shape_source(teacher, tokenizer, student: str | None, task) -> tuple:
    """(model, tokenizer) that a shape of `student` (a Shape's) is cut from: the teacher, or the pretrained student
    it names with the fresh head distill gives it."""
    if student is None:
        return teacher, tokenizer
    return with_new_head(student_dir(Path(student)), task.auto_class, teacher.config.id2label, seed=0)


def shape_graphs(teacher_dir: Path, shapes: list[Shape], texts: tuple[str, ...], scratch: Path, threads: int | None,
                 latency: LatencyConfig, int8: Int8DynamicConfig | None = Int8DynamicConfig(),
                 task=None) -> tuple[dict[str, Path], list[str]]:
    """({shape name: its graph dir under `scratch`}, the fusions left out): each shape built from the teacher (or
    its pretrained student), exported, fused and (with `int8`) quantized as a run would ship it. The fusion set is
    the one a run's `optimize` would pick here (`fusions: auto`, its candidates timed after `int8` at `latency` on
    `threads`), picked on the first shape and used for every shape: on an AVX-512 Xeon, ONNX Runtime's
    SkipLayerNormalization made the demo's int8 graph 1.4x slower, and fusing everything would time every shape so.
    `task`: the teacher's (None: the model dir's own, `task_of`)."""
    from edgepress.tasks import task_of

    task = task or task_of(teacher_dir)
    teacher, tokenizer = task.load_model(teacher_dir)
    sources = {student: shape_source(teacher, tokenizer, student, task) for student in {s.student for s in shapes}}
    graphs, fuse = {}, OptimizeConfig(threads=threads, latency=latency,
                                      quantized_with=None if int8 is None else int8.model_dump())
    for k, shape in enumerate(shapes):
        step = Path(scratch) / str(k)
        source, words = sources[shape.student]
        with quiet("edgepress"):  # a line per shape and step would drown the table
            export_model_object(build_shape(source, shape), words, step / "onnx", texts, ExportConfig(),
                                f"shape {shape.name}", task=task)
            left_out = optimize_onnx(step / "onnx", step / "fused", texts, fuse, int8_dynamic_as_shipped)["disabled"]
            fuse = OptimizeConfig(fusions="all", disable=tuple(left_out))
            if int8 is not None:  # timing only: the graph a run ships is checked by its own stages
                int8_dynamic(step / "fused", step / "int8", texts, int8.model_copy(update={"parity": UNCHECKED}))
        graphs[shape.name] = step / ("int8" if int8 is not None else "fused")
    return graphs, list(fuse.disable)


def time_shapes(teacher_dir: Path, shapes: list[Shape], texts: tuple[str, ...], threads: int | None,
                latency: LatencyConfig, int8: Int8DynamicConfig | None = Int8DynamicConfig(),
                max_length: int | None = None, task=None) -> dict[str, dict]:
    """Per shape (by name): the fixed-shape and natural p50 over interleaved rounds (`compare_latency`), the
    shipped graph's size in MB and the fusions left out, of `shape_graphs`."""
    with tempfile.TemporaryDirectory(prefix="edgepress-shapes-") as scratch:
        graphs, left_out = shape_graphs(teacher_dir, shapes, texts, Path(scratch), threads, latency, int8, task)
        timings = compare_latency(graphs, texts, threads, cfg=latency, max_length=max_length)
        return {name: {**timings[name], "size_mb": (graph / ONNX_FILE).stat().st_size / 1e6,
                       "fusions_left_out": left_out} for name, graph in graphs.items()}


def keeps_as_much(a: Shape, b: Shape) -> bool:
    """Whether `a` keeps at least as much of the teacher as `b` (depth, heads and FFN neurons), or of the same
    pretrained student: it can learn what `b` can. Shapes of two students are never compared."""
    return a.student == b.student and (a.layers or 0) >= (b.layers or 0) and a.heads_keep >= b.heads_keep \
        and a.ffn_keep >= b.ffn_keep and a.width_keep >= b.width_keep and a.rank_keep >= b.rank_keep


def dominated(table: dict[str, dict], shapes: list[Shape]) -> dict[str, str]:
    """{shape: the shape that beats it}: for each shape, another that keeps at least as much of the teacher and is
    at least as fast and as small, better in one (e.g. half the heads timed no faster than all of them: the pruned
    shape would only lose accuracy). A smaller shape never beats a larger one: it may learn less."""
    beaten = {}
    for shape in shapes:
        row = table[shape.name]
        for other in shapes:
            better = table[other.name]
            no_worse = better["fixed_p50_ms"] <= row["fixed_p50_ms"] and better["size_mb"] <= row["size_mb"]
            if other != shape and keeps_as_much(other, shape) and no_worse and \
                    (better["fixed_p50_ms"], better["size_mb"]) != (row["fixed_p50_ms"], row["size_mb"]):
                beaten[shape.name] = other.name
                break
    return beaten
