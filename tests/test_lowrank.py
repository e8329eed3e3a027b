"""`lowrank`: chosen Linears factored from their truncated SVD (models/lowrank.py, compress/lowrank.py). The support
matrix runs the method on every family and exports, fuses and quantizes the result (tests/test_matrix.py); these
check what it promises on its own: nothing changes at the full rank, a factored model loads back from its record,
the Linears are factored only where the timing says so, and what it refuses."""

import json

import numpy as np
import pytest

from edgepress.errors import ConfigError, ModelError


def _logits(model, words, texts):
    from edgepress.models.evaluate import predict_logits

    return predict_logits(model, words, texts, 48)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_full_rank_changes_nothing_and_a_lower_one_factors_every_part(family, family_model, movie_data):
    """At rank min(in, out) the factors multiply back to the weights (ModernBERT's GeGLU input: rows of two halves;
    the word table: to its width); at a quarter of it, every FFN and attention-output Linear of every layer is two
    Linears of that rank."""
    from edgepress.compress.lowrank import ranks_of
    from edgepress.models.arch import part
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import PARTS, WORDS, factorable, factorize

    texts = movie_data.validation.texts[:40]
    model, words = load_classifier(family_model(family))
    before = _logits(model, words, texts)
    everything = factorable(model, (*PARTS, WORDS))
    assert len(everything) == 3 * 2 + 1  # three parts in each of two layers, and the word table
    factorize(model, ranks_of(everything, 1.0))
    np.testing.assert_allclose(_logits(model, words, texts), before, atol=1e-5)
    assert factorable(model, (*PARTS, WORDS)) == {}  # nothing whole is left to factor
    shapes = {name: shape for name, shape in everything.items() if "embeddings" not in name}

    model, words = load_classifier(family_model(family))
    ranks = ranks_of(shapes, 0.25)
    factorize(model, ranks)
    for name, (in_features, out_features) in shapes.items():
        factored = part(model.base_model, name)
        assert (factored.down.in_features, factored.down.out_features) == (in_features, min(shapes[name]) // 4)
        assert (factored.up.in_features, factored.up.out_features) == (ranks[name], out_features)
    assert model.config.lowrank_ranks == ranks
    assert _logits(model, words, texts).shape == before.shape


def test_a_factored_model_loads_back_from_its_record(family_model, movie_data, tmp_path):
    """MPNet with heads pruned, its FFN and word table factored: both records rebuilt by the loader, the same
    logits; a fresh head on it (a pretrained student's) keeps the factored encoder."""
    from edgepress.compress.lowrank import ranks_of
    from edgepress.compress.structured import prune_heads
    from edgepress.models.loading import load_classifier, with_new_head
    from edgepress.models.lowrank import factorable, factorize

    texts = movie_data.validation.texts[:40]
    model, words = load_classifier(family_model("mpnet"))
    prune_heads(model, [[1], [0, 1]])
    factorize(model, ranks_of(factorable(model, ("ffn_in", "ffn_out", "words")), 0.5))
    model.save_pretrained(tmp_path, safe_serialization=True)
    words.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["lowrank_ranks"] == {
        "embeddings.word_embeddings": 16,
        **{f"encoder.layer.{i}.{p}": 16 for i in range(2) for p in ("intermediate.dense", "output.dense")}}
    again, _ = load_classifier(tmp_path)
    np.testing.assert_allclose(_logits(again, words, texts), _logits(model, words, texts), atol=1e-6)
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    fresh, _ = with_new_head(tmp_path, "AutoModelForSequenceClassification", {0: "a", 1: "b", 2: "c"}, seed=0)
    assert fresh.mpnet.encoder.layer[0].intermediate.dense.rank == 16


def test_a_student_cut_from_a_head_pruned_factored_model_carries_its_records_renumbered(family_model, movie_data,
                                                                                        tmp_path):
    """distill after heads or lowrank: the layers a student keeps bring what the config records of them (heads
    removed, Linears factored) under their new numbers, and the student loads back as it was saved; a record of a
    layer left out is dropped."""
    from edgepress.compress.distill import keep_layers
    from edgepress.compress.lowrank import ranks_of
    from edgepress.compress.structured import prune_heads
    from edgepress.models.heads import pruned_heads
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import factorable, factorize

    texts = movie_data.validation.texts[:40]
    model, words = load_classifier(family_model("bert"))
    prune_heads(model, [[0, 1], [1]])  # the heads each layer keeps
    removed = pruned_heads(model.config)
    factorize(model, ranks_of(factorable(model, ("ffn_in", "words")), 0.5))
    keep_layers(model, (1,))
    assert pruned_heads(model.config) == {0: removed[1]}
    assert model.config.lowrank_ranks == {"embeddings.word_embeddings": 16, "encoder.layer.0.intermediate.dense": 16}
    model.save_pretrained(tmp_path, safe_serialization=True)
    words.save_pretrained(tmp_path)
    again, _ = load_classifier(tmp_path)
    np.testing.assert_allclose(_logits(again, words, texts), _logits(model, words, texts), atol=1e-6)


@pytest.mark.parametrize("record", [[16], {"encoder.layer.0.intermediate.dense": 0},
                                    {"encoder.layer.0.intermediate.dense": True}, {"embeddings": 4},
                                    {"encoder.layer.0.intermediate.dense": 100000}])
def test_a_record_that_does_not_fit_is_refused(record, family_model, tmp_path):
    import shutil

    from edgepress.models.loading import load_classifier

    shutil.copytree(family_model("bert"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "lowrank_ranks": record}))
    with pytest.raises(ModelError, match="lowrank_ranks (must map|names embeddings, which is not a Linear or|gives "
                                         "encoder.layer.0.intermediate.dense rank 100000, above its full rank 32)"):
        load_classifier(tmp_path / "m")


@pytest.mark.parametrize("record", ["lowrank_ranks", "pruned_hidden_size", "pruned_heads"])
def test_weights_whose_record_was_lost_or_changed_are_refused_naming_the_record(record, family_model, tmp_path):
    """A dir edgepress cut, its config.json's record deleted (or, for the factors, another rank written): the
    weights do not fit what the config builds, and the error names the records instead of a shape dump."""
    from edgepress.compress.lowrank import ranks_of
    from edgepress.compress.structured import prune_heads
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import factorable, factorize
    from edgepress.models.width import narrow

    model, words = load_classifier(family_model("bert"))
    {"lowrank_ranks": lambda: factorize(model, ranks_of(factorable(model), 0.5)),
     "pruned_hidden_size": lambda: narrow(model, list(range(16))),
     "pruned_heads": lambda: prune_heads(model, [[0], [1]])}[record]()
    model.save_pretrained(tmp_path / "m")
    words.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    for changed in ({k: v for k, v in config.items() if k != record},
                    *([{**config, record: {name: 8 for name in config[record]}}] if record == "lowrank_ranks" else [])):
        (tmp_path / "m" / "config.json").write_text(json.dumps(changed))
        with pytest.raises(ModelError, match=r"weights (that do not fit its config.json|of other shapes than its "
                                             r"config.json builds).*Fix: restore the config.json saved with these "
                                             r"weights .*pruned_heads, pruned_hidden_size, lowrank_ranks"):
            load_classifier(tmp_path / "m")


def test_each_shape_is_factored_only_where_the_timing_found_it_faster(family_model, small_data, tmp_path):
    """The method times every Linear shape whole and factored and factors exactly the shapes whose factors were
    faster; where none was, the model comes out as it went in, with no recovery run."""
    from edgepress.compress.lowrank import LowRankConfig, lowrank, shape_name
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import factorable
    from edgepress.runtime.latency import LatencyConfig

    cfg = LowRankConfig(keep=0.25, epochs=1, threads=1, latency=LatencyConfig(warmup=2, runs=20))
    details = lowrank(family_model("bert"), tmp_path / "l", small_data, cfg)
    shapes = factorable(load_classifier(family_model("bert"))[0], cfg.parts)  # the FFN's, by default
    named = {name: shape_name(*shapes[name], min(shapes[name]) // 4) for name in shapes}
    assert set(details["timing"]) == set(named.values()) and len(named) == 4
    faster = {name for name, timed in details["timing"].items() if timed["faster"]}
    assert set(details["factored"]) == {name for name, shape in named.items() if shape in faster}
    assert len(details["timing"][next(iter(details["timing"]))]["whole_p50_ms"]) == 3  # three interleaved rounds
    if not details["factored"]:
        assert "history" not in details
        assert (tmp_path / "l" / "model.safetensors").read_bytes() == \
            (family_model("bert") / "model.safetensors").read_bytes()


def test_every_part_named_is_factored_without_the_timing_and_nothing_cuts_after_it(family_model, small_data,
                                                                                    tmp_path):
    from edgepress.compress.lowrank import LowRankConfig, lowrank
    from edgepress.compress.structured import FfnConfig, ffn
    from edgepress.models.loading import load_classifier

    cfg = LowRankConfig(keep=0.5, epochs=1, only_where_faster=False, parts=("ffn_in", "ffn_out", "attn_out"))
    details = lowrank(family_model("bert"), tmp_path / "l", small_data, cfg)
    assert details["timing"] == {} and len(details["factored"]) == 6 and "history" in details
    model, _ = load_classifier(tmp_path / "l")
    assert model.bert.encoder.layer[1].attention.output.dense.rank == 16
    with pytest.raises(ConfigError, match=r"has ffn_in, ffn_out factored by lowrank \(config.json's lowrank_ranks\), "
                                          r"which ffn cuts whole. Fix: put lowrank after ffn, or leave ffn_in, "
                                          r"ffn_out out of its parts"):
        ffn(tmp_path / "l", tmp_path / "f", small_data, FfnConfig(epochs=1))
    assert not (tmp_path / "f").exists()


def test_heads_and_ffn_cut_a_model_whose_word_table_alone_is_factored(family_model, small_data, tmp_path):
    """heads and ffn leave the word table whole: a table lowrank factored before them stays factored through both;
    width, which narrows the table, refuses it."""
    from edgepress.compress.lowrank import LowRankConfig, lowrank
    from edgepress.compress.structured import FfnConfig, HeadsConfig, WidthConfig, ffn, heads, width
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import factored_in

    lowrank(family_model("bert"), tmp_path / "l", small_data, LowRankConfig(keep=0.25, epochs=1, parts=("words",),
                                                                             only_where_faster=False))
    heads(tmp_path / "l", tmp_path / "h", small_data, HeadsConfig(keep=0.5, epochs=1))
    ffn(tmp_path / "h", tmp_path / "f", small_data, FfnConfig(keep=0.5, epochs=1))
    model, _ = load_classifier(tmp_path / "f")
    assert factored_in(model) == {"words"} and model.config.pruned_heads
    layer = model.bert.encoder.layer[0]
    assert layer.intermediate.dense.out_features < load_classifier(tmp_path / "h")[0].config.intermediate_size
    with pytest.raises(ConfigError, match=r"has words factored by lowrank .*which width cuts whole"):
        width(tmp_path / "f", tmp_path / "w", small_data, WidthConfig(keep=0.5, epochs=1))


def test_a_run_times_its_shapes_as_the_int8_stage_after_it_will_ship_them(tmp_path, tiny_model_dir, movie_data):
    """In a pipeline, lowrank times on the run's threads and latency shape, int8-dynamic quantized since an int8
    stage follows; what it made exports and quantizes. A model whose FFN is factored already has nothing left to
    factor: validate says so, exit 2."""
    from tests.test_stagecache import _config, _csv, _stages
    from tests.test_trust import invoke

    data = _csv(tmp_path / "d.csv", movie_data)
    stages = [{"name": "rank", "method": "lowrank", "params": {"keep": 0.25, "epochs": 1}},
              {"name": "export", "method": "export"}, {"name": "int8", "method": "int8-dynamic"}]
    result = invoke("run", _config(tmp_path / "p.yaml", tiny_model_dir, data, stages), "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    rank, _, int8 = _stages(tmp_path / "run")
    params = json.loads((tmp_path / "run" / "stages" / "01-rank" / "config.json").read_text())["params"]
    assert params["int8"] is True and params["threads"] == 1 and params["latency"]["runs"] == 5
    assert len(rank["details"]["timing"]) == 2 and int8["status"] == "passed"  # the FFN's two shapes

    from edgepress.compress.lowrank import ranks_of
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import factorable, factorize

    model, words = load_classifier(tiny_model_dir)
    factorize(model, ranks_of(factorable(model, ("ffn_in", "ffn_out")), 0.5))
    model.save_pretrained(tmp_path / "factored")
    words.save_pretrained(tmp_path / "factored")
    result = invoke("validate", _config(tmp_path / "q.yaml", tmp_path / "factored", data, stages[:1]))
    assert result.exit_code == 2 and "no whole Linear at ffn_in, ffn_out left to factor" in result.output, \
        result.output
    for method in ("heads", "ffn", "width"):  # the cuts of the FFN refuse it there too, not after training
        cut = [{"name": "cut", "method": method, "params": {"epochs": 1}}]
        result = invoke("validate", _config(tmp_path / f"{method}.yaml", tmp_path / "factored", data, cut))
        if method == "heads":  # it leaves the FFN as it is
            assert result.exit_code == 0, result.output
            continue
        assert result.exit_code == 2 and "has ffn_in, ffn_out factored by lowrank (config.json's lowrank_ranks), " \
            f"which {method} cuts whole" in result.output, result.output


def test_validate_refuses_a_part_that_two_lowrank_stages_would_factor(tmp_path, tiny_model_dir, movie_data):
    """A second lowrank stage on a part an earlier one factors is refused before any work, exit 2, naming both
    stages (fallbacks included); on other parts it is taken."""
    from tests.test_stagecache import _config, _csv
    from tests.test_trust import invoke

    data = _csv(tmp_path / "d.csv", movie_data)
    first = {"name": "rank", "method": "lowrank", "params": {"epochs": 1}}  # the FFN's, by default
    again = {"name": "again", "method": "int8-dynamic", "on_fail": {"fallback": [
        {"method": "lowrank", "params": {"parts": ["attn_out", "ffn_out"]}}]}}
    other = {"name": "other", "method": "lowrank", "params": {"parts": ["attn_out"], "epochs": 1}}
    result = invoke("validate", _config(tmp_path / "p.yaml", tiny_model_dir, data, [first, again]))
    assert result.exit_code == 2 and "stage 'again' (lowrank) would factor again ffn_out, which stage 'rank' " \
        "factors before it. Fix: one lowrank stage for each part" in result.output, result.output
    result = invoke("validate", _config(tmp_path / "q.yaml", tiny_model_dir, data, [first, other]))
    assert result.exit_code == 0, result.output


def test_a_factored_word_table_is_vocab_pruned_in_its_thin_factor(family_model, small_data, tmp_path):
    """lowrank's word table (for size: not timed), then vocab: the (vocab, rank) factor loses the rows the train
    split never uses, the (rank -> hidden) Linear stays; the train texts' logits do not change, and it exports with
    hard parity, fuses and quantizes with theirs (the word lookup and its Linear left unfused)."""
    from edgepress.compress.lowrank import LowRankConfig, lowrank
    from edgepress.compress.quantize import Int8DynamicConfig, int8_dynamic
    from edgepress.compress.vocab import VocabConfig, vocab_prune
    from edgepress.export.onnx import ExportConfig, export_onnx
    from edgepress.export.optimize import OptimizeConfig, optimize_onnx
    from edgepress.models.loading import load_classifier

    cfg = LowRankConfig(keep=0.5, epochs=1, parts=("words",), threads=1)
    details = lowrank(family_model("bert"), tmp_path / "l", small_data, cfg)
    assert details["factored"] == {"embeddings.word_embeddings": 16} and details["timing"] == {}
    factored, words = load_classifier(tmp_path / "l")
    table = factored.bert.embeddings.word_embeddings
    assert (table.table.weight.shape, table.up.weight.shape) == ((words.vocab_size, 16), (32, 16))
    pruned = vocab_prune(tmp_path / "l", tmp_path / "v", small_data, VocabConfig())
    again, kept = load_classifier(tmp_path / "v")
    small = again.bert.embeddings.word_embeddings
    assert small.table.num_embeddings == pruned["rows_after"] < words.vocab_size and small.rank == 16
    texts = small_data.train.texts[:40]
    np.testing.assert_allclose(_logits(again, kept, texts), _logits(factored, words, texts), atol=1e-5)
    texts = small_data.validation.texts
    assert export_onnx(tmp_path / "v", tmp_path / "onnx", texts, ExportConfig())["parity"]["agreement"] == 1.0
    fused = optimize_onnx(tmp_path / "onnx", tmp_path / "fused", texts, OptimizeConfig(fusions="all"))
    assert "EmbedLayerNormalization" not in fused["fused_ops"] and fused["parity"]["max_abs_diff"] <= 1e-3
    assert int8_dynamic(tmp_path / "fused", tmp_path / "int8", texts, Int8DynamicConfig())["parity"]["agreement"] \
        >= 0.9
