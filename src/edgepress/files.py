"""Atomic writes: every artifact appears whole or not at all (temp file or dir, then rename)."""

import contextlib
import hashlib
import json
import os
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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write `text` as UTF-8, atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON, atomically."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temp dir beside `path`; on success it replaces `path`, on failure it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


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
    added or removed weight, config or tokenizer file changes it. Sub-directories (checkpoints) do not count."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        digest.update(f"{f.name}\0{file_sha256(f)}\n".encode())
    return digest.hexdigest()
