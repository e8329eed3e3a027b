"""JSON Schemas of the two YAML files a user writes (a pipeline, a search), from the same pydantic models that
validate them, for editors (`# yaml-language-server: $schema=...`): each stage's `params` are checked against its
method's config. `edgepress validate` stays the authority: it also checks what a schema cannot say (stage order,
what the model takes)."""

import json
from pathlib import Path

from pydantic import BaseModel

KINDS = ("pipeline", "search")


def _merge(defs: dict, more: dict) -> None:
    for name, schema in more.items():
        if defs.setdefault(name, schema) != schema:
            raise ValueError(f"two configs named {name} with different schemas")


def schema(kind: str) -> dict:
    """The JSON Schema (draft 2020-12) of a `kind` config ("pipeline" or "search")."""
    from edgepress.pipeline.config import PipelineConfig
    from edgepress.registry import METHODS
    from edgepress.search.config import SearchConfig

    model: type[BaseModel] = {"pipeline": PipelineConfig, "search": SearchConfig}[kind]
    root = model.model_json_schema()
    defs = root.setdefault("$defs", {})
    if kind == "pipeline":
        choices = []
        for name, method in METHODS.items():
            params = method.config.model_json_schema()
            _merge(defs, params.pop("$defs", {}))
            defs[f"params.{name}"] = {**params, "description": method.summary}
            choices.append({"if": {"properties": {"method": {"const": name}}, "required": ["method"]},
                            "then": {"properties": {"params": {"$ref": f"#/$defs/params.{name}"}}}})
        for stage in ("StageConfig", "Alternative"):  # a stage and a fallback: a known method, its own params
            defs[stage]["properties"]["method"] = {**defs[stage]["properties"]["method"], "enum": list(METHODS)}
            defs[stage]["allOf"] = choices
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"edgepress {kind} config", **root}


def write_schema(kind: str, out: Path | None) -> str:
    """The schema as text, also written to `out` when given."""
    text = json.dumps(schema(kind), indent=2, sort_keys=True) + "\n"
    if out is not None:
        from edgepress.errors import ConfigError
        from edgepress.files import nearest_existing, write_text

        above = nearest_existing(out.parent)
        if not above.is_dir():
            raise ConfigError(f"--out {out} cannot be written: {above} is a file. Fix: the path of a file in a "
                              f"directory (missing directories are created)")
        if out.is_dir():
            raise ConfigError(f"--out {out} is a directory. Fix: give the path of a file (it is replaced if it "
                              f"exists)")
        try:
            write_text(out, text)
        except OSError as e:
            raise ConfigError(f"--out {out} cannot be written: {e.strerror or e}. Fix: a file in a directory you "
                              f"can write") from None
    return text
