"""The support matrix: every method and every bundle target on a tiny classifier of each family edgepress knows,
over the kind of vocabulary that family ships, trained on real sentences (conftest's `family_model`). Each cell is a
test marked `matrix`; conftest records its outcome and the notes it leaves (`record_property("matrix", ...)`), and
`docs/gen_matrix.py` writes the README's matrix from those outcomes. The last test here fails when the README says
anything but what this session's cells found."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from edgepress.deploy.targets import detect_target
from edgepress.errors import ConfigError
from edgepress.registry import METHODS
from edgepress.tasks import CLASSIFICATION
from tests.conftest import FAMILIES, has_cuda, matrix_outcomes
from tests.test_bundle import transformers_js, web_missing

ROOT = Path(__file__).resolve().parents[1]
# Each step's params: the smallest run that still does what the method does (one epoch on 320 sentences). qat and
# int8-static make the weights this machine's integer kernels take, as a pipeline's detected target sets them: on x86
# without VNNI, full-range weights saturate ONNX Runtime's u8 x s8 products (electra's static int8 graph: argmax
# agreement 0.895 with its float graph on an AVX2 EPYC, under the 0.9 its parity check asks)
PARAMS = {"distill": {"student_layers": 1, "epochs": 1}, "heads": {"keep": 0.5, "epochs": 1},
          "ffn": {"keep": 0.5, "epochs": 1}, "width": {"keep": 0.5, "epochs": 1},
          "lowrank": {"keep": 0.5, "epochs": 1, "only_where_faster": False},
          "magnitude": {"sparsity": 0.5, "epochs": 1},
          "lottery": {"sparsity": 0.5, "rounds": 2, "epochs": 1},
          "qat": {"epochs": 1, "learning_rate": 1e-4, "reduce_range": detect_target() == "x86-avx2"},
          "int8-static": {"reduce_range": detect_target() == "x86-avx2"},
          "fp16": {"providers": ["cpu"]}, "int8-7bit": {"reduce_range": True, "per_channel": True},
          "optimize": {"latency": {"warmup": 1, "runs": 5}}}  # auto still times its fusion sets: briefly
TARGETS = ("x86-vnni", "x86-avx2", "arm64", "cuda", "mobile", "web")
AGREEMENT = 0.9  # a compressed model's labels against its source's, on 300 validation sentences
QUANTIZED_OPS = {"int8-dynamic": {"MatMulInteger"}, "int8-static": {"QuantizeLinear", "DequantizeLinear"},
                 "int4": {"MatMulNBits"}}


class Artifacts:
    """What a family's cells make, each once a module: {(family, step): (dir, details)}. A step is a method name
    (torch methods from the family's trained model, ONNX methods from its export), "qat-export" (the export of
    qat's model) or "int8-7bit" (int8-dynamic with x86-avx2's 7-bit weights)."""

    def __init__(self, family_model, data, root: Path):
        self.model, self.data, self.root, self.made, self.labels = family_model, data, root, {}, {}

    def source_labels(self, family: str, texts) -> np.ndarray:
        """The family's trained model's labels on `texts` (the module's 300 sentences), predicted once."""
        if family not in self.labels:
            self.labels[family] = _labels(self.model(family), texts)
        return self.labels[family]

    def _source(self, family: str, step: str) -> Path:
        if step == "qat-export":
            return self.get(family, "qat")[0]
        if step == "int8-7bit" or METHODS[step].takes[0].startswith("onnx"):
            return self.get(family, "export")[0]
        return self.model(family)

    def get(self, family: str, step: str) -> tuple[Path, dict]:
        if (family, step) not in self.made:
            method = METHODS[{"qat-export": "export", "int8-7bit": "int8-dynamic"}.get(step, step)]
            src, out = self._source(family, step), self.root / family / step
            inputs = self.data if method.inputs == "splits" else self.data.validation.texts
            run = method.function("torch-qat" if step == "qat-export" else method.takes[0])  # qat's own export
            self.made[family, step] = (out, run(src, out, inputs, method.config.model_validate(PARAMS.get(step, {}))))
        return self.made[family, step]


@pytest.fixture(scope="module")
def made(family_model, small_data, tmp_path_factory) -> Artifacts:
    return Artifacts(family_model, small_data, tmp_path_factory.mktemp("matrix"))


@pytest.fixture(scope="module")
def texts(movie_data) -> tuple[str, ...]:
    return movie_data.validation.take(300).texts


def _logits(model_dir: Path, texts) -> np.ndarray:
    from edgepress.models.evaluate import predict_logits
    from edgepress.models.loading import load_classifier

    model, tokenizer = load_classifier(model_dir)
    return predict_logits(model, tokenizer, texts, 64)


def _labels(model_dir: Path, texts) -> np.ndarray:
    return _logits(model_dir, texts).argmax(1)


def _agreement(made: Artifacts, family: str, model_dir: Path, texts) -> float:
    """The share of `texts` the torch model at `model_dir` labels as the family's trained model does."""
    return float((made.source_labels(family, texts) == _labels(model_dir, texts)).mean())


def _layers(model_dir: Path):
    from edgepress.models.arch import arch_of, layer_list
    from edgepress.models.loading import load_classifier

    model, _ = load_classifier(model_dir)
    return arch_of(model), layer_list(model)


def _validate(model_dir: Path, method: str, params: dict) -> None:
    """What `edgepress validate` runs for a stage: the method's own check on the model the config names."""
    from edgepress.models.loading import load_classifier

    model, tokenizer = load_classifier(model_dir)
    METHODS[method].check(model, tokenizer, METHODS[method].config.model_validate(params), CLASSIFICATION)


# --- the method cells: each runs the method on the family's model (or its export) and checks what it promises

def _distill(made, family, method, texts, note):
    out, _ = made.get(family, "distill")
    assert len(_layers(out)[1]) == 1
    assert _agreement(made, family, out, texts) >= 0.6  # one epoch from 320 sentences into one layer: roughly
    if family == "modernbert":
        for params, reason in (({"layer_map": [1]}, "first layer differs"), ({"style": "tinybert"}, "Q and K")):
            with pytest.raises(ConfigError, match=reason):
                _validate(made.model(family), "distill", {"student_layers": 1, **params})
        note("ModernBERT: a student keeps layer 0 (built without an attention norm) and TinyBERT's Q/K loss is "
             "refused (one fused Wqkv), both at validate; hinton and distilbert styles work")


def _structured(made, family, method, texts, note):
    from edgepress.models.arch import heads_of, neurons_of

    count = heads_of if method == "heads" else neurons_of
    before, after = _layers(made.model(family)), _layers(made.get(family, method)[0])
    assert [count(after[0], layer) for layer in after[1]] == [count(before[0], layer) // 2 for layer in before[1]]
    assert _agreement(made, family, made.get(family, method)[0], texts) >= 0.8  # half of each, one epoch back


def _width(made, family, method, texts, note):
    """Half the hidden state's dimensions kept wherever it is carried (the narrowed model loads from its record);
    exported, fused and int8'd, each graph holds to its parity check against the narrowed model."""
    from edgepress.models.arch import part
    from edgepress.models.loading import load_classifier
    from edgepress.models.width import hidden_parts

    out, details = made.get(family, "width")
    assert details["pruned"] == {"pruned_hidden_size": 16}
    model, parts = load_classifier(out)[0], hidden_parts(load_classifier(made.model(family))[0])  # found at full width
    assert {getattr(part(model, name), {"in": "in_features", "out": "out_features", "table": "embedding_dim"}.get(
        how, "normalized_shape")) for name, how in parts} <= {16, (16,)}
    assert _agreement(made, family, out, texts) >= 0.8  # half the width, one epoch back
    _graphs_hold(made, family, out, "width")


def _lowrank(made, family, method, texts, note):
    """Every layer's FFN Linears stored as two factors of half their rank (the factored model loads from its
    record); exported, fused and int8'd, each graph holds to its parity check against the factored model."""
    from edgepress.models.loading import load_classifier
    from edgepress.models.lowrank import factorable

    out, details = made.get(family, "lowrank")
    shapes = factorable(load_classifier(made.model(family))[0], ("ffn_in", "ffn_out"))
    assert details["factored"] == {name: min(shape) // 2 for name, shape in shapes.items()} and len(shapes) == 4
    assert factorable(load_classifier(out)[0], ("ffn_in", "ffn_out")) == {}  # factored, as loaded back
    assert _agreement(made, family, out, texts) >= 0.8  # half the rank, one epoch back
    _graphs_hold(made, family, out, "lowrank")


def _graphs_hold(made, family, model_dir: Path, name: str) -> None:
    """`model_dir` exported, fused and int8'd: each graph holds to its parity check against the one before."""
    graph = model_dir
    for step in ("export", "optimize", "int8-dynamic"):
        method = METHODS[step]
        done = method.run(graph, made.root / family / f"{name}-{step}", made.data.validation.texts,
                          method.config.model_validate(PARAMS.get(step, {})))
        graph = made.root / family / f"{name}-{step}"
        assert done["parity"]["agreement"] >= (1.0 if step == "export" else AGREEMENT)


def _vocab(made, family, method, texts, note):
    """Rows of tokens the train split never uses are gone; a text made of kept pieces (every train text) gives
    the unpruned logits (tests/test_vocab.py proves it piece by piece, and that no text becomes unknown)."""
    out, details = made.get(family, "vocab")
    assert details["rows_after"] < details["rows_before"]
    train = made.data.train.texts
    np.testing.assert_allclose(_logits(out, train), _logits(made.model(family), train), atol=1e-5)


def _sparse(made, family, method, texts, note):
    from edgepress.models.loading import load_classifier

    out, details = made.get(family, method)
    assert details["sparsity"]["pruned_weights_sparsity"] == pytest.approx(0.5, abs=0.01)
    weights = dict(load_classifier(out)[0].named_parameters())
    assert len(details["pruned"]) >= 4 * len(_layers(out)[1])  # QKV, attention output, FFN in and out per layer
    zeros = sum(int((weights[name] == 0).sum()) for name in details["pruned"])  # the saved model holds the zeros
    assert zeros >= 0.5 * sum(weights[name].numel() for name in details["pruned"])
    assert _agreement(made, family, out, texts) >= AGREEMENT


def _qat(made, family, method, texts, note):
    """The Linears qat fake-quantized are the ones the exported graph quantizes; a Linear outside the layers that
    it left float (ELECTRA's embedding projection, ModernBERT's head dense) stays float in the graph too."""
    _, details = made.get(family, "qat-export")
    assert details["parity"]["agreement"] >= 0.99 and details["float_parity"]["max_abs_diff"] <= 1e-4
    assert details["carried_ranges"] == 2 * 4  # per layer: Q/K/V's shared input (or the fused QKV's), O, FFN in, out


def _onnx(made, family, method, texts, note):
    import onnx

    out, details = made.get(family, method)
    parity = details["parity"]
    assert parity["n_examples"] >= 133  # real sentences, alone and padded, and passages past 128 tokens
    if method in ("export", "optimize"):
        assert parity["max_abs_diff"] <= 1e-4 and parity["agreement"] == 1.0
    if method == "export":  # traced with eager attention whatever the model loads with (sdpa, by default)
        assert details["attention"]["exported_with"] == "eager"
    else:
        assert parity["agreement"] >= AGREEMENT
    assert QUANTIZED_OPS.get(method, set()) <= set(details.get("quantized_ops", {}))
    if method == "fp16":
        graph = onnx.load(str(out / "model.onnx")).graph
        assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer)
    if method == "optimize":
        assert bool(details.get("unfused_attention")) == (family in ("deberta-v2", "modernbert", "mpnet"))
        if details.get("unfused_attention"):
            note("DeBERTa, ModernBERT, MPNet: ONNX Runtime's optimizer has no attention fusion for them (layer norm "
                 "and activation fusions only); the stage says so in its details")


def _cascade(made, family, method, texts, note):
    """The family's int8 graph as the student of a cascade whose fallback is its float export: the threshold meets
    0.99 agreement with the family's model on validation, and each text is answered by the model it is routed to."""
    from edgepress.compress.cascade import CascadeConfig, cascade
    from edgepress.device.cascade import FALLBACK, STUDENT, Cascade
    from edgepress.device.predictor import Predictor

    out = made.root / family / "cascade"
    cfg = CascadeConfig(fallback=made.get(family, "export")[0], min_agreement=0.99, baseline_model=made.model(family),
                        threads=1, max_length=64)
    details = cascade(made.get(family, "int8-dynamic")[0], out, made.data, cfg, CLASSIFICATION)
    assert details["cascade"]["validation"]["agreement"] >= 0.99
    routed, own = Cascade(out), {STUDENT: Predictor(out), FALLBACK: Predictor(out / FALLBACK)}
    for text in texts[:20]:
        answer = routed.answer(text)
        np.testing.assert_allclose(answer.output, own[answer.model].logits([text])[0], atol=1e-5)


CHECKS = {"distill": _distill, "cascade": _cascade, "heads": _structured, "ffn": _structured, "width": _width,
          "lowrank": _lowrank, "vocab": _vocab,
          "magnitude": _sparse, "lottery": _sparse, "qat": _qat,
          **{m: _onnx for m in ("export", "optimize", "fp16", "int8-dynamic", "int8-static", "int4")}}


@pytest.mark.matrix
@pytest.mark.parametrize("column", list(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_method(family, column, made, texts, record_property):
    CHECKS[column](made, family, column, texts, lambda text: record_property("matrix", text))


# --- the target cells: the family's graph bundled for each target, and run where this machine can run it

def _bundled(made, family, step, target, tmp_path) -> Path:
    from edgepress.deploy.bundle import bundle_model

    return bundle_model(made.get(family, step)[0], tmp_path / target, target)


def _runs_like_torch(made, family, bundle: Path, texts, providers=("cpu",)) -> None:
    from edgepress.device.predictor import Predictor

    predictor = Predictor(bundle, providers)
    labels = [predictor.id2label[int(i)] for i in made.source_labels(family, texts)]
    assert np.mean([p.label == t for p, t in zip(predictor.predict_each(texts), labels, strict=True)]) >= AGREEMENT


def _x86(made, family, target, texts, tmp_path, note):
    from edgepress.deploy.targets import int8_weight_ranges

    bundle = _bundled(made, family, "int8-7bit" if target == "x86-avx2" else "int8-dynamic", target, tmp_path)
    peaks = set(int8_weight_ranges(bundle / "model.onnx").values())
    assert peaks and (max(peaks) <= 64 if target == "x86-avx2" else max(peaks) > 64)
    _runs_like_torch(made, family, bundle, texts)


def _arm64(made, family, target, texts, tmp_path, note):
    _runs_like_torch(made, family, _bundled(made, family, "int8-dynamic", "arm64", tmp_path), texts)
    note("arm64: the bundle is built and run here (x86); on an arm64 userland under qemu by `make test-arm64`, "
         "which is not in `make test`")


def _cuda(made, family, target, texts, tmp_path, note):
    with pytest.raises(ConfigError, match="quantized for a CPU"):
        _bundled(made, family, "int8-dynamic", "cuda", tmp_path)
    bundle = _bundled(made, family, "fp16", "cuda", tmp_path)
    _runs_like_torch(made, family, bundle, texts, ("cuda",) if has_cuda() else ("cpu",))
    note("cuda: the fp16 graph (an int8 one is refused: no CUDA integer kernels); run on the CUDA execution "
         "provider where a GPU is, else on the CPU (CI has no GPU)")


def _mobile(made, family, target, texts, tmp_path, note):
    import json

    bundle = _bundled(made, family, "int8-dynamic", "mobile", tmp_path)
    mobile = json.loads((bundle / "edgepress.json").read_text())["mobile"]
    assert mobile["ort_vs_onnx_max_abs_diff"] <= 1e-4 and (bundle / "model.ort").is_file()


def _web(made, family, target, texts, tmp_path, note):
    """transformers.js reads the family's tokenizer and runs its int8 graph to the scores predict.py gives."""
    from edgepress.device.predictor import Predictor

    bundle = _bundled(made, family, "int8-dynamic", "web", tmp_path)
    sample = list(texts[:40])
    result = transformers_js(bundle, sample, tmp_path)["predictions"]
    python = Predictor(bundle).predict_each(sample)
    # the label transformers.js chose has the score predict.py gives it (a tie may be broken either way)
    np.testing.assert_allclose([r["score"] for r in result],
                               [p.scores[r["label"]] for r, p in zip(result, python, strict=True)], atol=1e-4)


TARGET_CHECKS = {"x86-vnni": _x86, "x86-avx2": _x86, "arm64": _arm64, "cuda": _cuda, "mobile": _mobile, "web": _web}


@pytest.mark.matrix
@pytest.mark.parametrize("column", TARGETS)
@pytest.mark.parametrize("family", FAMILIES)
def test_target(family, column, made, texts, tmp_path, record_property):
    if column == "web" and web_missing():
        pytest.skip(web_missing())
    TARGET_CHECKS[column](made, family, column, texts, tmp_path, lambda text: record_property("matrix", text))


# --- the README says what the cells found

def _generator():
    spec = importlib.util.spec_from_file_location("gen_matrix", ROOT / "docs" / "gen_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_matrix_is_what_the_cells_found(request):
    outcomes = matrix_outcomes(request.config)
    generator = _generator()
    missing = generator.missing(outcomes)
    if missing:
        pytest.skip(f"the matrix is incomplete in this session ({missing[0]}, ...): the README is checked when "
                    f"every cell runs and passes")
    assert generator.block((ROOT / "README.md").read_text()) == generator.render(outcomes), \
        "README.md's support matrix is not what the cells found: .venv/bin/python docs/gen_matrix.py"
