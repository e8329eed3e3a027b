"""The fault corpus's mutation that root does not feel: a file, or a dir, that cannot be read (mode 000).

Root reads any file, so these cases run in one child process with the read-override capabilities dropped (`setpriv`,
util-linux); run as another user, they run as they are. The cases are the corpus's own: every file of each model
dir, ONNX dir and bundle (whatever it holds), the dir itself, every data file kind each reader takes, the config
file; each given to every command that reads it, and judged by the corpus's rules (`judge`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.test_faults import (
    COMMANDS,
    COUNTS,
    DATA_READERS,
    FAST_RUNTIME,
    _arg,
    _fill,
    _own_files,
    config_bases,
    data_files,
    dirs,
    failed,
    judge,
    sentence_model,
    snapshot,
)

__all__ = ["config_bases", "data_files", "dirs", "sentence_model"]  # the corpus's fixtures, used here too

ROOT = Path(__file__).resolve().parents[1]
# root without the capabilities that let it read what it may not (util-linux's setpriv)
UNPRIVILEGED = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                "--bounding-set=-dac_override,-dac_read_search"]
# the child: each case's command line through the corpus's `invoke`, in process; what it ended with, as JSON
# (many commands in one process: a log handler an earlier command's captured stream was given, closed since, is not
# the command's fault; a real command's streams stay open)
CHILD = """
import json, logging, sys
from tests.test_faults import invoke
logging.raiseExceptions = False
ended = []
for args in json.loads(open(sys.argv[1]).read()):
    result = invoke(*args)
    ended.append({"exit_code": result.exit_code, "output": result.output,
                  "exception": None if result.exception is None else type(result.exception).__name__,
                  "message": str(result.exception or "")[:500]})
open(sys.argv[2], "w").write(json.dumps(ended))
"""


def _run_unprivileged(cases: list[list], tmp_path: Path) -> list[SimpleNamespace]:
    """The command lines of `cases`, run in one child that cannot read a mode-000 file: how each ended."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root reads every file, and setpriv (util-linux) is not here to drop that")
        prefix = UNPRIVILEGED
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    done = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(tmp_path / "cases.json"),
                           str(tmp_path / "ended.json")], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return [SimpleNamespace(exit_code=e["exit_code"], output=e["output"],
                            exception=None if e["exception"] is None else
                            SystemExit(e["exit_code"]) if e["exception"] == "SystemExit" else
                            RuntimeError(f"{e['exception']}: {e['message']}"))
            for e in json.loads((tmp_path / "ended.json").read_text())]


def test_a_file_or_dir_that_cannot_be_read_meets_every_command_that_reads_it(dirs, data_files, config_bases,
                                                                             tiny_model_dir, tiny_onnx_dir,
                                                                             sentence_model, token_model, tmp_path):
    """Each file of each dir kind (and the dir itself), each data file a reader takes, the config file: made
    unreadable, given to each command that reads it: exit 0 (what the command does not read), 2 or 3, no traceback;
    a refusal names the file or its dir, with a Fix; nothing changed; no --out left behind."""
    cases = []  # (case, command line, names a refusal carries, its inputs' snapshot, its --out, the count's key)
    for kind, commands in COMMANDS.items():
        good = dirs[kind]
        for i, file in enumerate([None, *_own_files(kind, dirs)]):
            case_dir = tmp_path / f"{kind.replace(' ', '-')}-{i}"
            shutil.copytree(good, case_dir, symlinks=True)
            rel = file.relative_to(good) if file else Path(".")
            names = (rel.name, str(case_dir)) if file else (str(case_dir),)
            before = snapshot(case_dir, dirs["data"])
            (case_dir / rel).chmod(0)
            for command, args in commands.items():
                out = case_dir.with_name(f"{case_dir.name}-{command}-out")
                cases.append((f"{command} {kind}/{rel}: unreadable", [_arg(a, case_dir, dirs, out) for a in args],
                              names, before, out, (command, f"{kind} dir files (unreadable)")))
    for reader, (kinds, args, section) in DATA_READERS.items():
        for kind in kinds:
            good = data_files[kind]
            file = tmp_path / f"{reader.replace(' ', '-')}-{kind}{good.suffix}"
            shutil.copyfile(good, file)
            out = file.with_suffix(".out")
            names = {"FILE": file, "GOOD": data_files["csv"], "MODEL": tiny_model_dir, "ONNX": tiny_onnx_dir,
                     "SENTENCE": sentence_model, "TOKEN": token_model, "OUT": out}
            if section is not None:
                names["CONFIG"] = file.with_suffix(".yaml")
                names["CONFIG"].write_text(yaml.safe_dump({
                    "model": str(tiny_model_dir), **_fill(section, names), "runtime": FAST_RUNTIME,
                    "stages": [{"name": "export", "method": "export"}]}))
            before = snapshot(file)
            file.chmod(0)
            cases.append((f"{reader} {kind}: unreadable", [str(_fill(a, names)) for a in args], (file.name,), before,
                          out, (args[0], f"{reader} ({kind}, unreadable)")))
    for kind in ("pipeline", "search"):
        file = tmp_path / f"{kind}.yaml"
        file.write_text(yaml.safe_dump(config_bases[kind][""]))
        before = snapshot(file)
        file.chmod(0)
        command = "run" if kind == "pipeline" else "search"
        for args in (["validate"], [command, "--out", str(file.with_suffix(".out")),
                                    *(["--trials", "1"] if kind == "search" else [])]):
            cases.append((f"{args[0]} {kind} file: unreadable", [args[0], str(file), *args[1:]], (file.name,), before,
                          file.with_suffix(".out"), (args[0], f"{kind} file (unreadable)")))

    ended = _run_unprivileged([[str(a) for a in args] for _, args, *_ in cases], tmp_path)
    problems = []
    for (case, _, names, before, out, key), result in zip(cases, ended, strict=True):
        COUNTS[key] += 1
        problems.append(judge(result, case, names, inputs=before, out=out if result.exit_code == 2 else None))
    problems = [p for p in problems if p]
    assert not problems, failed(problems)
