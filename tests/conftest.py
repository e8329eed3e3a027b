"""Shared fixtures: a session cache, the real demo data, the real vocabulary, and a tiny BERT built from a config."""

import os
from pathlib import Path

import pytest


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

    from edgepress.models.teacher import encoder_dir

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


def tiny_distilbert(tokenizer, n_layers: int = 2):
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layers=n_layers, n_heads=2, hidden_dim=64,
                              max_position_embeddings=128, num_labels=2)
    return DistilBertForSequenceClassification(config).eval()


def tiny_roberta(tokenizer):
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                           pad_token_id=tokenizer.pad_token_id, type_vocab_size=1, num_labels=2)
    return RobertaForSequenceClassification(config).eval()


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

    path = tmp_path_factory.mktemp("teacher")
    model = tiny_bert(tokenizer, seed=1)
    cfg = TrainConfig(epochs=3, batch_size=32, learning_rate=2e-3, max_length=48, warmup_ratio=0.0, seed=5)
    train_classifier(model, tokenizer, movie_data.train.take(3000), movie_data.validation.take(300), cfg, path)
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
