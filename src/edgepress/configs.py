"""Strict configs: a pydantic validation failure becomes one ConfigError with a line per wrong field."""

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from edgepress.errors import ConfigError

Config = TypeVar("Config", bound=BaseModel)


def _describe(error: dict) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key (check its spelling; see the README for the keys this section takes)"
    got = f": got {error['input']!r}" if "input" in error and not isinstance(error["input"], dict) else ""
    return f"{where}: {error['msg']}{got}"


def build(cls: type[Config], data: dict[str, Any] | None = None, where: str = "config", **values: Any) -> Config:
    """`cls(**data, **values)`, with every validation failure listed in one ConfigError."""
    try:
        return cls.model_validate({**(data or {}), **values})
    except ValidationError as e:
        lines = "\n".join(f"  ✗ {_describe(error)}" for error in e.errors())
        raise ConfigError(f"{where} is not valid ({e.error_count()} problem(s)):\n{lines}") from None
