"""The pipeline YAML: model, data, runtime, and stages with their gates. Strict: unknown keys are errors, every
problem is listed at once, and each stage's `params` are checked against its method's config."""

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgepress.configs import build
from edgepress.data.config import DataConfig
from edgepress.errors import ConfigError
from edgepress.registry import METHODS
from edgepress.runtime.latency import LatencyConfig

Strict = ConfigDict(extra="forbid", frozen=True)
Target = Literal["x86-vnni", "x86-avx2", "arm64", "cuda", "mobile", "web"]


class AccuracyGate(BaseModel):
    """Accuracy limits, as fractions: `max_drop` vs the baseline, `max_stage_drop` vs the stage before, `min`."""

    model_config = Strict
    max_drop: float | None = Field(None, ge=0, le=1)
    max_stage_drop: float | None = Field(None, ge=0, le=1)
    min: float | None = Field(None, ge=0, le=1)


class LatencyGate(BaseModel):
    """Latency limits on one provider at the runtime's fixed shape; `min_speedup` is baseline p50 / stage p50."""

    model_config = Strict
    provider: Literal["cpu", "cuda"] = "cpu"
    max_p50_ms: float | None = Field(None, gt=0)
    max_p90_ms: float | None = Field(None, gt=0)
    min_speedup: float | None = Field(None, gt=0)


class SizeGate(BaseModel):
    """Size limits: `max_mb` of the weight files, `min_ratio` = baseline size / stage size."""

    model_config = Strict
    max_mb: float | None = Field(None, gt=0)
    min_ratio: float | None = Field(None, gt=0)


class ParityGate(BaseModel):
    """Parity of an ONNX artifact with the model it came from (checked by the method itself)."""

    model_config = Strict
    max_abs_diff: float | None = Field(None, gt=0)
    min_agreement: float | None = Field(None, ge=0, le=1)


class Gates(BaseModel):
    model_config = Strict
    accuracy: AccuracyGate | None = None
    latency: LatencyGate | None = None
    size: SizeGate | None = None
    parity: ParityGate | None = None

    @model_validator(mode="after")
    def _each_sets_a_limit(self) -> "Gates":
        for kind, gate in self:
            limits = [name for name in type(gate).model_fields if name != "provider"] if gate else []
            if gate is not None and all(getattr(gate, name) is None for name in limits):
                raise ValueError(f"the {kind} gate sets no limit: give at least one of {', '.join(limits)}")
        return self


class Alternative(BaseModel):
    """A method (with params) to try when a stage misses a gate."""

    model_config = Strict
    method: str
    params: dict[str, Any] = {}

    @model_validator(mode="after")
    def _known_method_and_params(self) -> "Alternative":
        check_method(self.method, self.params)
        return self


class OnFail(BaseModel):
    model_config = Strict
    fallback: list[Alternative] = Field(default_factory=list)


class StageConfig(BaseModel):
    """One stage: a name, a registry method, its params, its gates, and what to try when a gate fails."""

    model_config = Strict
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    method: str
    params: dict[str, Any] = {}
    gates: Gates = Gates()
    on_fail: OnFail = OnFail()

    @model_validator(mode="after")
    def _known_method_and_params(self) -> "StageConfig":
        check_method(self.method, self.params)
        return self


class RuntimeConfig(BaseModel):
    """Where and how every stage is measured."""

    model_config = Strict
    providers: tuple[Literal["cpu", "cuda"], ...] = Field(("cpu",), min_length=1)
    target: Target | None = None
    threads: int = Field(2, ge=1)
    latency: LatencyConfig = LatencyConfig()


class PipelineConfig(BaseModel):
    """A whole run: `edgepress run CONFIG.yaml --out RUN_DIR`."""

    model_config = Strict
    model: str = "demo:minilm-movie"
    data: DataConfig = DataConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    stages: list[StageConfig] = Field(default_factory=list)

    @field_validator("stages")
    @classmethod
    def _stages_chain(cls, stages: list[StageConfig]) -> list[StageConfig]:
        names = [s.name for s in stages]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"stage names must be unique; repeated: {', '.join(repeated)}")
        kind = "torch"
        for stage in stages:
            method = METHODS[stage.method]
            if method.takes != kind:
                raise ValueError(f"stage '{stage.name}' ({stage.method}) needs a {method.takes} model but gets a "
                                 f"{kind} one; put torch stages first, then export, then ONNX stages")
            kind = method.gives
        return stages


def check_method(method: str, params: dict[str, Any]) -> None:
    """`method` must be in the registry and `params` must fit its config."""
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}': choose from {', '.join(METHODS)}")
    try:
        METHODS[method].config.model_validate(params)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"params of {method}: {problems}") from None


def load_config(path: str | Path) -> PipelineConfig:
    """Read and check a pipeline YAML; every problem is listed in one ConfigError."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config {path} does not exist. Fix: give the path of a pipeline YAML (see README)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping with model, data, runtime and stages")
    return build(PipelineConfig, data, where=str(path))
