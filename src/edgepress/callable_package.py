"""A package whose name is also a function of the Python API (`edgepress.search`, `edgepress.export`): Python sets
an imported package as an attribute of its parent, over any function of that name, so the package module itself is
made callable: `edgepress.search(config, out, budget)` is the API's function whether or not edgepress.search has been
imported, and `edgepress.search.study` is still the module."""

import sys
import types
from importlib import import_module
from typing import Any


class CallablePackage(types.ModuleType):
    """A package module that, called, calls the API function of its name (edgepress/api.py)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(import_module("edgepress.api"), self.__name__.rpartition(".")[2])(*args, **kwargs)


def make_callable(name: str) -> None:
    """Make the package `name` (its `__name__`) call the API function of the same name."""
    sys.modules[name].__class__ = CallablePackage
