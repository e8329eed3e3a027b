import json

import numpy as np
import onnx
import pytest

from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic, int8_dynamic_as_shipped
from edgepress.errors import ConfigError, ExportParityError
from edgepress.export import onnx as onnx_export
from edgepress.export.onnx import ExportConfig, export_onnx
from edgepress.export.optimize import Fp16Config, OptimizeConfig, fp16_onnx, optimize_onnx
from edgepress.export.parity import ParityConfig, check_parity
from edgepress.models.heads import remove_heads
from edgepress.registry import METHODS
from edgepress.runtime.latency import LatencyConfig
from edgepress.runtime.session import open_session
from edgepress.tasks import CLASSIFICATION
from tests.conftest import save, tiny_bert, tiny_distilbert, tiny_encoder, tiny_roberta


def tiny_pruned_heads(tokenizer):
    model = tiny_bert(tokenizer, seed=3, num_attention_heads=4)
    remove_heads(model, {0: [0, 2], 1: [3]})  # layer 0 keeps 2 heads, layer 1 keeps 3
    return model


ALL = OptimizeConfig(fusions="all")  # every fusion, no timing: the fused ops are known


def _family(name):
    return lambda tokenizer: tiny_encoder(name, tokenizer)


BUILDERS = {"bert": tiny_bert, "distilbert": tiny_distilbert, "roberta": tiny_roberta,
            "bert-pruned-heads": tiny_pruned_heads,
            **{f: _family(f) for f in ("xlm-roberta", "electra", "deberta-v2", "modernbert", "mpnet")}}


# families whose attention ONNX Runtime's optimizer does not fuse -> the SkipLayerNormalization it fuses (two a
# layer; MPNet's embeddings add word and position vectors before their LayerNorm: one more)
UNFUSED = {"deberta-v2": 4, "modernbert": 4, "mpnet": 5}


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_export_matches_torch_and_fuses(arch, tmp_path, tokenizer, movie_data):
    src = save(BUILDERS[arch](tokenizer), tokenizer, tmp_path / "model")
    parity = export_onnx(src, tmp_path / "onnx", movie_data.validation.texts)["parity"]
    assert parity["max_abs_diff"] <= 1e-4 and parity["agreement"] == 1.0
    # 64 sentences alone, the same 64 in padded batches, two long passages alone and padded beside a short text
    assert parity["n_examples"] == 64 + 64 + 2 + 3
    session = open_session(tmp_path / "onnx" / "model.onnx")
    names = [i.name for i in session.get_inputs()]
    assert names[:2] == ["input_ids", "attention_mask"]
    # what forward takes and uses (DeBERTa-v3 has no token types: type_vocab_size 0)
    assert ("token_type_ids" in names) == (arch not in ("distilbert", "modernbert", "deberta-v2", "mpnet"))
    assert all(isinstance(d, str) for d in session.get_inputs()[0].shape)  # dynamic batch and sequence axes
    fused = optimize_onnx(tmp_path / "onnx", tmp_path / "fused", movie_data.validation.texts, ALL)
    assert fused["parity"]["max_abs_diff"] <= 1e-3
    if arch in UNFUSED:  # ORT's fusions know none of these attentions: the stage says so
        assert "Attention" not in fused["fused_ops"]
        assert fused["fused_ops"]["SkipLayerNormalization"] == UNFUSED[arch]
        assert fused["unfused_attention"] == (f"ONNX Runtime's optimizer fuses no attention in {arch} graphs: "
                                              f"attention runs as separate MatMul and Softmax ops")
    else:
        assert "unfused_attention" not in fused
    if arch.startswith("bert"):
        assert fused["fused_ops"]["Attention"] == 2
        assert fused["fused_ops"]["SkipLayerNormalization"] == 4
        assert fused["fused_ops"]["EmbedLayerNormalization"] == 1


def test_per_layer_ffn_widths_export_and_fuse(tmp_path, tokenizer, movie_data):
    """What structured FFN pruning produces: each layer's intermediate width cut to its own size."""
    from transformers.pytorch_utils import prune_linear_layer

    from edgepress.export.onnx import export_model_object

    model = tiny_bert(tokenizer, seed=4)
    for layer, keep in zip(model.bert.encoder.layer, (48, 16), strict=True):
        index = layer.intermediate.dense.weight.norm(dim=1).argsort(descending=True)[:keep].sort().values
        layer.intermediate.dense = prune_linear_layer(layer.intermediate.dense, index, dim=0)
        layer.output.dense = prune_linear_layer(layer.output.dense, index, dim=1)
    parity = export_model_object(model, tokenizer, tmp_path / "onnx", movie_data.validation.texts, ExportConfig(),
                                 "ffn-pruned", task=CLASSIFICATION)["parity"]
    assert parity["max_abs_diff"] <= 1e-4
    shapes = {tuple(t.dims) for t in onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph.initializer}
    assert {(32, 48), (32, 16)} <= shapes  # the two widths survive export
    fused = optimize_onnx(tmp_path / "onnx", tmp_path / "fused", movie_data.validation.texts, ALL)
    assert fused["fused_ops"]["Attention"] == 2 and fused["parity"]["agreement"] == 1.0


def test_dynamic_axes(tiny_onnx_dir):
    graph = onnx.load(str(tiny_onnx_dir / "model.onnx")).graph
    for tensor in [*graph.input, *graph.output]:
        dims = tensor.type.tensor_type.shape.dim
        assert dims[0].dim_param, f"{tensor.name}: batch axis is fixed"
        if tensor.name != "logits":
            assert dims[1].dim_param, f"{tensor.name}: sequence axis is fixed"


def test_switched_off_fusion_is_not_applied_and_is_recorded(tiny_onnx_dir, tmp_path, movie_data):
    fused = optimize_onnx(tiny_onnx_dir, tmp_path / "f", movie_data.validation.texts,
                          OptimizeConfig(fusions="all", disable=("skip_layer_norm", "bias_skip_layer_norm")))
    assert "SkipLayerNormalization" not in fused["fused_ops"]
    assert fused["fused_ops"]["LayerNormalization"] == 4
    assert fused["disabled"] == ["skip_layer_norm", "bias_skip_layer_norm"]
    assert json.loads((tmp_path / "f" / "config.json").read_text())["id2label"]["1"] == "positive"


def test_a_left_out_fusion_stays_out_when_onnx_runtime_opens_the_graph(tiny_onnx_dir, tmp_path, movie_data):
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.device.sessions import SESSION_FILE
    from edgepress.runtime.session import session_op_counts

    texts = movie_data.validation.texts
    optimize_onnx(tiny_onnx_dir, tmp_path / "f", texts, OptimizeConfig(fusions="all", disable=("skip_layer_norm",)))
    int8_dynamic(tmp_path / "f", tmp_path / "q", texts, Int8DynamicConfig())
    side = json.loads((tmp_path / "q" / SESSION_FILE).read_text())  # travels with the graph to the next stage
    assert side == {"disabled_optimizers": ["SkipLayerNormFusion"], "left_out_fusions": ["skip_layer_norm"]}
    ran = session_op_counts(tmp_path / "q" / "model.onnx")
    assert "SkipLayerNormalization" not in ran and ran["LayerNormalization"] == 4
    (tmp_path / "q" / SESSION_FILE).unlink()  # without it, ORT fuses the int8 graph's Add + LayerNorm again
    assert session_op_counts(tmp_path / "q" / "model.onnx")["SkipLayerNormalization"] == 4
    optimize_onnx(tmp_path / "f", tmp_path / "again", texts, OptimizeConfig(fusions="all"))
    assert not (tmp_path / "again" / SESSION_FILE).exists()  # a later optimize decides for itself


def test_fp16_keeps_io_types_and_matches(tiny_onnx_dir, tmp_path, movie_data):
    result = fp16_onnx(tiny_onnx_dir, tmp_path / "h", movie_data.validation.texts, Fp16Config(providers=("cpu",)))
    graph = onnx.load(str(tmp_path / "h" / "model.onnx")).graph
    assert {i.type.tensor_type.elem_type for i in graph.input} == {onnx.TensorProto.INT64}
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer)
    assert result["parity"]["agreement"] >= 0.99


def test_parity_miss_raises_a_line_per_check_and_leaves_nothing(monkeypatch, tiny_model_dir, tmp_path, movie_data):
    def skewed(model):
        def run(feeds):
            logits = real(model)(feeds)
            return logits + np.array([0.5, -0.5], dtype=np.float32)  # flips close calls, shifts every logit
        return run

    real = onnx_export.torch_runner
    monkeypatch.setattr(onnx_export, "torch_runner", skewed)
    with pytest.raises(ExportParityError) as e:
        export_onnx(tiny_model_dir, tmp_path / "out", movie_data.validation.texts)
    message = str(e.value)
    assert "does not match its reference on 133 real texts" in message
    assert "✗ max |Δlogit| 0.5 > 0.0001" in message
    assert "✗ argmax agreement" in message
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_graph_wrong_only_past_128_tokens_fails_parity(monkeypatch, tmp_path, tokenizer, movie_data):
    """ModernBERT's trap in several runtimes: right on short inputs, wrong once a text passes its 128-token local
    window. The parity check's long passages (the model's 160 positions here; feeds 72–74, after the 64 sentences
    alone and their 8 padded batches) catch such a graph."""
    def wrong_when_long(model):
        def run(feeds):
            logits = real(model)(feeds)
            return logits + (feeds["input_ids"].shape[1] > 128)
        return run

    real = onnx_export.torch_runner
    monkeypatch.setattr(onnx_export, "torch_runner", wrong_when_long)
    src = save(tiny_encoder("modernbert", tokenizer), tokenizer, tmp_path / "model")
    with pytest.raises(ExportParityError, match=r"max \|Δlogit\| 1 > 0.0001 \(worst: batch 7[234], 160 tokens\)"):
        export_onnx(src, tmp_path / "out", movie_data.validation.texts)


def test_check_parity_passes_identical_runners_and_reports_numbers():
    feeds = [{"input_ids": np.ones((2, 5), dtype=np.int64)}]
    logits = np.array([[0.1, 0.2], [0.3, -0.1]], dtype=np.float32)
    result = check_parity(lambda f: logits, lambda f: logits + 1e-6, feeds, ParityConfig(), "same")
    assert result["agreement"] == 1.0 and result["max_abs_diff"] == pytest.approx(1e-6, rel=0.1)


def test_export_config_is_strict():
    from edgepress.configs import build
    from edgepress.errors import ConfigError

    with pytest.raises(ConfigError, match=r"opset: Input should be greater than or equal to 14: got 11"):
        build(ExportConfig, opset=11)


def test_registry_entries_resolve():
    from typing import get_args

    from edgepress.registry import KIND_WORDS, Kind

    assert {"export", "optimize", "fp16"} <= set(METHODS)
    assert set(KIND_WORDS) == set(get_args(Kind))
    for name, method in METHODS.items():
        assert callable(method.run), name
        method.config()  # every method runs with its defaults
        assert method.takes and set(method.takes) <= set(KIND_WORDS) and method.gives in KIND_WORDS, name


def test_exported_dir_carries_the_config_and_tokenizer_of_its_source(tiny_onnx_dir, tiny_model_dir, movie_data):
    """What transformers (and optimum) read beside model.onnx: the exported dir's own config and tokenizer, which
    must describe the source model and tokenize exactly as its tokenizer does."""
    from transformers import AutoConfig, AutoTokenizer

    exported, source = AutoConfig.from_pretrained(tiny_onnx_dir), AutoConfig.from_pretrained(tiny_model_dir)
    assert exported.id2label == {0: "negative", 1: "positive"} == source.id2label
    assert (exported.model_type, exported.hidden_size, exported.num_hidden_layers) == \
        (source.model_type, source.hidden_size, source.num_hidden_layers)
    texts = list(movie_data.test.texts[:20])
    assert AutoTokenizer.from_pretrained(tiny_onnx_dir)(texts)["input_ids"] == \
        AutoTokenizer.from_pretrained(tiny_model_dir)(texts)["input_ids"]


def test_each_reshape_gets_its_own_layers_head_count(tmp_path, tokenizer, movie_data):
    """transformers 5 reshapes Q/K/V to (batch, seq, -1, head_size); export writes each layer's head count in (ORT's
    attention fusion reads it there). The dynamo exporter shares one shape between all layers: pinning must not."""
    from edgepress.device.feeds import encode, load_tokenizer
    from edgepress.export.onnx import model_inputs, pin_head_counts, torch_runner, write_onnx
    from edgepress.export.parity import ort_runner

    model = tiny_pruned_heads(tokenizer)  # 2 heads in layer 0, 3 in layer 1
    path = tmp_path / "model.onnx"
    write_onnx(model, tokenizer, path, opset=18, task=CLASSIFICATION, dynamo=True)
    assert pin_head_counts(path) == 6  # Q, K, V of 2 layers
    counts = sorted(int(onnx.numpy_helper.to_array(t)[0]) for t in onnx.load(str(path)).graph.initializer
                    if t.name.endswith("/heads"))
    assert counts == [2, 2, 2, 3, 3, 3]
    save(model, tokenizer, tmp_path / "dir")
    feeds = encode(load_tokenizer(tmp_path / "dir", 128), list(movie_data.test.texts[:8]),
                   model_inputs(model, tokenizer))
    np.testing.assert_allclose(ort_runner(open_session(path))(feeds), torch_runner(model)(feeds), atol=1e-5)


FAST = LatencyConfig(warmup=1, runs=5)


def test_auto_fusions_keep_the_fastest_candidate_and_record_every_timing(tiny_onnx_dir, tmp_path, movie_data):
    fused = optimize_onnx(tiny_onnx_dir, tmp_path / "f", movie_data.validation.texts, OptimizeConfig(latency=FAST))
    timing = fused["timing"]
    candidates = timing["candidates"]
    assert list(candidates) == ["all", "no attention", "no skip_layer_norm", "no bias_gelu", "no embed_layer_norm",
                                "none"]
    assert all(len(c["p50_ms"]) == 3 and c["median_p50_ms"] == sorted(c["p50_ms"])[1] for c in candidates.values())
    chosen = timing["chosen"]
    assert candidates[chosen]["median_p50_ms"] == min(c["median_p50_ms"] for c in candidates.values())
    assert fused["disabled"] == candidates[chosen]["left_out"]  # the graph written is the one that won
    assert ("Attention" in fused["fused_ops"]) == (chosen not in ("no attention", "none"))
    assert timing["timed_int8"] is False and timing["shape"] == [1, 128]


def test_auto_fusions_time_the_int8_graph_at_natural_lengths_when_asked(tiny_onnx_dir, tmp_path, movie_data):
    # a quantization whose own parity check would fail: the copies are for timing; the int8 stage judges its graph
    strict = ParityConfig(max_abs_diff=1e-9, min_agreement=1.0)
    cfg = OptimizeConfig(latency=FAST, disable=("attention",), threads=1, natural=True,
                         quantized_with=Int8DynamicConfig(per_channel=True, parity=strict, gptq=True).model_dump())
    timing = optimize_onnx(tiny_onnx_dir, tmp_path / "f", movie_data.validation.texts, cfg,
                           int8_dynamic_as_shipped)["timing"]
    assert timing["timed_int8"] is True and timing["threads"] == 1
    assert timing["shape"] == "natural"  # each text at its own length, as a min_natural_speedup gate times them
    assert "no attention" not in timing["candidates"]  # never used: not a candidate
    assert all("attention" in c["left_out"] for c in timing["candidates"].values())


def test_auto_fusions_time_keep_floats_nodes_float_and_leave_out_a_set_that_fuses_them_away(tiny_onnx_dir, tmp_path,
                                                                                          movie_data, monkeypatch):
    # the demo's int8 stage keeps the fused embedding node float: a set without that fusion has no such node
    from edgepress.compress import quantize

    timed_with = []

    def recorded(src, out, texts, cfg):
        timed_with.append(cfg.keep_float)
        return int8_dynamic(src, out, texts, cfg)

    monkeypatch.setattr(quantize, "int8_dynamic", recorded)
    cfg = OptimizeConfig(latency=FAST, threads=1,
                         quantized_with={"keep_float": ("EmbedLayerNormalization_0",)})
    fused = optimize_onnx(tiny_onnx_dir, tmp_path / "f", movie_data.validation.texts, cfg, int8_dynamic_as_shipped)
    candidates = fused["timing"]["candidates"]
    unusable = {name for name, c in candidates.items() if "unusable" in c}
    # (ORT's optimizer fuses the embedding's layer norm only where it feeds a fused Attention)
    assert unusable == {name for name, c in candidates.items() if "EmbedLayerNormalization" not in c["fused_ops"]}
    assert {"no embed_layer_norm", "none"} <= unusable and "all" not in unusable
    assert all("EmbedLayerNormalization_0" in candidates[name]["unusable"] for name in unusable)
    assert timed_with == [("EmbedLayerNormalization_0",)] * (len(candidates) - len(unusable))  # timed as it ships
    assert fused["timing"]["chosen"] not in unusable and "median_p50_ms" in candidates[fused["timing"]["chosen"]]
    assert fused["fused_ops"]["EmbedLayerNormalization"] == 1
    int8_dynamic(tmp_path / "f", tmp_path / "q", movie_data.validation.texts,
                 Int8DynamicConfig(**cfg.quantized_with))  # it quantizes

    with pytest.raises(ConfigError, match="fits none of the 6 fusion sets.* Gather_9"):
        optimize_onnx(tiny_onnx_dir, tmp_path / "g", movie_data.validation.texts,
                      cfg.model_copy(update={"quantized_with": {"keep_float": ("Gather_9",)}}), int8_dynamic_as_shipped)
    assert not (tmp_path / "g").exists()
