"""Strict configs: a pydantic validation failure becomes one ConfigError with a line per wrong field, in the words
of someone writing YAML (a list, a mapping), not pydantic's ("valid tuple", "instance of SplitConfig")."""

from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, Field, ValidationError

from edgepress.errors import ConfigError

Config = TypeVar("Config", bound=BaseModel)

# The bounds numeric config fields take (the schema, an editor and `validate` show them): a value outside is refused
# before anything runs, and no value inside overflows what reads it. Every numeric field has a lower and an upper
# bound (tests/test_faults.py walks the schemas for one without).
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]  # what numpy's and torch's generators both take
Epochs = Annotated[int, Field(ge=1, le=1000)]
Layers = Annotated[int, Field(ge=1, le=256)]  # encoder layers of a student
LayerIndex = Annotated[int, Field(ge=0, le=255)]
Tokens = Annotated[int, Field(ge=8, le=8192)]  # tokens per text after truncation
TextCount = Annotated[int, Field(ge=1, le=10**9)]  # texts, words, steps: as many as a machine could hold
Milliseconds = Annotated[float, Field(gt=0, le=1e7)]
Megabytes = Annotated[float, Field(gt=0, le=1e6)]
Ratio = Annotated[float, Field(gt=0, le=1e4)]  # a speedup or a size ratio
Threads = Annotated[int, Field(ge=1, le=1024)]
Share = Annotated[float, Field(gt=0, le=1)]  # of heads, neurons: (0, 1]
Logits = Annotated[float, Field(gt=0, le=1e6)]  # a tolerance on |logit difference|


def names_something(value):
    """A path as a config or the command line writes it names something: an empty one would be read as the working
    directory (and the command line's is often a variable that is not set)."""
    if not isinstance(value, str | Path):
        return value  # the field's type says what it should be
    if not str(value).strip():
        raise ValueError("should name a file or directory, not be empty")
    if "\x00" in str(value):
        raise ValueError("holds a NUL character, which no path can")
    return value


PathText = Annotated[str, BeforeValidator(names_something)]  # a file, a directory or a demo: name
PathName = Annotated[Path, BeforeValidator(names_something)]

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
    "finite_number": "should be a finite number",
}
SHOWN_INPUT = 60  # characters of a wrong value quoted back
FIX = ("Fix: give each field above a value it takes (docs/reference/ lists every field with its type and bounds; "
       "`edgepress schema` gives them to an editor)")


# the start of a tagged union's tags: the form a field is written in, which is no key of the YAML and is left out
# of the place an error names (data.unlabeled.max_texts, not data.unlabeled.form:mapping.max_texts)
FORM = "form:"


def describe(error: dict) -> str:
    """One line for one pydantic error: where, what is wrong, and the value given when it is short."""
    where = ".".join(str(part) for part in error["loc"] if not str(part).startswith(FORM))
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key (check its spelling; docs/reference/ lists the keys each section takes)"
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


def recorded_is(recorded: Any, current: BaseModel) -> bool:
    """`recorded` (a config an earlier run wrote to disk) is `current`: read as `current`'s class, a field added
    since taking its default; a record that no longer validates (a field gone, not a mapping) is not."""
    try:
        return type(current).model_validate(recorded) == current
    except ValidationError:
        return False


def describe_all(error: ValidationError) -> list[str]:
    """`describe`'s lines, less the echoes: a list whose items were refused is also "too short" after validation,
    without them (pydantic counts what passed), which says nothing the item's own line does not."""
    errors = error.errors()
    items = {tuple(e["loc"][:-1]) for e in errors if e["loc"] and isinstance(e["loc"][-1], int)}
    return [describe(e) for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in items)]


def _options(annotation: Any) -> tuple:
    """The types a field takes: each of a union's, an Annotated type's own (its bounds aside)."""
    if get_origin(annotation) is Annotated:
        return _options(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return tuple(option for arg in get_args(annotation) for option in _options(arg))
    return (annotation,)


def _numeric(annotation: Any) -> bool:
    """The field takes a number (int or float, alone or in a union) and not true/false."""
    options = _options(annotation)
    return bool(set(options) & {int, float}) and bool not in options


def _boolean(annotation: Any) -> bool:
    """The field takes true or false, and no number or text."""
    options = _options(annotation)
    return bool in options and not set(options) & {int, float, str}


def _numeric_items(annotation: Any) -> bool:
    """The field takes a list of numbers."""
    return any(get_origin(o) in (list, tuple) and get_args(o) and _numeric(get_args(o)[0])
               for o in _options(annotation))


def _boolean_items(annotation: Any) -> bool:
    """The field takes a list of true or false."""
    return any(get_origin(o) in (list, tuple) and get_args(o) and _boolean(get_args(o)[0])
               for o in _options(annotation))


def _model(annotation: Any) -> type[BaseModel] | None:
    options = _options(annotation)
    return next((o for o in options if isinstance(o, type) and issubclass(o, BaseModel)), None)


def _list_of_models(annotation: Any) -> type[BaseModel] | None:
    """The model of a `list[Model]` field, else None."""
    items = get_args(annotation)
    return _model(items[0]) if items else None


def not_numbers(cls: type[BaseModel], data: dict[str, Any], prefix: str = "") -> list[str]:
    """Lines for every true/false or text given where only a number belongs (pydantic reads `epochs: true` as 1
    epoch and `epochs: "1"` as 1), and every number or text where only true or false does (it reads `"yes"` and 1
    as true)."""
    lines = []
    for name, value in data.items():
        field = cls.model_fields.get(name)
        if field is None:
            continue
        if isinstance(value, bool) and _numeric(field.annotation):
            lines.append(f"{prefix}{name}: should be a number, not true or false: got {str(value).lower()}")
        elif isinstance(value, str) and _numeric(field.annotation) and str not in _options(field.annotation):
            lines.append(f"{prefix}{name}: should be a number, not text: got {value!r}. Fix: write it unquoted")
        elif isinstance(value, str | int | float) and not isinstance(value, bool) and _boolean(field.annotation):
            lines.append(f"{prefix}{name}: should be true or false: got {value!r}. Fix: write true or false, "
                         f"unquoted")
        elif isinstance(value, list) and _numeric_items(field.annotation):
            lines += [f"{prefix}{name}.{i}: should be a number, not "
                      f"{'true or false' if isinstance(item, bool) else 'text'}: got {item!r}"
                      for i, item in enumerate(value) if isinstance(item, bool | str)]
        elif isinstance(value, list) and _boolean_items(field.annotation):
            lines += [f"{prefix}{name}.{i}: should be true or false: got {item!r}. Fix: write true or false, unquoted"
                      for i, item in enumerate(value) if not isinstance(item, bool)]
        elif isinstance(value, dict) and (nested := _model(field.annotation)) is not None:
            lines += not_numbers(nested, value, f"{prefix}{name}.")
        elif isinstance(value, list) and (nested := _list_of_models(field.annotation)) is not None:
            for i, item in enumerate(value):
                lines += not_numbers(nested, item, f"{prefix}{name}.{i}.") if isinstance(item, dict) else []
    return lines


def validated(cls: type[Config], data: dict[str, Any]) -> tuple[Config | None, list[str]]:
    """(`cls` built from `data`, or None; a line per problem): numbers given as true/false or text, then whatever
    else pydantic finds (its line for a field already flagged left out)."""
    problems = not_numbers(cls, data)
    flagged = {line.split(":")[0] for line in problems}
    try:
        built = cls.model_validate(data)
    except ValidationError as e:
        return None, problems + [line for line in describe_all(e) if line.split(":")[0] not in flagged]
    return (None if problems else built), problems


def build(cls: type[Config], data: dict[str, Any] | None = None, where: str = "config", **values: Any) -> Config:
    """`cls(**data, **values)`, with every validation failure listed in one ConfigError."""
    built, problems = validated(cls, {**(data or {}), **values})
    if problems:
        lines = "\n".join(f"  ✗ {line}" for line in problems)  # a line may hold several (a validator's)
        fix = "" if all("Fix:" in line for line in problems) else f"\n{FIX}"  # each names its own already
        raise ConfigError(f"{where} is not valid ({lines.count('✗')} problem(s)):\n{lines}{fix}") from None
    return built
