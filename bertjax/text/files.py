"""Files: local text files as lines, and paths that are local or on an object store.

Text files: glob expansion, gzip, strict UTF-8. What both the corpus backends (bertjax.data.backends) and
vocabulary learning (bertjax.text.vocab_learning) read text files with, so that both see the same text, and
what the task readers (JSON lines, SQuAD JSON, CoNLL columns) read a whole data file with (read_text). A bad
byte is an error naming file and line, never a silent U+FFFD that would teach the model a character the
text never had.

Paths: a directory may be local or an object-store URL (gs://bucket/run, or another scheme etils.epath
knows); whatever every layer writes there (a workdir, a learned vocabulary, predictions) goes through
is_remote/join/path/make/write_bytes/local_copy, so a remote directory never turns into a local
directory named "gs:". Local paths behave as plain files (appends, renames).
"""

import glob
import gzip
import hashlib
import os
import tempfile
import zlib
from collections.abc import Iterator

from etils import epath

_GZIP_MAGIC = b"\x1f\x8b"

# The file a vocabulary of each tokenizer kind is kept as (in a workdir, or learned into one).
VOCAB_FILES = {"wordpiece": "vocab.txt", "sentencepiece": "sentencepiece.model", "bpe": "tokenizer.json"}


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
        if not matches and os.path.isdir(os.path.expanduser(part)):
            raise FileNotFoundError(f"data.input_pattern={pattern!r}: {part!r} is a directory; give a glob of its "
                                    f"files, e.g. {os.path.join(part, '*.txt')!r}")
        if not matches:
            which = f" (its part {part!r} matches nothing)" if len(parts) > 1 else ""
            raise FileNotFoundError(f"no files match data.input_pattern={pattern!r}{which}")
        files.update(matches)
    return sorted(files)


def read_lines(path: str, max_line_chars: int = 1_000_000) -> Iterator[tuple[int, str]]:
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


def read_text(path, expected: str) -> str:
    """A whole local text file decoded strictly as UTF-8, a byte-order mark dropped (some editors write one).
    A missing file, a directory (expected: what the file should be, e.g. "a JSON-lines file") or a bad byte
    is one ValueError line naming the file, file:line for the byte."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, expected {expected}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: invalid UTF-8 ({e.reason})") from None


# ---------------------------------------------------------------------------------------------------
# Paths: local, or on an object store through etils.epath
# ---------------------------------------------------------------------------------------------------


def is_remote(path: str) -> bool:
    """gs://bucket/run and other URLs: no appends, no local file operations."""
    return "://" in str(path)


def join(directory: str, *parts: str) -> str:
    """A path inside the directory, as a string. A local directory is made absolute (as Orbax needs); a
    URL is kept as it is (os.path.abspath would make gs://b a local ./gs:/b)."""
    if is_remote(directory):
        return "/".join([str(directory).rstrip("/"), *parts])
    return os.path.join(os.path.abspath(str(directory)), *parts)


def path(directory: str, *parts: str) -> epath.Path:
    """The same, as an etils.epath.Path (local files or the object store's client)."""
    return epath.Path(join(directory, *parts))


def make(directory: str) -> None:
    """Create the directory (a workdir); one line (ValueError) when it cannot be, e.g. an unknown scheme
    or no access."""
    try:
        path(directory).mkdir(parents=True, exist_ok=True)
        if is_remote(directory):
            # Object stores have no directories, so mkdir proves nothing: write and remove a probe file.
            probe = path(directory, f".write-test-{os.getpid()}")
            probe.write_text("")
            probe.unlink()
    except Exception as e:  # noqa: BLE001 -- whatever the filesystem said, the run cannot start
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if isinstance(e, KeyError):  # epath's answer to a scheme it has no backend for
            reason = f"unknown scheme {reason}"
        raise ValueError(f"cannot write to the workdir {directory} ({reason}): give a local directory or a "
                         f"gs:// URL this machine can write to") from None


def write_bytes(target: str, data: bytes) -> None:
    """Write a whole file so that no reader sees half of it: beside and renamed for a local file; an
    object store replaces an object in one piece anyway."""
    if not is_remote(target):
        temporary = f"{target}.tmp-{os.getpid()}"
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, target)
        return
    epath.Path(target).write_bytes(data)


def cache_dir(*parts: str) -> str:
    """bertjax's cache of things worth computing once per machine (the demo corpus, a preview's learned
    vocabulary): $BERTJAX_CACHE_DIR, else $XDG_CACHE_HOME/bertjax, else ~/.cache/bertjax."""
    root = os.environ.get("BERTJAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bertjax")
    return os.path.join(root, *parts)


def local_copy(source: str) -> str:
    """A local file with the contents of `source`: the path itself when local, else a copy in a
    per-content cache directory (tokenizer libraries read local files only)."""
    if not is_remote(source):
        return source
    data = epath.Path(source).read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), "bertjax-remote-files", digest)
    local = os.path.join(directory, source.rstrip("/").rsplit("/", 1)[-1])
    if not os.path.exists(local):
        os.makedirs(directory, exist_ok=True)
        write_bytes(local, data)
    return local
