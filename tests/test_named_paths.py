"""Every path and module the project names in its prose exists: README.md, docs/, launch/ scripts, configs
and the package's own docstrings and comments name bertjax/... files and `python -m bertjax...` programs,
and a file that moved must not leave its old name behind in them."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
# bertjax/a/b.py, bertjax/a/ (a package), docs/x.md, configs/y.py, tests/z.py, launch/w.py
PATH = re.compile(r"(?<![\w./-])((?:bertjax|docs|configs|tests|launch)/[\w./<>{}*-]*[\w/>}*])")
MODULE = re.compile(r"python3? -m (bertjax(?:\.\w+)+)")
# Paths that are placeholders in the prose, not files of the repository.
PLACEHOLDERS = re.compile(r"<|\{|\*|\.\.\.")


def prose_files() -> list[pathlib.Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "docs").rglob("*.ipynb"))]
    found += sorted((REPO / "launch").rglob("*"))
    found += sorted((REPO / "bertjax").rglob("*.py")) + sorted((REPO / "configs").rglob("*.py"))
    found += sorted((REPO / "tests").rglob("*.py"))
    # This file names missing paths on purpose; test_layout.py writes a made-up package of its own.
    return [f for f in found if f.is_file() and f.name not in (pathlib.Path(__file__).name, "test_layout.py")]


def named(text: str) -> tuple[set[str], set[str]]:
    paths = {m.rstrip(".") for m in PATH.findall(text) if not PLACEHOLDERS.search(m)}
    modules = set(MODULE.findall(text))
    return paths, modules


def module_exists(name: str) -> bool:
    relative = pathlib.Path(*name.split("."))
    return (REPO / relative).with_suffix(".py").is_file() or (REPO / relative / "__main__.py").is_file()


def test_every_named_path_and_program_exists():
    missing = []
    for f in prose_files():
        paths, modules = named(f.read_text(encoding="utf-8", errors="replace"))
        where = f.relative_to(REPO)
        missing += [f"{where}: {p}" for p in sorted(paths) if not (REPO / p).exists()]
        missing += [f"{where}: python -m {m}" for m in sorted(modules) if not module_exists(m)]
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)


def test_the_checker_sees_paths_and_modules():
    paths, modules = named("see bertjax/runs/start.py and docs/design.md; python -m bertjax.train --config=configs/"
                           "tiny.py; bertjax/models/<family>.py; `bertjax/gone.py`.")
    assert paths == {"bertjax/runs/start.py", "docs/design.md", "configs/tiny.py", "bertjax/gone.py"}
    assert modules == {"bertjax.train"}
    assert module_exists("bertjax.train") and not module_exists("bertjax.gone")


def test_the_design_map_names_every_module_once():
    """docs/design.md's map has one line per module of the package, and no line for a module that is gone."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    mapped = re.findall(r"^    (bertjax/\S+\.py) ", text, re.M)
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "bertjax").rglob("*.py"))
    assert sorted(mapped) == modules, (sorted(set(modules) - set(mapped)), sorted(set(mapped) - set(modules)))
