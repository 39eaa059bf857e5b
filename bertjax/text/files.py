"""Local text files as lines: glob expansion, gzip, strict UTF-8.

What both the corpus sources (bertjax.data.sources) and vocabulary learning (bertjax.text.vocab) read
text files with, so that both see the same text. A bad byte is an error naming file and line, never a
silent U+FFFD that would teach the model a character the text never had.
"""

import glob
import gzip
import os
import zlib
from collections.abc import Iterator

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
