"""The YAML loader under fuzzing: whatever a person (or a template gone wrong) writes, the answer is a valid config
or one ConfigError, never another exception."""

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgepress.errors import ConfigError
from edgepress.pipeline.config import PipelineConfig, load_config
from edgepress.registry import METHODS

KEYS = ["model", "data", "runtime", "stages", "source", "text_column", "label_column", "max_length", "split",
        "test", "validation", "seed", "providers", "target", "threads", "latency", "batch_size",
        "sequence_length", "warmup", "runs", "name", "method", "params", "gates", "on_fail", "fallback",
        "accuracy", "max_drop", "min", "parity", "max_abs_diff", "size", "max_mb", "provider", "min_speedup",
        "epochs", "per_channel", "student_layers", "keep", "disable", "opset"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from([*METHODS, "cpu", "cuda", "x86-vnni", "demo:minilm-movie", "1e-3", ""]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) |
                      st.dictionaries(st.sampled_from(KEYS), inner, max_size=4), max_leaves=16)
STAGE = st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "export", "bad name", ""]),
                               "method": st.sampled_from([*METHODS, "nope"])},
                              optional={"params": VALUES, "gates": VALUES, "on_fail": VALUES})
CONFIGS = st.dictionaries(st.sampled_from(["model", "data", "runtime", "stages", "extra"]),
                          VALUES | st.lists(STAGE, max_size=4), max_size=5)


def _load(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
        try:
            return load_config(path)
        except ConfigError as e:
            assert str(e)  # an error that says something
            return e


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS)
def test_plausible_mappings_give_a_config_or_a_config_error(data):
    result = _load(yaml.safe_dump(data, allow_unicode=True))
    assert isinstance(result, PipelineConfig | ConfigError)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gives_a_config_or_a_config_error(text):
    assert isinstance(_load(text), PipelineConfig | ConfigError)


@given(st.lists(st.sampled_from(["qkv", "", "ffn", 3, None]), min_size=1, max_size=3))
@settings(max_examples=20, deadline=None)
def test_a_list_of_refused_items_says_each_item_once_and_nothing_about_its_length(items):
    """A list field with a least length (lowrank's parts, here) whose every item is refused: each item's own line,
    not pydantic's echo that the list, emptied of them, is too short."""
    from pydantic import ValidationError

    from edgepress.compress.lowrank import LowRankConfig
    from edgepress.configs import describe_all

    try:
        LowRankConfig(parts=items)
    except ValidationError as e:
        lines = describe_all(e)
    assert len(lines) == len(items) and all(line.startswith(f"parts.{i}: ") for i, line in enumerate(lines))


def test_every_true_or_false_field_refuses_numbers_and_text():
    """Each field of every method's params that takes only true or false (found from the configs, not listed) is
    refused 1, 0.0, "yes" and "false" (pydantic would read them as booleans), its line naming the fix."""
    from edgepress.configs import _boolean, validated

    fields = [(method, name) for method, entry in METHODS.items()
              for name, field in entry.config.model_fields.items() if _boolean(field.annotation)]
    assert len(fields) >= 5  # only_where_faster, per_channel, ...
    for method, name in fields:
        for value in (1, 0.0, "yes", "false"):
            problems = validated(METHODS[method].config, {name: value})[1]
            assert f"{name}: should be true or false: got {value!r}. Fix: write true or false, unquoted" in \
                problems, (method, name, value, problems)
