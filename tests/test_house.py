"""The house's seams, read from the source (an AST walk of src/, imports made lazily inside functions included):
no import circles between modules nor between packages, no private name taken from another module, and the task
asked, not worked out again, outside tasks/."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of src/ (a package by its __init__.py)."""
    found = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str | None, int]]:
    """(module imported, the name taken from it or None, line) for every import of a src/ module in `path`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # a submodule
                    found.append((f"{base}.{alias.name}", None, node.lineno))
                elif base in modules:
                    found.append((base, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {target for target, _, _ in _imports(name, path, modules) if target != name}
            for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is at least one import circle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_every_kind_of_import():
    """The checks below can fail: the walk finds top-level, lazy and package imports, and a planted circle."""
    graph = _graph()
    assert "edgepress.compress.kd" in graph["edgepress.compress.distill"]  # top-level `from ... import`
    assert "edgepress.models.fakequant" in graph["edgepress.pipeline.measure"]  # inside a function
    assert "edgepress.tasks" in graph["edgepress.compress.kd"]  # a package (tasks/__init__.py)
    planted = {**graph, "edgepress.tasks": graph["edgepress.tasks"] | {"edgepress.compress.kd"}}
    assert ["edgepress.compress.kd", "edgepress.tasks"] in _circles(planted)


def test_no_two_modules_import_each_other():
    assert _circles(_graph()) == []


def _package(module: str) -> str:
    """The package of src/edgepress a module belongs to (`edgepress.compress.kd` -> `edgepress.compress`); a module
    directly under edgepress/ (`edgepress.registry`) is its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (SRC / Path(*parts)).is_dir() else module


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph seen package by package: an import between two packages' modules joins the packages."""
    found: dict[str, set[str]] = {}
    for module, targets in graph.items():
        package = _package(module)
        found.setdefault(package, set()).update(_package(t) for t in targets if _package(t) != package)
    return found


def test_the_package_walk_sees_a_circle_between_packages():
    """The check below can fail: a lazy import planted from tasks/ into deploy/ (which imports tasks) is a circle."""
    graph = _graph()
    assert _package("edgepress.compress.kd") == "edgepress.compress" and _package("edgepress.tasks") == \
        "edgepress.tasks" and _package("edgepress.registry") == "edgepress.registry"
    assert "edgepress.tasks" in _packages(graph)["edgepress.deploy"]
    planted = {**graph, "edgepress.tasks.embedding": graph["edgepress.tasks.embedding"] | {"edgepress.deploy.web"}}
    assert ["edgepress.deploy", "edgepress.tasks"] in _circles(_packages(planted))


def test_no_two_packages_import_each_other():
    """compress/ and export/, deploy/, models/ and tasks/ imported each other in two circles (issue 77); a method's
    package sits above the passes it uses, tasks/ above models/."""
    assert _circles(_packages(_graph())) == []


def test_no_private_name_is_taken_from_another_module():
    modules = _modules()
    taken = [f"{path.relative_to(SRC)}:{line} takes {target}.{what}"
             for name, path in modules.items() for target, what, line in _imports(name, path, modules)
             if what is not None and what.startswith("_") and not what.startswith("__") and target != name]
    assert taken == []


# What telling the three tasks apart looks like in the source: comparing a task's `targets` or a task's name, sniffing
# a model or its dir, testing which kind of data set a split is.
TASK_NAMES = {"classification", "embedding", "token-classification"}
TASK_CONSTANTS = {"CLASSIFICATION", "EMBEDDING", "TOKEN_CLASSIFICATION"}  # tasks/' objects, device/bundle.py's names
SNIFFS = {"is_token_classifier_dir", "is_sentence_encoder", "is_sentence_dir"}
DATA_SETS = {"TaggedSet", "PairSet", "TextSet"}

# The places outside tasks/ that still tell the tasks apart, (module, function) -> (how many, why they stay): one
# more fails the test below, so a new branch is a decision made here, not a drift.
TASK_BRANCHES = {
    ("cli/app.py", "evaluate"): (1, "rendering: a token classifier's figures are entity-level, over sentences"),
    ("compress/distill.py", "distill"): (1, "a sentence encoder distils on vectors (distill_embeddings)"),
    ("compress/kd.py", "load_with_kd_targets"): (1, "vectors have their own loss and scoring, by task.targets"),
    ("compress/kd.py", "transfer_set"): (1, "tagged data's transfer set is built per word (tagged_transfer_set)"),
    ("compress/structured.py", "recover"): (1, "a sentence encoder prunes on vectors, by task.targets"),
    # the device: each task's reader, picked by the task the manifest records (device/bundle.bundle_task), the graph
    # checked against it; torch-free, so it cannot ask tasks/, whose names and outputs are its constants
    ("device/cascade.py", "__init__"): (1, "a cascade is of classifiers or token classifiers, both of one task"),
    ("device/cli.py", "answer_lines"): (1, "what predict.py and `edgepress predict` print, by the task"),
    ("device/cli.py", "similar"): (1, "`similar` refuses a classifier's bundle in its own words"),
    ("device/predictor.py", "__init__"): (2, "a tagger's reader; id2label, which every labelled task needs"),
    ("device/predictor.py", "embed"): (1, "vectors from an embedder only"),
    ("device/predictor.py", "logits"): (1, "labels from a classifier only"),
    ("device/sessions.py", "task_output"): (2, "the graph gives what the task's reader reads"),
    ("models/loading.py", "load_classifier"): (1, "its default class, for callers that load a classifier dir bare"),
    ("models/sentence.py", "encoder_of"): (1, "the module a method changes: a sentence encoder's Transformer"),
    ("models/sentence.py", "module_folders"): (1, "not a task branch: the sentence-transformers format's own folders"),
}


def _task_branches() -> dict[tuple[str, str], list[int]]:
    """(module under src/edgepress, innermost function) -> lines, for every place outside tasks/ that tells the tasks
    apart (see TASK_NAMES, SNIFFS, DATA_SETS)."""
    found: dict[tuple[str, str], list[int]] = {}
    root = SRC / "edgepress"
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] != "tasks":
            _find_branches(ast.parse(path.read_text(encoding="utf-8")), path.relative_to(root).as_posix(),
                           "<module>", found)
    return found


def _find_branches(node: ast.AST, module: str, function: str, found: dict) -> None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        function = node.name
    if _tells_tasks_apart(node):
        found.setdefault((module, function), []).append(node.lineno)
    for child in ast.iter_child_nodes(node):
        _find_branches(child, module, function, found)


def _tells_tasks_apart(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(isinstance(side, ast.Attribute) and side.attr == "targets" for side in sides) or \
            any(isinstance(side, ast.Constant) and side.value in TASK_NAMES for side in sides) or \
            any(getattr(side, "id", getattr(side, "attr", None)) in TASK_CONSTANTS for side in sides)
    if isinstance(node, ast.Call):
        called = getattr(node.func, "id", getattr(node.func, "attr", None))
        if called in SNIFFS:
            return True
        if called == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            return any(getattr(kind, "id", None) in DATA_SETS for kind in kinds)
    return False


def test_the_walk_sees_every_way_of_telling_the_tasks_apart():
    """The check below can fail: each way, planted in a function, is found."""
    for planted in ("task.targets == 'vectors'", "name != 'token-classification'", "is_sentence_dir(path)",
                    "predictor.task == EMBEDDING", "task is not bundle.CLASSIFICATION",
                    "isinstance(train, (TextSet, TaggedSet))"):
        tree = ast.parse(f"def f():\n    return {planted}\n")
        assert any(_tells_tasks_apart(node) for node in ast.walk(tree)), planted
    assert not any(_tells_tasks_apart(node) for node in ast.walk(ast.parse("task.name == other.name")))


def test_the_task_is_asked_not_worked_out_again_outside_tasks():
    """Outside tasks/ the three tasks are told apart only where TASK_BRANCHES says why (issue 50: from 43 sites in 18
    modules to these)."""
    found = {site: len(lines) for site, lines in _task_branches().items()}
    allowed = {site: count for site, (count, _) in TASK_BRANCHES.items()}
    assert found == allowed, {site: _task_branches().get(site) for site, _ in set(found.items()) ^ set(allowed.items())}


def test_the_device_reads_a_bundles_task_from_its_manifest_not_from_its_graph():
    """device/ picks a bundle's reader by the task its manifest records (`bundle.bundle_task`) and checks the graph
    against it (`sessions.task_output`); before issue 77 it worked the task out again from the graph's output names.
    `output_name` and `gives_token_logits` stay for what reads a graph alone (a pass's parity, a CUDA binding)."""
    guesses = {"output_name", "gives_token_logits"}
    calls = [f"{path.name}:{node.lineno}" for path in sorted((SRC / "edgepress" / "device").glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in guesses]
    assert calls == []


BENCHMARKS = SRC.parent / "benchmarks"
MOST_BENCHMARKS = 11  # scripts with a main: the side-by-side harnesses (classifier, embedder, tagger), their peers'
# builders (optimum, sentence-transformers and model2vec), the sweep over families, the device runs (arm64, cuda), the
# two teachers the examples use and the cascade's confidence rule
PROVENANCE = {"environment", "cpu_model", "isa_flags", "node"}  # what benchmarks/harness.py's provenance() records


def _own_provenance(path: Path) -> list[int]:
    """The lines of `path` that record the machine themselves instead of through harness.provenance()."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in PROVENANCE]


def test_the_provenance_walk_sees_a_script_recording_the_machine_itself():
    """The check below can fail."""
    assert _own_provenance(BENCHMARKS / "harness.py")  # harness itself records it: the one place
    assert not _own_provenance(BENCHMARKS / "compare.py")


def test_benchmarks_are_a_few_harnesses_with_one_provenance_header():
    """benchmarks/ holds a few scripts (issue 78: 34 with their own mains, 23 provenance headers whose keys
    disagreed), each recording where and how it measured through harness.provenance(); a module without a main
    (the XLM-R tokenizer the sweep uses) is not a script."""
    files = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "harness.py")
    scripts = [p.name for p in files if '__name__ == "__main__"' in p.read_text(encoding="utf-8")]
    assert len(scripts) <= MOST_BENCHMARKS, scripts
    assert {p.name: lines for p in files if (lines := _own_provenance(p))} == {}
