"""The search's `student` choice (issue 52): a student cut from the teacher's own layers, or a pretrained encoder of
another family and tokenizer distilled from the teacher's logits; both timed in one shape table, the pretrained
student's trial run as distill's `student`, best.yaml reproducing it, its bundle reading texts with its own
tokenizer."""

import json
from pathlib import Path

import pytest
import yaml

from edgepress.runtime.latency import LatencyConfig
from edgepress.search.config import SearchConfig, pipeline_for
from edgepress.search.shapes import Shape, build_shape, dominated, shape_source, time_shapes
from edgepress.tasks import CLASSIFICATION
from tests.conftest import save, tiny_encoder
from tests.test_stagecache import _csv
from tests.test_trust import FAST_RUNTIME, invoke


@pytest.fixture(scope="module")
def bpe_student(tmp_path_factory, bpe_tokenizer) -> Path:
    """A 1-layer RoBERTa encoder over its own byte-level BPE, as pretrained encoders ship: no head, no label names."""
    bare = tiny_encoder("roberta", bpe_tokenizer, layers=1, seed=3).roberta
    bare.config.id2label, bare.config.label2id = {0: "LABEL_0", 1: "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}
    return save(bare, bpe_tokenizer, tmp_path_factory.mktemp("bpe-student") / "encoder")


def test_the_space_chooses_between_the_teachers_layers_and_pretrained_students(family_model, bpe_student):
    """Each student's shapes (a pretrained one at its own depth), each point's pipeline: distill into the teacher's
    layers or into the named encoder; unset, the space is what it was (the teacher's layers only)."""
    space = {"student": ["layers", str(bpe_student), "layers"], "layers": [1, 2], "heads_keep": [1.0, 0.5],
             "ffn_keep": [1.0], "vocab": [False], "quantization": ["int8-dynamic"], "epochs": [1]}
    cfg = SearchConfig.model_validate({"model": str(family_model("mpnet")), "space": space})
    filled = cfg.space.filled(2)
    assert filled.student == ["layers", str(bpe_student)]  # once each
    names = [s.name for s in filled.shapes()]
    assert names == ["1 layers, heads 1, ffn 1", "1 layers, heads 0.5, ffn 1", "2 layers, heads 1, ffn 1",
                     "2 layers, heads 0.5, ffn 1", f"{bpe_student}, heads 1, ffn 1", f"{bpe_student}, heads 0.5, ffn 1"]
    stages = {s.name: [(st.method, st.params) for st in pipeline_for(cfg, 2, p, CLASSIFICATION).stages]
              for s, p in zip(filled.shapes(), filled.points(), strict=True)}
    student = stages[f"{bpe_student}, heads 0.5, ffn 1"]
    assert student[0][0] == "distill" and student[0][1]["student"] == str(bpe_student)
    assert "student_layers" not in student[0][1] and student[1][0] == "heads"
    assert stages["1 layers, heads 1, ffn 1"][0][1]["student_layers"] == 1
    assert stages["2 layers, heads 1, ffn 1"][0][0] == "export"  # the teacher's own depth: no distillation
    with pytest.raises(ValueError, match=r"space.layers are depths of students cut from the teacher's layers, and "
                                         r"space.student has no `layers`"):
        SearchConfig.model_validate({"space": {**space, "student": [str(bpe_student)]}})
    default = SearchConfig.model_validate({"space": {k: v for k, v in space.items() if k != "student"}})
    assert [s.name for s in default.space.filled(2).shapes()] == names[:4]
    # a pretrained student's shapes are never beaten by the teacher's: neither keeps what the other has
    a, b = Shape(1), Shape(None, student=str(bpe_student))
    table = {a.name: {"fixed_p50_ms": 1.0, "size_mb": 1.0}, b.name: {"fixed_p50_ms": 2.0, "size_mb": 2.0}}
    assert dominated(table, [a, b]) == {}


def test_a_pretrained_students_shape_is_built_and_timed_from_the_student(family_model, bpe_student, movie_data):
    from edgepress.models.loading import load_classifier
    from edgepress.tasks import CLASSIFICATION

    teacher, words = load_classifier(family_model("mpnet"))
    shape = Shape(None, heads_keep=0.5, ffn_keep=0.5, student=str(bpe_student))
    source, student_words = shape_source(teacher, words, shape.student, CLASSIFICATION)
    model = build_shape(source, shape)
    assert model.config.model_type == "roberta" and len(model.roberta.encoder.layer) == 1
    assert model.config.id2label == teacher.config.id2label and len(student_words) != len(words)
    assert model.roberta.encoder.layer[0].attention.self.query.out_features == 16  # 1 of its 2 heads
    shapes = [Shape(2), shape]
    table = time_shapes(family_model("mpnet"), shapes, movie_data.validation.texts[:32], threads=1,
                        latency=LatencyConfig(warmup=1, runs=5))
    assert list(table) == [s.name for s in shapes]
    assert table[shape.name]["size_mb"] < table[Shape(2).name]["size_mb"]  # 1 layer over 8,000 tokens


def test_a_search_on_a_tiny_mpnet_teacher_picks_a_pretrained_student_and_best_yaml_ships_it(
        tmp_path, family_model, bpe_student, movie_data):
    """Objective size: the BPE student's int8 graph (8,000 tokens) is smaller than any cut of the teacher (30,522),
    so it is trained first, passes, and beats the teacher's shape, which never runs. best.yaml distils into it; its
    bundle ships the student's tokenizer and gives best's predictions."""
    from edgepress.data import DataConfig, load_data
    from edgepress.device.predictor import Predictor

    data = _csv(tmp_path / "d.csv", movie_data)
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(family_model("mpnet")), "data": {"source": str(data)}, "runtime": FAST_RUNTIME,
        "constraints": {"accuracy": {"max_drop": 0.5}}, "objective": "size",
        "space": {"student": ["layers", str(bpe_student)], "layers": [1], "heads_keep": [1.0], "ffn_keep": [1.0],
                  "vocab": [False], "quantization": ["int8-dynamic"], "epochs": [1]}}))
    assert invoke("validate", config).exit_code == 0
    result = invoke("search", config, "--out", tmp_path / "out", "--trials", 2)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    student = f"{bpe_student}, heads 1, ffn 1"
    assert set(report["shapes"]) == {"1 layers, heads 1, ffn 1", student}
    first = report["trials"][0]
    assert first["params"]["shape"] == student and first["stop"] == "passed"
    assert [t["stop"] for t in report["trials"][1:]] in ([], ["beaten"])
    best = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    assert best["stages"][0]["method"] == "distill" and best["stages"][0]["params"]["student"] == str(bpe_student)
    assert report["best"]["reproduced"]
    bundle = Path(report["best"]["bundle"])
    assert json.loads((bundle / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    final = json.loads((tmp_path / "out" / "best" / "report.json").read_text())["stages"][-1]
    predicted = json.loads((tmp_path / "out" / "best" / "stages" / f"{len(best['stages']):02d}-{final['name']}"
                            / "predictions.json").read_text())
    predictor = Predictor(bundle)
    ids = {label: i for i, label in predictor.id2label.items()}
    split = load_data(DataConfig(source=str(data))).test
    assert list(split.ids) == predicted["ids"]
    assert [ids[p.label] for p in predictor.predict_each(split.texts)] == predicted["predictions"]


def test_validate_takes_a_search_on_the_base_teacher_without_building_it(monkeypatch, tmp_path, tokenizer):
    """demo:mpnet-movie, like the demo teacher, is built on first use by a run or a search; `validate` reads its
    encoder's depth (here a tiny MPNet standing in for all-mpnet-base-v2) and trains nothing."""
    import dataclasses

    from edgepress import teacher

    encoder = save(tiny_encoder("mpnet", tokenizer, layers=4), tokenizer, tmp_path / "encoder")
    base = teacher.DEMO_TEACHERS[teacher.BASE_TEACHER]
    monkeypatch.setitem(teacher.DEMO_TEACHERS, teacher.BASE_TEACHER, dataclasses.replace(base, encoder=lambda: encoder))
    monkeypatch.setenv("EDGEPRESS_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump({"model": "demo:mpnet-movie", "space": {"student": ["layers", "demo:minilm"],
                                                                            "layers": [2, 5]}}))
    result = invoke("validate", config)
    assert result.exit_code == 2 and "space.layers asks for 5 layers; the teacher has 4" in result.output
    config.write_text(yaml.safe_dump({"model": "demo:mpnet-movie", "space": {"student": ["layers", "demo:minilm"],
                                                                            "layers": [2, 3]}}))
    result = invoke("validate", config)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "cache" / "models" / "mpnet-movie").exists()


def test_a_student_whose_position_table_is_shorter_than_the_runs_texts_is_refused_at_validate(
        tmp_path, tiny_model_dir, bpe_tokenizer, movie_data):
    """Every model dir a stage names is held to the run's token lengths, as the model is: a pretrained student of 32
    positions cannot read data.max_length 64 (it would fail inside torch, after the teacher's outputs were made)."""
    short = tiny_encoder("roberta", bpe_tokenizer, layers=1, max_position_embeddings=34).roberta
    student = save(short, bpe_tokenizer, tmp_path / "short")
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "data": {"source": str(_csv(tmp_path / "d.csv", movie_data)), "max_length": 64},
        "stages": [{"name": "student", "method": "distill", "params": {"student": str(student)}}]}))
    result = invoke("validate", config)
    assert result.exit_code == 2 and f"stage 'student' (distill) student {student}: longer than the model's 32 " \
        "positions: data.max_length 64" in result.output
