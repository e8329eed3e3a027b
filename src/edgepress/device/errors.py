"""The error tree a device can meet: each error carries the exit code a command returns for it
(`exit_code`). edgepress's own errors (`edgepress.errors`) are these classes and more."""



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


class ProviderUnavailable(EdgepressError):
    """An ONNX Runtime execution provider was asked for but is not the one running."""

    exit_code = 2
