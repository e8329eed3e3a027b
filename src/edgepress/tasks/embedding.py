"""embedding (a sentence-transformers dir): a sentence vector per text; against the baseline's vectors, each text's
cosine to its baseline vector and the overlap of its top-10 neighbours among the test texts with the baseline's
(`neighbour_overlap`, the primary metric: the baseline's own is 1, so `accuracy.max_drop: 0.1` allows 90%)."""

from dataclasses import dataclass

import numpy as np

from edgepress.data.dataset import PairSet, TextSet
from edgepress.device.bundle import EMBEDDING, TASK_OUTPUTS
from edgepress.logs import tracked
from edgepress.tasks.classification import Classification

# The sentence-transformers pooling modes transformers.js's feature-extraction pipeline computes from token vectors,
# by its own name for each: the mean over the attention mask, and the first token (both as edgepress's graph pools)
WEB_POOLING = {"mean": "mean", "cls": "cls"}
NEIGHBOURS = 10  # the k of neighbour_overlap
# `edgepress init`'s final gate: each test text finds 80% of its 10 nearest test texts again (int8-dynamic per
# channel kept 0.84 of all-MiniLM-L6-v2's on the demo's texts; smoothed, 0.91 on a VNNI CPU and 0.89 on AVX2 with its
# 7-bit weights; with keep_float: 10, 0.94)
STARTER_DROP = 0.2


@dataclass(frozen=True)
class Embedding:
    name: str = EMBEDDING
    # a bundle's model card (Classification's)
    pipeline_tag: str = "feature-extraction"
    graph_output: str = TASK_OUTPUTS[EMBEDDING]
    example_text: str = "A sentence to embed."
    optimum_class: str | None = None
    output: str = "sentence_embedding"
    predicts: str = "vectors"
    primary: str = "neighbour_overlap"
    gated: tuple[str, ...] = ("neighbour_overlap", "spearman")  # spearman: on data.pairs
    methods: tuple[str, ...] | None = ("distill", "heads", "ffn", "lowrank", "vocab", "magnitude", "export",
                                       "optimize", "fp16", "int8-dynamic", "int8-static", "int4")
    # why a method left out of `methods` is, where it says more than "not built yet"
    refused: tuple[tuple[str, str], ...] = (
        ("cascade", "a cascade defers a text by its student's confidence in a label, and a sentence embedder gives "
                    "vectors, for which no confidence has been measured to defer well"),)
    # smoothing: all-MiniLM-L6-v2's int8 neighbours 0.84 -> 0.91 on a VNNI CPU (benchmarks/embeddings.py)
    int8_params: tuple[tuple[str, object], ...] = (("smooth", 0.85),)
    width_params: tuple[tuple[str, object], ...] = ()  # its recovery learns the teacher's vectors
    labelled: bool = False  # vectors: no label names
    starter_leaves_out: tuple[tuple[str, str], ...] = ()

    def starter_drop(self, n_test: int) -> float:
        """The drop of neighbour overlap the final gate `edgepress init` writes allows (`STARTER_DROP`)."""
        return STARTER_DROP

    def starter_gate_line(self, drop: float, n_test: int) -> str:
        """What `edgepress init` says of its final gate."""
        return (f"The final gate asks that each of the {n_test:,} test texts find {1 - drop:.0%} of its 10 nearest "
                f"test texts where your model finds them (neighbour overlap {1 - drop:g}). int8 per channel kept 0.84 "
                f"of all-MiniLM-L6-v2's on movie snippets; keep_float: 10 (its 10 most sensitive nodes float) kept "
                f"0.94.")

    load = Classification.load
    check_student_words = Classification.check_student_words  # its check_distill refuses a pretrained student first
    output_axes = Classification.output_axes
    targets: str = "vectors"

    def save_model(self, model, out) -> None:
        """A sentence-transformers dir in `out`: the encoder and the files that say how it pools."""
        from edgepress.models.sentence import save_sentence_encoder

        save_sentence_encoder(model, out)

    def traced(self, model):
        """(what the export traces, the outputs beside `output`): the encoder giving its token vectors too, so
        that the exporter names the tensor its pooling reads (`TOKEN_OUTPUT`), a name that stays on the tensor once
        that output is dropped again."""
        from edgepress.models.sentence import TOKEN_OUTPUT, with_token_output

        return with_token_output(model), (TOKEN_OUTPUT,)

    def save_config(self, model, out) -> None:
        """The encoder's config.json beside the sentence-transformers files that say how it pools."""
        from edgepress.models.sentence import save_layout

        model.config.save_pretrained(out)
        save_layout(model.layout, model.config.hidden_size, out)

    def check_distill(self, cfg) -> None:
        """A sentence encoder's student learns the teacher's vectors alone: the hidden-state styles are refused."""
        from edgepress.errors import ConfigError

        if cfg.style != "hinton":
            raise ConfigError(f"a sentence-embedding student learns the teacher's sentence vectors (cosine + MSE); "
                              f"style {cfg.style} adds hidden-state losses not built for it yet. Fix: style hinton "
                              f"(the default)")
        if cfg.student is not None:
            raise ConfigError("distill's student (a pretrained encoder of its own) is built for classifiers; a "
                              "sentence encoder's student of another width would need its vectors projected to the "
                              "teacher's, not built yet. Fix: leave student out (a student cut from the teacher's "
                              "layers: student_layers)")

    def check_recovery(self, cfg) -> None:
        """A sentence encoder's recovery learns the teacher's vectors: the hidden-state loss is refused."""
        from edgepress.errors import ConfigError

        if cfg.hidden_weight:
            raise ConfigError("hidden_weight: a sentence encoder's recovery learns the teacher's sentence vectors "
                              "(cosine + MSE); a hidden-state loss is not built for it. Fix: remove hidden_weight")

    def check_teacher(self, model, teacher) -> None:
        """A recovery's `teacher` dir is a sentence encoder's: its vectors are the recovery's targets."""
        from edgepress.errors import ConfigError
        from edgepress.models.sentence import is_sentence_dir

        if not is_sentence_dir(teacher):
            raise ConfigError(f"teacher {teacher} is not a sentence-transformers dir (no modules.json): a "
                              f"sentence encoder's recovery learns a sentence encoder's vectors. Fix: a "
                              f"sentence-transformers teacher, or teacher: baseline")

    def web_pipeline(self, model_dir) -> dict:
        """feature-extraction, with the options that pool as the model in `model_dir` does; a ConfigError for a
        pooling transformers.js lacks."""
        from edgepress.errors import ConfigError
        from edgepress.models.sentence import read_layout

        layout = read_layout(model_dir)
        pooling = layout.pooling
        if len(pooling) != 1 or pooling[0] not in WEB_POOLING:
            raise ConfigError(f"target web: {model_dir} pools its token vectors with {' + '.join(pooling)}, and "
                              f"transformers.js's feature-extraction pipeline pools with {' or '.join(WEB_POOLING)} "
                              f"only. Fix: another target (x86-vnni, x86-avx2, arm64, mobile, cuda: their predict.py "
                              f"pools inside the graph), or a model that pools with {' or '.join(WEB_POOLING)}")
        return {"pipeline": "feature-extraction",
                "options": {"pooling": WEB_POOLING[pooling[0]], "normalize": layout.normalize}}

    def load_model(self, model_dir):
        """(sentence encoder, tokenizer) of a sentence-transformers dir (models/sentence.py)."""
        from edgepress.models.sentence import load_sentence_encoder

        return load_sentence_encoder(model_dir)

    def torch_predictions(self, model, tokenizer, texts: tuple[str, ...], max_length: int) -> np.ndarray:
        from edgepress.models.evaluate import predict_outputs

        return predict_outputs(model, tokenizer, texts, max_length)

    def onnx_predictions(self, predictor, texts: tuple[str, ...], what: str) -> np.ndarray:
        return np.stack([predictor.embed([text])[0] for text in tracked(texts, len(texts), what)]) if texts else \
            np.zeros((0, 0), np.float32)

    def scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """Sentence vectors have no score of their own: their primary metric is measured against the baseline's."""
        return {"task": self.name, "primary_metric": self.primary, "n_test": len(part),
                "dimension": int(preds.shape[1]) if preds.ndim == 2 else 0}

    def baseline(self, part: TextSet, preds: np.ndarray) -> dict:
        """The baseline against itself: cosine and neighbour overlap 1 (what a stage's drop is measured from)."""
        return self.versus(part, preds, preds)

    def set_scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """A set's own figures: the scored pairs' Spearman correlation with its CI (`sts_metrics`); none for a
        fidelity set (its vectors are scored against the baseline's, in `versus`)."""
        from edgepress.data.metrics import sts_metrics

        return sts_metrics(part.scores, *part.halves(preds)) if isinstance(part, PairSet) else {}

    def versus(self, part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """Against the baseline's vectors of the same texts: cosine and neighbour overlap with their CIs; the drop
        of the overlap from the baseline's own (1) with its CI; `agreement` (what fidelity gates judge) is the
        neighbour overlap."""
        from edgepress.data.metrics import embedding_metrics

        if len(part) < 2:
            return {}
        figures = embedding_metrics(base, preds, k=min(NEIGHBOURS, len(part) - 1))
        lo, hi = figures["neighbour_overlap_ci95"]
        return {**{k: v for k, v in figures.items() if k != "n_test"},
                "neighbour_overlap_drop_ci95": [1 - hi, 1 - lo],
                "agreement": figures["neighbour_overlap"], "agreement_ci95": [lo, hi],
                **self._pairs_drop(part, base, preds)}

    @staticmethod
    def _pairs_drop(part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """On scored pairs: the paired 95% CI of the Spearman drop from the baseline's."""
        from edgepress.data.metrics import spearman_drop_ci95

        if not isinstance(part, PairSet):
            return {}
        return {"spearman_drop_ci95": spearman_drop_ci95(part.scores, part.halves(base), part.halves(preds))}
