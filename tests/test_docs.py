"""The documentation site (issue 26): its reference pages are generated from the code and committed fresh, they
cover every registry method, every config field, every target, command and error, and the site builds strictly."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgepress.deploy.targets import TARGETS
from edgepress.registry import METHODS
from edgepress.schema import schema

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pages()


def test_the_committed_reference_pages_are_the_generated_ones(reference):
    for name, text in reference.items():
        assert (ROOT / "docs" / "reference" / name).read_text(encoding="utf-8") == text, \
            f"docs/reference/{name} is stale: make docs"


def _section(page: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = page.index(f"\n{heading}\n")
    end = re.search(rf"\n#{{1,{len(level)}}} ", page[start + len(heading) + 2:])
    return page[start:start + len(heading) + 2 + end.start()] if end else page[start:]


def test_every_method_and_each_of_its_params_is_in_the_reference(reference):
    for name, method in METHODS.items():
        section = _section(reference["methods.md"], f"## {name}")
        for field in method.config.model_fields:
            assert f"| `{field}` |" in section, (name, field)


@pytest.mark.parametrize("kind", ["pipeline", "search"])
def test_every_config_field_is_in_the_reference(reference, kind):
    config = schema(kind)
    page = reference[f"{kind}.md"]
    for field in config["properties"]:
        assert f"| `{field}` |" in _section(page, "## The config"), field
    for name, model in config["$defs"].items():
        if name.startswith("params."):
            continue  # the methods page's
        section = _section(page, f"### {name}")
        for field in model.get("properties", {}):
            assert f"| `{field}` |" in section, (name, field)


def test_every_target_command_and_error_is_in_the_reference(reference):
    from edgepress.cli.app import app

    assert all(f"\n## {name}\n" in reference["targets.md"] for name in TARGETS)
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert all(f"\n## {name}\n" in reference["cli.md"] for name in commands)
    for error in ("ConfigError", "DataError", "ModelError", "ProviderUnavailable", "ExportParityError", "GateFailed"):
        assert f"\n## {error}\n\nExit code " in reference["errors.md"], error
    assert "Fix:** choose one of" in reference["errors.md"]  # a message and its fix, read from the source


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (make setup installs it)")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr
    for page in ("index.html", "your-model/index.html", "reference/methods/index.html", "reference/errors/index.html"):
        assert (tmp_path / page).is_file(), page


def test_the_readme_shows_the_your_model_example_as_it_is():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme[readme.index("```yaml\n") + len("```yaml\n"):]
    example = (ROOT / "examples" / "your-model.yaml").read_text(encoding="utf-8")
    body = "".join(line for line in example.splitlines(keepends=True) if not line.startswith("#"))
    assert shown.startswith(body + "```"), "README.md's config differs from examples/your-model.yaml"


def test_the_site_shows_the_committed_headline_plot():
    assert (ROOT / "docs/assets/compare.svg").read_bytes() == (ROOT / "benchmarks/results/compare.svg").read_bytes(), \
        "docs/assets/compare.svg differs from benchmarks/results/compare.svg: copy it over"
