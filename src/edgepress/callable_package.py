"""A package whose name is also a function of the Python API (`edgepress.search`, `edgepress.export`): Python sets
an imported package as an attribute of its parent, over any function of that name, so the package module itself is
made callable: `edgepress.search(config, out, budget)` is the API's function whether or not edgepress.search has been
imported, and `edgepress.search.study` is still the module."""

import inspect
import sys
import types
from importlib import import_module
from typing import Any


class CallablePackage(types.ModuleType):
    """A package module that, called, calls the API function of its name (edgepress/api.py), and whose signature
    and docstring are that function's (`help`, `inspect.signature`)."""

    def _function(self) -> Any:
        return getattr(import_module("edgepress.api"), self.__name__.rpartition(".")[2])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._function()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self._function())

    @property
    def __doc__(self) -> str | None:  # the function's: what a user calling edgepress.search asks for
        return self._function().__doc__


def make_callable(name: str) -> None:
    """Make the package `name` (its `__name__`) call the API function of the same name."""
    sys.modules[name].__class__ = CallablePackage
