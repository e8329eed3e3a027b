"""Atomic writes: every artifact appears whole or not at all (temp file or dir, then rename)."""

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same directory, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; artifacts are ordinary files
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        _refused(e, path, f"the file was {len(data) / 1e6:.1f} MB")
        raise


def write_text(path: Path, text: str) -> None:
    """Write `text` as UTF-8, atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON, atomically."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_onnx(path: Path, external_data: bool = True):
    """The ONNX model at `path` (an onnx.ModelProto; its external weights read too unless `external_data` is
    False): the one reader every command opens a graph with. A file that is not one (empty, cut short, another
    format, weights missing) is a ModelError naming the fix."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        return onnx.load(str(path), load_external_data=external_data)
    except PermissionError as e:
        from edgepress.errors import access_denied

        raise access_denied(e) from None
    except (DecodeError, RuntimeWarning, ValueError, OSError, onnx.checker.ValidationError) as e:
        from edgepress.errors import ModelError

        raise ModelError(f"{path} is not a readable ONNX model ({_why(e)}). Fix: export the model again (an export "
                         f"stage, or `edgepress export`), or bundle the run's final/ again") from None


def _why(e: Exception) -> str:
    """A reader's error on one line, short enough for a message (its type where it says nothing)."""
    return " ".join(str(e).split())[:200] or type(e).__name__


def write_arrays(path: Path, arrays: dict) -> None:
    """Numeric arrays by name as an .npz file, atomically."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes(path, buffer.getvalue())


def read_arrays(path: Path) -> dict:
    """The arrays of an .npz file `write_arrays` wrote; objects are refused (no pickle is ever loaded). A file
    that is not one (empty, cut short, another format) is a ModelError."""
    import zipfile

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        from edgepress.errors import ModelError

        raise ModelError(f"{path} is not an .npz file of arrays ({_why(e)}). Fix: run the stage again") from None


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temp dir beside `path`; on success it replaces `path`, on failure it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
        replace_dir(tmp, path)
    except BaseException as e:
        _refused(e, path, f"{_size(tmp) / 1e6:.1f} MB of it had been written")
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


@contextlib.contextmanager
def graph_apart(graph: Path, near: Path) -> Iterator[Path]:
    """`graph` (an .onnx file) as a file of a temp dir beside `near`, with the other files of its dir: hard links
    (no copy on one filesystem; copies where it takes none). onnxruntime.quantization writes a shape-inferred copy
    beside the graph it is given and deletes it: given this one, it never writes into another stage's artifact."""
    near.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=near.parent, prefix=f".{near.name}.", suffix=".tmp") as scratch:
        for f in graph.parent.iterdir():
            if f.is_file():
                try:
                    os.link(f, Path(scratch) / f.name)
                except OSError:
                    shutil.copy2(f, Path(scratch) / f.name)
        yield Path(scratch) / graph.name


def _refused(e: BaseException, path: Path, amount: str) -> None:
    """Raise the SystemRefused for `e` (errors.refused_by_system) where the machine refused the write of `path`."""
    from edgepress.errors import refused_by_system

    refused = refused_by_system(e, path, amount)
    if refused is not None and refused is not e:
        raise refused from None


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def replace_dir(src: Path, dst: Path) -> None:
    """`dst` becomes `src` (a dir on the same filesystem), whatever `dst` held. A reader of `dst` never meets half of
    it: the old one is renamed away whole (then deleted), the new one renamed in."""
    if not dst.exists():
        os.replace(src, dst)
        return
    old = _away(dst)
    os.replace(src, dst)
    shutil.rmtree(old)


def remove_dir(path: Path) -> None:
    """Remove the dir `path` whole, as a reader (or a process killed halfway) never meets half of it: renamed away
    first (into `.NAME.*.old` beside it), then deleted."""
    if path.is_dir():
        shutil.rmtree(_away(path))


def _away(path: Path) -> Path:
    """`path` renamed into a new hidden dir beside it; returns that dir."""
    old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
    os.replace(path, old / path.name)
    return old


LEFTOVER = re.compile(r"^\..+\.[a-z0-9_]{8}\.(tmp|old)$")  # a temp name of mkstemp/mkdtemp as the writes above make it


def remove_leftovers(folder: Path) -> None:
    """Remove what a killed process left in `folder` (held by this one's writer lock): the hidden temp and old dirs
    and files that atomic writes make beside their artifacts (`.NAME.*.tmp`, `.NAME.*.old`)."""
    for path in folder.glob(".*.*"):
        if LEFTOVER.match(path.name):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def writes_artifacts() -> bool:
    """This process writes artifacts: it is the only one, or rank 0 of a launch (torchrun, `accelerate launch`)."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def artifact_dir(path: Path) -> Iterator[Path]:
    """`atomic_dir(path)` in the process that writes artifacts; in the other processes of a launch, a private
    throwaway dir, so that code written for one process (save, then read back) runs unchanged in every one."""
    if writes_artifacts():
        with atomic_dir(path) as tmp:
            yield tmp
    else:
        with tempfile.TemporaryDirectory(prefix="edgepress-rank-") as tmp:
            yield Path(tmp)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_sha256(path: Path) -> str:
    """One digest of an artifact: a file's sha256, or of a dir's top-level files (names and contents), so a changed,
    added or removed weight, config or tokenizer file changes it. Sub-directories (checkpoints) do not count, but for
    the fallback of a cascade (the folder its cascade.json names): it is half of the artifact."""
    from edgepress.device.cascade import is_cascade, read_cascade

    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    files = [p for p in path.iterdir() if p.is_file()]
    if is_cascade(path):
        files += [p for p in (path / read_cascade(path)["fallback"]).rglob("*") if p.is_file()]
    digest = hashlib.sha256()
    for f in sorted(files):
        digest.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f)}\n".encode())
    return digest.hexdigest()


# --- what a command may replace ---------------------------------------------------------------------------------
# Every command that writes a directory replaces only what it wrote there before: an earlier artifact of its own
# kind, recognised by its marker file (a bundle's edgepress.json, a run's run.json, ...), and never a directory that
# holds or lies inside one of the command's own inputs, nor one holding files the marker does not list.

SHOWN_FILES = 3  # foreign files named in a refusal


def nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else the nearest of its parents that does (what creating it would write into)."""
    return next(p for p in (path, *path.parents) if p.exists())


def check_writable(out: Path) -> None:
    """`out` is, or can become, a directory this process may write."""
    from edgepress.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file. Fix: give the path of a directory (it is created if missing)")
    ancestor = nearest_existing(out)
    if not ancestor.is_dir():
        raise ConfigError(f"--out {out} cannot be created: {ancestor} is a file. Fix: give a directory path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out} cannot be written: {ancestor} is not writable by this user. "
                          f"Fix: choose a directory you can write, or change its permissions")


def resolved(path: Path, what: str) -> Path:
    """`path` made absolute, its links followed; a ConfigError naming `what` (--out, the model, ...) where a link
    leads back to itself (Python 3.11 raises RuntimeError there, later ones OSError)."""
    from edgepress.errors import ConfigError

    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:
        raise ConfigError(f"{what} {path} cannot be followed: {e}. Fix: a path that names a file or directory (no "
                          f"symbolic link that leads back to itself)") from None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_apart(out: Path, inputs: dict[str, Path], replaced: tuple[Path, ...] | None = None) -> None:
    """No input (`{"the model": path}`) lies in what the command replaces (`replaced`, paths under `out`; None:
    `out` whole), and `out` does not lie inside an input dir: a command never overwrites what it reads."""
    from edgepress.errors import ConfigError

    out = resolved(out, "--out")
    replaced = tuple(resolved(p, "--out") for p in replaced) if replaced is not None else (out,)
    for what, path in inputs.items():
        path = resolved(Path(path), what)
        if path == out:
            raise ConfigError(f"--out {out} is {what}, which this command reads. Fix: write to another directory")
        if any(_inside(path, r) for r in replaced):
            raise ConfigError(f"--out {out} holds {what} ({path}), which this command reads and would replace. "
                              f"Fix: write to a directory outside it")
        if path.is_dir() and _inside(out, path):
            raise ConfigError(f"--out {out} is inside {what} ({path}): this command would write into it. Fix: "
                              f"write to a directory outside it")


def foreign_files(folder: Path, marker: str) -> list[str] | None:
    """The files in `folder` that the artifact whose `marker` it holds did not write ([] for an empty folder or an
    artifact holding only its own files); None when `folder` holds files but no readable marker (not ours)."""
    present = listed_files(folder)
    if not present:
        return []
    try:
        listed = read_json(folder / marker).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if listed is None:  # an artifact written before its marker listed its files: all of it is taken as ours
        return []
    return [name for name in present if name != marker and name not in listed]


def check_owned(out: Path, marker: str, what: str) -> None:
    """`out` is new, empty, or an earlier `what` (e.g. bundle: its `marker`) holding nothing but the files it
    wrote."""
    from edgepress.errors import ConfigError

    if not out.is_dir():
        return
    foreign = foreign_files(out, marker)
    if foreign is None:
        raise ConfigError(f"--out {out} holds files that are not an edgepress {what} (no {marker}), and this command "
                          f"would replace them. Fix: give a new or empty directory, or the directory of an earlier "
                          f"{what}")
    if foreign:
        more = f" and {len(foreign) - SHOWN_FILES} more" if len(foreign) > SHOWN_FILES else ""
        raise ConfigError(f"--out {out} is an earlier {what}, but it also holds files it did not write "
                          f"({', '.join(foreign[:SHOWN_FILES])}{more}), which this command would delete. Fix: move "
                          f"them out, or give a new or empty directory")


def listed_files(folder: Path) -> list[str]:
    """Every file under `folder`, as the paths a marker lists them by."""
    from edgepress.device.locks import SUFFIX

    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not p.name.endswith(SUFFIX))  # a writer's lock (device/locks.py) is no file of it
