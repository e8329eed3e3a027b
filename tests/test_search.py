"""The pieces of `edgepress search` (issue 25) as they land: the latency-first table of shapes."""

from edgepress.models.loading import load_classifier
from edgepress.runtime.latency import LatencyConfig
from edgepress.search.shapes import Shape, build_shape, dominated, time_shapes


def test_a_shape_is_built_with_its_depth_heads_and_ffn_width(tiny_model_dir):
    teacher, _ = load_classifier(tiny_model_dir)
    model = build_shape(teacher, Shape(layers=1, heads_keep=0.5, ffn_keep=0.5))
    layer = model.bert.encoder.layer
    assert len(layer) == 1 and model.config.num_hidden_layers == 1
    assert layer[0].attention.self.query.out_features == teacher.config.hidden_size // 2
    assert model.config.intermediate_size == round(teacher.config.intermediate_size * 0.5)
    assert len(teacher.bert.encoder.layer) == 2  # the teacher is untouched


def test_shapes_are_timed_as_they_ship_and_the_dominated_named(tiny_model_dir, movie_data):
    shapes = [Shape(2), Shape(1), Shape(1, heads_keep=0.5, ffn_keep=0.5)]
    table = time_shapes(tiny_model_dir, shapes, movie_data.validation.texts[:64], threads=1,
                        latency=LatencyConfig(warmup=2, runs=10))
    assert list(table) == [s.name for s in shapes]
    assert all(row["fixed_p50_ms"] > 0 and row["providers_used"] == ["CPUExecutionProvider"] for row in table.values())
    sizes = [table[s.name]["size_mb"] for s in shapes]
    assert sizes[0] > sizes[1] > sizes[2]  # int8 graphs of fewer layers, then fewer heads and neurons
    synthetic = {"a": {"fixed_p50_ms": 1.0, "size_mb": 5.0}, "b": {"fixed_p50_ms": 2.0, "size_mb": 6.0},
                 "c": {"fixed_p50_ms": 0.5, "size_mb": 9.0}, "d": {"fixed_p50_ms": 1.0, "size_mb": 5.0}}
    assert dominated(synthetic) == {"b": "a"}  # c is faster, a and d tie: neither beats the other
