"""The JSON Schemas of the pipeline and search YAML (issue 26): generated from the pydantic configs, committed in
schema/ for editors, and carried by every example config."""

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from edgepress.registry import METHODS
from edgepress.schema import KINDS, schema
from tests.test_trust import invoke

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted(ROOT.glob("examples/*.yaml")) + sorted(ROOT.glob("src/edgepress/pipeline/demo*.yaml"))


@pytest.mark.parametrize("kind", KINDS)
def test_the_committed_schema_is_the_generated_one(kind):
    committed = json.loads((ROOT / "schema" / f"{kind}.schema.json").read_text())
    assert committed == schema(kind), f"schema/{kind}.schema.json is stale: `edgepress schema {kind} --out` it"
    jsonschema.Draft202012Validator.check_schema(committed)


def test_every_method_and_every_field_of_its_config_is_in_the_schema():
    defs = schema("pipeline")["$defs"]
    assert defs["StageConfig"]["properties"]["method"]["enum"] == list(METHODS)
    for name, method in METHODS.items():
        assert set(defs[f"params.{name}"]["properties"]) == set(method.config.model_fields), name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_names_its_schema_and_passes_it(path):
    first = path.read_text().splitlines()[0]
    named = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert named, f"{path.name}: the first line names no schema"
    file = (path.parent / named.group(1)).resolve()
    config = yaml.safe_load(path.read_text())
    assert file.name == ("pipeline" if "stages" in config else "search") + ".schema.json"
    jsonschema.validate(config, json.loads(file.read_text()))


@pytest.mark.parametrize("stage, where", [
    ({"name": "d", "method": "distill", "params": {"student_layers": "three"}}, "'three' is not of type"),
    ({"name": "d", "method": "distill", "params": {"studnet_layers": 3}}, "studnet_layers"),
    ({"name": "q", "method": "int8-dynamic", "params": {"per_channel": True, "epochs": 2}}, "epochs"),
    ({"name": "x", "method": "int3"}, "'int3' is not one of"),
    ({"name": "e", "method": "export", "on_fail": {"fallback": [{"method": "heads", "params": {"keep": 2}}]}},
     "2 is greater than the maximum of 1"),
])
def test_the_schema_catches_what_an_editor_should_flag(stage, where):
    config = {"model": "m", "data": {"source": "d.csv"}, "stages": [stage]}
    with pytest.raises(jsonschema.ValidationError, match=where):
        jsonschema.validate(config, schema("pipeline"))


def test_edgepress_schema_prints_or_writes_it(tmp_path):
    printed = invoke("schema", "search")
    assert printed.exit_code == 0 and json.loads(printed.output) == schema("search")
    written = invoke("schema", "--out", tmp_path / "p.json")
    assert written.exit_code == 0 and json.loads((tmp_path / "p.json").read_text()) == schema("pipeline")
