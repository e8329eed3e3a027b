"""Strict configs: a pydantic validation failure becomes one ConfigError with a line per wrong field, in the words
of someone writing YAML (a list, a mapping), not pydantic's ("valid tuple", "instance of SplitConfig")."""

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from edgepress.errors import ConfigError

Config = TypeVar("Config", bound=BaseModel)

# pydantic error type -> what a person writing the YAML or the command line should read instead
PLAIN_WORDS = {
    "tuple_type": "should be a list, e.g. [a, b]",
    "list_type": "should be a list, e.g. [a, b]",
    "model_type": "should be a mapping of keys to values, e.g. {key: value}",
    "model_attributes_type": "should be a mapping of keys to values, e.g. {key: value}",
    "dict_type": "should be a mapping of keys to values, e.g. {key: value}",
    "missing": "is required",
    "string_type": "should be text",
    "int_type": "should be a whole number",
    "int_parsing": "should be a whole number",
    "int_from_float": "should be a whole number",
    "float_type": "should be a number",
    "float_parsing": "should be a number",
    "bool_type": "should be true or false",
    "bool_parsing": "should be true or false",
}
SHOWN_INPUT = 60  # characters of a wrong value quoted back


def describe(error: dict) -> str:
    """One line for one pydantic error: where, what is wrong, and the value given when it is short."""
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key (check its spelling; see the README for the keys this section takes)"
    message = PLAIN_WORDS.get(error["type"], error["msg"].removeprefix("Value error, "))
    value = error.get("input")
    shown = repr(value)
    got = f": got {shown}" if "input" in error and not isinstance(value, dict | list | tuple) and \
        len(shown) <= SHOWN_INPUT and error["type"] != "missing" else ""
    return f"{where}: {message}{got}" if where else message


def changed(cfg: BaseModel, names: tuple[str, ...]) -> list[str]:
    """The fields among `names` that `cfg` sets to something other than their default (a param that only one
    choice of another uses must not be given, and silently ignored, with the other choices)."""
    fields = type(cfg).model_fields
    return [n for n in names if getattr(cfg, n) != fields[n].default]


def describe_all(error: ValidationError) -> list[str]:
    return [describe(e) for e in error.errors()]


def build(cls: type[Config], data: dict[str, Any] | None = None, where: str = "config", **values: Any) -> Config:
    """`cls(**data, **values)`, with every validation failure listed in one ConfigError."""
    try:
        return cls.model_validate({**(data or {}), **values})
    except ValidationError as e:
        lines = "\n".join(f"  ✗ {line}" for line in describe_all(e))  # a line may hold several (a validator's)
        raise ConfigError(f"{where} is not valid ({lines.count('✗')} problem(s)):\n{lines}") from None
