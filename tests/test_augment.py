import numpy as np
import pytest
import torch

from edgepress.compress.distill import DistillConfig, distill
from edgepress.compress.kd import hinton, transfer_set
from edgepress.data.augment import WORD, AugmentConfig, augment_texts, neighbour_table
from edgepress.data.dataset import DataSplits
from edgepress.errors import ConfigError
from edgepress.models.loading import load_classifier


def _embeddings(tokenizer, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((len(tokenizer), 16)).astype(np.float32)


def test_neighbours_are_the_nearest_whole_words_in_the_embeddings(tokenizer):
    emb = _embeddings(tokenizer)
    good, great = tokenizer.convert_tokens_to_ids(["good", "great"])
    emb[great] = emb[good] + 0.01  # the nearest token to "good" by cosine
    emb[tokenizer.convert_tokens_to_ids("##ing")] = emb[good]  # a word piece: never a replacement
    table = neighbour_table(tokenizer, emb, {"good", "unbelievably"}, k=3)
    assert table["good"][0] == "great" and "good" not in table["good"] and "##ing" not in table["good"]
    assert all(word.isalnum() for word in table["good"])
    assert "unbelievably" not in table  # several pieces: masked, never replaced


def test_copies_are_perturbed_seeded_and_distinct(tokenizer, movie_data):
    texts = movie_data.train.texts[:50]
    cfg = AugmentConfig(factor=4, probability=0.3)
    copies = augment_texts(texts, tokenizer, _embeddings(tokenizer), cfg)
    assert copies == augment_texts(texts, tokenizer, _embeddings(tokenizer), cfg)  # same seed, same copies
    assert copies != augment_texts(texts, tokenizer, _embeddings(tokenizer), cfg.model_copy(update={"seed": 1}))
    assert sum(map(len, copies)) > 150
    for text, made in zip(texts, copies, strict=True):
        assert len(made) == len(set(made)) <= 4 and text not in made
    assert any("[MASK]" in c for made in copies for c in made)
    assert any(len(WORD.findall(c)) <= 5 < len(WORD.findall(t)) for t, made in zip(texts, copies, strict=True)
               for c in made)


def test_each_method_alone_does_only_what_it_says(tokenizer, movie_data):
    texts = movie_data.train.texts[:40]
    masked = augment_texts(texts, tokenizer, _embeddings(tokenizer), AugmentConfig(methods=("mask",)))
    for text, made in zip(texts, masked, strict=True):
        for copy in made:  # every word is the text's own or the mask token, in the text's order and number
            a, b = WORD.findall(text), WORD.findall(copy.replace("[MASK]", "MASKED"))
            assert len(a) == len(b) and all(x == y or y == "MASKED" for x, y in zip(a, b, strict=True))
    swapped = augment_texts(texts, tokenizer, _embeddings(tokenizer), AugmentConfig(methods=("neighbours",)))
    assert all("[MASK]" not in c for made in swapped for c in made) and any(swapped)
    cut = augment_texts(texts, tokenizer, _embeddings(tokenizer), AugmentConfig(methods=("ngram",), factor=8))
    assert all(c in t and len(WORD.findall(c)) <= 5 for t, made in zip(texts, cut, strict=True) for c in made)


def test_masking_needs_a_mask_token(tokenizer):
    class NoMask:
        mask_token = None

    with pytest.raises(ConfigError, match="augment method mask needs a mask token.*Fix: augment.methods without"):
        augment_texts(("a text",), NoMask(), _embeddings(tokenizer), AugmentConfig())


def test_transfer_examples_have_the_soft_loss_alone():
    student, teacher = torch.randn(4, 2), torch.randn(4, 2)
    labels, cfg = torch.tensor([0, 1, 0, 1]), DistillConfig(alpha=0.25, temperature=2.0)
    everyone = hinton(student, teacher, labels, cfg)
    soft_only = hinton(student, teacher, labels, cfg.model_copy(update={"alpha": 1.0}))
    gold = torch.tensor([True, True, False, False])
    mixed = hinton(student, teacher, labels, cfg, gold)
    each = [(hinton(student[i:i + 1], teacher[i:i + 1], labels[i:i + 1], cfg.model_copy(update={"alpha": a})))
            for i, a in enumerate((0.25, 0.25, 1.0, 1.0))]
    assert float(mixed) == pytest.approx(float(sum(each)) / 4, rel=1e-5)
    assert float(hinton(student, teacher, labels, cfg, torch.ones(4, dtype=bool))) == pytest.approx(float(everyone))
    assert float(hinton(student, teacher, labels, cfg, torch.zeros(4, dtype=bool))) == pytest.approx(float(soft_only))


def test_distill_trains_on_the_teacher_labelled_copies(trained_teacher, tmp_path, movie_data):
    data = DataSplits(movie_data.train.take(200), movie_data.validation.take(64), movie_data.test.take(64),
                      movie_data.id2label, movie_data.source)
    cfg = DistillConfig(student_layers=1, epochs=1, max_length=32, augment=AugmentConfig(factor=3))
    teacher, tokenizer = load_classifier(trained_teacher)
    train, logits = transfer_set(trained_teacher, teacher, tokenizer, data, cfg)
    n = len(data.train)
    assert len(train) == len(logits) > 2 * n and train.ids[:n] == data.train.ids and train.ids[n].startswith(
        f"{data.train.ids[0]}~")
    assert np.array_equal(train.labels[:n], data.train.labels)  # gold labels kept; the copies' are the teacher's
    assert np.array_equal(train.labels[n:], logits.array[n:].argmax(1))
    details = distill(trained_teacher, tmp_path / "s", data, cfg)
    assert details["transfer_examples"] == len(train) - n
    assert load_classifier(tmp_path / "s")[0].config.num_hidden_layers == 1


def test_the_transfer_set_and_its_targets_are_built_once_per_content(trained_teacher, small_data, monkeypatch):
    import edgepress.compress.kd as kd_module
    import edgepress.models.evaluate as evaluate

    teacher, tokenizer = load_classifier(trained_teacher)
    cfg = DistillConfig(max_length=32, augment=AugmentConfig(factor=2, seed=7))
    train, logits = transfer_set(trained_teacher, teacher, tokenizer, small_data, cfg)

    def rebuilt(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(kd_module, "augment_texts", rebuilt)
    monkeypatch.setattr(evaluate, "predict_outputs", rebuilt)
    again, cached = transfer_set(trained_teacher, teacher, tokenizer, small_data, cfg)  # another stage, trial, run
    assert again.texts == train.texts and np.array_equal(again.labels, train.labels) and np.array_equal(
        cached.array, logits.array)
    with pytest.raises(AssertionError, match="built again"):  # another seed is another set
        transfer_set(trained_teacher, teacher, tokenizer, small_data, cfg.model_copy(
            update={"augment": AugmentConfig(factor=2, seed=8)}))


def _unlabeled_data(tmp_path, movie_data, lines: list[str], suffix: str = ".txt"):
    from edgepress.data import DataConfig, load_data
    from tests.test_stagecache import _csv

    path = tmp_path / f"u{suffix}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_data(DataConfig(source=str(_csv(tmp_path / "d.csv", movie_data)), unlabeled=str(path)))


def test_unlabeled_texts_are_read_and_the_splits_judged_on_left_out(tmp_path, movie_data, trained_teacher):
    from edgepress.data import DataConfig, load_data
    from tests.test_stagecache import _csv

    plain = load_data(DataConfig(source=str(_csv(tmp_path / "d.csv", movie_data))))
    fresh = list(movie_data.test.texts[500:530])  # texts the 200-row CSV's splits never saw
    near = "  ".join(plain.test.texts[1].upper().split())  # the same input for an uncased model
    data = _unlabeled_data(tmp_path, movie_data, [*fresh, plain.test.texts[0], plain.validation.texts[0], near])
    assert data.unlabeled == tuple(fresh) and "3 unlabeled texts also in the validation or test split or a set " \
        "judged on left out" in data.note
    assert data.manifest()["sizes"]["unlabeled"] == 30
    assert data.content_sha256(("train", "validation")) != plain.content_sha256(("train", "validation"))
    teacher, tokenizer = load_classifier(trained_teacher)
    train, logits = transfer_set(trained_teacher, teacher, tokenizer, data, DistillConfig(max_length=32))
    assert train.texts[len(data.train):] == tuple(fresh) and train.ids[-1] == "unlabeled:29"
    assert np.array_equal(train.labels[len(data.train):], logits.array[len(data.train):].argmax(1))
    assert train.draw.labelled == len(data.train) and train.draw.per_epoch is None  # every text every epoch


@pytest.mark.parametrize(("content", "suffix", "message"), [
    (["a fine film", "", "a dull one"], ".txt", r"line 2 is empty. Fix: one text per line, no empty lines"),
    (["1", "0", "1"], ".txt", r"holds labels, not texts \(every line is one of: 0, 1\)\. Fix: point data.unlabeled at "
                              r"texts"),
    (['{"body": "a fine film"}'], ".jsonl", r"has no text column 'text'; its columns are: body\. Fix: set "
                                            r"data.text_column"),
    (["a fine film"], ".parquet", r"is not a .txt, .csv or .jsonl file\. Fix: a .txt file with one text per line"),
])
def test_bad_unlabeled_files_are_refused_with_the_fix(tmp_path, movie_data, content, suffix, message):
    from edgepress.errors import DataError

    with pytest.raises(DataError, match=message):
        _unlabeled_data(tmp_path, movie_data, content, suffix)


def test_an_unlabeled_file_that_is_not_utf8_is_refused(tmp_path, movie_data):
    from edgepress.data import DataConfig, load_data
    from edgepress.errors import DataError
    from tests.test_stagecache import _csv

    (tmp_path / "u.txt").write_bytes("un film très beau\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"u.txt is not UTF-8 text \(invalid continuation byte at byte 10\)\. Fix"):
        load_data(DataConfig(source=str(_csv(tmp_path / "d.csv", movie_data)), unlabeled=str(tmp_path / "u.txt")))


def test_a_vocabulary_with_fewer_whole_words_than_neighbours_asked_for_gives_them_all(tokenizer):
    emb = _embeddings(tokenizer)
    table = neighbour_table(tokenizer, emb, {"good"}, k=10**6)
    assert len(table["good"]) == len(set(table["good"])) > 1000 and "good" not in table["good"]


def test_a_perturbed_copy_that_is_a_text_judged_on_is_not_trained_on(trained_teacher, small_data):
    from dataclasses import replace

    from edgepress.data.dataset import TextSet

    teacher, tokenizer = load_classifier(trained_teacher)
    cfg = DistillConfig(max_length=32, augment=AugmentConfig(factor=4, methods=("ngram",), seed=3))
    train, _ = transfer_set(trained_teacher, teacher, tokenizer, small_data, cfg)
    copies = train.texts[len(small_data.train):]
    held = TextSet(("held",), (copies[0].upper(),), small_data.test.labels[:1])  # one copy is a test text
    data = replace(small_data, test=held)
    train, _ = transfer_set(trained_teacher, teacher, tokenizer, data, cfg)
    assert copies[0] not in train.texts[len(small_data.train):]
    assert set(train.texts[len(small_data.train):]) == set(copies) - {copies[0]}


def test_a_missing_unlabeled_file_is_named_as_missing(tmp_path, movie_data):
    from edgepress.data import DataConfig, load_data
    from edgepress.errors import DataError
    from tests.test_stagecache import _csv

    with pytest.raises(DataError, match=r"data.unlabeled .*u.txt does not exist\. Fix: the path of a .txt"):
        load_data(DataConfig(source=str(_csv(tmp_path / "d.csv", movie_data)), unlabeled=str(tmp_path / "u.txt")))
