"""The pipeline YAML: model, data, runtime, and stages with their gates. Strict: unknown keys are errors, every
problem is listed at once, and each stage's `params` are checked against its method's config."""

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from edgepress.compress.structured import factored_fix
from edgepress.configs import Logits, Megabytes, Milliseconds, PathText, Ratio, build, validated
from edgepress.data.config import DataConfig
from edgepress.deploy.targets import INT8_METHODS, TARGETS, detect_target, refusals, target_params
from edgepress.errors import ConfigError
from edgepress.registry import METHODS
from edgepress.runtime.latency import LatencyConfig

Strict = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
MODEL = ("a Hugging Face sequence-classification dir (save_pretrained), a sentence-transformers dir, or a demo model: "
         "demo:minilm-movie (the classifier), demo:minilm (the sentence encoder), demo:mpnet (all-mpnet-base-v2, a "
         "base-size sentence encoder: `make base-model`), demo:mpnet-movie (the base-size classifier: it fine-tuned "
         "on the demo's movie snippets, built on first use)")
MAX_THREADS = 1024
Target = Literal[tuple(TARGETS)]  # x86-vnni, x86-avx2, arm64, cuda, mobile, web


class AccuracyGate(BaseModel):
    """Accuracy limits, as fractions: `max_drop` vs the baseline, `max_stage_drop` vs the stage before, `min`.
    `strict`: `max_drop` holds the upper end of the paired 95% CI of the drop (the drop the test split cannot rule
    out), not its point estimate."""

    model_config = Strict
    max_drop: float | None = Field(None, ge=0, le=1, description="largest drop against the baseline (0.01: one "
                                                               "point)")
    max_stage_drop: float | None = Field(None, ge=0, le=1, description="largest drop against the stage before")
    min: float | None = Field(None, ge=0, le=1, description="lowest accuracy accepted")
    strict: bool = Field(False, description="max_drop against the upper end of the paired 95% CI of the drop")
    metric: Literal["accuracy", "neighbour_overlap", "spearman", "f1"] | None = Field(
        None, description="the metric these limits judge; unset: the task's primary (a classifier's accuracy, an "
        "embedder's neighbour_overlap, a token classifier's entity-level f1); spearman: an embedder's on data.pairs")

    @model_validator(mode="after")
    def _strict_needs_max_drop(self) -> "AccuracyGate":
        if self.strict and self.max_drop is None:
            raise ValueError("accuracy.strict applies to max_drop, which is not set. Fix: add max_drop (e.g. "
                             "max_drop: 0.02), or remove strict")
        return self


class LatencyGate(BaseModel):
    """Latency limits on one provider at the runtime's fixed shape; `min_speedup` is baseline p50 / stage p50, timed
    side by side so that a load on the machine falls on both; `min_natural_speedup` the same at the test texts'
    natural lengths (cut at data.max_length, as the bundle reads them), one text a call (as a device embeds or labels
    them)."""

    model_config = Strict
    provider: Literal["cpu", "cuda"] = Field("cpu", description="whose latency is judged (one of "
                                                   "runtime.providers)")
    max_p50_ms: Milliseconds | None = Field(None, description="largest median latency at runtime.latency's shape")
    max_p90_ms: Milliseconds | None = Field(None, description="largest 90th-percentile latency")
    max_p99_ms: Milliseconds | None = Field(None, description="largest 99th-percentile latency, the tail a device "
                                            "meets once in a hundred calls (over runtime.latency.runs calls: give "
                                            "it 200 or more, so that it is not one slow call's)")
    min_speedup: Ratio | None = Field(None, description="smallest baseline p50 / stage p50, the two timed "
                                                              "again side by side, in turns, when the stage is "
                                                              "measured (cpu only: the torch baseline is timed on "
                                                              "cpu)")
    min_natural_speedup: Ratio | None = Field(None, description="smallest baseline p50 / stage p50 at the "
                                              "test texts' natural lengths (cut at data.max_length, as the "
                                              "bundle reads them), one text a call, timed side by side as "
                                              "min_speedup is (cpu only)")


class SizeGate(BaseModel):
    """Size limits: `max_mb` of the weight files, `min_ratio` = baseline size / stage size."""

    model_config = Strict
    max_mb: Megabytes | None = Field(None, description="largest size of the weight files, in MB (10^6 bytes)")
    min_ratio: Ratio | None = Field(None, description="smallest baseline size / stage size")


class ParityGate(BaseModel):
    """Parity of an ONNX artifact with the model it came from (checked by the method itself)."""

    model_config = Strict
    max_abs_diff: Logits | None = Field(None, description="largest |logit difference| (the method's own "
                                                             "parity tolerance)")
    min_agreement: float | None = Field(None, ge=0, le=1, description="smallest share of the same labels")


class FidelityGate(BaseModel):
    """Fidelity: how often a stage labels a text as the baseline (the model the user trusts) labels it, on each set
    of `on`. `strict`: the lower end of the agreement's 95% CI must reach the limit, not its point estimate."""

    model_config = Strict
    min_agreement: float | None = Field(None, ge=0, le=1, description="smallest share of texts labelled as the "
                                                                      "baseline labels them, on each set of `on`")
    strict: bool = Field(False, description="min_agreement against the lower end of the agreement's 95% CI")
    on: tuple[str, ...] = Field(("test",), min_length=1, description="the sets held to it: test, typos (the test "
                                "split with a typo in about one word of six), or names of data.fidelity_sets")


class Gates(BaseModel):
    """What a stage's result must meet: each kind sets at least one limit."""

    model_config = Strict
    accuracy: AccuracyGate | None = Field(None, description="on the test split, with CIs")
    latency: LatencyGate | None = Field(None, description="at runtime.latency's fixed shape (min_natural_speedup: at "
                                                          "the test texts' natural lengths)")
    size: SizeGate | None = Field(None, description="of the stage's weight files")
    parity: ParityGate | None = Field(None, description="of an ONNX artifact with the model it came from")
    fidelity: FidelityGate | None = Field(None, description="agreement with the baseline's labels on the test "
                                          "split or other sets (on)")

    @model_validator(mode="after")
    def _each_sets_a_limit(self) -> "Gates":
        problems = []
        for kind, gate in self:
            limits = [name for name in type(gate).model_fields if name not in ("provider", "strict", "on", "metric")] \
                if gate else []
            if gate is not None and all(getattr(gate, name) is None for name in limits):
                problems.append(f"the {kind} gate sets no limit: give at least one of {', '.join(limits)}")
        if problems:
            raise ValueError("\n  ✗ ".join(problems))
        return self


def params_dict(value: Any, info: ValidationInfo) -> Any:
    """A method's params as a config holds them: a params object built in code (`Int8DynamicConfig(...)`) becomes
    the dict of the fields it was given, once it is the method's own class; anything else is checked as it is."""
    method = METHODS.get(info.data.get("method"))  # an unknown one: check_method says so
    if isinstance(value, BaseModel) and method is not None and type(value) is not method.config:
        raise ValueError(f"method {info.data['method']} takes {method.config.__name__} params, not "
                         f"{type(value).__name__}. Fix: params={method.config.__name__}(...), or a dict of its fields")
    return value.model_dump(mode="json", exclude_unset=True) if isinstance(value, BaseModel) else value


Params = Annotated[dict[str, Any], BeforeValidator(params_dict)]  # a dict, or the method's params object


class Alternative(BaseModel):
    """A method (with params) to try when a stage misses a gate."""

    model_config = Strict
    method: str = Field(description="a registry method")
    params: Params = Field({}, description="the method's params (Methods reference)")

    @model_validator(mode="after")
    def _known_method_and_params(self) -> "Alternative":
        check_method(self.method, self.params)
        return self


class OnFail(BaseModel):
    """The alternatives a stage tries when its method fails or misses a gate."""

    model_config = Strict
    fallback: list[Alternative] = Field(default_factory=list, description="tried in order until one passes "
                                        "the stage's gates")


class StageConfig(BaseModel):
    """One stage: a name, a registry method, its params, its gates, and what to try when a gate fails."""

    model_config = Strict
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="unique in the pipeline; names the "
                                                                     "stage's dir (stages/NN-name)")
    method: str = Field(description="a registry method")
    params: Params = Field({}, description="the method's params (Methods reference)")
    gates: Gates = Field(Gates(), description="what the stage's result must meet")
    on_fail: OnFail = Field(OnFail(), description="what to try when a gate is missed or the method fails")

    @model_validator(mode="after")
    def _known_method_and_params(self) -> "StageConfig":
        check_method(self.method, self.params)
        return self

    @property
    def attempts(self) -> list[tuple[str, dict[str, Any]]]:
        """(method, params) of the stage's own attempt, then of each fallback, in the order they are tried."""
        return [(self.method, self.params), *((a.method, a.params) for a in self.on_fail.fallback)]


class RuntimeConfig(BaseModel):
    """Where and how every stage is measured."""

    model_config = Strict
    providers: tuple[Literal["cpu", "cuda"], ...] = Field(("cpu",), min_length=1, description="execution "
                                                            "providers every stage's latency is measured on")
    target: Target | None = Field(None, description="where the bundle will run (Targets reference); unset: "
                                  "this machine's")
    threads: int = Field(2, ge=1, le=MAX_THREADS, description="intra-op threads of every timing session")
    latency: LatencyConfig = Field(LatencyConfig(), description="the fixed shape and runs latency is timed at")
    launch: str | None = Field(None, min_length=1, description="a launcher command the training stages run under, "
                               "e.g. `accelerate launch --multi_gpu --num_processes 8` (pipeline/launch.py)")

    @field_validator("launch")
    @classmethod
    def _a_launcher(cls, launch: str | None) -> str | None:
        from edgepress.pipeline.launch import launch_command

        if launch is not None:
            launch_command(launch)  # parses, is an accelerate or torch launcher, and is installed
        return launch


class PipelineConfig(BaseModel):
    """A whole run: `edgepress run CONFIG.yaml --out RUN_DIR`."""

    model_config = Strict
    model: PathText = Field("demo:minilm-movie", description=MODEL)
    task: Literal["classification", "embedding", "token-classification"] | None = Field(
        None, description="what the model does: classification (a sequence classifier: labels, judged by accuracy), "
        "embedding (a sentence-transformers dir: sentence vectors, judged by their agreement with the baseline's "
        "neighbours) or token-classification (NER: a tag per word, judged by entity-level F1); read from the model "
        "dir when left out (a dir with modules.json is an embedding model, one whose config.json names a "
        "...ForTokenClassification a token classifier)")
    data: DataConfig = Field(DataConfig(), description="the examples, their columns and splits")
    runtime: RuntimeConfig = Field(RuntimeConfig(), description="where and how every stage is measured")
    stages: list[StageConfig] = Field(default_factory=list, description="run in order, each gated")

    @field_validator("stages")
    @classmethod
    def _unique_names(cls, stages: list[StageConfig]) -> list[StageConfig]:
        names = [s.name for s in stages]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"stage names must be unique; repeated: {', '.join(repeated)}")
        return stages

    @model_validator(mode="after")
    def _runnable(self) -> "PipelineConfig":
        problems = [*stage_order_problems(self.stages), *latency_gate_problems(self.stages, self.runtime.providers),
                    *parity_gate_problems(self.stages), *fidelity_set_problems(self.stages, self.data)]
        if self.runtime.target is not None:
            problems += refusals(self.runtime.target, [(s.name, m) for s in self.stages for m in _methods(s)])
            problems += full_range_problems(self.stages, self.runtime.target)
        if problems:
            raise ValueError("\n  ✗ ".join(problems))
        return self


def fidelity_set_problems(stages: list[StageConfig], data: DataConfig) -> list[str]:
    """A fidelity gate on a set the run does not measure."""
    known = ("test", "typos", *data.fidelity_sets)
    return [f"stage {s.name}: fidelity.on names {', '.join(map(repr, unknown))}, which the run does not measure. "
            f"Fix: test, typos, or a set named in data.fidelity_sets ({', '.join(data.fidelity_sets) or 'none'})"
            for s in stages if s.gates.fidelity and (unknown := [n for n in s.gates.fidelity.on if n not in known])]


def with_target(target: str, method: str, params: dict) -> tuple[dict, dict]:
    """`target_params` with the method's own `per_channel` default (True for a method without the field: qat is
    per channel)."""
    field = METHODS[method].config.model_fields.get("per_channel")
    return target_params(target, method, params, True if field is None else bool(field.default))


def full_range_problems(stages: list[StageConfig], target: str) -> list[str]:
    """For x86-avx2: each int8 attempt whose weights would be full range (per-tensor scales, for which the target
    fills in no reduce_range, or reduce_range: false). Its bundle is refused unless the run was measured on a CPU
    without VNNI, where any saturation is in the accuracy the gates passed: on any other machine, say so now."""
    if target != "x86-avx2" or detect_target() == "x86-avx2":
        return []
    return [f"stage '{stage.name}' ({method}): its int8 weights would be full range (reduce_range off), which target "
            f"x86-avx2 refuses unless measured on a CPU without VNNI (this one has VNNI). Fix: per_channel: true "
            f"(the target then sets reduce_range: true), or reduce_range: true, or target x86-vnni"
            for stage in stages for method, params in stage.attempts
            if method in INT8_METHODS and not with_target(target, method, params)[0].get("reduce_range")]


def _methods(stage: StageConfig) -> list[str]:
    return [method for method, _ in stage.attempts]


def stage_order_problems(stages: list[StageConfig]) -> list[str]:
    """Each stage's method (and every fallback) must take what the stage before gives (registry kinds), and none
    may cut a part a stage before it factored (`Method.cuts`, `Method.factors`), and a method that cuts a model once
    (`Method.once`) is in one stage, and no part is factored by two stages."""
    from edgepress.registry import KIND_WORDS

    problems, kinds, source, qat, cut, parts = [], {"torch"}, "the model", None, {}, {}
    for stage in stages:
        for method, params in stage.attempts:
            whole = [part for part in METHODS[method].cuts if part in parts]
            if whole:
                this, before = f"stage '{stage.name}'", f"stage '{parts[whole[0]]}'"
                problems.append(f"{this} ({method}) cuts {', '.join(whole)} whole; {before} stores "
                                f"{'it' if len(whole) == 1 else 'them'} as factors before it. "
                                f"{factored_fix(this, whole, before)}")
            factors = METHODS[method].factored(params)
            again = [part for part in factors if parts.get(part, stage.name) != stage.name]
            if again:
                problems.append(f"stage '{stage.name}' ({method}) would factor again {', '.join(again)}, which stage "
                                f"'{parts[again[0]]}' factors before it. Fix: one {method} stage for each part")
            parts.update({part: parts.get(part, stage.name) for part in factors})
            if cut.get(method, stage.name) != stage.name:
                problems.append(f"stage '{stage.name}' ({method}) would cut again what stage '{cut[method]}' cut: "
                                f"{method} takes a model it has not cut. Fix: one {method} stage, with the keep you "
                                f"want in the end")
            if METHODS[method].once:
                cut.setdefault(method, stage.name)
            wrong = sorted(kinds - set(METHODS[method].takes))
            if wrong:
                takes = " or ".join(KIND_WORDS[k] for k in METHODS[method].takes)
                fix = ("order the stages torch → export → ONNX stages; see README for what each method takes"
                       if qat is None else
                       f"only export may follow qat (stage '{qat}', as its method or a fallback), and its export is "
                       f"the int8 graph already: remove {method} or the qat")
                problems.append(f"stage '{stage.name}' ({method}) needs {takes} but gets {KIND_WORDS[wrong[0]]} "
                                f"from {source}. Fix: {fix}")
        kinds = {METHODS[m].output(k) for m in _methods(stage) for k in kinds}
        source, qat = f"stage '{stage.name}'", stage.name if "torch-qat" in kinds else qat
    return problems


def _speedup_rule(gate: LatencyGate) -> str | None:
    """The first speedup rule `gate` sets (min_speedup, min_natural_speedup), None when it sets neither."""
    return next((rule for rule in ("min_speedup", "min_natural_speedup") if getattr(gate, rule) is not None), None)


def latency_gate_problems(stages: list[StageConfig], providers: tuple[str, ...]) -> list[str]:
    """A latency gate must be on a provider the run measures; torch artifacts (and so the baseline, which
    `min_speedup` divides by) are timed on cpu only."""
    from edgepress.registry import TORCH

    problems, kinds = [], {"torch"}
    for stage in stages:
        gate = stage.gates.latency
        kinds = {METHODS[m].output(k) for m in _methods(stage) for k in kinds}
        if gate is None:
            continue
        if gate.provider not in providers:
            problems.append(f"stage '{stage.name}': its latency gate is on {gate.provider}, which runtime.providers "
                            f"({', '.join(providers)}) does not measure. Fix: add {gate.provider} to "
                            f"runtime.providers or set the gate's provider to one of them")
        elif gate.provider != "cpu" and (rule := _speedup_rule(gate)):
            problems.append(f"stage '{stage.name}': {rule} on {gate.provider} divides by the baseline's "
                            f"{gate.provider} latency, but the baseline (torch) is timed on cpu only. Fix: use "
                            f"max_p50_ms / max_p90_ms / max_p99_ms on {gate.provider}, or {rule} on cpu")
        elif gate.provider != "cpu" and kinds & set(TORCH):
            problems.append(f"stage '{stage.name}' gives a torch model, timed on cpu only; its latency gate is on "
                            f"{gate.provider}. Fix: gate latency on {gate.provider} after the export stage")
    return problems


def parity_gate_problems(stages: list[StageConfig]) -> list[str]:
    """A parity gate belongs on a stage whose methods check parity (they make or rewrite a graph): on any other it
    could never be measured, and the run would fail it after training."""
    problems = []
    for stage in stages:
        unchecked = [m for m in _methods(stage) if "parity" not in METHODS[m].config.model_fields]
        if stage.gates.parity is not None and unchecked:
            problems.append(f"stage '{stage.name}' ({', '.join(_methods(stage))}) has a parity gate, but "
                            f"{', '.join(unchecked)} checks no parity (it makes a torch model). Fix: put the parity "
                            f"gate on the export stage or an ONNX stage")
    return problems


def check_method(method: str, params: dict[str, Any]) -> None:
    """`method` must be in the registry and `params` must fit its config."""
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}': choose from {', '.join(METHODS)}")
    problems = validated(METHODS[method].config, params)[1]
    if problems:
        raise ValueError(f"params of {method}: {'; '.join(problems)}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key written twice in one mapping is an error (PyYAML keeps the last). A merge
    (`<<: *anchor`) is YAML's own: the keys written beside it win over the merged ones."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # the safe loader's flatten_mapping takes it
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping (first on line "
                    f"{seen[key].start_mark.line + 1}); edgepress does not guess which one you meant",
                    key_node.start_mark)
            if isinstance(key, Hashable):
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML's) reads 2e-5 and 1e9 as text: a float needs a dot there. YAML 1.2 and every other reader take
# them as numbers, and people write learning rates so: the loader does too (its own resolver lists, not the
# SafeLoader's, which other code shares)
_UniqueKeyLoader.yaml_implicit_resolvers = {first: list(resolvers) for first, resolvers
                                           in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                       re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                       list("-+0123456789"))

# YAML 1.1 reads on, off, yes, no (and y, n) as booleans: `fidelity: {on: [typos]}` became {True: [typos]}. YAML 1.2
# has true and false alone, and so has this loader
for _first, _resolvers in _UniqueKeyLoader.yaml_implicit_resolvers.items():
    _resolvers[:] = [(tag, regexp) for tag, regexp in _resolvers if tag != "tag:yaml.org,2002:bool"]
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                       list("tTfF"))

MAX_VALUES = 100_000  # a pipeline has hundreds; more means YAML aliases multiplying (a "billion laughs" file)


class _HoldsItself(ValueError):
    """A YAML alias used inside the node it names (`&a [*a]`): a value that never ends."""


def _expanded_size(value: Any, sizes: dict[int, int | None]) -> int:
    """How many values `value` holds once YAML aliases are expanded (each shared node counted once per use);
    `_HoldsItself` where a node holds itself."""
    if not isinstance(value, dict | list):
        return 1
    if id(value) not in sizes:
        sizes[id(value)] = None  # being counted: met again below it, it holds itself
        children = value.values() if isinstance(value, dict) else value
        sizes[id(value)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    if sizes[id(value)] is None:
        raise _HoldsItself
    return sizes[id(value)]


def read_yaml(path: Path) -> Any:
    """The parsed YAML file at `path`; every way it can be unreadable is a ConfigError naming the fix."""
    if path.is_dir():
        raise ConfigError(f"config {path} is a directory. Fix: give the path of a pipeline YAML file inside it")
    if path.exists() and not path.is_file():
        raise ConfigError(f"config {path} is not a file (a device, a pipe or a socket). Fix: give the path of a "
                          f"pipeline YAML file")
    if not path.is_file():
        raise ConfigError(f"config {path} does not exist. Fix: give the path of a pipeline YAML (see README)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path} is not UTF-8 text ({e.reason} at byte {e.start}). "
                          f"Fix: save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"config {path} cannot be read: {e.strerror}. Fix: check its permissions") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        size = _expanded_size(data, {})
    except yaml.YAMLError as e:
        where = str(e).replace('"<unicode string>"', str(path))
        raise ConfigError(f"{path} is not valid YAML: {where}\nFix: correct the YAML at that line (a pipeline config "
                          f"is a mapping of model, data, runtime and stages, as in examples/)") from None
    except _HoldsItself:
        raise ConfigError(f"{path} uses a YAML alias inside the value it names (as in `a: &x [*x]`), a value without "
                          f"end. Fix: write that value out instead of the alias") from None
    except RecursionError:
        raise ConfigError(f"{path} nests too deeply to be a pipeline config. Fix: write it flat") from None
    if size > MAX_VALUES:
        raise ConfigError(f"{path} expands to more than {MAX_VALUES:,} values (YAML aliases repeating each other?). "
                          f"Fix: write the config without nested aliases")
    return data


SEARCH_SECTIONS = ("constraints", "objective", "space")  # what only a search config has (edgepress.search.config)


def is_search(data: Any) -> bool:
    """Whether a parsed config is a search's, not a pipeline's: a section only a search has, and no stages."""
    return isinstance(data, dict) and "stages" not in data and any(key in data for key in SEARCH_SECTIONS)


def load_config(path: str | Path) -> PipelineConfig:
    """Read and check a pipeline YAML; every problem is listed in one ConfigError."""
    return pipeline_config(read_yaml(Path(path)), Path(path))


def pipeline_config(data: Any, path: Path) -> PipelineConfig:
    """Check what `read_yaml(path)` read as a pipeline config; every problem is listed in one ConfigError."""
    if data is None:
        raise ConfigError(f"{path} is empty. Fix: write at least the model, data and stages of a pipeline (see "
                          f"examples/ and the README)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping with model, data, runtime and stages (it holds a "
                          f"{type(data).__name__}). Fix: write it as `key: value` lines (`edgepress init` writes one "
                          f"to start from)")
    if is_search(data):
        sections = ", ".join(key for key in SEARCH_SECTIONS if key in data)
        raise ConfigError(f"{path} is a search config ({sections}, no stages): a search writes the pipelines itself. "
                          f"Fix: `edgepress search {path} --out SEARCH_DIR`, or a pipeline config with stages "
                          f"(see examples/)")
    if sections := ", ".join(key for key in SEARCH_SECTIONS if key in data):
        raise ConfigError(f"{path} holds a pipeline's stages and a search's {sections}: one config is one or the "
                          f"other. Fix: keep the stages for `edgepress run`, or the search's sections without "
                          f"stages for `edgepress search`")
    return build(PipelineConfig, data, where=str(path))


def with_runtime(cfg: PipelineConfig, flag: str, **changes: Any) -> PipelineConfig:
    """`cfg` with its runtime section changed from the command line (`--device`, `--target`), validated again:
    its gates and stages must still make sense."""
    runtime = {**cfg.runtime.model_dump(mode="json"), **changes}
    return build(PipelineConfig, {**cfg.model_dump(mode="json"), "runtime": runtime}, where=f"the config with {flag}")
