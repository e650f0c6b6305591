"""The package's module graph: no import cycles, no imports running up the layers.

The graph is computed from the source with ``ast`` (module-level and function-level imports
alike, since a lazy import is still a dependency), so it also checks code paths no test runs.
Run against another checkout with ``EDGEDEPLOY_LAYERING_ROOT=/path/to/checkout``.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

PACKAGE = "edgedeploy"

# Layer per top-level module or subpackage of edgedeploy (see edgedeploy/__init__.py).
LAYERS: dict[str, int] = {
    # 0: errors and plain data
    "errors": 0,
    "_version": 0,
    "_compat": 0,
    "schema": 0,
    "policy": 0,
    "artifacts": 0,
    "runtimes": 0,
    "stagenames": 0,
    "config": 0,
    "config_ranges": 0,
    "config_flags": 0,
    "onnxspec": 0,
    "hfspec": 0,
    "jsonread": 0,  # one bounded, non-blocking JSON read from a path (no edgedeploy imports)
    "sidecar": 0,
    "hostenv": 0,
    "reportview": 0,
    "targets": 0,
    "device": 0,
    # 1: tools over files, models and ONNX graphs
    "fileio": 1,
    "modelio": 1,
    "onnxtools": 1,
    # 2: domain packages
    "precision": 2,
    "trt": 2,
    "validate": 2,
    "train": 2,
    "backends": 2,
    "remote": 2,
    # 3: orchestration
    "stages": 3,
    # 4: running a build
    "pipeline": 4,
    # 5: entry points
    "api": 5,
    "commands": 5,
    "cli": 5,
    "__main__": 5,
    "": 5,  # the package itself (re-exports the API)
}
# Inside stages/, these are the contract and the registry, not stages.
STAGE_SUPPORT = {"stages", "stages.base"}


def _root() -> Path:
    return Path(os.environ.get("EDGEDEPLOY_LAYERING_ROOT", Path(__file__).resolve().parent.parent)) / PACKAGE


def module_graph(root: Path) -> dict[str, set[str]]:
    """{module: modules of the package it imports}; names are relative to the package ("" is the package)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_pkg)

    def resolve(name: str) -> str | None:
        while name not in modules:
            if not name:
                return None
            name = name.rpartition(".")[0]
        return name

    def _is_module(dotted: str) -> bool:
        return dotted[len(PACKAGE) + 1 :] in modules

    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in modules.items():
        here = (name if is_pkg else name.rpartition(".")[0]).split(".") if name else []
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                    mod = ".".join([PACKAGE, *base, *([node.module] if node.module else [])])
                else:
                    mod = node.module or ""
                # ``from pkg import sub`` depends on the submodule when one exists, else on pkg
                targets = [f"{mod}.{a.name}" if _is_module(f"{mod}.{a.name}") else mod for a in node.names]
            for t in targets:
                if t == PACKAGE or t.startswith(PACKAGE + "."):
                    r = resolve(t[len(PACKAGE) + 1 :])
                    if r is not None:
                        deps.add(r)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    top = module.split(".")[0]
    assert top in LAYERS, f"edgedeploy.{module}: not assigned a layer in tests/test_layering.py"
    return LAYERS[top]


def test_graph_parses_lazy_imports() -> None:
    graph = module_graph(_root())
    assert "stages.export" in graph and "errors" in graph
    assert "errors" in graph["api"] or "config" in graph["api"]


def test_no_import_cycles() -> None:
    found = cycles(module_graph(_root()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_upward_imports() -> None:
    graph = module_graph(_root())
    upward = [
        f"edgedeploy.{m} (layer {layer(m)}) imports edgedeploy.{d} (layer {layer(d)})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer(d) > layer(m)
    ]
    assert not upward, "imports running up the layers:\n" + "\n".join(upward)


def test_no_stage_imports_another_stage() -> None:
    graph = module_graph(_root())
    bad = [
        f"edgedeploy.{m} imports edgedeploy.{d}"
        for m, deps in sorted(graph.items())
        if m.startswith("stages.") and m not in STAGE_SUPPORT
        for d in sorted(deps)
        if d.startswith("stages") and d not in STAGE_SUPPORT
    ]
    assert not bad, "stages import each other:\n" + "\n".join(bad)


def test_every_package_says_what_it_owns() -> None:
    root = _root()
    missing = [
        str(init.relative_to(root.parent))
        for init in sorted(root.rglob("__init__.py"))
        if not ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    ]
    assert not missing, "packages without a docstring: " + ", ".join(missing)
