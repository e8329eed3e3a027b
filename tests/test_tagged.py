"""Token-classification data: CoNLL-style and JSON-lines files, the model's tags, words to sub-words, and entity-level
F1 against seqeval's own."""

import json
import random

import numpy as np
import pytest
from seqeval.metrics import classification_report, f1_score
from seqeval.scheme import IOB2, IOBES

from edgepress.data.metrics import entity_f1_drop_ci95, entity_metrics, entity_spans
from edgepress.data.tagged import (
    IGNORED,
    TaggedSet,
    check_tag_names,
    first_subword_labels,
    read_tagged,
    scheme_of,
    tag_ids,
    words_of,
)
from edgepress.device.feeds import first_subword_rows
from edgepress.errors import DataError

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
LABEL2ID = {t: i for i, t in enumerate(BIO)}


def test_a_conll_file_reads_as_sentences_of_words_and_their_last_column(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n\n"
                    "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
    assert read_tagged(path, "IOB2") == [(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
                                         (["Peter", "Blackburn"], ["B-PER", "I-PER"])]


def test_a_conll_line_without_a_tag_names_its_line(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(DataError, match=r"line 2 \('rejects'\) has a word and no tag"):
        read_tagged(path, "IOB2")


def test_json_lines_with_tokens_and_tags_and_with_character_spans(tmp_path):
    path = tmp_path / "test.jsonl"
    rows = [{"tokens": ["Peter", "lives", "in", "Paris"], "tags": ["B-PER", "O", "O", "B-LOC"]},
            {"text": "Anna Karenina moved to New York City.", "spans": [
                {"start": 0, "end": 13, "label": "PER"}, {"start": 23, "end": 36, "label": "LOC"}]}]
    path.write_text("\n".join(map(json.dumps, rows)) + "\n")
    bio = read_tagged(path, "IOB2")
    assert bio[1] == (["Anna", "Karenina", "moved", "to", "New", "York", "City", "."],
                      ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "I-LOC", "O"])
    assert read_tagged(path, "IOBES")[1][1] == ["B-PER", "E-PER", "O", "O", "B-LOC", "I-LOC", "E-LOC", "O"]
    assert read_tagged(path, "IO")[1][1] == ["I-PER", "I-PER", "O", "O", "I-LOC", "I-LOC", "I-LOC", "O"]


@pytest.mark.parametrize("row, message", [
    ({"tokens": ["a", "b"], "tags": ["O"]}, "got 2 tokens, 1 tags"),
    ({"text": "Peter lives", "spans": [{"start": 0, "end": 3, "label": "PER"}]},
     r"the span 'Pet' \(0-3\) does not start and end on word boundaries"),
    ({"text": "Peter", "spans": [[0, 5, "PER"]]}, r"a span is \[0, 5, 'PER'\]"),
    ({"sentence": "Peter"}, "neither tokens and tags nor text and spans"),
    ({"tokens": [], "tags": []}, "the sentence has no token"),
    ({"text": "  ", "spans": []}, "has no word"),
    ({"text": "Peter Blackburn", "spans": [{"start": 0, "end": 15, "label": "PER"},
                                           {"start": 0, "end": 5, "label": "LOC"}]},
     r"the span 'Peter' \(0-5, LOC\) overlaps another span"),
])
def test_bad_json_lines_name_the_line_and_the_fix(tmp_path, row, message):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"tokens": ["ok"], "tags": ["O"]}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"line 2.*{message}.*Fix:"):
        read_tagged(path, "IOB2")


def test_an_empty_file_or_another_kind_is_refused(tmp_path):
    (tmp_path / "empty.conll").write_text("\n-DOCSTART- O\n\n")
    with pytest.raises(DataError, match="holds no sentence"):
        read_tagged(tmp_path / "empty.conll", "IOB2")
    (tmp_path / "train.csv").write_text("text,label\n")
    with pytest.raises(DataError, match=r"is no .conll, .txt, .iob, .bio, .tsv \(CoNLL-style\) or .jsonl file"):
        read_tagged(tmp_path / "train.csv", "IOB2")


def test_a_tag_the_model_does_not_know_lists_the_models_tags():
    sentences = [(["EU", "rejects"], ["B-ORG", "O"]), (["German"], ["B-MISC"]), (["Peter"], ["S-PER"])]
    with pytest.raises(DataError, match=r"the model has no tag 'B-MISC', 'S-PER'; its tags are: O, B-PER, .*I-ORG\. "
                                        r"Fix: tag the data with the model's tags"):
        tag_ids(sentences, LABEL2ID, "data.source train.txt")
    assert [t.tolist() for t in tag_ids(sentences[:1], LABEL2ID, "x")] == [[5, 0]]


def test_data_in_another_scheme_than_the_models_is_refused():
    """BIO data read by a BIOES model would lose its every entity (a lone B- is no entity in BIOES)."""
    bioes = {t: i for i, t in enumerate(["O", "B-PER", "I-PER", "E-PER", "S-PER"])}
    with pytest.raises(DataError, match=r"the data is tagged IOB2 .* the model reads IOBES .* Fix: tag the data in "
                                        r"IOBES"):
        tag_ids([(["Peter", "Blackburn"], ["B-PER", "I-PER"])], bioes, "train.conll")
    assert len(tag_ids([(["Peter", "Blackburn"], ["B-PER", "E-PER"]), (["x"], ["O"])], bioes, "train.conll")) == 2
    with pytest.raises(DataError, match=r"the data is tagged IO .* the model reads IOB2"):
        tag_ids([(["Peter", "Blackburn"], ["I-PER", "I-PER"])], LABEL2ID, "train.conll")


def test_a_classifiers_demo_data_is_no_token_classifiers():
    from edgepress.data import DataConfig
    from edgepress.data.tagged import load_tagged

    with pytest.raises(DataError, match=r"demo:movie-snippets is a classifier's data .* Fix: give demo:conll2003"):
        load_tagged(DataConfig(source="demo:movie-snippets"), LABEL2ID)


def test_the_scheme_is_read_from_the_models_tags_and_bad_tags_refused():
    assert scheme_of(BIO) == "IOB2"
    assert scheme_of(["O", "B-PER", "I-PER", "E-PER", "S-PER"]) == "IOBES"
    assert scheme_of(["O", "I-PER", "I-LOC"]) == "IO"
    check_tag_names(BIO, "the model")
    with pytest.raises(DataError, match=r"the tags 'PER', 'X-LOC' are not O or B-/I-/E-/S-TYPE"):
        check_tag_names(["O", "PER", "X-LOC", "B-ORG"], "the model")


def test_words_split_as_berts_pre_tokenizer_cuts_them():
    assert [w for w, _, _ in words_of("Don't stop, U.S.A.!")] == ["Don", "'", "t", "stop", ",", "U", ".", "S", ".",
                                                                  "A", ".", "!"]


def test_a_words_tag_goes_to_its_first_subword_and_back():
    # [CLS] Black ##burn lives [SEP]: word 0 is two sub-words
    word_ids = [None, 0, 0, 1, None]
    labels = first_subword_labels(word_ids, np.array([1, 0]))
    assert labels.tolist() == [IGNORED, 1, IGNORED, 0, IGNORED]
    predicted = np.array([9, 1, 2, 0, 9])  # what the model says at each position
    assert first_subword_rows(word_ids, predicted, 2, 0).tolist() == [1, 0]
    # a third word truncated away is predicted O (scored as a miss, not dropped)
    assert first_subword_rows(word_ids, predicted, 3, 0).tolist() == [1, 0, 0]


def test_alignment_with_a_real_fast_tokenizer(tokenizer):
    words = ["Blackburn", "visited", "Zwolle"]
    encoding = tokenizer(words, is_split_into_words=True)
    labels = first_subword_labels(encoding.word_ids(), np.array([1, 0, 3]))
    first = [encoding.word_ids().index(w) for w in range(3)]
    assert labels[first].tolist() == [1, 0, 3]
    assert np.sum(labels != IGNORED) == 3 and labels[0] == IGNORED and labels[-1] == IGNORED


def test_a_tagged_set_keeps_its_words_and_tags_when_selected():
    tagged = TaggedSet.of(["a", "b", "c"], [["EU", "rejects"], ["Peter"], ["x"]], [[5, 0], [1], [0]])
    assert tagged.texts == ("EU rejects", "Peter", "x") and tagged.labels.tolist() == [-1, -1, -1]
    part = tagged.select([2, 0])
    assert isinstance(part, TaggedSet) and part.words == (("x",), ("EU", "rejects"))
    assert [t.tolist() for t in part.tags] == [[0], [5, 0]] and part.ids == ("c", "a")
    assert tagged.take(1).words == (("EU", "rejects"),)


def _noisy(sentences, keep, tags, seed):
    rng = random.Random(seed)
    return [[t if rng.random() < keep else rng.choice(tags) for t in s] for s in sentences]


@pytest.mark.parametrize("scheme, tags", [
    (IOB2, BIO), (IOBES, ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "E-LOC", "S-LOC"])])
def test_entity_f1_and_per_type_f1_are_seqevals_strict_ones(scheme, tags):
    rng = random.Random(0)
    true = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(300)]
    pred = _noisy(true, 0.8, tags, 1)
    ours = entity_metrics(true, pred, scheme.__name__)
    assert ours["f1"] == pytest.approx(f1_score(true, pred, mode="strict", scheme=scheme), abs=1e-12)
    report = classification_report(true, pred, mode="strict", scheme=scheme, output_dict=True)
    for name, figures in ours["per_type"].items():
        assert figures["f1"] == pytest.approx(report[name]["f1-score"], abs=1e-12)
        assert figures["support"] == report[name]["support"]
    lo, hi = ours["f1_ci95"]
    assert lo < ours["f1"] < hi and hi - lo < 0.1


def test_strict_spans_on_known_cases():
    # an I- that begins nothing is no entity in strict BIO; a type change ends one
    assert entity_spans([["I-PER", "I-PER", "O", "B-LOC", "I-ORG"]], "IOB2") == [{("LOC", 3, 4)}]
    # IO: a run of one type is one entity
    assert entity_spans([["I-PER", "I-PER", "I-LOC", "O", "I-LOC"]], "IO") == [
        {("PER", 0, 2), ("LOC", 2, 3), ("LOC", 4, 5)}]
    perfect = entity_metrics([["B-PER", "I-PER", "O"]] * 5, [["B-PER", "I-PER", "O"]] * 5, "IOB2")
    assert perfect["f1"] == 1.0 and perfect["f1_ci95"] == [1.0, 1.0] and perfect["n_entities"] == 5
    boundary = entity_metrics([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]], "IOB2")
    assert boundary["f1"] == 0.0 and boundary["per_type"]["PER"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                                                       "support": 1}


def test_the_paired_f1_drop_ci_is_zero_for_the_same_tags_and_covers_a_real_drop():
    rng = random.Random(2)
    true = [[rng.choice(BIO) for _ in range(rng.randint(2, 10))] for _ in range(400)]
    base = _noisy(true, 0.9, BIO, 3)
    assert entity_f1_drop_ci95(true, base, base, "IOB2") == [0.0, 0.0]
    worse = _noisy(base, 0.9, BIO, 4)
    drop = entity_metrics(true, base, "IOB2")["f1"] - entity_metrics(true, worse, "IOB2")["f1"]
    lo, hi = entity_f1_drop_ci95(true, base, worse, "IOB2")
    assert 0 < lo < drop < hi
    # the pairing: narrower than the two F1s' own intervals would suggest
    assert hi - lo < np.diff(entity_metrics(true, base, "IOB2")["f1_ci95"])[0]
