"""What edgepress's command line takes besides its commands: the command group, whose usage errors end with their fix
like every other refusal, the parser of a path, and the choices its options offer."""

import contextlib
from enum import StrEnum
from pathlib import Path

import typer
from typer.core import TyperGroup

try:  # typer raises the click it vendors (0.2x on), whose errors it does not export
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError


class Commands(TyperGroup):
    """edgepress's commands: a usage error (an unknown command or option, a value of the wrong type, an argument
    missing) ends like every other refusal, exit 2 with its fix."""

    def make_context(self, *args, **kwargs):
        with _fix_named():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _fix_named():
            return super().invoke(ctx)


@contextlib.contextmanager
def _fix_named():
    try:
        yield
    except UsageError as e:
        if "Fix:" not in e.message:
            command = e.ctx.command_path if e.ctx is not None else "edgepress"
            fix = f"Fix: see `{command} --help` for what it takes"
            e.message = f"{e.message.rstrip('.')}. {fix}" if e.message else fix  # a missing argument's is empty
        raise


class Provider(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


class Aggregation(StrEnum):  # device.entities.AGGREGATIONS
    simple = "simple"
    first = "first"
    max = "max"
    average = "average"
    none = "none"


class DemoTask(StrEnum):  # the keys of pipeline.demo.DEMOS (not imported here: the CLI starts without the runner)
    classification = "classification"
    embedding = "embedding"


Split = StrEnum("Split", {name: name for name in ("test", "validation", "train", "all")})
Target = StrEnum("Target", {name.replace("-", "_"): name for name in ("x86-vnni", "x86-avx2", "arm64", "cuda",
                                                                      "mobile", "web")})


def path(text: str) -> Path:
    """A path given on the command line, as a config's is checked (`configs.names_something`): an empty one (an
    unset variable: `--out "$DIR"`) would be the current dir."""
    from edgepress.configs import names_something

    try:
        return Path(names_something(text))
    except ValueError as e:
        raise typer.BadParameter(f"{e}. Fix: give the path (an empty value is often a variable that is not set)"
                                 ) from None


class Kind(StrEnum):
    pipeline = "pipeline"
    search = "search"
