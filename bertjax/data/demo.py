"""The built-in demo corpus: prose that ships with every Python installation, so a first run needs
no download and no data decision.

Two sources, both real English written by people for people:
  1. pydoc_data.topics: the language reference sections behind help("topic"); one document each.
  2. docstrings of the standard library, read with `ast` from the source files (nothing is
     imported). One document per module (its docstring and those of its top-level functions) and
     one per class (its docstring and its methods'), in source order: a class's docstrings are
     about one thing, so consecutive sentences are fair "IsNext" pairs for NSP.
Everything is read in sorted order, so the result depends only on the Python version (and on a
distribution's patches to its standard library), not on the machine, the working directory or the
installed packages.
"""

import ast
import functools
import gc
import hashlib
import json
import os
import re
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pydoc_data.topics import topics

from bertjax.text import files
from bertjax.text.sentences import split_sentences

# Docstrings with fewer than _MIN_DOCSTRING_SENTENCES prose sentences are left out: one-liners
# ("Return the value.") are formulaic, would be a third of the documents, and cannot give an
# IsNext pair of their own. Code, doctests, tables, headings, signatures and parameter lists are
# dropped; reST markup is reduced to its text.
_MIN_DOCSTRING_SENTENCES = 2
# Directories of the standard library that are not documentation prose: tests, IDLE, the 2to3
# machinery, third-party packages, generated codec tables, and source 1 itself.
_SKIP_STDLIB_DIRS = frozenset(
    "test tests idlelib lib2to3 site-packages dist-packages __pycache__ turtledemo encodings"
    " pydoc_data".split()
)
_UNDERLINE = re.compile(r"([=*\-~^#\"'`+])\1{2,}")
_LIST_MARKER = re.compile(r"(?:[*+\-\u2022]|\d{1,2}[.)]|\(\d{1,2}\)|[a-z][.)]) +")
# "str.rsplit(sep=None, maxsplit=-1)", "match(pattern, string) -> Match": the line naming a function.
_SIGNATURE = re.compile(r"[\w.]+\(.*\)(?: *-> *.*)?")
# "def f(x):", "class C(Base):", "x, y = f()": statements left at the margin of a docstring.
_CODE_LINE = re.compile(
    r"(?:async +)?(?:def|class) +\w+ *[(:]|[\w.()\[\]'\"]+(?:, *[\w.()\[\]'\"]+)* +[-+*/|&]?=[^=]"
)
# Counting characters with a regex substitution: a Python loop over every character would be
# most of the corpus build time.
_NON_LETTERS = re.compile(r"[\W\d_]+")
_NON_SYMBOLS = re.compile(r"[^\W_]+|\s+")  # what is left: punctuation, symbols, "_"
_FOOTNOTE = re.compile(r"\s*(?<!\S)\[\d+\](?=[\s.,;:)]|$)")  # "saved. [5] A" -> "saved. A"
# :role:`text`, :role:`~a.b.name`, :role:`title <target>`, :pep:`8` -> text, name, title, PEP 8
_ROLE = re.compile(r":([A-Za-z][\w.+-]*(?::[A-Za-z][\w.+-]*)*):`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_TEX_QUOTES = re.compile(r"``(.+?)''|`([^`'\s]+)'")  # old docstrings: ``quoted'' and `name'
_INTERPRETED = re.compile(r"`([^`]+)`_{0,2}")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")


def demo_documents(max_documents: int | None = None) -> list[list[str]]:
    """The built-in demo corpus (see above): the same documents, in the same order, on every call.

    Built once per machine and Python (most of the time goes to parsing the standard library) and kept in
    bertjax's cache directory; a process reads it once.
    """
    documents = _demo_corpus()
    if max_documents is not None:
        if max_documents < 1:
            raise ValueError(f"max_documents={max_documents} must be at least 1 (or None for all)")
        documents = documents[:max_documents]
    return [list(document) for document in documents]  # fresh lists: callers may mutate them


@functools.lru_cache(maxsize=1)
def _demo_corpus() -> tuple[tuple[str, ...], ...]:
    """The corpus from the cache file of this Python's sources and this code, or built and written there.
    The key covers every file read (path, size, time) and the code that cleans them, so an edit to
    either makes a new file; a cache that cannot be written is only slower."""
    root = sysconfig.get_paths()["stdlib"]
    key = hashlib.sha256(sys.version.encode())
    import pydoc_data.topics  # data module only: no side effects on import

    for path in (pydoc_data.topics.__file__, *_stdlib_source_files(root)):
        status = os.stat(path)
        key.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\0".encode())
    for module in (__file__, sys.modules[split_sentences.__module__].__file__):
        with open(module, "rb") as f:
            key.update(f.read())
    cached = files.cache_dir("demo-corpus", key.hexdigest()[:24] + ".json")
    try:
        with open(cached, encoding="utf-8") as f:
            return tuple(tuple(document) for document in json.load(f))
    except (OSError, ValueError):
        pass
    documents = _build_demo_corpus()
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        files.write_bytes(cached, json.dumps(documents).encode("utf-8"))
    except OSError:
        pass
    return documents


def _build_demo_corpus() -> tuple[tuple[str, ...], ...]:
    seen, documents = set(), []
    for document in (*_reference_manual_documents(), *_docstring_documents()):
        document = tuple(document)
        if document not in seen:  # e.g. a docstring copied between modules
            seen.add(document)
            documents.append(document)
    return tuple(documents)


def _reference_manual_documents() -> Iterator[list[str]]:
    for name in sorted(topics):
        if sentences := _prose_sentences(topics[name]):
            yield sentences


def _docstring_documents() -> Iterator[list[str]]:
    root = sysconfig.get_paths()["stdlib"]
    for path in _stdlib_source_files(root):
        with open(path, "rb") as f:
            source = f.read()
        tree = _parse_without_gc(source, path)
        if tree is None:
            continue
        for docstrings in _docstring_groups(tree):
            sentences = []
            for docstring in docstrings:
                prose = _prose_sentences(docstring)
                if len(prose) >= _MIN_DOCSTRING_SENTENCES:
                    sentences.extend(prose)
            if sentences:
                yield sentences


def _stdlib_source_files(root: str) -> list[str]:
    found = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in _SKIP_STDLIB_DIRS]
        found.extend(os.path.join(directory, n) for n in names if n.endswith(".py"))
    return sorted(found, key=lambda p: os.path.relpath(p, root))


def _parse_without_gc(source: bytes, path: str) -> ast.Module | None:
    """ast.parse with the cyclic garbage collector paused, or None for a file that does not parse.

    A syntax tree is a great many small objects without cycles, so the collections their allocation
    triggers find nothing to free (docs/design.md, "Input pipeline").
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=path)
    except (SyntaxError, ValueError):  # e.g. a template file shipped with a .py name
        return None
    finally:
        if was_enabled:
            gc.enable()


def _docstring_groups(tree: ast.Module) -> Iterator[list[str]]:
    """Docstrings grouped into documents: the module with its functions, then each class with its
    methods (nested classes are their own group). Nested functions are skipped: they are helpers."""
    module = [ast.get_docstring(tree) or ""]
    classes = []
    _collect_docstrings(tree.body, module, classes)
    yield module
    while classes:  # breadth-first, so classes come in source order within each nesting level
        node = classes.pop(0)
        group = [ast.get_docstring(node) or ""]
        nested = []
        _collect_docstrings(node.body, group, nested)
        yield group
        classes.extend(nested)


def _collect_docstrings(body: list[ast.stmt], group: list[str], classes: list[ast.ClassDef]) -> None:
    """Adds the docstrings of the functions defined in `body` (also inside if/try/with blocks, as
    in `if sys.platform == ...: def f(): ...`) to `group`, and collects the classes found."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            group.append(ast.get_docstring(node) or "")
        elif isinstance(node, ast.ClassDef):
            classes.append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                _collect_docstrings(block, group, classes)
            for handler in getattr(node, "handlers", []):
                _collect_docstrings(handler.body, group, classes)


def _prose_sentences(text: str) -> list[str]:
    """Sentences of the prose paragraphs of a docstring or manual page, code and markup removed."""
    return [
        sentence
        for paragraph in _prose_paragraphs(text)
        for sentence in split_sentences(paragraph)
        if _looks_like_prose(sentence)
    ]


def _prose_paragraphs(text: str) -> Iterator[str]:
    """Blank-line separated blocks that are prose, each joined into one line of plain text.

    Dropped: blocks with a heading underline, a doctest prompt, a table border, a signature or
    another code-like line, and indented blocks (code samples, grammar rules) unless they read as
    prose, i.e. end like a sentence (the manual indents the text describing each method). Inside a
    block, an indented line after a line ending in ":" starts a parameter or definition list, where
    the block is cut; any other indented line continues the text ("1. text\\n   more").
    """
    for block in re.split(r"\n[ \t]*\n", text.expandtabs()):
        lines = textwrap.dedent(block.strip("\n")).rstrip().split("\n")
        if not lines[0] or any(_is_markup_line(line) for line in lines):
            continue
        if block.lstrip("\n")[:1] == " " and not _ends_like_sentence(lines[-1]):
            continue
        if marker := _LIST_MARKER.match(lines[0]):
            lines[0] = lines[0][marker.end() :]
        for i in range(1, len(lines)):
            if lines[i][:1] == " " and lines[i - 1].endswith(":"):
                lines = lines[:i]
                break
        paragraph = _strip_markup(" ".join(line.strip() for line in lines))
        if paragraph.endswith("::"):  # reST: "for example::" introduces the (dropped) code block
            paragraph = paragraph[:-1]
        yield paragraph


def _ends_like_sentence(line: str) -> bool:
    """Ends in . ! or ? (before closing quotes/brackets), but not in an ellipsis: code rarely does."""
    line = line.rstrip().rstrip("\"')]\u201d\u2019")
    return line.endswith((".", "!", "?")) and not line.endswith("..")


def _is_markup_line(line: str) -> bool:
    stripped = line.strip()
    return (
        bool(_UNDERLINE.fullmatch(stripped))
        or stripped.startswith((">>>", "... ", "|", "+-", "+=", "-[", ".. "))
        or bool(_SIGNATURE.fullmatch(stripped) or _CODE_LINE.match(stripped))
        or _looks_like_code(stripped)
    )


def _looks_like_code(line: str) -> bool:
    """More symbols than letters: `x = f(a, b)[0]`, `a -> b`, table rows, regular expressions."""
    return len(_NON_SYMBOLS.sub("", line)) > len(_NON_LETTERS.sub("", line))


def _strip_markup(text: str) -> str:
    """reST and footnote markup to plain text: :func:`~os.path.join` -> join, ``x`` -> x, **x** -> x."""
    text = _ROLE.sub(_role_text, text)
    text = _TEX_QUOTES.sub(lambda m: f'"{m.group(1)}"' if m.group(1) else f"'{m.group(2)}'", text)
    text = _LITERAL.sub(r"\1", text).replace("``", '"')  # an unbalanced one is a typo for a quote
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    return _FOOTNOTE.sub("", text)


def _role_text(match: re.Match) -> str:
    role, tilde, text = match.groups()
    if role in ("pep", "rfc"):
        return f"{role.upper()} {text}"
    return text.rsplit(".", 1)[-1] if tilde else text  # "~" shows only the last component


def _looks_like_prose(sentence: str) -> bool:
    """At least three words, mostly letters, no leftover prompt: drops "Args:", "See also:", code."""
    if len(sentence.split()) < 3 or ">>>" in sentence:
        return False
    letters = len(_NON_LETTERS.sub("", sentence))
    return letters >= 0.6 * (len(sentence) - sentence.count(" "))
