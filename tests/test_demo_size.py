"""The guard of `make demo`'s size gate: what about the demo's final model is fixed without training — its shape and
its vocabulary — made from the encoder the demo teacher is fine-tuned from (cut to the demo's layers, heads and FFN,
a fresh head, no training: the bytes depend on the shape and the vocabulary alone), taken through the demo's own
vocab, export, fuse and int8 stages on its real train split and transfer texts, and the demo's size gate checked
on what comes out. No teacher is built; the full demo is `make demo` (and the slow tests)."""

import numpy as np
import pytest

from edgepress.pipeline import demo
from edgepress.pipeline.config import RuntimeConfig
from edgepress.runtime.latency import LatencyConfig

SIZE_STAGES = ["vocab", "export", "fuse", "int8"]  # the demo's stages after its training ones


def demo_stages() -> dict:
    """The shipped demo's stages, by method."""
    return {stage.method: stage for stage in demo.demo_config().stages}


@pytest.fixture(scope="module")
def demo_shape(tmp_path_factory, movie_data):
    """The demo's final torch shape, untrained: MiniLM-L6 with a fresh head, cut to the distill stage's layers, then
    to the heads and FFN neurons the heads and ffn stages keep (which ones does not change a byte)."""
    from edgepress.compress.distill import DistillConfig, make_student
    from edgepress.compress.structured import FfnConfig, HeadsConfig, keep_top, prune_ffn, prune_heads
    from edgepress.models.loading import with_new_head
    from edgepress.tasks import CLASSIFICATION
    from edgepress.teacher import encoder_dir

    stages = demo_stages()
    model, tokenizer = with_new_head(encoder_dir(), CLASSIFICATION.auto_class, movie_data.id2label, seed=0)
    student, _ = make_student(model, DistillConfig.model_validate(stages["distill"].params))
    layers, config = student.config.num_hidden_layers, student.config
    prune_heads(student, keep_top(np.zeros((layers, config.num_attention_heads)),
                                  HeadsConfig.model_validate(stages["heads"].params).keep))
    prune_ffn(student, keep_top(np.zeros((layers, config.intermediate_size)),
                                FfnConfig.model_validate(stages["ffn"].params).keep))
    path = tmp_path_factory.mktemp("demo-shape")
    CLASSIFICATION.save_model(student, path)
    tokenizer.save_pretrained(path)
    return path


def size_run_config(model_dir):
    """The demo's config with `model_dir` for its model and only its stages from vocab on, each with the demo's own
    params and fallbacks; the gates kept are the size gate and the parity limits on the graphs' logits (the methods'
    own agreement checks still run; an untrained head's accuracy says nothing, and speed is measured in
    benchmarks/), the latency timed briefly."""
    cfg = demo.demo_config()
    stages = []
    for stage in cfg.stages:
        if stage.name in SIZE_STAGES:
            parity = stage.gates.parity and stage.gates.parity.model_copy(update={"min_agreement": None})
            stages.append(stage.model_copy(update={"gates": stage.gates.model_copy(
                update={"accuracy": None, "latency": None, "parity": parity})}))
    fast = RuntimeConfig(threads=cfg.runtime.threads, latency=LatencyConfig(warmup=2, runs=5))
    return cfg.model_copy(update={"model": str(model_dir), "runtime": fast, "stages": stages})


def test_the_demo_config_is_valid_against_its_real_data_and_transfer_texts():
    from edgepress.pipeline.inputs import check_inputs

    cfg = demo.demo_config()
    _, data = check_inputs(cfg, build_teacher=False)  # the teacher's architecture and tokenizer, not built
    assert len(data.unlabeled) == cfg.data.transfer.max_texts == 25000
    assert [s.name for s in cfg.stages] == ["distill", "heads", "ffn", *SIZE_STAGES]
    assert demo_stages()["int8-dynamic"].gates.size.max_mb is not None


def test_the_demo_shape_meets_the_demo_size_gate_through_its_own_vocab_and_int8(demo_shape, tmp_path):
    from edgepress.pipeline.runner import run_pipeline

    cfg = size_run_config(demo_shape)
    assert cfg.data.transfer == demo.demo_config().data.transfer  # the demo's 25,000 transfer texts
    report = run_pipeline(cfg, tmp_path / "run")  # GateFailed (exit 3 in the CLI) where int8 misses the size gate
    assert [s["name"] for s in report["stages"]] == SIZE_STAGES
    assert all(s["status"] == "passed" for s in report["stages"])
    int8 = report["stages"][-1]
    limit = demo_stages()["int8-dynamic"].gates.size.max_mb
    size = next(g for g in int8["gates"] if g["kind"] == "size")
    assert size["limit"] == limit and size["passed"] and int8["metrics"]["size_bytes"] / 1e6 <= limit
    vocab = report["stages"][0]["details"]
    assert vocab["unlabeled_texts"] == 25000 and vocab["rows_after"] < vocab["rows_before"]
