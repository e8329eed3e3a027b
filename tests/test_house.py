"""The house's seams, read from the source (an AST walk of src/, imports made lazily inside functions included):
no import circles between modules, and no private name taken from another module."""

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


def test_no_private_name_is_taken_from_another_module():
    modules = _modules()
    taken = [f"{path.relative_to(SRC)}:{line} takes {target}.{what}"
             for name, path in modules.items() for target, what, line in _imports(name, path, modules)
             if what is not None and what.startswith("_") and not what.startswith("__") and target != name]
    assert taken == []
