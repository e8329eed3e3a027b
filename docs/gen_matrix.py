"""Writes the README's support matrix from what the tests found: it runs tests/test_matrix.py (a cell per family and
method, and per family and bundle target, on tiny models trained on real sentences), reads each cell's outcome and
notes, and replaces the block between the markers in README.md. It writes nothing when a cell failed or did not run:
the matrix says only what passed. tests/test_matrix.py fails when the committed README differs from its session's
outcomes.

    .venv/bin/python docs/gen_matrix.py            # about 4 minutes on 2 cores
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = "<!-- support matrix: written by docs/gen_matrix.py from the outcomes of tests/test_matrix.py -->"
END = "<!-- end of the support matrix -->"
MARKS = "¹²³⁴⁵⁶⁷⁸⁹"


def columns() -> tuple[list[str], list[str]]:
    """(methods, targets), in the registry's order."""
    from edgepress.deploy.targets import TARGETS
    from edgepress.registry import METHODS

    return list(METHODS), list(TARGETS)


def missing(outcomes: dict) -> list[str]:
    """'family|column: outcome' of every cell that did not pass (or has no outcome)."""
    methods, targets = columns()
    cells = outcomes["cells"]
    return [f"{key}: {cells.get(key, {}).get('outcome', 'not run')}" for family in outcomes["families"]
            for key in (f"{family}|{column}" for column in methods + targets)
            if cells.get(key, {}).get("outcome") != "passed"]


def _table(outcomes: dict, names: list[str], notes: list[str]) -> list[str]:
    rows = [f"| model type (vocabulary) | {' | '.join(f'`{n}`' for n in names)} |",
            f"|---|{'|'.join(':-:' for _ in names)}|"]
    for family, vocabulary in outcomes["families"].items():
        marks = []
        for name in names:
            cell = outcomes["cells"][f"{family}|{name}"]
            for note in cell["notes"]:
                if note not in notes:
                    notes.append(note)
            marks.append("✓" + "".join(MARKS[notes.index(n)] for n in cell["notes"]))
        rows.append(f"| `{family}` ({vocabulary}) | {' | '.join(marks)} |")
    return rows


def render(outcomes: dict) -> str:
    """The README block: a table of methods and one of targets, a row per family, and the cells' notes."""
    methods, targets = columns()
    notes: list[str] = []
    lines = [START, *_table(outcomes, methods, notes), "", *_table(outcomes, targets, notes), ""]
    lines += [f"{MARKS[i]} {note}" + ("  " if i < len(notes) - 1 else "") for i, note in enumerate(notes)]
    return "\n".join([*lines, END])


def block(readme: str) -> str:
    """The matrix block of `readme` (markers included), or '' when it has none."""
    if START not in readme:
        return ""
    return readme[readme.index(START):readme.index(END) + len(END)]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "outcomes.json"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_matrix.py"],
                       cwd=ROOT, env={**os.environ, "EDGEPRESS_MATRIX_OUT": str(out)}, check=False)
        outcomes = json.loads(out.read_text())
    failed = missing(outcomes)
    if failed:
        print("README.md not written: these cells did not pass\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    readme = (ROOT / "README.md").read_text()
    if not block(readme):
        print(f"README.md has no {START} ... {END} block to replace", file=sys.stderr)
        return 1
    (ROOT / "README.md").write_text(readme.replace(block(readme), render(outcomes)))
    print("README.md: support matrix written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
