"""What every benchmark here shares: one provenance header (the command, the commit, the date, the host, the CPU and
its instruction sets, the threads, the libraries), one markdown table writer, and one way to write what it measured
(whole or not at all: edgepress.files' atomic writers). A script imports it as `from harness import ...` (it runs as
`python benchmarks/NAME.py`, which puts benchmarks/ first on the path)."""

import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def command() -> str:
    """The command that is running, as a reader would type it again from the checkout's root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(HERE.parent) if script.is_relative_to(HERE.parent) else script
    return shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]])


def commit() -> str | None:
    """The checkout's commit (short), '+changes' when files it tracks differ from it; None outside a git checkout."""
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(HERE.parent), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return None
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def provenance(threads: int | None = None) -> dict:
    """Where, when and how a result was measured: `command`, `commit`, `measured_at` (UTC), `host` (the host
    name), `isa` (the vector, matrix and dot-product instruction sets), then edgepress's environment record (`cpu`,
    `machine`: the architecture, `cores`, `threads` timed on, the library versions), as every run's report holds it."""
    from edgepress.device.timing import isa_flags
    from edgepress.pipeline.environment import environment

    return {"command": command(), "commit": commit(), "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "isa": isa_flags(), **environment(threads)}


def measured(p: dict) -> str:
    """The provenance as the sentence that heads a result's table."""
    threads = f", {p['threads']} threads" if p.get("threads") else ""
    isa = f" ({', '.join(p['isa'])})" if p.get("isa") else ""
    return (f"Measured {p['measured_at'][:10]} on {p['cpu']}{isa}{threads}, onnxruntime {p['onnxruntime']}, torch "
            f"{p['torch']}: `{p['command']}` at commit {p['commit'] or 'unknown'}.")


def table(header: Sequence[str], rows: Iterable[Sequence], align: str | None = None) -> list[str]:
    """A markdown table's lines: `header`, then a line per row (each cell as str() gives it; a '|' in a cell is
    escaped). `align`: a character per column, 'l' or 'r' (default: left)."""
    def line(cells: Sequence) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if a == "r" else "---" for a in (align or "l" * len(header))) + "|"
    lines = [line(header), rule]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under a header of {len(header)}: {row}")
        lines.append(line(row))
    return lines


def write_results(path: Path, result: dict, markdown: str | None = None, **others: str) -> None:
    """`result` as PATH (.json), `markdown` beside it as PATH.md, and each of `others` as PATH.<key> (svg=...),
    each written whole or not at all."""
    from edgepress.files import write_json, write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    if markdown is not None:
        write_text(path.with_suffix(".md"), markdown)
    for suffix, text in others.items():
        write_text(path.with_suffix(f".{suffix}"), text)
