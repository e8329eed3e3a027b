"""`edgepress init MODEL DATA` (issue 26): a commented starting pipeline that fits the model and the data,
validated before it is written."""

import yaml

from edgepress.pipeline.config import load_config
from edgepress.tasks import resolvable_drop
from tests.conftest import save, tiny_distilbert
from tests.test_stagecache import _csv
from tests.test_trust import invoke


def test_init_writes_a_pipeline_that_fits_the_model_and_the_data(tmp_path, tiny_model_dir, movie_data):
    data = _csv(tmp_path / "d.csv", movie_data)  # 200 rows: test 20
    result = invoke("init", tiny_model_dir, data, "--out", tmp_path / "p.yaml")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "p.yaml").read_text()
    cfg = load_config(tmp_path / "p.yaml")
    assert [s.name for s in cfg.stages] == ["distill", "heads", "ffn", "vocab", "export", "fuse", "int8"]
    assert cfg.stages[0].params["student_layers"] == 1  # half of the tiny model's 2 layers
    assert cfg.data.max_length % 32 == 0 and cfg.data.max_length <= 128  # within the tiny model's positions
    assert cfg.runtime.latency.sequence_length == cfg.data.max_length
    assert cfg.stages[-1].gates.accuracy.max_drop == resolvable_drop(20) == 0.14
    said = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))  # the comments, unwrapped
    assert "train 160, validation 20, test 20 examples" in said and "2 labels (negative, positive)" in said
    assert invoke("validate", tmp_path / "p.yaml").exit_code == 0
    again = invoke("init", tiny_model_dir, data, "--out", tmp_path / "p.yaml")  # never over a file of the user's
    assert again.exit_code == 2 and "exists" in again.output and (tmp_path / "p.yaml").read_text() == text


def test_init_leaves_out_what_the_model_cannot_take_and_says_why(tmp_path, tokenizer, movie_data):
    from transformers import AlbertConfig, AlbertForSequenceClassification

    data = _csv(tmp_path / "d.csv", movie_data)
    model = save(tiny_distilbert(tokenizer), tokenizer, tmp_path / "distilbert")
    result = invoke("init", model, data)
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.output)
    assert [s["name"] for s in config["stages"]] == ["distill", "heads", "ffn", "vocab", "export", "fuse", "int8"]
    header = " ".join(line[2:] for line in result.output.splitlines() if line.startswith("# "))
    assert "DistilBertForSequenceClassification, 2 layers" in header and "None" not in header
    assert "hidden 32, FFN 64, 2 heads" in header and "2 labels (negative, positive), a WordPiece tokenizer" in header
    albert = AlbertConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    model = save(AlbertForSequenceClassification(albert), tokenizer, tmp_path / "albert")
    result = invoke("init", model, data)
    assert result.exit_code == 0, result.output
    assert [s["name"] for s in yaml.safe_load(result.output)["stages"]] == ["vocab", "export", "fuse", "int8"]
    assert "# heads left out: edgepress does not know the layer layout of albert models" in result.output
    assert "# distill left out: " in result.output and "# ffn left out: " in result.output


def test_the_final_gate_is_what_the_test_split_can_resolve():
    assert resolvable_drop(1057) == 0.02 and resolvable_drop(2176) == 0.015 and resolvable_drop(100_000) == 0.01


def test_init_names_the_fix_for_a_column_that_is_not_there(tmp_path, tiny_model_dir, movie_data):
    result = invoke("init", tiny_model_dir, _csv(tmp_path / "d.csv", movie_data), "--text-column", "review")
    assert result.exit_code == 2 and "review" in result.output and "Traceback" not in result.output
