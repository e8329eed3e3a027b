"""One writer per directory. A command that writes a directory (a run, a bundle's or an export's --out, a teacher)
holds its lock while it writes: an OS lock (`flock`) on a small file beside it, `.NAME.edgepress-lock` in its parent,
which the kernel releases when the process ends however it ends, so a lock left by a killed process never blocks. The
file names its holder (pid, command, since when) for the refusal a second writer meets, and for a reader (evaluate,
bench, bundle, predict.py), which checks the lock of what it reads and of every directory above it, and says the
directory is being written instead of reading half of it. The file stays when the lock goes: it is what the next
writer locks (a lock file deleted and made again would let two writers hold two locks).

Where `fcntl` is missing (Windows), nothing is locked and nothing is refused."""

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import InUse

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

SUFFIX = ".edgepress-lock"
HELD = "EDGEPRESS_WRITING"  # the lock files this process holds, for itself and the processes it starts (a launch)


def lock_path(folder: Path) -> Path:
    """The lock file of `folder`: beside it, so that a directory replaced whole keeps its lock; inside it where its
    parent may not be written (`--out .` in a directory whose parent is not the user's), as a run dir is never
    replaced whole."""
    folder = Path(os.path.abspath(folder))
    beside = folder.parent / f".{folder.name}{SUFFIX}"
    return beside if beside.exists() or os.access(_existing(folder.parent), os.W_OK) else folder / SUFFIX


def _existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def _holder(fd: int) -> str:
    """Who holds the lock on the open lock file `fd`, in words: what it wrote when it took the lock."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"process {info['pid']} (`{info['command']}`, since {since})"
    except (OSError, ValueError, KeyError, TypeError):  # taken a moment ago, its words not written yet
        return "another process"


def _command() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return " ".join([name, *sys.argv[1:]])[:200]


READERS_WAIT_S = 1.0  # a reader holds the lock shared for a moment (check_not_written); a writer waits that out


def _locked(fd: int) -> bool:
    """Take the exclusive lock of the open lock file `fd` (True), or find it held by a writer (False)."""
    deadline = time.monotonic() + READERS_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


@contextlib.contextmanager
def writing(folder: Path, what: str) -> Iterator[None]:
    """Hold `folder`'s writer lock while the block writes it (`what` names it in a refusal: "--out", "the run dir");
    another process holding it is an InUse naming that process and the fix."""
    if fcntl is None:
        yield
        return
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if not _locked(fd):
            raise InUse(f"{what} {folder} is being written by {_holder(fd)}. Fix: wait for it to finish (or stop it), "
                        f"or write to another directory") from None
        words = json.dumps({"pid": os.getpid(), "command": _command(), "since": time.time()}).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, words, 0)
        before = os.environ.get(HELD)
        os.environ[HELD] = os.pathsep.join(filter(None, (before, str(path))))
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(HELD, None)
            else:
                os.environ[HELD] = before
    finally:
        os.close(fd)  # the lock goes with the descriptor


def check_not_written(path: Path) -> None:
    """`path` and every directory above it are not being written by another process (their writer locks are free;
    one this process or its parent holds, `HELD`, is its own): else an InUse naming the writer, instead of a command
    reading half of what another writes."""
    if fcntl is None:
        return
    path = Path(os.path.abspath(path))
    held = set(filter(None, os.environ.get(HELD, "").split(os.pathsep)))
    for folder in (path, *path.parents):
        for lock in (folder.parent / f".{folder.name}{SUFFIX}", folder / SUFFIX):
            if folder != folder.parent and str(lock) not in held and lock.is_file():
                _check_free(lock, folder)


def _check_free(lock: Path, folder: Path) -> None:
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # a lock file this user may not open: its writer is not one this reader can wait for
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise InUse(f"{folder} is being written by {_holder(fd)}: what it holds is not finished. Fix: wait for it "
                    f"to finish (or stop it), then run this command again") from None
    finally:
        os.close(fd)
