"""A token classifier's pretrained student of another family and tokenizer (issue 52): the teacher's logits of each
word (tokenizer-free: one row a word) placed at the first token of that word in the student's own tokenization; run,
exported and bundled, its bundle tags as the run's export did. A tokenizer that cannot take pre-split words is refused
at validate, naming the fix."""

import json

import pytest

from edgepress.errors import ConfigError
from tests.conftest import save, tiny_encoder
from tests.test_tokens import FAST, ner_dir, run_config  # noqa: F401 - ner_dir is a fixture

TAGS_TRAIN = {"epochs": 8, "batch_size": 8, "learning_rate": 5e-3}


def _bare(family: str, words, tmp_path, seed: int = 3):
    """An encoder of `family` over `words`, as pretrained encoders ship: no head, no label names."""
    model = tiny_encoder(family, words, seed=seed).roberta
    model.config.id2label, model.config.label2id = {0: "LABEL_0", 1: "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}
    return save(model, words, tmp_path)


def test_a_token_classifiers_student_reads_the_words_with_its_own_tokenizer(token_model, ner_dir, unigram_tokenizer,  # noqa: F811
                                                                           tmp_path):
    import numpy as np

    from edgepress.data import DataConfig
    from edgepress.device.predictor import Predictor
    from edgepress.models.loading import label2id_of
    from edgepress.pipeline import runner
    from edgepress.tasks import task_of
    from tests.test_trust import invoke

    student = _bare("xlm-roberta", unigram_tokenizer, tmp_path / "encoder")
    stages = [{"name": "student", "method": "distill", "params": {"student": str(student), **TAGS_TRAIN},
               "gates": {"accuracy": {"max_drop": 1.0}}},
              {"name": "export", "method": "export"}]
    report = runner.run_pipeline(run_config(tmp_path, token_model, ner_dir, stages), tmp_path / "run")
    assert [s["status"] for s in report["stages"]] == ["passed", "passed"]
    details = report["stages"][0]["details"]
    assert details["student_model_type"] == "xlm-roberta" and details["student"] == str(student)
    # it learned entities from per-word targets placed on its own tokens: after one epoch it tagged none (validation
    # F1 0); after 8, test F1 0.29 against the teacher's 0.30
    assert details["history"][0]["val_f1"] < 0.05 < report["stages"][0]["metrics"]["f1"] and details["val_f1"] > 0.2
    bundle = tmp_path / "bundle"
    assert invoke("bundle", tmp_path / "run", "--out", bundle).exit_code == 0
    assert json.loads((bundle / "tokenizer.json").read_text())["model"]["type"] == "Unigram"
    # the bundle's tags of the run's test sentences are the run's export stage's (O for a word cut off)
    predictor = Predictor(bundle)
    run = json.loads((tmp_path / "run" / "stages" / "02-export" / "predictions.json").read_text())
    split = task_of(token_model).load(DataConfig(source=str(ner_dir), max_length=64), label2id_of(token_model)).test
    assert list(split.ids) == run["ids"]
    outside = {label: i for i, label in predictor.id2label.items()}["O"]
    for words, row in zip(split.words, run["predictions"], strict=True):
        logits = predictor.word_logits(list(words))
        assert np.where(np.isnan(logits).any(axis=1), outside, logits.argmax(axis=1)).tolist() == row[:len(words)]


def test_a_student_tokenizer_that_cannot_take_words_is_refused_at_validate(token_model, ner_dir, bpe_tokenizer,  # noqa: F811
                                                                          tmp_path):
    from edgepress.pipeline.inputs import check_inputs

    student = _bare("roberta", bpe_tokenizer, tmp_path / "bpe")  # byte-level BPE without add_prefix_space
    cfg = run_config(tmp_path, token_model, ner_dir, [{"name": "d", "method": "distill",
                                                       "params": {"student": str(student)}}])
    with pytest.raises(ConfigError, match=r"distill's student tokenizer cuts a sentence's words apart unlike the "
                                          r"sentence itself .* \"add_prefix_space\": true in its "
                                          r"tokenizer_config.json.*tokenizer.json, .*or student_layers"):
        check_inputs(cfg)
    # the fix it names: the space added before each word, as raw text has it (then the same cuts either way); a
    # generic tokenizer reads it from tokenizer.json, RobertaTokenizer from tokenizer_config.json
    tokenizer = json.loads((student / "tokenizer.json").read_text())
    assert tokenizer["pre_tokenizer"]["type"] == "ByteLevel"
    tokenizer["pre_tokenizer"]["add_prefix_space"] = True
    (student / "tokenizer.json").write_text(json.dumps(tokenizer))
    check_inputs(cfg)
    settings = json.loads((student / "tokenizer_config.json").read_text())
    for space, refused in ((False, True), (True, False)):
        (student / "tokenizer_config.json").write_text(json.dumps(
            {**settings, "tokenizer_class": "RobertaTokenizer", "add_prefix_space": space}))
        if refused:
            with pytest.raises(ConfigError, match=r"cuts a sentence's words apart unlike the sentence itself"):
                check_inputs(cfg)
        else:
            check_inputs(cfg)
    cfg = run_config(tmp_path, token_model, ner_dir, [{"name": "d", "method": "distill",
                                                       "params": {"student": str(student), "style": "tinybert"}}])
    with pytest.raises(ConfigError, match=r"style tinybert \(hidden states across tokenizers\) is built for sequence "
                                          r"classifiers. Fix: style hinton"):
        check_inputs(cfg)
