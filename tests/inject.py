"""Fault injection, the way SQLite's test harness fails every I/O its workloads make: an edgepress command run with
its write number N made to fail with ENOSPC, or its process killed with SIGKILL right there; then what it left on
disk is checked against docs/run-directory.md, and the command run again.

`python -m tests.inject` is a fork server: it imports edgepress (and torch, transformers, onnxruntime) once, then
reads one JSON case per line on stdin and runs two cases at a time, each in a forked child, answering one JSON
line per case on stdout (in the order they finish):
    {"id": ..., "root": DIR, "steps": [{"argv": [...], "fault": null | ["enospc", N] | ["kill", N]}, ...],
     "copy": [[from, to], ...], "check": {"kind": "run" | "search" | "out", "dir": DIR, ...},
     "digest": [path, ...]}
 -> {"id": ..., "codes": [exit code, or -9 when killed, per step], "outputs": [...], "writes": [[event, path
     relative to root], ...] of the first step, "problems": [what the first step left that breaks an invariant;
     what the last left, which must also be finished], "digest": {file: sha256} of what the last step left}
A write is what Python's audit hooks see under `root`: a file opened for writing, a rename, a mkdir, a removal (each
one inside shutil.rmtree too). What native code writes itself (safetensors, ONNX Runtime, SQLite) is not seen one
by one; it lands in a temp dir or file that a seen rename promotes. ENOSPC is raised where the call would raise it;
a kill at an `open` first does what the open does (the file created or truncated, nothing written in it): the
state a crash leaves right after a file was opened, where a file written in place is torn."""

import hashlib
import importlib
import json
import os
import select
import shutil
import signal
import sys
from pathlib import Path

CREATES = ("open", "os.rename", "os.mkdir")  # where a full disk refuses
EVENTS = (*CREATES, "os.remove", "os.rmdir", "shutil.rmtree")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
AT_ONCE = 2  # cases run side by side
PRELOADED = ("edgepress.cli.app", "edgepress.compress.quantize", "edgepress.deploy.bundle", "edgepress.export.onnx",
             "edgepress.export.optimize", "edgepress.pipeline.report", "edgepress.pipeline.runner", "matplotlib.pyplot",
             "onnxruntime.quantization", "torch.onnx", "transformers.models.bert.modeling_bert")


# --- the command, its writes counted and one of them faulted --------------------------------------------------------

def _path(name, dir_fd) -> str | None:
    if not isinstance(name, str | bytes | os.PathLike):
        return None  # an open of a file descriptor
    name = os.fsdecode(name)
    if dir_fd not in (None, -1) and not os.path.isabs(name):
        name = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
    return os.path.abspath(name)


def _written(event: str, args: tuple) -> str | None:
    """The path `event` writes, or None when it writes nothing."""
    if event == "open":
        return _path(args[0], None) if args[2] & WRITE_FLAGS else None
    if event == "os.rename":
        return _path(args[1], args[3])  # where it lands
    if event in ("os.mkdir", "os.remove", "os.rmdir"):
        return _path(args[0], args[-1])
    return _path(args[0], None)  # shutil.rmtree


def _command(step: dict, root: str, output: str) -> None:
    """Run one step's command in this (forked) process, its writes under `root` counted and its fault injected;
    exits with the command's code."""
    root = os.path.abspath(root) + os.sep
    fault = step.get("fault") or (None, 0)
    writes, inside = [], [False]

    def record() -> None:
        inside[0] = True
        with open(output + ".writes", "w") as f:
            json.dump(writes, f)

    def hook(event: str, args: tuple) -> None:
        if event not in EVENTS or inside[0]:
            return
        path = _written(event, args)
        if path is None or not path.startswith(root) or event == "os.mkdir" and os.path.isdir(path):
            return  # not under root, or a mkdir of a dir that is there: no write (the kernel says EEXIST first)
        writes.append((event, path[len(root):]))
        if len(writes) != fault[1]:
            return
        if fault[0] == "enospc":
            raise OSError(28, "No space left on device", path)
        record()
        if event == "open":  # what the open does, and nothing more
            os.close(os.open(path, args[2] & ~os.O_EXCL | os.O_CREAT, 0o644))
        os.kill(os.getpid(), signal.SIGKILL)

    out = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.argv = ["edgepress", *step["argv"]]
    sys.addaudithook(hook)
    code = 0
    try:
        from edgepress.cli.app import main

        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a traceback is what the checks look for
        import traceback

        traceback.print_exc()
        code = 1
    record()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _step(step: dict, root: str, output: str) -> tuple[int, list, str]:
    pid = os.fork()
    if pid == 0:
        _command(step, root, output)
    _, status = os.waitpid(pid, 0)
    with open(output + ".writes") as f:
        writes = json.load(f)
    return os.waitstatus_to_exitcode(status), writes, Path(output).read_text(errors="replace")


# --- what must hold on disk at every instant (docs/run-directory.md) -----------------------------------------------

def _json(path: Path, problems: list[str]):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        problems.append(f"{path} cannot be read as JSON ({type(e).__name__}: {e})")
        return None


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _files(folder: Path) -> list[str]:
    from edgepress.files import listed_files

    return listed_files(folder)


def bundle_problems(bundle: Path, run_id: str | None = None) -> list[str]:
    """A bundle is whole: its manifest lists exactly its files, each with its sha256 (and names `run_id`)."""
    from edgepress.files import file_sha256

    problems = []
    manifest = _json(bundle / "edgepress.json", problems)
    if manifest is None:
        return problems
    listed = manifest.get("files", {})
    if sorted({*listed, "edgepress.json"}) != _files(bundle):
        problems.append(f"{bundle}: its files {_files(bundle)} are not the ones its manifest lists {sorted(listed)}")
    problems += [f"{bundle / name}: its sha256 is not the manifest's" for name, digest in listed.items()
                 if (bundle / name).is_file() and file_sha256(bundle / name) != digest]
    if run_id is not None and manifest.get("run_id") != run_id:
        problems.append(f"{bundle} is of run {manifest.get('run_id')}, the run dir's run.json of run {run_id}")
    return problems


def _temp_names(root: Path) -> list[str]:
    """A temp file or dir where a reader would take it for an artifact (its name not starting with a dot), or an
    artifact dir that holds one."""
    return [f"{p}: a temp name a reader would take" for p in root.rglob("*")
            if (".tmp" in p.name or ".old" in p.name) and not p.name.startswith(".")]


def run_problems(run: Path, stages: list[str]) -> list[str]:
    """What breaks the run dir's invariants: a torn record, a report that disagrees with the stage records, a
    recorded sha256 that is not its artifact's, a final/ that is not whole and of this run, a temp name in view."""
    from edgepress.files import tree_sha256

    problems = _temp_names(run) if run.exists() else []
    for path in sorted(run.rglob("*.json")):
        if not _hidden(path, run):
            _json(path, problems)
    run_id = (_json(run / "run.json", problems) or {}).get("run_id") if (run / "run.json").exists() else None
    records = {}
    for index, name in enumerate(["baseline", *stages]):
        folder = run / "stages" / f"{index:02d}-{name}"
        if not (folder / "stage.json").is_file():
            continue
        record = records[name] = _json(folder / "stage.json", []) or {}
        inside = record.get("artifact") == str(folder / "model")
        if record.get("status") == "passed" and inside and tree_sha256(folder / "model") != record["artifact_sha256"]:
            problems.append(f"{folder}: the sha256 its stage.json records is not its model's")
    if (run / "report.json").is_file():
        report = _json(run / "report.json", []) or {}
        if report.get("run_id") != run_id:
            problems.append(f"report.json is of run {report.get('run_id')}, run.json of run {run_id}")
        if [s["name"] for s in report.get("stages", [])] != stages:
            problems.append(f"report.json lists the stages {[s['name'] for s in report.get('stages', [])]}")
        if report.get("baseline", {}).get("artifact") and records.get("baseline", {}).get("run_id") != run_id:
            problems.append("report.json has a baseline that no stage record of its run holds")
        for stage in report.get("stages", []):
            record = records.get(stage["name"], {})
            if stage["status"] != "skipped" and (record.get("status"), record.get("run_id")) != (stage["status"],
                                                                                            run_id):
                problems.append(f"report.json says stage {stage['name']} {stage['status']}; its record says "
                                f"{record.get('status')} (run {record.get('run_id')})")
    if (run / "final").exists():
        problems += bundle_problems(run / "final", run_id)
        problems += [f"final/ exists, but stage {name} has not passed in run {run_id}" for name in stages
                     if (records.get(name, {}).get("status"), records.get(name, {}).get("run_id")) != ("passed",
                                                                                                    run_id)]
    return problems


def out_problems(out: Path, before: dict | None) -> list[str]:
    """A bundle's --out: absent, the earlier bundle as it was (`before`, its digest), or a whole new bundle."""
    problems = _temp_names(out.parent)
    if not out.exists() or (before is not None and digest(out) == before):
        return problems
    return problems + bundle_problems(out)


def digest_of(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def digest(root: Path) -> dict[str, str]:
    """Every file under `root` (temp names and locks aside) -> its sha256."""
    return {name: digest_of(root / name) for name in _files(root)} if root.is_dir() else {}


def search_problems(out: Path) -> list[str]:
    """A search dir: its records whole, each trial's run dir holding the run invariants."""
    problems = _temp_names(out) if out.exists() else []
    for path in sorted(out.glob("*.json")):
        _json(path, problems)
    for trial in sorted(out.glob("trials/*/run.json")):
        stages = [s["name"] for s in (_json(trial, problems) or {}).get("config", {}).get("stages", [])]
        problems += run_problems(trial.parent, stages)
    return problems


def _problems(check: dict, finished: bool) -> list[str]:
    """What breaks the invariants of what a step left; `finished`: it was the undisturbed last step, so what it
    made must also be complete (a passed run, a bundle, a search with its trials)."""
    folder = Path(check["dir"])
    if check["kind"] == "run":
        problems = run_problems(folder, check["stages"])
        if finished:  # a run removes what an earlier, killed one's atomic writes left
            problems += [f"{p}: left over" for where in (folder, folder / "stages") for p in where.glob(".*.*")
                         if p.suffix in (".tmp", ".old")]
        status = json.loads((folder / "report.json").read_text())["status"] if finished and not problems else None
        return problems + ([f"the run ended {status}, not passed"] if finished and status != "passed" else [])
    if check["kind"] == "search":
        problems = search_problems(folder)
        trials = (_json(folder / "report.json", problems) or {}).get("trials", []) if finished else [None]
        return problems + ([] if trials else ["the search's report lists no trial"])
    if finished:
        return bundle_problems(folder) + _temp_names(folder.parent)
    return out_problems(folder, check.get("before"))


# --- the server -------------------------------------------------------------------------------------------------

def _case(case: dict, answer: str) -> None:
    """Set up a case's root, run its steps (each in a forked child), check what its first step left, and write the
    answer."""
    root = Path(case["root"])
    for source, target in case.get("copy", []):
        shutil.copytree(source, target, symlinks=True)
    codes, outputs, writes, problems = [], [], [], []
    for n, step in enumerate(case["steps"]):
        code, seen, output = _step(step, case["root"], f"{answer}.{n}")
        codes.append(code)
        outputs.append(output[-4000:])
        if n == 0:
            writes = seen
            problems = _problems(case["check"], finished=len(case["steps"]) == 1) if case.get("check") else []
    if len(case["steps"]) > 1 and case.get("check"):
        problems += [f"after the command ran again: {p}" for p in _problems(case["check"], finished=True)]
    last = {name: digest_of(root / name) for name in case.get("digest", [])}
    if case.get("clean"):
        shutil.rmtree(root, ignore_errors=True)
    Path(answer).write_text(json.dumps({"id": case["id"], "codes": codes, "outputs": outputs, "writes": writes,
                                        "problems": problems, "digest": last}))


def serve(scratch: str) -> None:
    os.environ["COLUMNS"] = "400"  # one message per line
    os.environ["OMP_NUM_THREADS"] = "1"  # torch's threads: one per case, the cases side by side
    for module in PRELOADED:  # imported once, before the forks
        importlib.import_module(module)

    pending, running, buffer, done = [], {}, b"", False
    print("ready", flush=True)
    while not done or pending or running:
        while pending and len(running) < AT_ONCE:
            case = pending.pop(0)
            answer = os.path.join(scratch, f"case-{case['id']}")
            pid = os.fork()
            if pid == 0:
                try:
                    _case(case, answer)
                except BaseException:  # noqa: BLE001 - the harness's own failure, answered as such
                    import traceback

                    Path(answer).write_text(json.dumps({"id": case["id"], "error": traceback.format_exc()}))
                os._exit(0)
            running[pid] = answer
        if not done and _readable(0.05):
            chunk = os.read(0, 1 << 16)
            done = chunk == b""
            *lines, buffer = (buffer + chunk).split(b"\n")
            pending += [json.loads(line) for line in lines if line.strip()]
        elif done and running:
            pid, _ = os.waitpid(-1, 0)
            print(Path(running.pop(pid)).read_text(), flush=True)
        while running:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            print(Path(running.pop(pid)).read_text(), flush=True)


def _readable(timeout: float | None) -> bool:
    return bool(select.select([0], [], [], timeout)[0])


if __name__ == "__main__":
    serve(sys.argv[1])
