"""The typed errors of edgepress. The CLI maps each to an exit code (see `EXIT_CODES`)."""


class EdgepressError(Exception):
    """Base of every error edgepress raises on purpose. Its message names the fix."""

    exit_code = 1


class ConfigError(EdgepressError):
    """A config or a command-line value is wrong."""

    exit_code = 2


class DataError(EdgepressError):
    """The data cannot be read or does not fit the model."""

    exit_code = 2


class ModelError(EdgepressError):
    """A model directory cannot be loaded."""

    exit_code = 2


class ExportParityError(EdgepressError):
    """An exported or rewritten graph does not match the model it came from; `result` holds the numbers."""

    exit_code = 2

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result


class ProviderUnavailable(EdgepressError):
    """An ONNX Runtime execution provider was asked for but is not the one running."""

    exit_code = 2


class GateFailed(EdgepressError):
    """A stage missed one of its gates."""

    exit_code = 3
