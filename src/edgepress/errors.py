"""The typed errors of edgepress. Each carries the exit code the CLI returns for it (`exit_code`).

The base and the errors a device can meet (bad config value, data, model, provider) live in the torch-free
predictor, which every bundle carries as its own `predict.py`; they are the same classes here. `missing` words
the message for a path that is not there."""

import errno
import os
from pathlib import Path

from edgepress.device.errors import (
    AccessDenied,
    ConfigError,
    DataError,
    EdgepressError,
    InUse,
    ModelError,
    ProviderUnavailable,
    access_denied,
)

__all__ = ["AccessDenied", "ConfigError", "DataError", "EdgepressError", "ExportParityError", "GateFailed",
           "InUse", "ModelError", "ProviderUnavailable", "SystemRefused", "access_denied", "missing",
           "refused_by_system"]


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
    """A stage missed one of its gates: `stage` names it and `gates` holds the gates it missed (each's kind, rule,
    value and limit, as the report records them); the Python API sets `result`, the run's result as it was
    written (edgepress.results.RunResult)."""

    exit_code = 3

    def __init__(self, message: str, stage: str | None = None, gates: tuple[dict, ...] = ()):
        super().__init__(message)
        self.stage, self.gates, self.result = stage, tuple(gates), None


class SystemRefused(EdgepressError):
    """The machine refused what a step needed: disk space, quota, a writable filesystem, file handles, memory.
    Nothing half-written is promoted (files.py); a run stays resumable."""

    exit_code = 2


AGAIN = "then run the command again (with --resume, a run continues from the last stage that passed)"
# errno -> (what the system said, what frees it)
REFUSALS = {
    errno.ENOSPC: ("no space left on the device", "free space there, or write to a disk with room (--out)"),
    errno.EDQUOT: ("the disk quota is used up", "free space within your quota, or write to another disk (--out)"),
    errno.EROFS: ("the filesystem is read-only", "write to a writable directory (--out)"),
    errno.EMFILE: ("too many files are open in this process", "raise the limit (`ulimit -n 4096`)"),
    errno.ENFILE: ("too many files are open on this machine", "close other programs, or raise the system's limit"),
}
# what libraries that write through their own code say for a full disk (torch's stream writer, safetensors)
FULL_DISK_WORDS = ("no space left on device", "os error 28", "file write failed", "database or disk is full")
OUT_OF_MEMORY_WORDS = ("can't allocate memory", "not enough memory", "out of memory")


def _free(path: Path) -> str:
    """'N MB free there' for the filesystem holding `path` (or its nearest existing parent)."""
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
        stats = os.statvfs(existing)
        return f"{stats.f_bavail * stats.f_frsize / 1e6:.1f} MB free there"
    except (OSError, StopIteration):
        return "free space unknown"


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (MemAvailable; None where the system does not say)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _memory() -> str:
    free = available_memory()
    return "" if free is None else f" ({free / 2**30:.1f} GiB free)"


def refused_by_system(e: BaseException, path: Path | None = None, amount: str | None = None) -> SystemRefused | None:
    """The SystemRefused for `e` where the machine refused a step (see REFUSALS; MemoryError, and the words torch,
    safetensors and SQLite use for a full disk or memory), naming the path (`path` where `e` names none) and, for
    space, how much the step needed where known (`amount`: "the file was 3.2 MB"); None for any other error."""
    if isinstance(e, SystemRefused):
        return e
    if isinstance(e, MemoryError) or isinstance(e, RuntimeError) and any(
            w in str(e).lower() for w in OUT_OF_MEMORY_WORDS):
        return SystemRefused(f"out of memory{_memory()}. Fix: close other programs, or give the step less to hold "
                             f"(a smaller batch_size or max_length), or run on a machine with more memory; {AGAIN}")
    code = e.errno if isinstance(e, OSError) else None
    if code is None and not isinstance(e, EdgepressError) and any(w in str(e).lower() for w in FULL_DISK_WORDS):
        code = errno.ENOSPC
    if code not in REFUSALS:
        return None
    what, fix = REFUSALS[code]
    where = (e.filename if isinstance(e, OSError) and e.filename else None) or path
    space = code in (errno.ENOSPC, errno.EDQUOT) and where is not None
    amount = f"; {amount}" if space and amount else ""
    return SystemRefused(f"{where or 'a write'}: {what}{f' ({_free(Path(where))}{amount})' if space else ''}. "
                         f"Fix: {fix}; {AGAIN}")
