"""The package's import graph has no cycle, and every package says what it owns.

Every `import` and `from ... import` of a genesys module counts, wherever it stands: at the top, inside
a function (a lazy import runs all the same, only later) and under `if TYPE_CHECKING:` (the annotation
still names the other module: a cycle through type hints is a layering that points both ways).
Relative imports are resolved. Importing `genesys.a.b` runs `genesys/a/__init__.py` first, so the edge
goes to each package on the way too, except those the importer is itself inside (they are running
already). A module named by a string handed to `importlib` is not seen: the package does that only for
plugins, built-in commands and backends, each loaded by something below it.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE = "genesys"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

Edges = dict[str, dict[str, str]]  # module -> {imported module: "file:line" of the first such import}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name; a package is its `__init__.py`."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]
) -> list[str]:
    """The dotted names whose namespace an import statement reads: `import a.b` reads a.b; `from a
    import b` reads a.b when that is a module, else a (where b is defined)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The genesys module a dotted name loads: the longest prefix that is a module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_graph() -> Edges:
    modules = _modules()
    names = set(modules)
    edges: Edges = {name: {} for name in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        own_packages = set(_ancestors(module))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, path.name == "__init__.py", names):
                if name != PACKAGE and not name.startswith(PACKAGE + "."):
                    continue
                target = _resolve(name, modules)
                if target is None:
                    continue
                for loaded in (target, *(p for p in _ancestors(target) if p not in own_packages)):
                    if loaded != module:
                        where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                        edges[module].setdefault(loaded, where)
    return edges


def package_graph(edges: Edges) -> Edges:
    """The module graph collapsed to genesys's packages and top-level modules (`genesys.x`)."""

    def top_level(module: str) -> str:
        return ".".join(module.split(".")[:2])

    collapsed: Edges = {}
    for module, targets in edges.items():
        node = collapsed.setdefault(top_level(module), {})
        for target, where in targets.items():
            if top_level(target) != top_level(module):
                node.setdefault(top_level(target), where)
    return collapsed


def _reachable(edges: Edges, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in edges.get(todo.pop(), {}):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _shortest_cycle(edges: Edges, start: str) -> list[str] | None:
    """The shortest cycle through `start` as [start, ..., start] (breadth first), or None."""
    parents: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if start in edges.get(node, {}):
            path = [node]
            while path[-1] != start:
                path.append(parents[path[-1]])
            return [*reversed(path), start]
        for target in sorted(edges.get(node, {})):
            if target not in parents and target != start:
                parents[target] = node
                queue.append(target)
    return None


def find_cycles(edges: Edges) -> list[list[str]]:
    """One shortest cycle for each set of modules that import each other round a loop."""
    reach = {node: _reachable(edges, node) for node in edges}
    cycles, covered = [], set()
    for node in sorted(edges):
        if node in covered or node not in reach[node]:
            continue
        loop = {other for other in reach[node] if node in reach.get(other, ())}
        covered |= loop
        cycles.append(min((_shortest_cycle(edges, member) for member in sorted(loop)), key=len))
    return cycles


def describe(cycles: list[list[str]], edges: Edges) -> str:
    return "\n\n".join(
        "\n".join(f"  {a} -> {b}  ({edges[a][b]})" for a, b in zip(cycle, cycle[1:])) for cycle in cycles
    )


def test_find_cycles_names_the_shortest_loop_of_each_tangle():
    edges = {
        "a": {"b": "a.py:1"},
        "b": {"c": "b.py:1", "a": "b.py:2"},
        "c": {"a": "c.py:1", "d": "c.py:2"},
        "d": {"e": "d.py:1"},
        "e": {"d": "e.py:1"},
    }
    assert find_cycles(edges) == [["a", "b", "a"], ["d", "e", "d"]]
    assert find_cycles({"a": {"b": "a.py:1"}, "b": {}}) == []


def test_no_module_imports_itself_back():
    edges = module_graph()
    cycles = find_cycles(edges)
    assert not cycles, "import cycles between modules:\n" + describe(cycles, edges)


def test_packages_import_one_way():
    edges = package_graph(module_graph())
    cycles = find_cycles(edges)
    assert not cycles, "import cycles between packages:\n" + describe(cycles, edges)


def _package_dirs() -> list[Path]:
    """Every folder of the package that holds Python modules."""
    return sorted({path.parent for path in ROOT.rglob("*.py") if "__pycache__" not in path.parts})


@pytest.mark.parametrize("folder", _package_dirs(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_every_package_says_what_it_owns(folder: Path):
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder} holds modules but no __init__.py"
    assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), f"{init} has no docstring"
