"""The fault corpus: bad input as a class, not a list. Its cases are generated from what the code already declares,
so that a new field, file or command joins it without anyone adding a case:

- every field of the JSON Schemas `edgepress schema` writes (pipeline, search; each method's params), given each
  value of its type's bad set, through `edgepress validate`;
- every file a model dir, an ONNX dir, a bundle and a run dir hold (whatever is there), each mutated mechanically
  (empty, truncated, random bytes, JSON of the wrong shape, other encodings, NUL bytes, a directory in its place, a
  symlink loop), through every command that reads that dir;
- every data file kind (CSV, JSON lines, CoNLL, pairs, texts), mutated the same way and with every line end.

Every case is judged by the same rules (`judge`): exit 0 (the input is in fact fine), 2 or 3, never anything else;
no traceback; a refusal names the file or field and carries a `Fix:`; every input byte-identical afterwards; no
--out left behind by a refusal. A value the schema refuses must be refused (exit 2). The counts of cases, per command
and per kind, are printed at the end of the session."""

import collections
import contextlib
import copy
import csv
import hashlib
import io
import json
import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from edgepress.cli.app import app
from edgepress.registry import METHODS
from edgepress.schema import schema
from tests.conftest import conll_text

COUNTS: collections.Counter = collections.Counter()  # (command, kind) -> cases run (conftest prints them)
FAST_RUNTIME = {"threads": 1, "latency": {"warmup": 1, "runs": 3}}


def invoke(*args) -> object:
    """`edgepress ARGS`; with `predict.py` first, a bundle's own command line (the device package's, in process:
    what a bundle's predict.py runs), given the bundle dir it would run from."""
    if args[:1] == ("predict.py",):
        return _predict_py(Path(args[1]), *args[2:])
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def _predict_py(bundle: Path, *args) -> SimpleNamespace:
    from edgepress.device.cli import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            code, exception = main([str(a) for a in args], here=bundle), None
        except SystemExit as e:  # argparse's own refusals
            code, exception = e.code, e
        except Exception as e:  # noqa: BLE001 - what the judge reports
            code, exception = 1, e
    return SimpleNamespace(exit_code=code, output=printed.getvalue(), exception=exception)


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file under `roots` (or each file given) -> its sha256: what must be byte-identical afterwards. A dir
    is kept too, so that a file that appears in it shows."""
    found = {}
    for root in roots:
        if root.is_dir():
            found[str(root)] = "a directory"
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        found |= {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    return found


def judge(result, case: str, names: tuple[str, ...] = (), refused: bool = False, inputs: dict | None = None,
          out: Path | None = None) -> str | None:
    """What is wrong with how a command met `case` (None: nothing). `names`: what a refusal must name (any of
    them: the field, the file); `refused`: the input is certainly bad (exit 2 expected)."""
    text = result.output
    if result.exit_code not in (0, 2, 3) or not isinstance(result.exception, SystemExit | None):
        return f"{case}: exit {result.exit_code}, {type(result.exception).__name__}: {result.exception}"
    if "Traceback" in text:
        return f"{case}: a traceback in the output"
    if refused and result.exit_code != 2:
        return f"{case}: exit {result.exit_code} where the input is bad (expected 2)"
    if result.exit_code == 2:
        if "Fix:" not in text:
            return f"{case}: a refusal without a Fix: {text.strip()[-300:]}"
        if names and not any(name in text for name in names):
            return f"{case}: a refusal that names none of {names}: {text.strip()[-300:]}"
        if out is not None and out.exists():
            return f"{case}: --out {out} left behind by a refusal"
    if inputs is not None and (after := snapshot(*map(Path, inputs))) != inputs:
        changed = sorted(set(inputs.items()) ^ set(after.items()))[:3]
        return f"{case}: an input changed: {changed}"
    return None


def failed(problems: list[str]) -> str:
    if os.environ.get("EDGEPRESS_FAULTS_OUT"):
        Path(os.environ["EDGEPRESS_FAULTS_OUT"]).write_text("\n".join(problems))
    return f"{len(problems)} case(s) ended badly:\n" + "\n".join(problems[:25])


# --- every config field


def _csv(path: Path, movie_data) -> Path:
    rows = zip(movie_data.train.texts[:200], movie_data.train.labels[:200], strict=True)
    path.write_text("text,label\n" + "".join(f'"{t.replace(chr(34), chr(39))}",{int(y)}\n' for t, y in rows))
    return path


def _resolve(node: dict, defs: dict) -> dict:
    while "$ref" in node:
        node = {**defs[node["$ref"].split("/")[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _types(node: dict, defs: dict) -> list[dict]:
    """The alternatives of a field: each anyOf branch, resolved."""
    node = _resolve(node, defs)
    return [_resolve(n, defs) for n in node["anyOf"]] if "anyOf" in node else [node]


def leaves(node: dict, defs: dict, path: tuple = ()) -> list[tuple[tuple, dict]]:
    """(path, schema) of every field under `node` a value is written to: numbers, booleans, text, choices, lists of
    those; a mapping's fields in turn (a list of mappings: its first item's). `[]` in a path: a list's item."""
    found, objects = [], [t for t in _types(node, defs) if "properties" in t]
    for obj in objects[:1]:
        for key, sub in obj["properties"].items():
            if any("properties" in t for t in _types(sub, defs)):
                found += leaves(sub, defs, (*path, key))
            elif any(t.get("type") == "array" and "properties" in _resolve(t.get("items", {}), defs)
                     for t in _types(sub, defs)):
                item = next(_resolve(t["items"], defs) for t in _types(sub, defs) if t.get("type") == "array")
                found += [((*path, key), sub)] + leaves(item, defs, (*path, key, 0))
            else:
                found.append(((*path, key), sub))
    return found


def bad_values(node: dict, defs: dict) -> list:
    """The values of a field's bad set: past each bound, NaN, ±inf, huge, text, a bool, null, an empty list, a list
    where a value goes, a mapping, a choice that is none of its choices. Some may be fine (null where it is allowed);
    the schema says which."""
    values = ["text", True, None, [], {"key": 1}, math.nan, math.inf, -math.inf, 10**30]
    for t in _types(node, defs):
        for bound, step in (("minimum", -1), ("exclusiveMinimum", 0), ("maximum", 1), ("exclusiveMaximum", 0)):
            if bound in t:
                values.append(t[bound] + step * (1 if t.get("type") == "integer" else 0.5))
        if t.get("type") == "integer":
            values += [2.5, [1]]
        if t.get("type") == "number":
            values += ["0.5", [0.5]]
        if "enum" in t or "const" in t:
            values += ["no-such-choice", 3]
        if t.get("type") == "boolean":
            values += ["maybe", 2]
        if t.get("type") == "string":
            values += ["", "\x00", 12]
        if t.get("type") == "array":
            values += [[[1]], [None]]
    return values


def _set(config: dict, path: tuple, value) -> dict:
    """`config` with `value` at `path` (the mappings and lists on the way made where missing)."""
    config = copy.deepcopy(config)
    node = config
    for key, then in zip(path[:-1], path[1:], strict=True):
        if isinstance(node, dict) and not isinstance(node.get(key), dict | list):
            node[key] = [{}] if isinstance(then, int) else {}
        node = node[key]
    node[path[-1]] = value
    return config


def config_cases(kind: str, bases: dict[str, dict]) -> list[tuple[str, dict, tuple[str, ...], str, tuple | None]]:
    """(case, config, names a refusal must carry, its base, the change: (path, value), None for an unknown key) for
    every field of the `kind` schema and every bad value, on the base config each field belongs to (`bases`: "" for
    the config's own fields, a method name for its params)."""
    root = schema(kind)
    defs = root["$defs"]
    cases = []
    fields = [("", path, node) for path, node in leaves(root, defs)]
    if kind == "pipeline":  # each method's params, on a stage of that method
        fields += [(name, ("stages", -1, "params", *path), node) for name in METHODS
                   for path, node in leaves(defs[f"params.{name}"], defs)]
    for base, path, node in fields:
        where = ".".join(str(k) for k in path if k not in (0, -1))
        for value in bad_values(node, defs):
            value = [value] if _is_items(node, defs) and not isinstance(value, list) else value
            # a refusal names the field or a section it is in (a gate's missing limit names the gate)
            names = tuple(str(k) for k in path if isinstance(k, str))
            cases.append((f"{kind} {base + ': ' if base else ''}{where} = {value!r}", _set(bases[base], path, value),
                          names, base, (path, value)))
        parent = _set(bases[base], (*path[:-1], "no_such_key"), 1)  # an unknown key beside it
        cases.append((f"{kind} {where}: an unknown key beside it", parent, ("no_such_key",), base, None))
    return cases


def _is_items(node: dict, defs: dict) -> bool:
    """A list of values, not of mappings (its bad values are written as its one item)."""
    return any(t.get("type") == "array" and "properties" not in _resolve(t.get("items", {}), defs)
               for t in _types(node, defs))


# what a method's stage needs to pass `validate` on the tiny 2-layer model of a CPU machine
BASE_PARAMS = {"distill": {"student_layers": 1}, "fp16": {"providers": ["cpu"]}}


def _chain(method: str) -> list[dict]:
    """The shortest stages that reach `method`'s own: it alone on a torch model, after export on a graph."""
    stage = {"name": "s", "method": method, **({"params": BASE_PARAMS[method]} if method in BASE_PARAMS else {})}
    return [stage] if "torch" in METHODS[method].takes else [{"name": "export", "method": "export"}, stage]


@pytest.fixture(scope="module")
def config_bases(tmp_path_factory, tiny_model_dir, movie_data) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("config-corpus")
    data = _csv(root / "d.csv", movie_data)
    pipeline = {"model": str(tiny_model_dir), "data": {"source": str(data)}, "runtime": FAST_RUNTIME}
    return {"pipeline": {"": {**pipeline, "stages": [{"name": "export", "method": "export"}]},
                         **{name: {**pipeline, "stages": _chain(name)} for name in METHODS}},
            "search": {"": {**pipeline, "constraints": {"accuracy": {"max_drop": 0.5}},
                            "space": {"layers": [1], "heads_keep": [1.0], "ffn_keep": [1.0], "vocab": [False],
                                      "quantization": ["int8-dynamic"], "epochs": [1]}}}}


# fields whose values are checked against what the run makes, which `validate` has not got: keep_float's node names
# are the names of the graph the export stage writes (the run refuses names it lacks, exit 2, naming keep_float)
CHECKED_ON_WHAT_THE_RUN_MAKES = {"keep_float"}


@pytest.mark.parametrize("kind", ["pipeline", "search"])
def test_every_config_field_meets_its_bad_values_with_exit_2_and_its_name(kind, config_bases, tmp_path):
    """Each base config validates; then every field of the schema, given each value of its type's bad set, is
    either fine (by the schema: `validate` may still refuse it, naming it) or refused by `validate` with exit 2, the
    field named and a Fix. The converse: what `validate` accepts, the run (or search) does not refuse: the values it
    accepted on one base, all set at once, run to exit 0 (`accepted_runs`)."""
    from jsonschema import Draft202012Validator

    bases = config_bases[kind]
    for name, base in bases.items():
        (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
        result = invoke("validate", tmp_path / "base.yaml")
        assert result.exit_code == 0, f"base config {name or kind}: {result.output}"
    checker = Draft202012Validator(schema(kind))
    problems, file, out, ran = [], tmp_path / f"{kind}.yaml", tmp_path / "out", set()
    command = "run" if kind == "pipeline" else "search"
    accepted = collections.defaultdict(list)  # base -> (case, change, names) validate accepted
    for case, config, names, base, change in config_cases(kind, bases):
        file.write_text(yaml.safe_dump(config, allow_unicode=True))
        before = snapshot(file)
        result = invoke("validate", file)
        COUNTS["validate", f"{kind} field values"] += 1
        refused = not checker.is_valid(config)
        problems.append(judge(result, case, names, refused=refused, inputs=before))
        if result.exit_code == 0 and change is not None:
            accepted[base].append((case, change, names))
        if refused and names not in ran:  # the run (or search) refuses it too, before writing anything
            ran.add(names)
            result = invoke(command, file, "--out", out, *(("--trials", 1) if kind == "search" else ()))
            COUNTS[command, f"{kind} field values"] += 1
            problems.append(judge(result, f"{command}: {case}", names, refused=True, inputs=before, out=out))
            _clear(out)
    for base, cases in accepted.items():
        problems += accepted_runs(kind, base, bases[base], cases, tmp_path)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


def accepted_runs(kind: str, name: str, base: dict, cases: list, tmp_path: Path) -> list[str | None]:
    """Run (or search, one trial) what `validate` accepted on `base` (the base config `name`): the values all set at
    once in one config, and on their own those that cannot join it (a value that empties the list another's path goes
    through, or one that makes the combination invalid) or that are checked on what the run makes. Each must exit 0;
    one checked on what the run makes may be refused (exit 2) naming its field."""
    command = "run" if kind == "pipeline" else "search"
    together, alone = base, []
    for case, (path, value), names in cases:
        try:
            combined = _set(together, path, value)
        except (IndexError, KeyError, TypeError):
            combined = None
        if combined is None or CHECKED_ON_WHAT_THE_RUN_MAKES & set(map(str, path)):
            alone.append((case, _set(base, path, value), names))
        else:
            together = combined
    file, out, problems = tmp_path / "accepted.yaml", tmp_path / "out", []
    file.write_text(yaml.safe_dump(together, allow_unicode=True))
    if invoke("validate", file).exit_code != 0:  # the values clash: each on its own
        alone += [(case, _set(base, path, value), names) for case, (path, value), names in cases]
        together = None
    runs = [(f"{kind} {name + ': ' if name else ''}{len(cases) - len(alone)} values at once", together, ())] \
        if together is not None else []
    for case, config, names in runs + alone:
        file.write_text(yaml.safe_dump(config, allow_unicode=True))
        before = snapshot(file)
        result = invoke(command, file, "--out", out, *(("--trials", 1) if kind == "search" else ()))
        COUNTS[command, f"{kind} values validate accepts"] += 1
        late = CHECKED_ON_WHAT_THE_RUN_MAKES & set(names)
        problem = judge(result, f"{command} of what validate accepts: {case}", tuple(late), inputs=before)
        if problem is None and result.exit_code != 0 and not (late and result.exit_code == 2):
            problem = f"{command} of what validate accepts: {case}: exit {result.exit_code}: {result.output[-300:]}"
        problems.append(problem)
        _clear(out)
    return problems


# --- every file a command reads


def _text_lines(data: bytes, end: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", end)


def _utf16(data: bytes) -> bytes | None:
    try:
        return b"\xff\xfe" + data.decode("utf-8").encode("utf-16-le")
    except UnicodeDecodeError:
        return None  # not text


def _latin1(data: bytes) -> bytes | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return (text + "\ncafé\n").encode("latin-1", errors="replace")


# name -> bytes of a file -> mutated bytes (None: the mutation does not apply to it)
BYTES = {
    "empty": lambda data: b"",
    "one byte": lambda data: data[:1],
    "truncated at half": lambda data: data[: len(data) // 2],
    "truncated by one byte": lambda data: data[:-1],
    "random bytes": lambda data: hashlib.shake_256(data).digest(max(len(data), 16) if len(data) < 4096 else 4096),
    "NUL bytes in the middle": lambda data: data[: len(data) // 2] + b"\x00" * 8 + data[len(data) // 2:],
    "JSON of another shape": lambda data: b'[1, "two", null]',
    "a JSON mapping of other keys": lambda data: b'{"unexpected": {"nested": [1, 2]}}',
    "UTF-16 with a BOM": _utf16,
    "latin-1": _latin1,
    "CRLF line ends": lambda data: _text_lines(data, b"\r\n") if b"\n" in data else None,
    "lone CR line ends": lambda data: _text_lines(data, b"\r") if b"\n" in data else None,
}
# name -> path -> None: what stands in the file's place
PLACES = {
    "a directory in its place": lambda path: (path.unlink(), path.mkdir()),
    "a symlink loop in its place": lambda path: (path.unlink(), path.symlink_to(path.name)),
    "missing": lambda path: path.unlink(),
}


def mutations(path: Path) -> list[tuple[str, object]]:
    """(name, fn(path)) of every mutation that applies to the file at `path` (JSON shapes to .json files only)."""
    data, found = path.read_bytes(), []
    for name, fn in BYTES.items():
        if "JSON" in name and path.suffix != ".json":
            continue
        mutated = fn(data)
        if mutated is not None and mutated != data:
            found.append((name, lambda p, m=mutated: p.write_bytes(m)))
    return found + list(PLACES.items())


def _files(root: Path) -> list[Path]:
    """The files of a dir that a command reads (a bundle's own Python code aside: it is what runs)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts)


def _eval_csv(path: Path, movie_data) -> Path:
    rows = zip(movie_data.test.texts[:16], movie_data.test.labels[:16], strict=True)
    path.write_text("text,label\n" + "".join(f'"{t.replace(chr(34), chr(39))}",{int(y)}\n' for t, y in rows))
    return path


def _external(onnx_dir: Path, out: Path) -> Path:
    """The ONNX dir with its weights in model.onnx.data (as a graph over 2 GB is saved)."""
    import onnx

    shutil.copytree(onnx_dir, out)
    onnx.save(onnx.load(str(out / "model.onnx")), str(out / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data")
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_model_dir, tiny_onnx_dir, sentence_model, movie_data) -> dict[str, Path]:
    """A good dir of each kind a command takes: a torch model dir (a classifier's, a sentence encoder's), an ONNX
    dir (its weights inside the graph or beside it), a bundle; and the data it reads."""
    root = tmp_path_factory.mktemp("file-corpus")
    result = invoke("bundle", tiny_onnx_dir, "--out", root / "bundle")
    assert result.exit_code == 0, result.output
    return {"torch": tiny_model_dir, "sentence": sentence_model, "onnx": tiny_onnx_dir,
            "onnx external data": _external(tiny_onnx_dir, root / "external"), "bundle": root / "bundle",
            "data": _eval_csv(root / "eval.csv", movie_data), "train": _csv(root / "train.csv", movie_data)}


# kind of dir -> command -> its arguments (DIR: the dir, OUT: an --out that must not be left behind, DATA: texts)
COMMANDS = {
    "torch": {"evaluate": ("evaluate", "DIR", "--data", "DATA", "--max-length", 32),
              "init": ("init", "DIR", "TRAIN", "--out", "OUT"),
              "export": ("export", "DIR", "--out", "OUT", "--data", "DATA", "--max-length", 32, "--no-optimize")},
    "onnx": {"evaluate": ("evaluate", "DIR", "--data", "DATA", "--max-length", 32),
             "bench": ("bench", "DIR", "--runs", 2, "--warmup", 0, "--seq-len", 16),
             "bundle": ("bundle", "DIR", "--out", "OUT"),
             "predict": ("predict", "DIR", "a fine film")},
    "bundle": {"evaluate": ("evaluate", "DIR", "--data", "DATA"),
               "bench": ("bench", "DIR", "--runs", 2, "--warmup", 0, "--seq-len", 16),
               "bundle": ("bundle", "DIR", "--out", "OUT"),
               "predict": ("predict", "DIR", "a fine film"),
               "predict.py": ("predict.py", "DIR", "a fine film", "--json")},
}
# a dir kind that holds what another kind holds and more: only its own files are mutated, given to that kind's
# commands (a sentence encoder's modules, pooling and prompts are read as `init` describes the model)
EXTENDS = {"sentence": ("torch", ("init",)), "onnx external data": ("onnx", tuple(COMMANDS["onnx"]))}
COMMANDS |= {kind: {command: COMMANDS[base][command] for command in commands}
             for kind, (base, commands) in EXTENDS.items()}


def _own_files(kind: str, dirs: dict) -> list[Path]:
    """The files of the good dir of `kind` that the dir it extends does not hold at the same place."""
    good = dirs[kind]
    if kind not in EXTENDS:
        return _files(good)
    base = dirs[EXTENDS[kind][0]]
    shared = {p.relative_to(base) for p in _files(base)}
    return [p for p in _files(good) if p.relative_to(good) not in shared]


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_every_file_of_a_model_dir_mutated_meets_every_command_that_reads_it(kind, dirs, tmp_path):
    """Each file of the dir (whatever the dir holds), mutated each way that applies to it, given to each command
    that takes such a dir: exit 0 (what the command does not read), 2 or 3, never a traceback; a refusal names the
    file or the dir, with a Fix; the dir and the data unchanged; no --out left behind."""
    good = dirs[kind]
    problems = []
    for command, args in COMMANDS[kind].items():
        result = invoke(*[_arg(a, good, dirs, tmp_path / "good-out") for a in args])
        assert result.exit_code == 0, f"{command} on the good {kind} dir: {result.output}"
        _clear(tmp_path / "good-out")
        for file in _own_files(kind, dirs):
            rel = file.relative_to(good)
            for name, mutate in mutations(file):
                case_dir = tmp_path / "case"
                shutil.copytree(good, case_dir, symlinks=True)
                mutate(case_dir / rel)
                out = tmp_path / "out"
                before = snapshot(case_dir, dirs["data"])
                result = invoke(*[_arg(a, case_dir, dirs, out) for a in args])
                COUNTS[command, f"{kind} dir files"] += 1
                problems.append(judge(result, f"{command} {kind}/{rel}: {name}", (rel.name, str(case_dir)),
                                      inputs=before, out=out if result.exit_code == 2 else None))
                _clear(case_dir, out)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


def test_a_tokenizer_saved_as_vocab_and_merges_alone_is_refused_whole_whatever_its_files_hold(family_model, dirs,
                                                                                             tmp_path):
    """A byte-level BPE tokenizer given by vocab.json + merges.txt (no tokenizer.json): transformers 5 builds it only
    with sentencepiece or tiktoken installed, which edgepress does not need, so the dir is refused with its fix
    (exit 2), as it is with either file mutated each way: never a traceback, the dir unchanged."""
    from transformers import AutoTokenizer

    good = tmp_path / "bpe"
    shutil.copytree(family_model("roberta"), good)
    AutoTokenizer.from_pretrained(good).backend_tokenizer.model.save(str(good))  # vocab.json, merges.txt
    (good / "tokenizer.json").unlink()
    cases = [("as saved", good / "vocab.json", lambda p: None)]
    cases += [(name, good / file, mutate) for file in ("vocab.json", "merges.txt") for name, mutate in
              mutations(good / file)]
    problems, case_dir = [], tmp_path / "case"
    for name, file, mutate in cases:
        shutil.copytree(good, case_dir, symlinks=True)
        mutate(case_dir / file.name)
        before = snapshot(case_dir)
        result = invoke("init", case_dir, dirs["train"], "--out", tmp_path / "out")
        COUNTS["init", "BPE vocab.json + merges.txt"] += 1
        problems.append(judge(result, f"init bpe/{file.name}: {name}", (str(case_dir),), refused=True,
                              inputs=before, out=tmp_path / "out"))
        _clear(case_dir)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


def _arg(arg, case_dir: Path, dirs: dict, out: Path):
    return {"DIR": case_dir, "DATA": dirs["data"], "TRAIN": dirs["train"], "OUT": out}.get(arg, arg) \
        if isinstance(arg, str) else arg


def _clear(*paths: Path) -> None:
    for path in paths:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)


# --- what a line of input is

# texts that hold, inside them, the characters str.splitlines would also end a line at
TEXTS = ("a fine film\u2028 after all", "dull\u2029 and long", "the plot\u0085 holds", "plain")


def _field_values(value) -> dict[str, object]:
    """name -> a value of another type or size for a config.json field holding `value`."""
    found = {"null": None, "in a list": [value], "in a mapping": {"x": value}}
    found |= {"as text": str(value)} if not isinstance(value, str) else {"a number": 7}
    if isinstance(value, int) and not isinstance(value, bool):
        found |= {"zero": 0, "negative": -1, "one more": value + 1}
    return found


# config.json fields that size a weight: any other value than the weights were saved with must be refused
SHAPING = {"num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings",
           "type_vocab_size"}


@pytest.mark.parametrize("kind", ["torch", "onnx", "bundle"])
def test_every_field_of_a_models_config_meets_its_bad_values_through_what_reads_it(kind, dirs, tmp_path):
    """Each field of a model dir's config.json (whatever it holds: a classifier's, its ONNX dir's, its bundle's)
    given values of other types and sizes, read by `evaluate` (the model loader, the label names, the tokenizer's
    limits): exit 0, 2 or 3, never a traceback; in a torch dir, a field that sizes a weight, given another size, is
    refused (weights that do not fit their config.json would make a model other than the one saved, silently)."""
    good = dirs[kind]
    config = {"id2label": {"0": "negative", "1": "positive"}, "label2id": {"negative": 0, "positive": 1},
              **json.loads((good / "config.json").read_text())}  # the label names too, where none were saved
    problems = []
    for field, value in config.items():
        for name, bad in _field_values(value).items():
            case_dir = tmp_path / "case"
            shutil.copytree(good, case_dir, symlinks=True)
            (case_dir / "config.json").write_text(json.dumps({**config, field: bad}))
            before = snapshot(case_dir, dirs["data"])
            result = invoke("evaluate", case_dir, "--data", dirs["data"], *(("--max-length", 32) if kind != "bundle"
                                                                            else ()))
            COUNTS["evaluate", f"{kind} config.json field values"] += 1
            shaping = kind == "torch" and field in SHAPING and isinstance(bad, int) and bad != value
            problems.append(judge(result, f"evaluate {kind} config.json {field}: {name}",
                                  ("config.json", str(case_dir)), refused=shaping, inputs=before))
            _clear(case_dir)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_every_text_reader_ends_a_line_at_a_line_end_only(end, dirs, tmp_path, movie_data):
    """`\\n`, `\\r\\n` and `\\r` end a line; U+2028, U+2029 and U+0085 inside a line are text: the bundle's
    `predict.py --file` gives one result a line, in order, and edgepress reads a .txt fidelity set and transfer
    texts with the same lines."""
    import subprocess
    import sys

    from edgepress.data import DataConfig, load_data

    file = tmp_path / "texts.txt"
    file.write_bytes(end.join(TEXTS).encode() + end.encode())
    done = subprocess.run([sys.executable, str(dirs["bundle"] / "predict.py"), "--file", str(file), "--json"],
                          capture_output=True, text=True, timeout=300)
    COUNTS["predict.py", "line ends"] += 1
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["text"] for line in done.stdout.splitlines()] == list(TEXTS)
    transfer = tmp_path / "transfer.txt"  # texts of its own: those judged on (the fidelity set's) are left out
    transfer.write_bytes(end.join(f"more: {text}" for text in TEXTS).encode() + end.encode())
    data = load_data(DataConfig(source=str(_csv(tmp_path / "d.csv", movie_data)), fidelity_sets={"f": str(file)},
                                unlabeled=str(transfer)))
    COUNTS["run", "line ends"] += 1
    assert data.fidelity["f"].texts == TEXTS and data.unlabeled == tuple(f"more: {text}" for text in TEXTS)


# --- every data file a run or a command reads


def _jsonl(path: Path, movie_data) -> Path:
    rows = zip(movie_data.train.texts[:200], movie_data.train.labels[:200], strict=True)
    path.write_text("".join(json.dumps({"text": t, "label": int(y)}) + "\n" for t, y in rows))
    return path


def _texts(path: Path, movie_data) -> Path:
    path.write_text("".join(f"{t}\n" for t in movie_data.test.texts[500:540]))
    return path


def _pairs(root: Path) -> dict[str, Path]:
    """The STS Benchmark's first 60 test pairs as a data.pairs file of each kind."""
    from edgepress.data.sts import sts_pairs

    rows = [{"sentence1": a, "sentence2": b, "score": score} for a, b, score in sts_pairs("test")[:60]]
    (root / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with (root / "pairs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return {"pairs.csv": root / "pairs.csv", "pairs.jsonl": root / "pairs.jsonl"}


def _tagged(root: Path, conll) -> dict[str, Path]:
    """Real CoNLL-2003 sentences as a CoNLL file and as tagged JSON lines."""
    (root / "tags.conll").write_text("-DOCSTART- -X- -X- O\n\n" + conll_text(conll["train"][:300]))
    (root / "tags.jsonl").write_text("".join(json.dumps({"tokens": w, "tags": t}) + "\n"
                                             for w, t in conll["train"][:300]))
    return {"conll": root / "tags.conll", "tags.jsonl": root / "tags.jsonl"}


@pytest.fixture(scope="module")
def data_files(tmp_path_factory, movie_data, conll) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data-corpus")
    return {"csv": _csv(root / "d.csv", movie_data), "jsonl": _jsonl(root / "d.jsonl", movie_data),
            "txt": _texts(root / "t.txt", movie_data), **_pairs(root), **_tagged(root, conll)}


@pytest.fixture(scope="module")
def sentence_model(tmp_path_factory, tokenizer) -> Path:
    """A tiny sentence-transformers dir (mean pooling, normalized)."""
    from tests.test_sentence import st_dir

    return st_dir(tmp_path_factory.mktemp("st"), tokenizer, "mean", True)


# where a data file goes: its kinds, and the command line that reads it (FILE: the mutated file; CONFIG: a pipeline
# config written with it, of the tiny classifier unless it names a model: MODEL/ONNX the tiny torch model / its ONNX
# export, SENTENCE a sentence encoder, TOKEN a token classifier)
DATA_READERS = {
    "data.source (tags)": (("conll", "tags.jsonl"), ("validate", "CONFIG"), {"model": "TOKEN",
                                                                             "data": {"source": "FILE"}}),
    "data.pairs": (("pairs.csv", "pairs.jsonl"), ("validate", "CONFIG"), {"model": "SENTENCE",
                                                                          "data": {"source": "GOOD",
                                                                                   "pairs": "FILE"}}),
    "data.source": (("csv", "jsonl"), ("validate", "CONFIG"), {"data": {"source": "FILE"}}),
    "data.unlabeled": (("txt", "csv", "jsonl"), ("validate", "CONFIG"), {"data": {"source": "GOOD",
                                                                                 "unlabeled": "FILE"}}),
    "data.fidelity_sets": (("txt", "csv", "jsonl"), ("validate", "CONFIG"),
                           {"data": {"source": "GOOD", "fidelity_sets": {"mine": "FILE"}}}),
    "evaluate --data": (("csv", "jsonl"), ("evaluate", "ONNX", "--data", "FILE", "--max-length", 32), None),
    "bench --data": (("csv", "jsonl"), ("bench", "ONNX", "--data", "FILE", "--runs", 2, "--warmup", 0), None),
    "export --data": (("csv",), ("export", "MODEL", "--out", "OUT", "--data", "FILE", "--max-length", 32,
                                 "--no-optimize"), None),
    "init DATA": (("csv", "jsonl"), ("init", "MODEL", "FILE", "--out", "OUT"), None),
}


def _fill(value, names: dict):
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    return str(names[value]) if isinstance(value, str) and value in names else value


@pytest.mark.parametrize("reader", list(DATA_READERS))
def test_every_data_file_mutated_meets_what_reads_it(reader, data_files, tiny_model_dir, tiny_onnx_dir, sentence_model,
                                                     token_model, tmp_path):
    """Each data file kind a reader takes, mutated each way that applies, read where a user gives it: exit 0 (what
    is still fine), 2 or 3; no traceback; a refusal names the file, with a Fix; the file unchanged; no --out."""
    kinds, args, section = DATA_READERS[reader]
    problems = []
    for kind in kinds:
        good = data_files[kind]
        for name, mutate in [("as it is", lambda p: None), *mutations(good)]:
            file = tmp_path / f"case{good.suffix}"
            shutil.copyfile(good, file)
            mutate(file)
            names = {"FILE": file, "GOOD": data_files["csv"], "MODEL": tiny_model_dir, "ONNX": tiny_onnx_dir,
                     "SENTENCE": sentence_model, "TOKEN": token_model, "OUT": tmp_path / "out"}
            if section is not None:
                config = tmp_path / "p.yaml"
                config.write_text(yaml.safe_dump({"model": str(tiny_model_dir), **_fill(section, names),
                                                  "runtime": FAST_RUNTIME,
                                                  "stages": [{"name": "export", "method": "export"}]}))
                names["CONFIG"] = config
            before = snapshot(file) if file.is_file() else None
            result = invoke(*[_fill(a, names) for a in args])
            COUNTS[args[0], f"{reader} ({kind})"] += 1
            problem = judge(result, f"{reader} {kind}: {name}", (file.name,), inputs=before,
                            out=names["OUT"] if result.exit_code == 2 else None)
            if name == "as it is" and result.exit_code != 0:
                problem = f"{reader} {kind}: the good file is refused: {result.output[-300:]}"
            problems.append(problem)
            _clear(file, names["OUT"])
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory, movie_data, conll) -> dict[str, Path]:
    """A data dir of each kind: a dataset saved by datasets' save_to_disk, and a token classifier's split files."""
    from datasets import Dataset, DatasetDict

    root = tmp_path_factory.mktemp("data-dirs")
    splits = {"train": movie_data.train, "validation": movie_data.validation, "test": movie_data.test}
    DatasetDict({name: Dataset.from_dict({"text": list(split.texts[:80]), "label": [int(y) for y in
                                                                                     split.labels[:80]]})
                 for name, split in splits.items()}).save_to_disk(str(root / "saved"))
    tagged = root / "tagged"
    tagged.mkdir()
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        (tagged / f"{name}.conll").write_text(conll_text(conll[split][:100]))
    return {"saved dataset": root / "saved", "tagged dir": tagged}


DATA_DIRS = {"saved dataset": "MODEL", "tagged dir": "TOKEN"}  # kind of data dir -> the model it is given with


@pytest.mark.parametrize("kind", list(DATA_DIRS))
def test_every_file_of_a_data_dir_mutated_meets_validate(kind, data_dirs, tiny_model_dir, token_model, tmp_path):
    """Each file of a data dir (whatever the dir holds), mutated each way that applies, as data.source: `validate`
    exits 0 (what is still fine) or 2 naming the file or the dir, with a Fix; never a traceback; the dir unchanged."""
    good, model = data_dirs[kind], {"MODEL": tiny_model_dir, "TOKEN": token_model}[DATA_DIRS[kind]]
    config, case_dir = tmp_path / "p.yaml", tmp_path / "data"
    config.write_text(yaml.safe_dump({"model": str(model), "data": {"source": str(case_dir)},
                                      "runtime": FAST_RUNTIME, "stages": [{"name": "export", "method": "export"}]}))
    shutil.copytree(good, case_dir)
    result = invoke("validate", config)
    assert result.exit_code == 0, f"the good {kind}: {result.output}"
    _clear(case_dir)
    problems = []
    for file in _files(good):
        rel = file.relative_to(good)
        for name, mutate in mutations(file):
            shutil.copytree(good, case_dir, symlinks=True)
            mutate(case_dir / rel)
            before = snapshot(case_dir)
            result = invoke("validate", config)
            COUNTS["validate", f"data.source ({kind} files)"] += 1
            problems.append(judge(result, f"validate {kind}/{rel}: {name}", (rel.name, str(case_dir)),
                                  inputs=before))
            _clear(case_dir)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


# --- the config file itself


@pytest.mark.parametrize("kind", ["pipeline", "search"])
def test_a_config_file_mutated_is_refused_alike_by_validate_and_by_what_runs_it(kind, config_bases, tmp_path):
    """The YAML file, mutated each way that applies: `validate` exits 0 or 2 (naming the file, with a Fix), never a
    traceback; what it refuses, `run` (or `search`) refuses too, with no --out left behind."""
    good = tmp_path / f"{kind}.yaml"
    good.write_text(yaml.safe_dump(config_bases[kind][""]))
    command = "run" if kind == "pipeline" else "search"
    problems, out = [], tmp_path / "out"
    for name, mutate in mutations(good):
        file = tmp_path / "case.yaml"
        shutil.copyfile(good, file)
        mutate(file)
        before = snapshot(file) if file.is_file() else None
        result = invoke("validate", file)
        COUNTS["validate", f"{kind} file"] += 1
        # a refusal names the file, or what in it is wrong (a value cut short: the model's path)
        problems.append(judge(result, f"validate {kind} file: {name}", (file.name, "model"), inputs=before))
        if result.exit_code == 2:
            result = invoke(command, file, "--out", out, *(("--trials", 1) if kind == "search" else ()))
            COUNTS[command, f"{kind} file"] += 1
            problems.append(judge(result, f"{command} {kind} file: {name}", (file.name, "model"), refused=True,
                                  inputs=before, out=out))
        _clear(file, out)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


# --- a run dir's own records


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, movie_data) -> tuple[Path, Path]:
    """(a finished, passed run of the tiny model: export, fuse, int8; its config)."""
    root = tmp_path_factory.mktemp("run-corpus")
    config = root / "p.yaml"
    config.write_text(yaml.safe_dump({"model": str(tiny_model_dir), "data": {"source": str(_csv(root / "d.csv",
                                                                                                movie_data))},
                                      "runtime": FAST_RUNTIME,
                                      "stages": [{"name": "export", "method": "export"},
                                                 {"name": "fuse", "method": "optimize", "params": {"fusions": "all"}},
                                                 {"name": "int8", "method": "int8-dynamic"}]}))
    result = invoke("run", config, "--out", root / "run")
    assert result.exit_code == 0, result.output
    return root / "run", config


# what a resumed run meets of each record (the slow command: two mutations that differ in kind)
RESUMED = ("truncated at half", "JSON of another shape")


def test_every_record_of_a_run_dir_mutated_meets_bundle_evaluate_and_resume(run_dir, dirs, tmp_path):
    """Each of a run dir's own records (the JSON files it writes; its models are the ONNX dirs' cases), mutated each
    way, given to what reads it: the run's top-level records to `bundle RUN` and `evaluate RUN`, every record (with
    the mutations in `RESUMED`) to `run --resume`, which takes a damaged record as none and runs that stage again.
    Exit 0, 2 or 3, no traceback, a refusal named with a Fix, no --out left behind."""
    good, config = run_dir
    records = sorted(p for p in good.rglob("*.json") if "final" not in p.parts and "model" not in p.parts)
    assert {"run.json", "report.json", "stage.json"} <= {p.name for p in records}
    problems, case_dir, out = [], tmp_path / "run", tmp_path / "out"
    for file in records:
        rel = file.relative_to(good)
        for name, mutate in mutations(file):
            top = len(rel.parts) == 1  # run.json, report.json, data_split.json: what bundle and evaluate read
            resume = name in RESUMED  # every stage's records, and the top-level ones
            if not (top or resume):
                continue
            shutil.copytree(good, case_dir, symlinks=True)
            mutate(case_dir / rel)
            before = snapshot(case_dir)
            commands = [("bundle", case_dir, "--out", out),
                        ("evaluate", case_dir, "--data", dirs["data"], "--max-length", 32)] if top else []
            for args in commands:
                result = invoke(*args)
                COUNTS[args[0], "run dir records"] += 1
                problems.append(judge(result, f"{args[0]} run/{rel}: {name}", (rel.name, str(case_dir)),
                                      inputs=before, out=out if result.exit_code == 2 else None))
                _clear(out)
            if resume:  # --resume writes into the run dir: its inputs are the config and the model
                result = invoke("run", config, "--out", case_dir, "--resume")
                COUNTS["run", "run dir records (--resume)"] += 1
                problems.append(judge(result, f"run --resume run/{rel}: {name}", (rel.name, str(case_dir))))
            _clear(case_dir, out)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


# --- every command-line option


def _int_values(low, high) -> list[str]:
    """An integer option's bad set: not a number, a fraction, below its least value (or 0 and -1), above its
    greatest."""
    below = [str(low - 1)] if low is not None else ["0", "-1"]
    return ["x", "1.5", *below, *([str(high + 1)] if high is not None else [])]


def option_values(param) -> list[str]:
    """The bad set of a typer option, from its declared type: what the command line itself can get wrong."""
    import enum

    annotation = param.type_descriptor.annotation
    if annotation is int:
        return _int_values(param.min, param.max)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return ["no-such-choice"]
    if annotation is str or annotation in (Path, Path | None):
        return [""]  # a path given as "": the current dir (the file corpus mutates what a path names)
    return []  # a flag, a list of names


def argparse_values(action) -> list[str]:
    """The bad set of an argparse option of a bundle's predict.py."""
    if action.choices:
        return ["no-such-choice"]
    if action.type is int:
        return _int_values(None, None)
    return [""] if action.type in (None, str, Path) else []


# command -> a good command line that is cheap to run (the names as in `_arg`); the option cases go after it
CLI_BASES = {
    "teacher": ("teacher", "--out", "OUT"), "demo": ("demo", "--out", "OUT"),
    "run": ("run", "CONFIG", "--out", "OUT"), "search": ("search", "SEARCH", "--out", "OUT", "--trials", 1),
    "validate": ("validate", "CONFIG"), "init": ("init", "MODEL", "TRAIN", "--out", "OUT"),
    "schema": ("schema", "pipeline"),
    "evaluate": ("evaluate", "ONNX", "--data", "DATA", "--max-length", 32),
    "export": ("export", "MODEL", "--out", "OUT", "--data", "DATA", "--max-length", 32, "--no-optimize"),
    "bench": ("bench", "ONNX", "--runs", 2, "--warmup", 0, "--seq-len", 16),
    "bundle": ("bundle", "ONNX", "--out", "OUT"),
    "predict": ("predict", "BUNDLE", "a fine film"),
    "predict.py": ("predict.py", "BUNDLE", "a fine film"),
    "predict.py similar": ("predict.py", "BUNDLE", "similar", "a fine film", "--corpus", "DATA"),
}


def cli_cases() -> list[tuple[str, tuple, tuple[str, ...]]]:
    """(command, the option's arguments, what a refusal names) for every option of every command (the typer app's
    and predict.py's parsers) with each value of its bad set, the option given with no value, and an option that
    does not exist."""
    import typer.main

    from edgepress.device.cli import _parser, _similar_parser

    options = {name: [(p.opts[0], option_values(p)) for p in command.params if p.param_type_name == "option"
                      and not p.is_flag]
               for name, command in typer.main.get_command(app).commands.items()}
    for name, parser in (("predict.py", _parser(Path("."))), ("predict.py similar", _similar_parser(Path(".")))):
        options[name] = [(a.option_strings[-1], argparse_values(a)) for a in parser._actions
                         if a.option_strings and a.nargs != 0]
    assert set(options) == set(CLI_BASES), "a command without a base command line in CLI_BASES"
    cases = []
    for command, found in options.items():
        cases.append((command, ("--no-such-option",), ("--no-such-option",)))
        for option, values in found:
            names = (option, option.lstrip("-"), option.lstrip("-").replace("-", "_"))
            cases += [(command, (option, value), names) for value in values]
            cases.append((command, (option,), names))  # the option last, its value missing
    return cases


def test_every_command_line_option_meets_its_bad_values_with_exit_2_and_its_name(dirs, config_bases, tiny_model_dir,
                                                                                  tiny_onnx_dir, tmp_path,
                                                                                  monkeypatch):
    """Every option of every command (and of a bundle's predict.py), generated from the parsers themselves, given
    each value of its type's bad set, no value, or an option that does not exist: exit 0 (the value is in fact fine),
    or 2 naming the option with a Fix; never a traceback, no --out left behind. It runs in a dir of the user's own
    (a path given as "" names it), which stays as it was."""
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "notes.txt").write_text("the user's own file\n")
    monkeypatch.chdir(here)
    pipeline, search = tmp_path / "p.yaml", tmp_path / "s.yaml"
    pipeline.write_text(yaml.safe_dump(config_bases["pipeline"][""]))
    search.write_text(yaml.safe_dump(config_bases["search"][""]))
    out = tmp_path / "out"
    names = {"OUT": out, "CONFIG": pipeline, "SEARCH": search, "MODEL": tiny_model_dir, "ONNX": tiny_onnx_dir,
             "BUNDLE": dirs["bundle"], "DATA": dirs["data"], "TRAIN": dirs["train"]}
    problems = []
    for command, option, named in cli_cases():
        before = snapshot(pipeline, search, dirs["data"], dirs["bundle"], here)
        result = invoke(*[names.get(a, a) if isinstance(a, str) else a for a in CLI_BASES[command]], *option)
        COUNTS[command.split()[0], "command-line options"] += 1
        problems.append(judge(result, f"{command} {' '.join(map(repr, option))}", named, inputs=before,
                              out=out if result.exit_code == 2 else None))
        _clear(out)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


# what a resumed run meets of a stage's stored vectors: cut short, not an .npz at all, a directory in its place
RESUMED_ARRAYS = ("truncated at half", "random bytes", "a directory in its place")


def test_a_stages_stored_vectors_mutated_are_taken_as_no_record_by_resume(sentence_model, movie_data, tmp_path):
    """An embedding run keeps a stage's sentence vectors in predictions.npz beside predictions.json: mutated (the
    kinds in RESUMED_ARRAYS), `run --resume` takes that stage's record as none and runs it again: exit 0, never a
    traceback."""
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"model": str(sentence_model),
                                      "data": {"source": str(_csv(tmp_path / "d.csv", movie_data))},
                                      "runtime": FAST_RUNTIME, "stages": [{"name": "export", "method": "export"}]}))
    good, case_dir = tmp_path / "run", tmp_path / "case"
    result = invoke("run", config, "--out", good)
    assert result.exit_code == 0, result.output
    [file] = [p for p in good.rglob("predictions.npz") if "01-export" in p.parts]
    rel, problems = file.relative_to(good), []
    for name, mutate in mutations(file):
        if name not in RESUMED_ARRAYS:
            continue
        shutil.copytree(good, case_dir, symlinks=True)
        mutate(case_dir / rel)
        result = invoke("run", config, "--out", case_dir, "--resume")
        COUNTS["run", "run dir arrays (--resume)"] += 1
        problems.append(judge(result, f"run --resume run/{rel}: {name}", (rel.name, str(case_dir))))
        if result.exit_code == 0 and "reused_from" in json.loads((case_dir / rel.parent / "stage.json").read_text()):
            problems.append(f"run --resume run/{rel}: {name}: the stage was reused, not run again")
        _clear(case_dir)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)


# what a resumed search meets of its study database: cut short, not a database, a directory in its place
RESUMED_STUDY = ("truncated at half", "random bytes", "a directory in its place")


def test_a_search_dirs_study_database_mutated_meets_search_resume(config_bases, tmp_path):
    """A search dir's study.db (the record of every trial), mutated (the kinds in RESUMED_STUDY), given to `search
    --resume`: exit 0 (sqlite still reads it) or 2 naming the database with a Fix; never a traceback."""
    config, good, case_dir = tmp_path / "s.yaml", tmp_path / "search", tmp_path / "case"
    config.write_text(yaml.safe_dump(config_bases["search"][""]))
    result = invoke("search", config, "--out", good, "--trials", 1)
    assert result.exit_code == 0, result.output
    problems = []
    for name, mutate in mutations(good / "study.db"):
        if name not in RESUMED_STUDY:
            continue
        shutil.copytree(good, case_dir, symlinks=True)
        mutate(case_dir / "study.db")
        result = invoke("search", config, "--out", case_dir, "--trials", 1, "--resume")
        COUNTS["search", "study database (--resume)"] += 1
        problems.append(judge(result, f"search --resume search/study.db: {name}", ("study.db",)))
        if "--storage" in result.output:  # the search's own database: no URL was given
            problems.append(f"search --resume search/study.db: {name}: a fix that speaks of --storage")
        _clear(case_dir)
    problems = [p for p in problems if p]
    assert not problems, failed(problems)
