"""Imports point down the layers (DESIGN.md): a lower module never imports a higher one.

    cli -> verify / export / inspection -> runtimes / serving / compat / data -> sources / spec / tf1_loader
        -> lint / savedmodel / checkpoint / layout / tfenv / tfexample / examples -> batches / dtypes -> findings / errors / files

Modules of one layer may import each other. A new top-level module must be given a layer here.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exportkit"
LAYERS = {
    "cli": 7, "__main__": 7,
    "verify": 6, "export": 6, "inspection": 6,
    "runtimes": 5, "serving": 5, "compat": 5, "data": 5,
    "sources": 4, "spec": 4, "tf1_loader": 4, "reference": 4,
    "lint": 3, "savedmodel": 3, "checkpoint": 3, "layout": 3, "tfenv": 3, "tfexample": 3, "examples": 3,
    "batches": 2, "dtypes": 2,
    "findings": 1, "errors": 1, "files": 1, "__init__": 1,
}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    assert top in LAYERS, f"exportkit.{top} has no layer: add it to LAYERS in {Path(__file__).name}"
    return LAYERS[top]


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "exportkit":
            if node.module == "exportkit":  # `from exportkit import layout` or `... import __version__`
                yield from (f"exportkit.{a.name}" if (PACKAGE / f"{a.name}.py").exists() or (PACKAGE / a.name).is_dir()
                            else "exportkit" for a in node.names)
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "exportkit")


def test_imports_point_down_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "exportkit." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if module == "exportkit.__init__":
            continue  # the package's public API re-exports lazily
        for target in _imports(path):
            if target == "exportkit":
                continue
            if _layer(target) > _layer(module):
                upward.append(f"{module} imports {target}")
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)
