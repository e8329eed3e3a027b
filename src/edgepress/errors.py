"""The typed errors of edgepress. Each carries the exit code the CLI returns for it (`exit_code`).

The base and the errors a device can meet (bad config value, data, model, provider) live in the torch-free
predictor, which every bundle carries as its own `predict.py`; they are the same classes here. `missing` words
the message for a path that is not there."""

from pathlib import Path

from edgepress.device.errors import (
    AccessDenied,
    ConfigError,
    DataError,
    EdgepressError,
    ModelError,
    ProviderUnavailable,
    access_denied,
)

__all__ = ["AccessDenied", "ConfigError", "DataError", "EdgepressError", "ExportParityError", "GateFailed",
           "ModelError", "ProviderUnavailable", "access_denied", "missing"]


def missing(path: str | Path) -> str:
    """'X does not exist', and for a relative path where it was looked for: paths (a config's too) are read from
    the directory edgepress runs in, not from the config's own. A `demo:` name is no path: it names no demo
    there."""
    if str(path).startswith("demo:"):
        return f"{path} does not exist: no demo of this kind has that name"
    where = "" if Path(path).expanduser().is_absolute() else f" in {Path.cwd()} (a relative path is read from the " \
        "directory edgepress runs in)"
    return f"{path} does not exist{where}"


class ExportParityError(EdgepressError):
    """An exported or rewritten graph does not match the model it came from; `result` holds the numbers, `limits`
    the tolerances the check applied (export.parity.ParityConfig: a token classifier's loose default is wider than
    the method's configured one)."""

    exit_code = 2

    def __init__(self, message: str, result: dict | None = None, limits=None):
        super().__init__(message)
        self.result, self.limits = result, limits


class GateFailed(EdgepressError):
    """A stage missed one of its gates."""

    exit_code = 3
