"""What the two table backends (Parquet files, Hugging Face datasets) share: one row is one document,
its text column split into sentences, or its list-of-strings sentences column taken as the sentences.
Rows whose value cannot be read as text are skipped and counted (BadRows). pyarrow is imported when a
table is first read: only these sources need it.
"""

from collections.abc import Iterable, Iterator

from etils import epath

from bertjax.data.backends.backend import BadRows
from bertjax.text import files

# Rows per batch read from a table: a batch's values are the only rows held in memory at once.
TABLE_BATCH_ROWS = 1024


def table_files(pattern: str) -> list[str]:
    """Comma-separated globs of local or object-store (gs://...) files -> the sorted files they match.

    Local globs go through bertjax.text.files.expand_pattern (the text source's rules: every glob must
    match); a remote one through etils.epath, with the same rule.
    """
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    local = [p for p in parts if not files.is_remote(p)]
    matched = set(files.expand_pattern(",".join(local))) if local else set()
    for part in parts:
        if files.is_remote(part):
            matches = _remote_glob(part)
            if not matches:
                raise FileNotFoundError(f"no files match {part!r} of data.input_pattern={pattern!r}")
            matched.update(matches)
    return sorted(matched)


def _remote_glob(pattern: str) -> list[str]:
    """gs://bucket/dir/*.parquet -> the matching objects, through epath (its directory, then the rest)."""
    scheme, rest = pattern.split("://", 1)
    pieces = rest.split("/")
    fixed = next((i for i, piece in enumerate(pieces) if any(c in piece for c in "*?[")), len(pieces))
    base = epath.Path(f"{scheme}://{'/'.join(pieces[:fixed])}")
    if fixed == len(pieces):
        return [str(base)] if base.exists() else []
    return [str(p) for p in base.glob("/".join(pieces[fixed:])) if p.is_file()]


def pyarrow():
    """The pyarrow module with pyarrow.parquet loaded, or one line saying to install it."""
    try:
        # Here, not at the top: only the table sources need pyarrow (slow to load), and the backends' table
        # (data.backends) is imported by the synthetic data path, which should not pay for it.
        import pyarrow
        import pyarrow.parquet  # noqa: F401 -- as above; makes pyarrow.parquet an attribute
    except ImportError:
        raise ValueError("data.source='parquet' and 'hf_datasets' read through pyarrow: pip install pyarrow") from None
    return pyarrow


def _text_type(arrow_type) -> bool:
    """Whether a column of this Arrow type holds text: strings, bytes (decoded here), or only nulls."""
    types = pyarrow().types
    if types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return (types.is_string(arrow_type) or types.is_large_string(arrow_type) or types.is_binary(arrow_type)
            or types.is_large_binary(arrow_type) or types.is_null(arrow_type)
            or getattr(types, "is_string_view", lambda t: False)(arrow_type)
            or getattr(types, "is_binary_view", lambda t: False)(arrow_type))


def check_column(where: str, schema, column: str, sentences: bool) -> None:
    """One line naming the key to set when the column is missing or holds something else than text."""
    key = "data.sentences_column" if sentences else "data.text_column"
    if column not in schema.names:
        raise ValueError(f"{where} has no column {column!r} (columns: {', '.join(schema.names) or 'none'}): "
                         f"set {key}")
    arrow_type = schema.field(column).type
    types = pyarrow().types
    if sentences:
        is_list = types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type)
        if not (types.is_null(arrow_type) or (is_list and _text_type(arrow_type.value_type))):
            raise ValueError(f"{where} column {column!r} is {arrow_type}, not a list of strings: set {key} to the "
                             f"column of sentences, or clear it and set data.text_column")
    elif not _text_type(arrow_type):
        raise ValueError(f"{where} column {column!r} is {arrow_type}, not text: set {key} to the column that "
                         f"holds the text")


def _decode(value, what: str) -> tuple[str | None, str | None]:
    """(text, None), or (None, why the row is skipped)."""
    if value is None:
        return None, f"null {what}"
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError as e:
            return None, f"invalid UTF-8 in the {what} at byte {e.start} ({e.reason})"
    return value, None


def _row_document(value, sentences: bool, split) -> tuple[list[str], str | None]:
    """One row's document (maybe empty), or the reason it is skipped."""
    if not sentences:
        text, bad = _decode(value, "text")
        return ([], bad) if bad else (split(text), None)
    if value is None:
        return [], "null sentences list"
    document = []
    for sentence in value:
        text, bad = _decode(sentence, "sentence")
        if bad:  # a document with a hole is a different document: the whole row goes
            return [], bad
        # What the sentence-per-line text format makes of a line: whitespace runs as one space.
        if text := " ".join(text.split()):
            document.append(text)
    return document, None


def table_documents(batches: Iterable[tuple[str, int, list]], sentences: bool, split,
                    bad_rows: BadRows | None) -> Iterator[list[str]]:
    """Documents of (file, first row, column values) batches, in order; bad rows counted and skipped."""
    for where, first_row, values in batches:
        for row, value in enumerate(values, first_row):
            document, bad = _row_document(value, sentences, split)
            if bad:
                if bad_rows is not None:
                    bad_rows.add(where, row, bad)
            elif document:
                yield document


def open_binary(path: str):
    """A local file, or an object-store object through etils.epath, as a binary file object."""
    return epath.Path(path).open("rb") if files.is_remote(path) else open(path, "rb")


def column_setting(settings) -> str:
    """The key and value of the column a table is read by, for a line about an empty table."""
    if settings.sentences_column:
        return f"data.sentences_column={settings.sentences_column!r}"
    return f"data.text_column={settings.text_column!r}"
