"""The package's layout: its layers, no import cycles between its modules, no flags defined on import,
and no TensorFlow where none is needed.

The import graph is read from the source (every import statement at any depth, inside functions too),
so an import cycle is caught even where it would only bite at run time.
"""

import ast
import io
import os
import pathlib
import subprocess
import sys
import tokenize

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
                                     # The synthetic pretraining run, the device's benchmark, and bertjax.load.
                                     "bertjax.benchmark, bertjax.train, bertjax.runs.pretraining, bertjax.inference",
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
    # bertjax.load, the one init-from it and every run read starting models through, and the batches it
    # embeds many texts in.
    ("inference", ("inference", "init_from", "embeddings", "")),
    # What a run is, once (start-up, console, each kind of run's story), over the whole library.
    ("runs", ("runs",)),
    # Benchmarks, their peers (HF, sentence-transformers), profiles and timing: above runs/, never below.
    ("bench", ("bench",)),
    # The programs: flags and one call into runs/ or bench/.
    ("programs", ("train", "finetune", "distill", "prune", "evaluate", "export", "plan", "benchmark", "summary",
                  "vocab", "prepare", "preview", "throughput", "demo_task", "mine")),
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
    write("preview.py", "from bertjax.training import workdir\nimport bertjax.runs.console\n")  # a program: fine
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
            + "defined = {m: [f.name for f in fs] for m, fs in flags.FLAGS.flags_by_module_dict().items()"
              " if 'bertjax' in m}\n"
            + "assert not defined, defined\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------
# Form: short modules and functions, imports at the top unless a comment says why, TensorFlow through
# text/tf_cpu.py alone
# ---------------------------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60  # from `def` to the function's last line (decorators not counted)
# The one module that imports TensorFlow (and tensorflow_text, TFDS, which import it): it hides the GPUs first.
TENSORFLOW_GATE = "text/tf_cpu.py"


def package_files(root: pathlib.Path, package: str = "bertjax") -> list[tuple[pathlib.Path, str]]:
    """(path relative to root, source) of every module of the package."""
    return [(path.relative_to(root), path.read_text(encoding="utf-8"))
            for path in sorted((root / package).rglob("*.py"))]


def size_problems(root: pathlib.Path, package: str = "bertjax") -> list[str]:
    """One line per module over MAX_MODULE_LINES and per function over MAX_FUNCTION_LINES."""
    problems = []
    for where, source in package_files(root, package):
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            problems.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES}): split it by what its parts do")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{where}:{node.lineno}: {node.name} is {length} lines (at most "
                                    f"{MAX_FUNCTION_LINES}): split it into named helpers")
    return problems


def function_imports(tree: ast.Module) -> list[ast.stmt]:
    """The import statements inside a function (at any depth, nested functions and methods included)."""
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def deferred_import_problems(root: pathlib.Path, package: str = "bertjax") -> list[str]:
    """One line per import inside a function with no comment saying why: one on a line of the statement,
    or a comment line directly above it."""
    problems = []
    for where, source in package_files(root, package):
        comments, comment_lines = set(), set()  # lines with a comment; lines that are only a comment
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments.add(token.start[0])
                if not token.line[:token.start[1]].strip():
                    comment_lines.add(token.start[0])
        for node in function_imports(ast.parse(source)):
            if comments & set(range(node.lineno, node.end_lineno + 1)) or node.lineno - 1 in comment_lines:
                continue
            problems.append(f"{where}:{node.lineno}: an import inside a function with no comment saying why it "
                            f"is not at the top (an optional dependency, TensorFlow kept off a path, ...): "
                            f"move it to the top, or say why on its line")
    return problems


def tensorflow_import_problems(root: pathlib.Path, package: str = "bertjax") -> list[str]:
    """One line per import of TensorFlow, tensorflow_text or TFDS anywhere but TENSORFLOW_GATE."""
    problems = []
    for where, source in package_files(root, package):
        if where == pathlib.Path(package, TENSORFLOW_GATE):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "tensorflow" or top.startswith("tensorflow_"):
                    problems.append(f"{where}:{node.lineno}: imports {name}: get it through "
                                    f"{package}/{TENSORFLOW_GATE} (tf = tf_cpu.import_tensorflow(), "
                                    f"import_tensorflow_text(), import_tensorflow_datasets()), which hides the "
                                    f"GPUs from TensorFlow first")
    return problems


def test_modules_and_functions_are_short():
    problems = size_problems(REPO)
    assert not problems, "\n".join(problems)


def test_imports_inside_functions_say_why():
    problems = deferred_import_problems(REPO)
    assert not problems, "\n".join(problems)


def test_tensorflow_only_through_tf_cpu():
    problems = tensorflow_import_problems(REPO)
    assert not problems, "\n".join(problems)
    gate = ast.parse((PACKAGE / TENSORFLOW_GATE).read_text(encoding="utf-8"))
    assert {a.name for n in ast.walk(gate) if isinstance(n, ast.Import) for a in n.names} >= {
        "tensorflow", "tensorflow_text", "tensorflow_datasets"}  # the checker looks at the right file


def write_package(root: pathlib.Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        target = root / "bertjax" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def test_size_checker_finds_long_modules_and_functions(tmp_path):
    def function(name: str, lines: int) -> str:  # `def` plus lines - 1 body lines
        return f"def {name}():\n" + "    x = 1\n" * (lines - 1)

    write_package(tmp_path, {
        "__init__.py": "",
        "fits.py": function("sixty", 60) + "\n" * (MAX_MODULE_LINES - 60),  # 600 lines, a 60-line function
        "long.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
        "nested.py": "class A:\n    @staticmethod\n" + "".join("    " + line + "\n" for line in
                                                               function("method", 61).splitlines()),
    })
    problems = size_problems(tmp_path)
    assert len(problems) == 2, problems
    assert problems[0].startswith("bertjax/long.py: 601 lines (at most 600)")
    assert problems[1].startswith("bertjax/nested.py:3: method is 61 lines (at most 60)")


def test_import_checker_finds_imports_without_a_reason(tmp_path):
    write_package(tmp_path, {
        "__init__.py": "",
        "a.py": (
            "import os  # the top: no reason needed\n"
            "import json\n"
            "\n\n"
            "def said_on_its_line():\n"
            "    import torch  # optional: only this needs it\n"
            "\n\n"
            "def said_above():\n"
            "    # optional: only this needs it\n"
            "    from transformers import (\n"
            "        AutoModel,\n"
            "    )\n"
            "\n\n"
            "def said_on_a_later_line():\n"
            "    from transformers import (\n"
            "        AutoModel,  # optional: only this needs it\n"
            "    )\n"
            "\n\n"
            "def unsaid():\n"  # line 22
            "    x = 1  # a comment on the line above is not about the import\n"
            "    import blingfire\n"
            "    y = '# not a comment'; import pyarrow\n"
            "\n\n"
            "class C:\n"
            "    def method(self):\n"
            "        def inner():\n"
            "            import datasets\n"
            "        return inner\n"
        ),
    })
    problems = deferred_import_problems(tmp_path)
    assert [p.split(": ")[0] for p in problems] == ["bertjax/a.py:24", "bertjax/a.py:25", "bertjax/a.py:31"], problems
    assert "with no comment saying why" in problems[0]


def test_tensorflow_checker_finds_imports_past_tf_cpu(tmp_path):
    write_package(tmp_path, {
        "__init__.py": "",
        "text/__init__.py": "",
        "text/tf_cpu.py": "def import_tensorflow():\n    import tensorflow as tf  # the gate\n    return tf\n",
        "data/__init__.py": "",
        "data/reader.py": "import tensorflow as tf\n",
        "data/tfds.py": "def read():\n    import tensorflow_datasets as tfds  # slow\n    return tfds\n",
        "models/__init__.py": "",
        "models/export.py": ("from tensorflow.python.ops import array_ops\nimport tensorflowish\n"
                             "from . import tensorflow\n"),
        "tasks/__init__.py": "",
        "tasks/span.py": "from bertjax.text import tf_cpu\n\ntf = tf_cpu.import_tensorflow()\n",  # the right way
    })
    problems = tensorflow_import_problems(tmp_path)
    assert [p.split(": ")[0] for p in problems] == [
        "bertjax/data/reader.py:1", "bertjax/data/tfds.py:2", "bertjax/models/export.py:1"], problems
    assert "imports tensorflow.python.ops: get it through bertjax/text/tf_cpu.py" in problems[2]


def test_the_quick_tier_has_a_module_for_every_package():
    """`pytest -m quick` (tests/conftest.py's QUICK_MODULES) tests every package of bertjax and the programs,
    and names only test modules that exist."""
    from conftest import QUICK_MODULES

    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    missing = sorted(packages - set(QUICK_MODULES))
    assert not missing, f"packages with no module in the quick tier: {missing}"
    absent = sorted(m for names in QUICK_MODULES.values() for m in names if not (REPO / "tests" / f"{m}.py").exists())
    assert not absent, f"QUICK_MODULES names missing test modules: {absent}"
    assert "programs" in QUICK_MODULES
