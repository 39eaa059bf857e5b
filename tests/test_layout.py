"""The package's layout: no import cycles between its modules, and no TensorFlow where none is needed.

The import graph is read from the source (every import statement at any depth, inside functions too),
so an import cycle is caught even where it would only bite at run time.
"""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "bertjax"


def package_modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every module of the package (packages by their __init__)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The package modules `name` imports anywhere in its source. `from a.b import c` counts as importing
    a.b and, where c is a module, a.b.c; importing a.b.c also runs a.b's __init__, which is counted."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            # Parents of the importer are running already when it runs: importing them closes no cycle.
            if candidate and candidate != name and not name.startswith(candidate + "."):
                targets.add(candidate)
    return targets


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_no_import_cycles():
    modules = package_modules()
    assert "bertjax.text.tokenizers" in modules and "bertjax.data.sources" in modules
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert "bertjax.text.tokenizers" in graph["bertjax.text.vocab"]  # the graph sees imports
    assert import_cycles(graph) == []


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_text_does_not_reach_into_data():
    modules = package_modules()
    for name, path in modules.items():
        if name.startswith("bertjax.text"):
            reached = imported_modules(name, path, modules)
            assert not [m for m in reached if m.startswith("bertjax.data")], name


@pytest.mark.parametrize("imports", ["bertjax", "bertjax.models.bert, bertjax.training.writers, bertjax.training.flops"])
def test_no_tensorflow_on_import(imports):
    code = f"import sys, {imports}\nassert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
