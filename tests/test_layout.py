"""The package's layout: its layers, no import cycles between its modules, no flags defined on import,
and no TensorFlow where none is needed.

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


def package_modules(root: pathlib.Path = REPO, package: str = "bertjax") -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every module of the package (packages by their __init__)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
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
    assert "bertjax.text.tokenizers" in modules and "bertjax.data.backends.text_files" in modules
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert "bertjax.text.tokenizers" in graph["bertjax.text.vocab_learning"]  # the graph sees imports
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


@pytest.mark.parametrize("imports", ["bertjax", "bertjax.models.bert, bertjax.training.writers, bertjax.training.flops",
                                     "bertjax.data.settings, bertjax.data.synthetic, bertjax.data.backends"])
def test_no_tensorflow_on_import(imports):
    code = f"import sys, {imports}\nassert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------------
# Layers: a module imports only from its own layer and the layers below it
# ---------------------------------------------------------------------------------------------------

# Lowest first, relative to the package; a module belongs to the layer of its longest listed prefix.
# `""` is the package's own __init__ (bertjax.load and friends), which sits with inference.
LAYERS = (
    ("environment", ("environment",)),  # the process's environment, before JAX and TensorFlow start
    ("text", ("text",)),
    ("data", ("data",)),
    ("models", ("models",)),
    ("training", ("training",)),
    ("tasks", ("tasks",)),
    ("compression", ("compression",)),
    ("interop", ("interop",)),
    ("inference", ("inference", "")),
    # What a run is, once (start-up, console, each kind of run's story), over the whole library.
    ("runs", ("runs",)),
    # The programs: flags and one call into runs/. By contract some live beside the library they drive.
    ("programs", ("train", "finetune", "distill", "prune", "evaluate", "export", "plan", "benchmark", "summary",
                  "vocab", "data.preview", "data.prepare", "data.throughput", "tasks.demo_tasks")),
)
PROGRAMS = frozenset(LAYERS[-1][1])
# Loading a config is `import configs.<name>` (configs/ is an installed package), never these.
CONFIG_LOADERS = frozenset({"importlib", "importlib.util", "importlib.machinery", "runpy"})


def layer_of(name: str, package: str = "bertjax") -> int:
    """The index in LAYERS of a dotted module name of the package (its longest listed prefix)."""
    relative = name.removeprefix(package).removeprefix(".")
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = relative == prefix or (prefix and relative.startswith(prefix + "."))
            if matches and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best is None:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS in tests/test_layout.py")
    return best


def import_lines(name: str, path: pathlib.Path, modules: dict) -> list[tuple[int, str]]:
    """(line, module) for every import statement of `name`, at any depth: `import a.b` targets a.b (the
    package modules nearest it), `from a import b` targets a.b where b is a module, else a. Imports of
    anything outside the package are kept by their own name (runpy, importlib, ...)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in dict.fromkeys(names):
            nearest = target
            while nearest and nearest not in modules:
                nearest = nearest.rpartition(".")[0]
            out.append((node.lineno, nearest or target))
    return out


def layering_violations(root: pathlib.Path, package: str = "bertjax") -> list[str]:
    """One line per import that runs against LAYERS, per library module importing a program, and per
    importlib/runpy import (configs are loaded by importing the configs package's modules)."""
    modules = package_modules(root, package)
    problems = []
    for name, path in sorted(modules.items()):
        where = path.relative_to(root)
        own = layer_of(name, package)
        for line, target in import_lines(name, path, modules):
            if target in CONFIG_LOADERS:
                problems.append(f"{where}:{line}: {name} imports {target}: load a config as `import "
                                f"configs.<name>` (configs/ is a package), not by path or by name")
            if target not in modules:
                continue
            theirs = layer_of(target, package)
            if target == package and own < layer_of("", package):
                # `import bertjax` from below reaches bertjax.load (inference) through the package's __init__.
                problems.append(f"{where}:{line}: {name} (layer {LAYERS[own][0]}) imports {package} itself, whose "
                                f"bertjax.load is layer {LAYERS[theirs][0]}: import the module it needs")
                continue
            if theirs == len(LAYERS) - 1 and target != name:
                problems.append(f"{where}:{line}: {name} imports the program {target}: a program is flags and one "
                                f"call, and what two programs share lives in bertjax/runs or below")
                continue
            if theirs > own:
                what = ("a program" if theirs == len(LAYERS) - 1 else f"layer {LAYERS[theirs][0]}")
                problems.append(f"{where}:{line}: {name} (layer {LAYERS[own][0]}) imports {target} ({what}): "
                                f"move the code it needs down, or this code up")
    return problems


def test_imports_follow_the_layers():
    problems = layering_violations(REPO)
    assert not problems, "imports against the layers (lowest first: " + " < ".join(
        n for n, _ in LAYERS) + "):\n" + "\n".join(problems)


def test_layer_checker_catches_upward_imports(tmp_path):
    def write(relative, text=""):
        target = tmp_path / "bertjax" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    for package in ("", "text/", "data/", "training/"):
        write(package + "__init__.py")
    write("text/files.py", "import os\n")
    write("data/inputs.py", "from bertjax.text import files\n")  # downward: fine
    write("training/workdir.py", "from bertjax.text import files\n")
    write("runs/__init__.py")
    write("text/vocab.py", "import os\n\n\ndef entry():\n    from bertjax import train\n")  # a program
    write("data/stream.py", "import json\n\n\ndef f():\n    from bertjax.training import workdir as w\n")
    write("data/preview.py", "from bertjax.training import workdir\nimport bertjax.runs.console\n")  # fine
    write("runs/console.py", "import runpy\n")
    write("train.py", "from bertjax.runs import console\n")  # a program: fine
    write("distill.py", "from bertjax import train\n")  # a program importing a program
    write("training/loop.py", "import bertjax\n")  # the package's own bertjax.load, from below it
    problems = layering_violations(tmp_path)
    assert len(problems) == 5, problems
    assert problems[0].startswith("bertjax/data/stream.py:5: bertjax.data.stream (layer data) imports "
                                  "bertjax.training.workdir (layer training)")
    assert problems[1].startswith("bertjax/distill.py:1: bertjax.distill imports the program bertjax.train")
    assert problems[2].startswith("bertjax/runs/console.py:1: bertjax.runs.console imports runpy")
    assert problems[3].startswith("bertjax/text/vocab.py:5: bertjax.text.vocab imports the program bertjax.train")
    assert problems[4].startswith("bertjax/training/loop.py:1: bertjax.training.loop (layer training) imports "
                                  "bertjax itself")


def test_importing_every_module_defines_no_flags():
    """Programs define their flags when entered (console.run_program), so importing all of them together
    (a notebook, the tests, another program) defines none: no module-level flag state."""
    names = sorted(n for n in package_modules() if not n.endswith("__main__"))
    code = ("import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
            + "from absl import flags\n"
            + "defined = {m: [f.name for f in fs] for m, fs in flags.FLAGS.flags_by_module_dict().items() if 'bertjax' in m}\n"
            + "assert not defined, defined\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
