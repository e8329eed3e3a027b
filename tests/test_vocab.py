import json

import numpy as np
import pytest
import torch
import yaml

from edgepress.compress.vocab import VocabConfig, vocab_prune
from edgepress.data.dataset import DataSplits
from edgepress.errors import ConfigError, ModelError
from edgepress.models.loading import load_classifier
from edgepress.pipeline.config import load_config
from edgepress.registry import METHODS
from tests.conftest import VOCABULARY, save, tiny_bert, tiny_encoder

# Rare words: the original tokenizer gives them pieces ("spectators", "##copic") the train subset below never does
RARE = "The cinematographer's kaleidoscopic phantasmagoria mesmerized the spectators."


@pytest.fixture(scope="module")
def small_data(movie_data) -> DataSplits:
    return DataSplits(movie_data.train.take(2000), movie_data.validation.take(64), movie_data.test.take(200),
                      movie_data.id2label, movie_data.source)


@pytest.fixture(scope="module")
def pruned(tmp_path_factory, tokenizer, small_data):
    """(unpruned dir, pruned dir, details) of a tiny BERT pruned on 2000 real train sentences."""
    root = tmp_path_factory.mktemp("vocab")
    src = save(tiny_bert(tokenizer, seed=1), tokenizer, root / "src")
    return src, root / "out", vocab_prune(src, root / "out", small_data)


def whole_and_split(tokenizer, pruned_vocab: dict, texts) -> tuple[list[str], list[str]]:
    """`texts` split into those whose original tokens were all kept and the others."""
    kept = [t for t in texts if all(piece in pruned_vocab for piece in tokenizer.tokenize(t))]
    return kept, [t for t in texts if t not in kept]


FAMILY_TOKENIZERS = list(VOCABULARY.items())


@pytest.mark.parametrize(("family", "vocabulary"), FAMILY_TOKENIZERS)
def test_a_text_whose_tokens_were_kept_gives_exactly_the_unpruned_logits(family, vocabulary, request, tmp_path,
                                                                         small_data):
    tokenizer = request.getfixturevalue(vocabulary)
    src = save(tiny_encoder(family, tokenizer), tokenizer, tmp_path / "src")
    vocab_prune(src, tmp_path / "out", small_data)
    original, _ = load_classifier(src)
    model, pruned_tokenizer = load_classifier(tmp_path / "out")
    kept, changed = whole_and_split(tokenizer, pruned_tokenizer.get_vocab(), small_data.test.texts)
    assert len(kept) > 30 and len(changed) > 30  # both kinds are really tested
    before = tokenizer(kept, padding=True, return_tensors="pt")
    after = pruned_tokenizer(kept, padding=True, return_tensors="pt")
    assert not torch.equal(before["input_ids"], after["input_ids"])  # renumbered ...
    assert [tokenizer.convert_ids_to_tokens(ids) for ids in before["input_ids"]] == \
        [pruned_tokenizer.convert_ids_to_tokens(ids) for ids in after["input_ids"]]  # ... the same pieces
    with torch.no_grad():
        assert torch.equal(model(**after).logits, original(**before).logits)  # the same rows, the same sums


def test_a_word_whose_pieces_were_dropped_is_split_into_kept_pieces_never_unk(pruned, tokenizer):
    _, out, _ = pruned
    _, pruned_tokenizer = load_classifier(out)
    vocab = pruned_tokenizer.get_vocab()
    before, after = tokenizer.tokenize(RARE), pruned_tokenizer.tokenize(RARE)
    assert "[UNK]" not in before and "spectators" in before and "spectators" not in vocab  # a whole word lost
    assert "[UNK]" not in after and all(p in vocab for p in after) and len(after) > len(before)
    assert "".join(after).replace("##", "") == "".join(before).replace("##", "")  # the same characters, re-split


def test_the_pruned_dir_is_smaller_reloads_and_exports_to_onnx(pruned, tmp_path, small_data):
    from edgepress.device.predictor import Predictor
    from edgepress.export.onnx import export_onnx

    _, out, details = pruned
    model, tokenizer = load_classifier(out)
    rows = model.get_input_embeddings().num_embeddings
    assert details["rows_after"] == rows < details["rows_before"] == 30522
    assert details["params_after"] == details["params_before"] - 32 * (30522 - rows)  # hidden 32: only rows went
    assert json.loads((out / "config.json").read_text())["vocab_size"] == rows == len(tokenizer)
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines() == \
        sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    assert 0.9 < details["test_token_coverage"] < 1 and 0 < details["test_sentence_coverage"] < 1
    json.dumps(details)

    export_onnx(out, tmp_path / "onnx", small_data.validation.texts)
    texts = list(small_data.test.texts[:32])
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()
    labels = [model.config.id2label[i] for i in logits.argmax(1)]
    assert [p.label for p in Predictor(tmp_path / "onnx").predict(texts)] == labels
    np.testing.assert_allclose(Predictor(tmp_path / "onnx").logits(texts), logits, atol=1e-4)


def test_min_count_drops_the_tokens_seen_fewer_times(pruned, tmp_path, small_data):
    src, _, once = pruned
    twice = vocab_prune(src, tmp_path / "out", small_data, VocabConfig(min_count=2))
    assert twice["rows_after"] < once["rows_after"] and twice["min_count"] == 2
    assert twice["test_token_coverage"] < once["test_token_coverage"]


def test_the_runs_unlabeled_texts_keep_their_frequent_tokens_too_unless_asked_not_to(pruned, tmp_path, small_data,
                                                                                    tokenizer):
    """data.unlabeled's texts are the user's in-domain text: the tokens they give at least `unlabeled_min_count`
    times (3) are kept beside the train split's (benchmarks/results/vocab_unlabeled.json); a token they give once is
    kept at `unlabeled_min_count: 1`; `unlabeled: false` keeps the train split's alone, as a run without unlabeled
    texts does."""
    import dataclasses

    src, _, alone = pruned
    once, thrice = dataclasses.replace(small_data, unlabeled=(RARE,)), dataclasses.replace(small_data,
                                                                                           unlabeled=(RARE,) * 3)
    rows = {}
    for name, data, cfg in (("once", once, VocabConfig()), ("thrice", thrice, VocabConfig()),
                            ("every", once, VocabConfig(unlabeled_min_count=1)),
                            ("train", thrice, VocabConfig(unlabeled=False))):
        details = vocab_prune(src, tmp_path / name, data, cfg)
        _, words = load_classifier(tmp_path / name)
        rows[name] = (details["rows_after"], "spectators" in words.get_vocab(), details["unlabeled_texts"])
    assert VocabConfig().unlabeled_min_count == 3
    assert rows["once"] == (alone["rows_after"], False, 1)  # seen once: not kept at the default
    assert rows["thrice"][0] > alone["rows_after"] and rows["thrice"][1:] == (True, 3)
    assert rows["every"] == (rows["thrice"][0], True, 1)  # the same tokens, seen once each
    assert rows["train"] == (alone["rows_after"], False, 0) and alone["unlabeled_texts"] == 0


@pytest.mark.parametrize(("family", "vocabulary"), [(f, v) for f, v in FAMILY_TOKENIZERS if v != "tokenizer"])
def test_a_text_with_dropped_pieces_keeps_its_characters_and_gets_no_unknown(family, vocabulary, request, tmp_path,
                                                                             small_data):
    """BPE falls back to the pieces a dropped piece was merged from, Unigram to kept pieces down to single
    characters: the same characters, more pieces, never the unknown token."""
    tokenizer = request.getfixturevalue(vocabulary)
    src = save(tiny_encoder(family, tokenizer), tokenizer, tmp_path / "src")
    vocab_prune(src, tmp_path / "out", small_data)
    _, pruned_tokenizer = load_classifier(tmp_path / "out")
    _, changed = whole_and_split(tokenizer, pruned_tokenizer.get_vocab(), small_data.test.texts)
    assert len(changed) > 10
    for text in changed:
        before, after = tokenizer.tokenize(text), pruned_tokenizer.tokenize(text)
        assert after != before and "".join(after) == "".join(before)
        assert tokenizer.unk_token not in after


def test_bpe_keeps_the_merges_of_kept_pieces_in_their_order(tmp_path, bpe_tokenizer, small_data):
    src = save(tiny_encoder("roberta", bpe_tokenizer), bpe_tokenizer, tmp_path / "src")
    details = vocab_prune(src, tmp_path / "out", small_data)
    before = json.loads((src / "tokenizer.json").read_text())["model"]
    after = json.loads((tmp_path / "out" / "tokenizer.json").read_text())["model"]
    merges = [tuple(m) for m in after["merges"]]
    assert len(after["vocab"]) == details["rows_after"] < details["rows_before"]
    assert 0 < len(merges) < len(before["merges"])
    rank = {tuple(m): r for r, m in enumerate(before["merges"])}
    assert [rank[m] for m in merges] == sorted(rank[m] for m in merges)  # a subset, in the original order
    assert all(a in after["vocab"] and b in after["vocab"] and a + b in after["vocab"] for a, b in merges)
    assert all(chr(c) in after["vocab"] for c in range(ord("!"), ord("~") + 1))  # the base bytes, all kept


def test_the_real_deberta_v3_vocabulary_shrinks_to_what_one_domain_uses(tmp_path, deberta_v3_tokenizer, small_data):
    """A monolingual, one-domain user of DeBERTa-v3's 128k vocabulary: the rows kept, the bytes saved, and the pruned
    dir served by the torch-free runtime (tokenizer.json alone: the SentencePiece model is not kept beside it)."""
    from edgepress.device.predictor import Predictor
    from edgepress.export.onnx import export_onnx

    src = save(tiny_encoder("deberta-v2", deberta_v3_tokenizer), deberta_v3_tokenizer, tmp_path / "src")
    details = vocab_prune(src, tmp_path / "out", small_data)
    assert details["rows_before"] == 128001 and details["rows_after"] < 12000  # 2,000 English sentences
    assert details["params_before"] - details["params_after"] == 32 * (128001 - details["rows_after"])
    assert not list((tmp_path / "out").glob("*.model"))
    model, tokenizer = load_classifier(tmp_path / "out")
    export_onnx(tmp_path / "out", tmp_path / "onnx", small_data.validation.texts)
    texts = list(small_data.test.texts[:32])
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(Predictor(tmp_path / "onnx").logits(texts), logits, atol=1e-4)


def test_a_word_level_tokenizer_is_refused_and_nothing_is_written(tmp_path, small_data):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "good": 2, "bad": 3}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", unk_token="<unk>")
    src = save(tiny_bert(tokenizer), tokenizer, tmp_path / "words")
    with pytest.raises(ConfigError, match=r"vocab pruning supports fast tokenizers whose model is WordPiece .* has a "
                                          r"WordLevel tokenizer\. Fix: remove the vocab stage"):
        vocab_prune(src, tmp_path / "out", small_data)
    assert not (tmp_path / "out").exists()


def whole_word_dir(path, texts):
    """A tiny BERT over a real WordPiece tokenizer whose vocabulary is the whole (lowercased) words of `texts` and
    no single characters but punctuation: a word whose token is dropped has no smaller pieces to fall back on."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = sorted({w for t in texts for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(t))})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.normalizer, wordpiece.pre_tokenizer = normalizer, splitter
    wordpiece.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    return save(tiny_bert(tokenizer), tokenizer, path)


def test_a_vocabulary_without_single_characters_is_refused_rather_than_giving_unk(tmp_path, small_data):
    texts = small_data.train.texts[:50] + small_data.validation.texts
    src = whole_word_dir(tmp_path / "words", texts)
    data = DataSplits(small_data.train.take(50), small_data.validation, small_data.test, small_data.id2label,
                      small_data.source)
    with pytest.raises(ModelError, match=r"(?s)does not reproduce the original on \d+ of 64 validation texts:\n  ✗ "
                                         r"text \d+: \[UNK\] after pruning, none before .*Fix: remove the vocab "
                                         r"stage for this model \(its vocabulary lacks single-character pieces"):
        vocab_prune(src, tmp_path / "out", data)
    assert not (tmp_path / "out").exists()


def test_vocab_is_a_pipeline_stage_with_strict_params(tmp_path):
    assert METHODS["vocab"].takes == ("torch",) and METHODS["vocab"].gives == "torch"
    assert METHODS["vocab"].inputs == "splits" and not METHODS["vocab"].trains
    stages = [{"name": "vocab", "method": "vocab", "params": {"min_count": 2}}, {"name": "export", "method": "export"}]
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump({"stages": stages}))
    assert load_config(tmp_path / "ok.yaml").stages[0].params == {"min_count": 2}
    stages[0]["params"] = {"min_cuont": 2, "min_count": 0}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"stages": stages}))
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "bad.yaml")
    assert "params of vocab: min_count: Input should be greater than or equal to 1: got 0; min_cuont: unknown key" \
        in str(e.value)
    stages[0]["params"] = {"unlabeled": False, "unlabeled_min_count": 2}  # a count of texts it was told not to read
    (tmp_path / "idle.yaml").write_text(yaml.safe_dump({"stages": stages}))
    with pytest.raises(ConfigError, match="unlabeled_min_count counts data.unlabeled's texts, which unlabeled: false "
                                          "leaves out. Fix: remove unlabeled_min_count, or set unlabeled: true"):
        load_config(tmp_path / "idle.yaml")
