"""token-classification (a ...ForTokenClassification dir: NER, PII): a tag per word; entity-level micro F1 against
the true tags (seqeval's strict spans, the primary metric), and against the baseline's tags (agreement)."""

from dataclasses import dataclass

import numpy as np

from edgepress.data.dataset import TextSet
from edgepress.device.bundle import TASK_OUTPUTS, TOKEN_CLASSIFICATION
from edgepress.logs import tracked
from edgepress.tasks.classification import Classification, resolvable_drop

# `edgepress init`'s final gate: 3 points of entity F1 (the MiniLM-L6 CoNLL-2003 teacher's int8 graph lost 0.0002; its
# 3-layer student with half its heads and FFN, int8, lost 0.020 at 20x the teacher's speed: examples/ner.yaml)
STARTER_DROP = 0.03

ONLY_TAGGED_WORDS = ("augment makes perturbed copies of texts, whose words would no longer carry their tags: it is "
                     "not built for token classifiers. Fix: remove augment (a token classifier distils on the train "
                     "split's tagged sentences and data.unlabeled's texts, which the teacher tags)")
WORDS_NOT_LABELLED = -1  # a word of a prediction array that is padding: (texts, most words), one tag id a word


@dataclass(frozen=True)
class TokenClassification:
    """A tag per word: predictions (texts, most words) of tag ids, -1 past each text's words; `tags` the model's tag
    names by id, in one scheme (BIO, BIOES or IO: `scheme_of`)."""

    tags: tuple[str, ...] = ()
    name: str = TOKEN_CLASSIFICATION
    # a bundle's model card (Classification's)
    pipeline_tag: str = "token-classification"
    graph_output: str = TASK_OUTPUTS[TOKEN_CLASSIFICATION]
    example_text: str = "Ada Lovelace was born in London."
    optimum_class: str | None = None
    output: str = "logits"
    predicts: str = "tags"
    primary: str = "f1"
    gated: tuple[str, ...] = ("f1",)
    methods: tuple[str, ...] | None = None  # every method: the training ones learn each word's tag
    refused: tuple[tuple[str, str], ...] = ()  # (method, why): none
    int8_params: tuple[tuple[str, object], ...] = ()
    width_params: tuple[tuple[str, object], ...] = ()  # the hidden-state loss is a sequence classifier's
    labelled: bool = True  # tag names (a bundle's manifest lists them as its labels)
    starter_leaves_out: tuple[tuple[str, str], ...] = (
        ("vocab", "vocab left out: a token classifier meets names its train split never had, which a vocabulary cut "
                  "to the train split's tokens splits into other pieces (on CoNLL-2003: 2.6 points of F1 for no "
                  "speed; docs/your-model.md)"),)

    def starter_drop(self, n_test: int) -> float:
        """The drop of entity F1 the final gate `edgepress init` writes allows (`STARTER_DROP`), no tighter than the
        `n_test` test sentences resolve (as validate says)."""
        return max(STARTER_DROP, resolvable_drop(n_test))

    def starter_gate_line(self, drop: float, n_test: int) -> str:
        """What `edgepress init` says of its final gate."""
        return (f"The final gate allows entity-level F1 (seqeval's strict spans) on the {n_test:,} test sentences to "
                f"drop {drop * 100:g} points below your model's.")

    @property
    def scheme(self) -> str:
        from edgepress.data.tagged import scheme_of

        return scheme_of(self.tags)

    def _ids(self, word_logits: list[np.ndarray]) -> np.ndarray:
        """(texts, most words) tag ids: each word's most likely tag, O for a word cut off (its logits NaN)."""
        outside = self.tags.index("O") if "O" in self.tags else 0
        out = np.full((len(word_logits), max((len(w) for w in word_logits), default=0)), WORDS_NOT_LABELLED,
                      np.int64)
        for i, logits in enumerate(word_logits):
            out[i, :len(logits)] = np.where(np.isnan(logits).any(axis=1), outside, logits.argmax(axis=1))
        return out

    def load(self, data, label2id: dict[str, int] | None):
        """The run's tagged sentences (`load_tagged`), each tag mapped by the model's `label2id`."""
        from edgepress.data.tagged import load_tagged

        return load_tagged(data, label2id)

    def torch_predictions(self, model, tokenizer, texts: tuple[str, ...], max_length: int) -> np.ndarray:
        from edgepress.models.evaluate import predict_word_logits

        return self._ids(predict_word_logits(model, tokenizer, texts, max_length))

    def onnx_predictions(self, predictor, texts: tuple[str, ...], what: str) -> np.ndarray:
        return self._ids([predictor.word_logits(text.split()) for text in tracked(texts, len(texts), what)])

    def names(self, preds: np.ndarray) -> list[list[str]]:
        """Each text's predicted tag names, its padding left out."""
        return [[self.tags[t] for t in row if t != WORDS_NOT_LABELLED] for row in np.asarray(preds)]

    def true_names(self, part: TextSet) -> list[list[str]] | None:
        """Each sentence's true tag names, where `part` has them (a tagged split, its typos), else None."""
        from edgepress.data.tagged import TaggedSet

        return [[self.tags[t] for t in tags] for tags in part.tags] if isinstance(part, TaggedSet) and part.tags \
            else None

    def scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """Entity-level micro F1 with its CI, precision, recall and per-type figures (`entity_metrics`)."""
        from edgepress.data.metrics import entity_metrics

        figures = entity_metrics(self.true_names(part), self.names(preds), self.scheme)
        return {"task": self.name, "primary_metric": self.primary, **figures, "n_test": len(part)}

    def baseline(self, part: TextSet, preds: np.ndarray) -> dict:
        """What the baseline's own metrics add: nothing (its F1 is its own)."""
        return {}

    def web_pipeline(self, model_dir) -> dict:
        """token-classification; the page joins the tags into entities (`aggregation_strategy` simple)."""
        return {"pipeline": "token-classification", "options": {"aggregation_strategy": "simple"}}

    def check_distill(self, cfg) -> None:
        """A pretrained student (`student`) of a token classifier learns the teacher's per-word logits (hinton): the
        hidden states of tagged words across tokenizers (tinybert) are refused."""
        from edgepress.errors import ConfigError

        if cfg.student is not None and cfg.style != "hinton":
            raise ConfigError(f"a token classifier's pretrained student learns the teacher's logits of each word; "
                              f"style {cfg.style} (hidden states across tokenizers) is built for sequence "
                              f"classifiers. Fix: style hinton, or student_layers (a student cut from the teacher's "
                              f"layers takes every style)")

    def check_recovery(self, cfg) -> None:
        """The recovery's hidden-state loss (`hidden_weight`) reads sentences as text, not as tagged words: refused."""
        from edgepress.errors import ConfigError

        if cfg.hidden_weight:
            raise ConfigError("hidden_weight: the recovery's hidden-state loss is built for sequence classifiers; a "
                              "token classifier's recovery learns the teacher's logits of each word. Fix: remove "
                              "hidden_weight")

    def check_student_words(self, words) -> None:
        """A pretrained student's tokenizer `words` reads a sentence's words as they are split, says which word each
        token starts (where the teacher's logits of that word go), and cuts them as it cuts the sentence itself (as
        raw text is read at inference): a fast tokenizer; a byte-level BPE one only when its pre-tokenizer adds the
        space before each word (add_prefix_space)."""
        from edgepress.errors import ConfigError

        sample = ["Japan", "'s", "Nikkei", "rose", "2.5", "percent", "."]
        fix = ("Fix: a student whose tokenizer does (a fast WordPiece or SentencePiece one; a byte-level BPE one with "
               "\"add_prefix_space\": true in its tokenizer_config.json, which RobertaTokenizer reads, and on the "
               "ByteLevel pre_tokenizer of its tokenizer.json, which a generic tokenizer reads), or student_layers")
        try:
            split = words([sample], is_split_into_words=True)
            split.word_ids(0)
            apart, whole = split.tokens(0), words(" " + " ".join(sample)).tokens()
        except Exception as e:  # noqa: BLE001 - a slow tokenizer refuses in its own way (ValueError, NotImplemented)
            raise ConfigError(f"distill's student reads each sentence's words with its own tokenizer, which must take "
                              f"words already split and say which word each token starts; its "
                              f"{type(words).__name__} cannot ({str(e).strip() or type(e).__name__}). {fix}") from None
        if apart != whole:
            raise ConfigError(f"distill's student tokenizer cuts a sentence's words apart unlike the sentence itself "
                              f"({' '.join(apart[1:5])} ... against {' '.join(whole[1:5])} ...: a byte-level BPE "
                              f"tokenizer without add_prefix_space reads each word as glued to the one before); it "
                              f"would learn tags on tokens that raw text never gives it. {fix}")

    check_teacher = Classification.check_teacher
    training_score = Classification.training_score
    auto_class: str = "AutoModelForTokenClassification"
    load_model = Classification.load_model
    traced = Classification.traced
    save_config = Classification.save_config
    output_axes: tuple[tuple[int, str], ...] = ((0, "batch_size"), (1, "sequence_length"))  # logits per token
    targets: str = "word-logits"
    save_model = Classification.save_model

    def agreement_of(self, base: np.ndarray, preds: np.ndarray) -> float:
        """`versus`'s agreement alone, without its CI: the entity F1 of these tags with the baseline's as the
        truth."""
        from edgepress.data.metrics import entity_f1

        return entity_f1(self.names(base), self.names(preds), self.scheme)

    def score_of(self, part: TextSet, preds: np.ndarray) -> float:
        """The primary metric alone, without its CI: entity F1 against the true tags."""
        from edgepress.data.metrics import entity_f1

        return entity_f1(self.true_names(part), self.names(preds), self.scheme)

    def set_scores(self, part: TextSet, preds: np.ndarray) -> dict:
        """A set's own entity F1 where it has true tags (the test split with typos has the test split's)."""
        from edgepress.data.metrics import entity_metrics

        true = self.true_names(part)
        return {"f1": entity_metrics(true, self.names(preds), self.scheme)["f1"]} if true is not None else {}

    def versus(self, part: TextSet, base: np.ndarray, preds: np.ndarray) -> dict:
        """Against the baseline's tags of the same texts: `agreement`, the entity F1 of these tags with the
        baseline's taken as the truth (and its CI); where the texts have true tags, the paired CI of the F1 drop."""
        from edgepress.data.metrics import entity_f1_drop_ci95, entity_metrics

        theirs, ours, true = self.names(base), self.names(preds), self.true_names(part)
        agreement = entity_metrics(theirs, ours, self.scheme)
        return {"agreement": agreement["f1"], "agreement_ci95": agreement["f1_ci95"],
                **({"f1_drop_ci95": entity_f1_drop_ci95(true, theirs, ours, self.scheme)} if true is not None
                   else {})}
