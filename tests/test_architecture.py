"""Imports point down the layers (DESIGN.md, docs/development.md), and no module reaches itself through its imports.

    faces      cli, entry, __main__, the package's Python API (__init__, api), pytest_plugin
    commands   inspection, compat, diff -> verify -> export
    engines    data -> runtimes -> serving
    knowledge  tfversions, tfexample, sources -> savedmodel
    primitives report, options, compare, inputs, storage
    ground     errors, findings, dtypes, files, log, version, tfenv, processes, signature_constants

Modules of one layer may import each other, but never in a circle (a circle means two modules are one concept cut
in two, or one of them should move down). Imports inside functions count: they are the same dependency, paid later.
A new top-level module or package must be given a layer here. The benchmarks follow the same rule: each bench
imports only benchmarks/harness.py, never another bench.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exportkit"
LAYERS = {
    "cli": 12, "entry": 12, "__main__": 12, "__init__": 12, "api": 12, "pytest_plugin": 12,
    "inspection": 11, "compat": 11, "diff": 11,
    "verify": 10,
    "export": 9,
    "data": 8,
    "runtimes": 7,
    "serving": 6,
    "tfversions": 5, "tfexample": 5, "sources": 5,
    "savedmodel": 4,
    "report": 3, "options": 3, "compare": 3, "inputs": 3, "storage": 3,
    "errors": 1, "findings": 1, "dtypes": 1, "files": 1, "log": 1, "version": 1, "tfenv": 1, "processes": 1,
    "signature_constants": 1,
}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    assert top in LAYERS, f"exportkit.{top} has no layer: add it to LAYERS in {Path(__file__).name}"
    return LAYERS[top]


def _is_module(name: str) -> bool:
    """`exportkit.a.b` names a file or a package of the source tree."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """The exportkit modules `path` imports (`from exportkit.a import b` is module a.b when b is one, else a)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "exportkit":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield sub if _is_module(sub) else node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "exportkit")


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): set(_imports(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), Tarjan's way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path(graph: dict[str, set[str]], component: list[str]) -> str:
    """One circle through the component's first module, as `a -> b -> a`, to say where to cut."""
    start, members = component[0], set(component)
    trail, seen = [start], {start}
    while True:
        nxt = sorted(t for t in graph[trail[-1]] if t in members)
        if start in nxt and len(trail) > 1 or nxt == [start]:
            return " -> ".join(trail + [start])
        step = next((t for t in nxt if t not in seen), None)
        if step is None:
            return " -> ".join(trail + [nxt[0]])
        trail.append(step)
        seen.add(step)


def test_imports_point_down_the_layers():
    upward = [f"{module} imports {target}" for module, targets in sorted(_graph().items())
              for target in sorted(targets) if _layer(target) > _layer(module)]
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_no_import_circles():
    graph = _graph()
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(_path(graph, c) for c in circles)


def test_the_circle_check_sees_a_circle():
    """The check itself, on a made-up graph: a circle through three modules beside an innocent chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(_circles(graph)) == [["a", "b", "c"], ["e"]]
    assert _path(graph, ["a", "b", "c"]) == "a -> b -> c -> a"


BENCHMARKS = ROOT / "benchmarks"


def _bench_graph() -> dict[str, set[str]]:
    """benchmarks/*.py by name, each with the benchmarks it imports (a bench's scripts run as `python benchmarks/x.py`,
    so they import each other by bare name)."""
    names = {path.stem for path in BENCHMARKS.glob("*.py")}
    graph = {}
    for path in sorted(BENCHMARKS.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
        graph[path.stem] = found & names
    return graph


def test_benchmarks_import_only_the_harness():
    graph = _bench_graph()
    assert "harness" in graph, "benchmarks/harness.py is the one module the benches share"
    wrong = [f"benchmarks/{bench}.py imports {target}" for bench, targets in sorted(graph.items())
             for target in sorted(targets) if target != "harness" or bench == "harness"]
    assert not wrong, "a bench imports another (share it through benchmarks/harness.py):\n" + "\n".join(wrong)
    assert not _circles(graph)


def test_benchmarks_import_down_into_exportkit():
    """The benches are the top of the house: whatever exportkit module they use must exist (a moved module's old
    name is caught here, not 20 minutes into `make bench`)."""
    missing = [f"benchmarks/{path.name} imports {name}" for path in sorted(BENCHMARKS.glob("*.py"))
               for name in _imports(path) if not _is_module(name)]
    assert not missing, "\n".join(missing)
