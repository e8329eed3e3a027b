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


class InUse(EdgepressError):
    """A directory it would write, or read, is being written by another process (device/locks.py)."""

    exit_code = 2


class AccessDenied(EdgepressError):
    """A file or directory it was given cannot be read (or written, for an --out): the system refused."""

    exit_code = 2


def access_denied(e: PermissionError, what: str | None = None) -> AccessDenied:
    """The refusal for a PermissionError (`e`): it names the path refused, or `what` where the error names none."""
    name = what or e.filename or "a file it was given"
    return AccessDenied(f"{name}: the system refused access to it ({e.strerror or e}). Fix: give the user this runs "
                        f"as permission to read it (and to write where it writes: an --out), or give it a copy that "
                        f"user owns")
