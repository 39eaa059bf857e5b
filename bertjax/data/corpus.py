"""Corpus sources -> documents of sentences: text files, TFDS datasets, and a built-in demo corpus.

A document is a `list[str]` of sentences, each non-empty, stripped, with whitespace runs collapsed
to one space. Pair building (next-sentence prediction) needs exactly this unit: consecutive sentences
of one document are the "IsNext" continuations, and a sentence from another document is "NotNext".

Sources (chosen by the entry program from `data.source`; library code takes explicit arguments):

  - "text":  files matched by a comma-separated list of globs, in one of four layouts:
      sentences          one sentence per line, a blank line between documents (the original
                         BERT format); the end of a file also ends a document.
      documents          one document per line, split into sentences here.
      jsonl              one JSON object per line, its text field split into sentences here.
      document_per_file  each file is one document: paragraphs on blank lines, then sentences.
    Plain or gzip files, strictly UTF-8: a bad byte is an error naming file and line, never a
    silent U+FFFD that would teach the model a character the text never had.
  - "tfds":  any TensorFlow Datasets dataset with a text feature (wikipedia/20230601.en, c4/en).
  - "demo":  prose that ships with every Python installation (the reference manual topics and the
    standard library's docstrings), so a first run needs no download and no data decision.

The held-out split (`is_eval_document`) is a hash of a document's own text, so it does not depend on
file layout, sharding or order: however the corpus is cut up, training never sees an eval document.
"""

import ast
import functools
import gc
import glob
import gzip
import hashlib
import json
import os
import re
import sysconfig
import textwrap
import zlib
from collections.abc import Iterable, Iterator

TEXT_FORMATS = ("sentences", "documents", "jsonl", "document_per_file")
SOURCES = ("demo", "text", "tfds")

# --------------------------------------------------------------------------------------------------
# Sentence splitting
# --------------------------------------------------------------------------------------------------
# A rule-based splitter for encyclopedic prose, predictable and fast enough to run on the fly: a
# sentence ends at . ! ? (or an ellipsis), optionally followed by closing quotes or brackets, when
# whitespace and a plausible sentence start (capital letter, digit, opening quote or bracket) come
# next. A lower-case continuation never starts a sentence, which alone handles "e.g. the",
# "... and", "vs. lower". Decimals, versions, URLs and e-mail addresses have no space after their
# dots, so they are never candidates. What remains is the period after an abbreviation or an
# initial; the three word lists below decide those.

# Titles, honorifics and Latin/reference words: they always qualify what follows ("Dr. Watson",
# "St. Louis", "cf. Smith", "Roe v. Wade"), so a period after them never ends a sentence.
_ALWAYS_CONTINUE = frozenset(
    """
    mr mrs ms messrs mme mlle dr prof rev hon gen col lt maj capt cmdr adm sgt cpl gov sen rep pres
    supt fr st mt ft e.g i.e cf vs v viz al ibid approx
    """.split()
)
# Words abbreviated before a number ("No. 5", "Fig. 3", "pp. 12", "c. 1500", "Sept. 11"). Before a
# digit the sentence goes on; otherwise the period is an ordinary one ("The answer was no. Then").
_NUMBER_PREFIXES = frozenset(
    """
    no nos vol vols fig figs p pp ch chap sec sect art eq eqs op nr c ca est
    jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)
# Abbreviations that end sentences as often as not ("... for Apple Inc. The company ...", "U.S."),
# and initials ("Malcolm X. He"). After them a period ends a sentence only when the next word is one
# that typically opens a sentence (below): "Apple Inc. The company" splits, "Apple Inc. CEO Tim Cook",
# "J. R. R. Tolkien" and "U.S. President" do not.
_MAY_END = frozenset("etc inc ltd co corp jr sr bros llc plc dept univ assn esp ph.d".split())
_INITIALISM = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # "U.S", "a.m" (the final period excluded)
_SENTENCE_OPENERS = frozenset(
    """
    The A An This That These Those There Here It Its He She They We I You His Her Their Our My
    In On At By For From To With As After Before During Since Until When While Where Although
    Though However But And Or So Yet Thus Therefore Also Then Later Today Some Many Most Several
    Each Both One Two Such Other Another Despite Following According Unlike If Because Between
    Among Under Over Once Only
    """.split()
)

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# Terminator run, then closing quotes/brackets, then the single space of normalized text.
_CANDIDATE = re.compile(r"([.!?\u2026]+)[\"'\u201d\u2019\u00bb)\]]* ")
_OPENING = "\"'\u201c\u2018\u00ab([\u00bf\u00a1"


def split_sentences(text: str) -> list[str]:
    """Splits prose into sentences; blank lines are paragraph breaks, single line breaks are spaces.

    Single line breaks are joined because text files are often hard-wrapped (one paragraph spread
    over many 72-column lines). Whitespace runs inside a sentence become one space.
    """
    sentences = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            sentences.extend(_split_paragraph(paragraph))
    return sentences


def _split_paragraph(paragraph: str) -> list[str]:
    """Sentences of one paragraph whose whitespace is already single spaces."""
    sentences, start = [], 0
    for match in _CANDIDATE.finditer(paragraph):
        if _ends_sentence(paragraph, match):
            sentences.append(paragraph[start : match.end() - 1])
            start = match.end()
    sentences.append(paragraph[start:])
    return [s for s in sentences if s]


def _ends_sentence(paragraph: str, match: re.Match) -> bool:
    """Whether the candidate terminator `match` (followed by a space) ends a sentence."""
    following = paragraph[match.end()]
    if not (following.isupper() or following.isdigit() or following in _OPENING):
        return False
    terminator = match.group(1)
    if terminator != ".":  # "?", "!", "?!", "...", "…" before a sentence start
        return True
    word_start = paragraph.rfind(" ", 0, match.start()) + 1
    word = paragraph[word_start : match.start()].lstrip(_OPENING)
    key = word.lower()
    if key in _ALWAYS_CONTINUE:
        return False
    if key in _NUMBER_PREFIXES and following.isdigit():
        return False
    if key in _MAY_END or _is_initial(word):
        return _next_word(paragraph, match.end()) in _SENTENCE_OPENERS
    return True


def _is_initial(word: str) -> bool:
    """An initial ("J" of "J. R. R. Tolkien") or initialism ("U.S"), without its final period.

    "I" does not count: it is far more often the pronoun ending a sentence ("So did I. Nobody").
    """
    return (len(word) == 1 and word.isupper() and word != "I") or bool(_INITIALISM.fullmatch(word))


def _next_word(paragraph: str, start: int) -> str:
    """The word starting at `start`, without opening quotes/brackets or trailing punctuation."""
    end = paragraph.find(" ", start)
    word = paragraph[start : end if end >= 0 else len(paragraph)]
    return word.lstrip(_OPENING).rstrip(".,;:!?\"'\u201d\u2019)]")


# --------------------------------------------------------------------------------------------------
# Text files
# --------------------------------------------------------------------------------------------------

_GZIP_MAGIC = b"\x1f\x8b"


def expand_pattern(pattern: str) -> list[str]:
    """Comma-separated globs (`**` allowed, `~` expanded) -> the sorted list of files they match.

    Every glob must match at least one file: a typo in one of several globs would otherwise
    quietly train on less data than intended.
    """
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"data.input_pattern={pattern!r} is empty: give a glob of text files")
    if any("://" in p for p in parts):
        raise ValueError(
            f"data.input_pattern={pattern!r} names a remote file system: only local files are"
            " read; copy the files to local disk first"
        )
    files = set()
    for part in parts:
        matches = [m for m in glob.glob(os.path.expanduser(part), recursive=True) if os.path.isfile(m)]
        if not matches:
            which = f" (its part {part!r} matches nothing)" if len(parts) > 1 else ""
            raise FileNotFoundError(f"no files match data.input_pattern={pattern!r}{which}")
        files.update(matches)
    return sorted(files)


def read_text_documents(
    paths: list[str],
    text_format: str,
    text_field: str = "text",
    *,
    max_line_chars: int = 1_000_000,
) -> Iterator[list[str]]:
    """Documents of the text files `paths`, in order, read lazily.

    Args:
      paths: plain or gzip-compressed UTF-8 files (gzip is recognised by its magic bytes, so the
        name need not end in .gz).
      text_format: one of TEXT_FORMATS (see the module docstring).
      text_field: the field holding the text, for text_format="jsonl".
      max_line_chars: a longer line is an error rather than a memory blow-up: it usually means a
        binary file, or text whose line breaks were lost.

    The format and the existence of every file are checked now, before the first document is read.
    """
    if text_format not in TEXT_FORMATS:
        raise ValueError(f"data.text_format={text_format!r} is not one of {', '.join(TEXT_FORMATS)}")
    paths = [str(p) for p in paths]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"text file not found: {path}")
    return _text_documents(paths, text_format, text_field, max_line_chars)


def _text_documents(paths, text_format, text_field, max_line_chars) -> Iterator[list[str]]:
    for path in paths:
        lines = _read_lines(path, max_line_chars)
        if text_format == "sentences":
            yield from _sentence_per_line_documents(lines)
        elif text_format == "documents":
            for _, line in lines:
                if sentences := split_sentences(line):
                    yield sentences
        elif text_format == "jsonl":
            for number, line in lines:
                if line.strip():
                    if sentences := split_sentences(_json_text(path, number, line, text_field)):
                        yield sentences
        else:  # document_per_file
            if sentences := split_sentences("\n".join(line for _, line in lines)):
                yield sentences


def _sentence_per_line_documents(lines: Iterable[tuple[int, str]]) -> Iterator[list[str]]:
    """The original BERT format: a blank line (or the end of the file) ends a document."""
    document = []
    for _, line in lines:
        sentence = " ".join(line.split())
        if sentence:
            document.append(sentence)
        elif document:
            yield document
            document = []
    if document:
        yield document


def _json_text(path: str, number: int, line: str, text_field: str) -> str:
    """The `text_field` string of one JSON-lines record, or an error naming file and line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path} line {number}: invalid JSON ({e.msg} at column {e.colno}):"
            " data.text_format='jsonl' expects one JSON object per line"
        ) from None
    if not isinstance(record, dict):
        raise ValueError(
            f"{path} line {number}: a JSON {type(record).__name__}, not an object:"
            " data.text_format='jsonl' expects one JSON object per line"
        )
    if text_field not in record:
        fields = ", ".join(map(repr, record)) or "none"
        raise ValueError(
            f"{path} line {number}: no {text_field!r} field (fields: {fields}):"
            " set data.text_field to the field that holds the text"
        )
    text = record[text_field]
    if not isinstance(text, str):
        raise ValueError(
            f"{path} line {number}: field {text_field!r} is a JSON {type(text).__name__}, not a"
            " string: set data.text_field to the field that holds the text"
        )
    return text


def _read_lines(path: str, max_line_chars: int) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its line break) for each line, decoded strictly as UTF-8.

    Lines are read with a byte limit, so a file without line breaks costs at most a few MB before
    it is reported, however large it is.
    """
    # A character is at most 4 bytes of UTF-8; 2 more for the "\r\n".
    max_bytes = 4 * max_line_chars + 2
    with _open_binary(path) as f:
        number = 0
        while True:
            number += 1
            try:
                raw = f.readline(max_bytes)
            except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                raise ValueError(
                    f"{path}: not a readable gzip file ({e}): replace it with a complete gzip"
                    " file, or drop the .gz from its name if it is plain text"
                ) from None
            if not raw:
                return
            if len(raw) == max_bytes and not raw.endswith(b"\n"):
                raise _long_line_error(path, number, None, max_line_chars)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path} line {number}: invalid UTF-8 at byte {e.start} of the line"
                    f" ({e.reason}): re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            line = line.rstrip("\r\n")
            if number == 1:
                line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not text
            if len(line) > max_line_chars:
                raise _long_line_error(path, number, len(line), max_line_chars)
            yield number, line


def _long_line_error(path: str, number: int, length: int | None, max_line_chars: int) -> ValueError:
    size = f"{length:,}" if length is not None else f"more than {max_line_chars:,}"
    return ValueError(
        f"{path} line {number}: a single line of {size} characters: is this file really text with"
        f" line breaks? (lines up to max_line_chars={max_line_chars:,} are read)"
    )


def _open_binary(path: str):
    """The file as a binary stream, decompressed if it is gzip (by magic bytes or a .gz name)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC or path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


# --------------------------------------------------------------------------------------------------
# TensorFlow Datasets
# --------------------------------------------------------------------------------------------------


def read_tfds_documents(
    name: str, split: str, text_feature: str, data_dir: str | None = None
) -> Iterator[list[str]]:
    """One document per example of a TFDS dataset, from its string feature `text_feature`.

    Every line break in an article is a paragraph break, unlike in split_sentences: TFDS text
    datasets are not hard-wrapped, and c4 puts one paragraph per line, so joining lines would glue a
    heading or a list item onto the next sentence. Files are read in order (shuffle_files=False),
    so the stream is the same on every run. The dataset is loaded (and, as tfds.load does, downloaded
    and prepared if it is not in `data_dir` yet) and its features checked now; examples are read
    lazily.
    """
    import tensorflow as tf  # only this source needs TensorFlow and TFDS; they take seconds to load
    import tensorflow_datasets as tfds

    dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    spec = dataset.element_spec
    features = sorted(spec) if isinstance(spec, dict) else []
    if text_feature not in features:
        raise ValueError(
            f"TFDS dataset {name!r} has no feature {text_feature!r} (features:"
            f" {', '.join(features) or 'none'}): set data.tfds_text_feature"
        )
    if spec[text_feature].dtype != tf.string or spec[text_feature].shape.rank != 0:
        raise ValueError(
            f"TFDS dataset {name!r} feature {text_feature!r} is {spec[text_feature]}, not a"
            " single string: set data.tfds_text_feature to a text feature"
        )
    texts = dataset.map(lambda example: example[text_feature])  # skip decoding other features
    return _tfds_documents(texts.as_numpy_iterator(), f"TFDS {name} split {split!r}")


def _tfds_documents(texts: Iterable[bytes], where: str) -> Iterator[list[str]]:
    for index, raw in enumerate(texts):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where} example {index}: invalid UTF-8 ({e.reason})") from None
        sentences = [s for line in text.split("\n") for s in split_sentences(line)]
        if sentences:
            yield sentences


# --------------------------------------------------------------------------------------------------
# Built-in demo corpus: the prose that ships with Python
# --------------------------------------------------------------------------------------------------
# Two sources, both real English written by people for people, present on every Python install:
#   1. pydoc_data.topics: the language reference sections behind help("topic"); one document each.
#   2. docstrings of the standard library, read with `ast` from the source files (nothing is
#      imported). One document per module (its docstring and those of its top-level functions) and
#      one per class (its docstring and its methods'), in source order: a class's docstrings are
#      about one thing, so consecutive sentences are fair "IsNext" pairs for NSP.
# Docstrings with fewer than _MIN_DOCSTRING_SENTENCES prose sentences are left out: one-liners
# ("Return the value.") are formulaic, would be a third of the documents, and cannot give an
# IsNext pair of their own. Code, doctests, tables, headings, signatures and parameter lists are
# dropped; reST markup is reduced to its text. Everything is read in sorted order, so the result
# depends only on the Python version (and on a distribution's patches to its standard library), not
# on the machine, the working directory or the installed packages.

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

    Built once per process (a few seconds, most of it parsing the standard library) and cached.
    """
    documents = _demo_corpus()
    if max_documents is not None:
        if max_documents < 1:
            raise ValueError(f"max_documents={max_documents} must be at least 1 (or None for all)")
        documents = documents[:max_documents]
    return [list(document) for document in documents]  # fresh lists: callers may mutate them


@functools.lru_cache(maxsize=1)
def _demo_corpus() -> tuple[tuple[str, ...], ...]:
    seen, documents = set(), []
    for document in (*_reference_manual_documents(), *_docstring_documents()):
        document = tuple(document)
        if document not in seen:  # e.g. a docstring copied between modules
            seen.add(document)
            documents.append(document)
    return tuple(documents)


def _reference_manual_documents() -> Iterator[list[str]]:
    from pydoc_data.topics import topics  # data module only: no side effects on import

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
    files = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in _SKIP_STDLIB_DIRS]
        files.extend(os.path.join(directory, n) for n in names if n.endswith(".py"))
    return sorted(files, key=lambda p: os.path.relpath(p, root))


def _parse_without_gc(source: bytes, path: str) -> ast.Module | None:
    """ast.parse with the cyclic garbage collector paused, or None for a file that does not parse.

    A syntax tree is a great many small objects without cycles: the collections their allocation
    triggers find nothing to free, yet took 40% of the time to parse the standard library.
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


# --------------------------------------------------------------------------------------------------
# Held-out split
# --------------------------------------------------------------------------------------------------


def is_eval_document(sentences: list[str], eval_fraction: float) -> bool:
    """Whether a document belongs to the held-out evaluation split.

    A document is held out iff the hash of its text, as a number in [0, 1), is below
    `eval_fraction`. The decision depends on the document alone, not on its position, file or
    shard, so no way of splitting or ordering the corpus can leak an eval document into training,
    and identical copies of a document land on the same side. It does depend on the sentence
    boundaries: reading the same files with another text_format may move documents across.
    """
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} must be between 0 and 1")
    digest = hashlib.blake2b("\n".join(sentences).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < eval_fraction * 2.0**64


# --------------------------------------------------------------------------------------------------
# One entry point for the configured source
# --------------------------------------------------------------------------------------------------


def read_documents(
    source: str,
    *,
    input_pattern: str | None = None,
    text_format: str = "sentences",
    text_field: str = "text",
    tfds_name: str | None = None,
    tfds_split: str = "train",
    tfds_text_feature: str = "text",
    tfds_data_dir: str | None = None,
) -> Iterator[list[str]]:
    """The documents of the configured source; the arguments mirror the `data.*` config keys.

    Settings are checked now (a wrong combination names the key to change); documents are read
    lazily, and a source that turns out to hold none raises at the end instead of training on
    nothing.
    """
    if source not in SOURCES:
        raise ValueError(f"data.source={source!r} is not one of {', '.join(map(repr, SOURCES))}")
    ignored = {
        "data.input_pattern": input_pattern if source != "text" else None,
        "data.tfds_name": tfds_name if source != "tfds" else None,
        "data.tfds_data_dir": tfds_data_dir if source != "tfds" else None,
    }
    for key, value in ignored.items():
        if value is not None:
            raise ValueError(
                f"{key}={value!r} is set but data.source={source!r} does not read it:"
                f" set data.source or clear {key}"
            )
    if source == "demo":
        return require_documents(demo_documents(), "data.source='demo'")
    if source == "text":
        if not input_pattern:
            raise ValueError("data.source='text' needs data.input_pattern, a glob of text files")
        documents = read_text_documents(
            expand_pattern(input_pattern), text_format, text_field=text_field
        )
        return require_documents(
            documents,
            f"data.input_pattern={input_pattern!r} with data.text_format={text_format!r}",
            check="that the files are not empty and that data.text_format matches their layout",
        )
    if not tfds_name:
        raise ValueError("data.source='tfds' needs data.tfds_name, e.g. 'wikipedia/20230601.en'")
    documents = read_tfds_documents(tfds_name, tfds_split, tfds_text_feature, tfds_data_dir)
    return require_documents(
        documents,
        f"TFDS {tfds_name!r} split {tfds_split!r}",
        check="data.tfds_split and data.tfds_text_feature",
    )


def require_documents(
    documents: Iterable[list[str]], what: str, *, check: str = "that the input is not empty"
) -> Iterator[list[str]]:
    """Passes `documents` through lazily, and raises at the end if there were none.

    An empty corpus would otherwise surface much later as an empty or endlessly waiting pipeline.
    """
    empty = True
    for document in documents:
        empty = False
        yield document
    if empty:
        raise ValueError(f"{what} yielded no documents: check {check}")
