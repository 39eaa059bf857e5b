"""Corpus sources -> documents of sentences: text files, Parquet files, Hugging Face datasets, TFDS
datasets, the built-in demo corpus.

A document is a `list[str]` of sentences, each non-empty, stripped, with whitespace runs collapsed
to one space: the unit next-sentence prediction pairs are drawn from.

Text files (data.source="text") come in one of four layouts (data.text_format):
    sentences          one sentence per line, a blank line between documents (the original BERT
                       format); the end of a file also ends a document.
    documents          one document per line, split into sentences here.
    jsonl              one JSON object per line, its text field split into sentences here.
    document_per_file  each file is one document: paragraphs on blank lines, then sentences.
TFDS (data.source="tfds") reads any dataset with a text feature (wikipedia/20230601.en, c4/en).
Parquet (data.source="parquet") and Hugging Face datasets (data.source="hf_datasets") are tables: one
row is one document, its text column split into sentences here, or its list-of-strings sentences
column taken as the sentences. Rows whose value cannot be read as text are skipped and counted
(BadRows).

The held-out split (`is_eval_document`) hashes a document's own text, so however the corpus is cut
up, training never sees an eval document.
"""

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator

from etils import epath

from bertjax.data import demo
from bertjax.text import files
from bertjax.text.sentences import get_splitter, split_sentences

TEXT_FORMATS = ("sentences", "documents", "jsonl", "document_per_file")
SOURCES = ("demo", "text", "tfds", "parquet", "hf_datasets")

# --------------------------------------------------------------------------------------------------
# Text files
# --------------------------------------------------------------------------------------------------


def read_text_documents(
    paths: list[str],
    text_format: str,
    text_field: str = "text",
    *,
    max_line_chars: int = 1_000_000,
    split: Callable[[str], list[str]] = split_sentences,
) -> Iterator[list[str]]:
    """Documents of the text files `paths`, in order, read lazily.

    Args:
      paths: plain or gzip-compressed UTF-8 files (gzip is recognised by its magic bytes, so the
        name need not end in .gz).
      text_format: one of TEXT_FORMATS (see the module docstring).
      text_field: the field holding the text, for text_format="jsonl".
      max_line_chars: a longer line is an error rather than a memory blow-up: it usually means a
        binary file, or text whose line breaks were lost.
      split: text -> sentences, for the formats that split (bertjax.text.sentences.get_splitter).

    The format and the existence of every file are checked now, before the first document is read.
    """
    if text_format not in TEXT_FORMATS:
        raise ValueError(f"data.text_format={text_format!r} is not one of {', '.join(TEXT_FORMATS)}")
    paths = [str(p) for p in paths]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"text file not found: {path}")
    return _text_documents(paths, text_format, text_field, max_line_chars, split)


def _text_documents(paths, text_format, text_field, max_line_chars, split) -> Iterator[list[str]]:
    for path in paths:
        lines = files.read_lines(path, max_line_chars)
        if text_format == "sentences":
            yield from _sentence_per_line_documents(lines)
        elif text_format == "documents":
            for _, line in lines:
                if sentences := split(line):
                    yield sentences
        elif text_format == "jsonl":
            for number, line in lines:
                if line.strip():
                    if sentences := split(_json_text(path, number, line, text_field)):
                        yield sentences
        else:  # document_per_file
            if sentences := split("\n".join(line for _, line in lines)):
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


# --------------------------------------------------------------------------------------------------
# TensorFlow Datasets
# --------------------------------------------------------------------------------------------------


def read_tfds_documents(
    name: str,
    split: str,
    text_feature: str,
    data_dir: str | None = None,
    *,
    split_text: Callable[[str], list[str]] = split_sentences,
) -> Iterator[list[str]]:
    """One document per example of a TFDS dataset, from its string feature `text_feature`.

    Every line break in an article is a paragraph break, unlike in split_sentences: TFDS text
    datasets are not hard-wrapped, and c4 puts one paragraph per line, so joining lines would glue a
    heading or a list item onto the next sentence. Files are read in order (shuffle_files=False),
    so the stream is the same on every run. The dataset is loaded (and, as tfds.load does, downloaded
    and prepared if it is not in `data_dir` yet) and its features checked now; examples are read
    lazily.
    """
    import tensorflow as tf  # only this source needs TensorFlow and TFDS, which are slow to load
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
    return _tfds_documents(texts.as_numpy_iterator(), f"TFDS {name} split {split!r}", split_text)


def _tfds_documents(texts: Iterable[bytes], where: str, split_text) -> Iterator[list[str]]:
    for index, raw in enumerate(texts):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where} example {index}: invalid UTF-8 ({e.reason})") from None
        sentences = [s for line in text.split("\n") for s in split_text(line)]
        if sentences:
            yield sentences


# --------------------------------------------------------------------------------------------------
# Tables: Parquet files and Hugging Face datasets (Arrow), one row per document
# --------------------------------------------------------------------------------------------------

# Rows per batch read from a table: a batch's values are the only rows held in memory at once.
TABLE_BATCH_ROWS = 1024


class BadRows:
    """Rows of a table that were skipped because their value is not readable text: a null, a null
    sentence inside a sentences list, or bytes that are not UTF-8. All are counted; the first few
    are kept as "file:row: reason" (rows numbered from 0 within their file) for the summary line."""

    def __init__(self, keep: int = 5):
        self.count, self.keep, self.first = 0, keep, []

    def add(self, file: str, row: int, reason: str) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(f"{file}:{row}: {reason}")

    def summary(self) -> str:
        """One line: how many rows were skipped, and the first few; "" when none were."""
        if not self.count:
            return ""
        more = f"; and {self.count - len(self.first)} more" if self.count > len(self.first) else ""
        return f"skipped {self.count} bad row{'s' * (self.count != 1)}: {'; '.join(self.first)}{more}"


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


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 -- makes pyarrow.parquet an attribute
    except ImportError:
        raise ValueError("data.source='parquet' and 'hf_datasets' read through pyarrow: pip install pyarrow") from None
    return pyarrow


def _text_type(arrow_type) -> bool:
    """Whether a column of this Arrow type holds text: strings, bytes (decoded here), or only nulls."""
    types = _pyarrow().types
    if types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return (types.is_string(arrow_type) or types.is_large_string(arrow_type) or types.is_binary(arrow_type)
            or types.is_large_binary(arrow_type) or types.is_null(arrow_type)
            or getattr(types, "is_string_view", lambda t: False)(arrow_type)
            or getattr(types, "is_binary_view", lambda t: False)(arrow_type))


def _check_column(where: str, schema, column: str, sentences: bool) -> None:
    """One line naming the key to set when the column is missing or holds something else than text."""
    key = "data.sentences_column" if sentences else "data.text_column"
    if column not in schema.names:
        raise ValueError(f"{where} has no column {column!r} (columns: {', '.join(schema.names) or 'none'}): "
                         f"set {key}")
    arrow_type = schema.field(column).type
    types = _pyarrow().types
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


def _table_documents(batches: Iterable[tuple[str, int, list]], sentences: bool, split,
                     bad_rows: "BadRows | None") -> Iterator[list[str]]:
    """Documents of (file, first row, column values) batches, in order; bad rows counted and skipped."""
    for where, first_row, values in batches:
        for row, value in enumerate(values, first_row):
            document, bad = _row_document(value, sentences, split)
            if bad:
                if bad_rows is not None:
                    bad_rows.add(where, row, bad)
            elif document:
                yield document


def _open_binary(path: str):
    """A local file, or an object-store object through etils.epath, as a binary file object."""
    return epath.Path(path).open("rb") if files.is_remote(path) else open(path, "rb")


def _parquet_batches(pieces: list[tuple[str, list[int] | None]], column: str, sentences: bool):
    """(file, first row, values) of the column, batch by batch, for each (file, row groups or None for
    all) in order; each file's footer is read and its column checked when its turn comes."""
    pq = _pyarrow().parquet
    for path, groups in pieces:
        with _open_binary(path) as f:
            parquet = _parquet_file(pq, path, f)
            _check_column(path, parquet.schema_arrow, column, sentences)
            sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
            starts = [0, *itertools.accumulate(sizes)]
            for group in range(parquet.num_row_groups) if groups is None else groups:
                row = starts[group]
                for batch in parquet.iter_batches(batch_size=TABLE_BATCH_ROWS, row_groups=[group], columns=[column]):
                    values = batch.column(0).to_pylist()
                    yield path, row, values
                    row += len(values)


def _parquet_file(pq, path: str, f):
    try:
        return pq.ParquetFile(f)
    except _pyarrow().ArrowInvalid as e:
        raise ValueError(f"{path}: not a readable Parquet file ({e}): data.input_pattern should match Parquet "
                         f"files only") from None


def parquet_row_groups(paths: list[str]) -> list[tuple[str, int]]:
    """(file, row group) of every row group of the files, in order (their footers only are read)."""
    pq = _pyarrow().parquet
    groups = []
    for path in paths:
        with _open_binary(path) as f:
            groups += [(path, g) for g in range(_parquet_file(pq, path, f).num_row_groups)]
    return groups


def read_parquet_documents(
    paths: list[str],
    text_column: str = "text",
    sentences_column: str | None = None,
    *,
    row_groups: list[list[int] | None] | None = None,
    split: Callable[[str], list[str]] = split_sentences,
    bad_rows: BadRows | None = None,
) -> Iterator[list[str]]:
    """One document per row of the Parquet files `paths`, in order (files, then rows), read lazily in
    batches of TABLE_BATCH_ROWS rows of the one column read.

    text_column: a string (or UTF-8 bytes) column, split into sentences by `split`; sentences_column,
    when set, a list-of-strings column taken as the document's sentences instead (whitespace runs
    collapsed, empty ones dropped, no splitter). row_groups: for each file, the row groups to read
    (None: all). Rows that are not readable text go to `bad_rows` and are skipped.
    """
    paths = [str(p) for p in paths]
    pieces = list(zip(paths, row_groups if row_groups is not None else [None] * len(paths)))
    sentences = bool(sentences_column)
    return _table_documents(_parquet_batches(pieces, sentences_column or text_column, sentences), sentences,
                            split, bad_rows)


def hf_arrow_files(path: str, split: str = "train") -> list[str]:
    """The Arrow files of a directory written by datasets' save_to_disk, in order: a Dataset's, or a
    DatasetDict's split `split` (data.hf_dataset_split). The directory's JSON files say which."""
    directory = epath.Path(path)
    if (directory / "dataset_dict.json").exists():
        splits = json.loads((directory / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise ValueError(f"data.hf_dataset_path={path!r} has the splits {', '.join(map(repr, splits))}, not "
                             f"{split!r}: set data.hf_dataset_split")
        directory = directory / split
    if not (directory / "state.json").exists():
        raise FileNotFoundError(f"data.hf_dataset_path={path!r} is not a directory written by "
                                f"datasets.Dataset.save_to_disk (no state.json or dataset_dict.json in "
                                f"{directory})")
    state = json.loads((directory / "state.json").read_text())
    return [str(directory / entry["filename"]) for entry in state["_data_files"]]


def _arrow_stream_batches(paths: list[str], column: str, sentences: bool):
    """(file, first row, values) of the column of datasets' Arrow files (the Arrow IPC stream format),
    batch by batch: local files are memory-mapped, so a batch costs only its column's values."""
    pa = _pyarrow()
    for path in paths:
        source = pa.memory_map(path) if not files.is_remote(path) else _open_binary(path)
        with source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid as e:
                raise ValueError(f"{path}: not an Arrow file of datasets.save_to_disk ({e})") from None
            _check_column(path, reader.schema, column, sentences)
            row = 0
            for batch in reader:
                values = batch.column(column)
                for start in range(0, len(values), TABLE_BATCH_ROWS):
                    chunk = values.slice(start, TABLE_BATCH_ROWS).to_pylist()
                    yield path, row, chunk
                    row += len(chunk)


def read_hf_arrow_documents(paths: list[str], text_column: str = "text", sentences_column: str | None = None, *,
                            split: Callable[[str], list[str]] = split_sentences,
                            bad_rows: BadRows | None = None) -> Iterator[list[str]]:
    """One document per row of save_to_disk's Arrow files `paths` (hf_arrow_files), as
    read_parquet_documents reads Parquet files."""
    sentences = bool(sentences_column)
    batches = _arrow_stream_batches([str(p) for p in paths], sentences_column or text_column, sentences)
    return _table_documents(batches, sentences, split, bad_rows)


def load_hf_dataset(name: str, split: str = "train"):
    """datasets.load_dataset(name, split), from the local cache when it holds it; one line when the
    package is missing or the dataset cannot be loaded."""
    try:
        import datasets
    except ImportError:
        raise ValueError("data.hf_dataset_name needs the Hugging Face datasets package: pip install datasets") from None
    try:
        return datasets.load_dataset(name, split=split, download_mode="reuse_cache_if_exists")
    except (FileNotFoundError, ValueError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"data.hf_dataset_name={name!r} split {split!r} cannot be loaded ({reason}): check the "
                         f"name and data.hf_dataset_split, or save the dataset with save_to_disk and set "
                         f"data.hf_dataset_path") from None


def read_hf_dataset_documents(dataset, where: str, text_column: str = "text", sentences_column: str | None = None,
                              *, split: Callable[[str], list[str]] = split_sentences,
                              bad_rows: BadRows | None = None) -> Iterator[list[str]]:
    """One document per row of a loaded datasets.Dataset, read as Arrow batches of TABLE_BATCH_ROWS rows
    (rows numbered from 0 over the whole split, reported as in `where`)."""
    sentences = bool(sentences_column)
    column = sentences_column or text_column
    _check_column(where, dataset.features.arrow_schema, column, sentences)

    def batches():
        row = 0
        for table in dataset.select_columns([column]).with_format("arrow").iter(batch_size=TABLE_BATCH_ROWS):
            values = table.column(column).to_pylist()
            yield where, row, values
            row += len(values)

    return _table_documents(batches(), sentences, split, bad_rows)


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
    text_column: str = "text",
    sentences_column: str | None = None,
    hf_dataset_path: str | None = None,
    hf_dataset_name: str | None = None,
    hf_dataset_split: str = "train",
    sentence_splitter: str = "default",
    bad_rows: BadRows | None = None,
) -> Iterator[list[str]]:
    """The documents of the configured source; the arguments mirror the `data.*` config keys.

    Settings are checked now (a wrong combination names the key to change); documents are read
    lazily, and a source that turns out to hold none raises at the end instead of training on
    nothing. Table rows that are not readable text are skipped into `bad_rows`.
    """
    if source not in SOURCES:
        raise ValueError(f"data.source={source!r} is not one of {', '.join(map(repr, SOURCES))}")
    ignored = {
        "data.input_pattern": input_pattern if source not in ("text", "parquet") else None,
        "data.tfds_name": tfds_name if source != "tfds" else None,
        "data.tfds_data_dir": tfds_data_dir if source != "tfds" else None,
        "data.sentences_column": sentences_column if source not in ("parquet", "hf_datasets") else None,
        "data.hf_dataset_path": hf_dataset_path if source != "hf_datasets" else None,
        "data.hf_dataset_name": hf_dataset_name if source != "hf_datasets" else None,
    }
    for key, value in ignored.items():
        if value is not None:
            raise ValueError(
                f"{key}={value!r} is set but data.source={source!r} does not read it:"
                f" set data.source or clear {key}"
            )
    split = get_splitter(sentence_splitter)
    if source == "demo":
        return require_documents(demo.demo_documents(), "data.source='demo'")
    if source == "text":
        if not input_pattern:
            raise ValueError("data.source='text' needs data.input_pattern, a glob of text files")
        documents = read_text_documents(
            files.expand_pattern(input_pattern), text_format, text_field=text_field, split=split
        )
        return require_documents(
            documents,
            f"data.input_pattern={input_pattern!r} with data.text_format={text_format!r}",
            check="that the files are not empty and that data.text_format matches their layout",
        )
    if source in ("parquet", "hf_datasets"):
        bad_rows = BadRows() if bad_rows is None else bad_rows  # counted all the same: an empty corpus says why
        documents, what = _table_source(source, input_pattern, hf_dataset_path, hf_dataset_name, hf_dataset_split,
                                        text_column, sentences_column, split, bad_rows)
        column = f"data.sentences_column={sentences_column!r}" if sentences_column else f"data.text_column={text_column!r}"
        return require_documents(documents, what, check=f"{column} and that the rows hold text", bad_rows=bad_rows)
    if not tfds_name:
        raise ValueError("data.source='tfds' needs data.tfds_name, e.g. 'wikipedia/20230601.en'")
    documents = read_tfds_documents(tfds_name, tfds_split, tfds_text_feature, tfds_data_dir,
                                    split_text=split)
    return require_documents(
        documents,
        f"TFDS {tfds_name!r} split {tfds_split!r}",
        check="data.tfds_split and data.tfds_text_feature",
    )


def _table_source(source, input_pattern, hf_dataset_path, hf_dataset_name, hf_dataset_split, text_column,
                  sentences_column, split, bad_rows, *, shard: int = 0, num_shards: int = 1):
    """(documents, what they are) of a parquet or hf_datasets source, shard `shard` of `num_shards`: whole
    files j % num_shards == shard when there are at least num_shards files, else Parquet row groups g
    (numbered over all files) with g % num_shards == shard when there are enough of those, else
    documents i % num_shards == shard."""
    bad_rows = BadRows() if bad_rows is None else bad_rows  # skipped all the same when nobody reports them
    columns = dict(text_column=text_column, sentences_column=sentences_column, split=split, bad_rows=bad_rows)
    if source == "parquet":
        if not input_pattern:
            raise ValueError("data.source='parquet' needs data.input_pattern, a glob of Parquet files")
        paths, what = table_files(input_pattern), f"data.input_pattern={input_pattern!r}"
        if num_shards > 1 and len(paths) < num_shards:
            groups = parquet_row_groups(paths)
            if len(groups) >= num_shards:
                mine = groups[shard::num_shards]
                chosen = [path for path in paths if any(p == path for p, _ in mine)]
                selected = [[g for p, g in mine if p == path] for path in chosen]
                return read_parquet_documents(chosen, row_groups=selected, **columns), what
        read = read_parquet_documents
    else:
        if bool(hf_dataset_path) == bool(hf_dataset_name):
            raise ValueError("data.source='hf_datasets' needs one of data.hf_dataset_path (a save_to_disk "
                             "directory) and data.hf_dataset_name (a dataset in the datasets cache)")
        if hf_dataset_name:
            what = f"data.hf_dataset_name={hf_dataset_name!r} split {hf_dataset_split!r}"
            dataset = load_hf_dataset(hf_dataset_name, hf_dataset_split)
            documents = read_hf_dataset_documents(dataset, f"{hf_dataset_name}[{hf_dataset_split}]", **columns)
            return _every_nth(documents, shard, num_shards), what
        paths = hf_arrow_files(hf_dataset_path, hf_dataset_split)
        what = f"data.hf_dataset_path={hf_dataset_path!r} split {hf_dataset_split!r}"
        read = read_hf_arrow_documents
    if num_shards > 1 and len(paths) >= num_shards:
        return read(paths[shard::num_shards], **columns), what
    return _every_nth(read(paths, **columns), shard, num_shards), what


def _every_nth(documents: Iterable[list[str]], shard: int, num_shards: int) -> Iterator[list[str]]:
    return (d for i, d in enumerate(documents) if i % num_shards == shard)


def require_documents(
    documents: Iterable[list[str]], what: str, *, check: str = "that the input is not empty",
    bad_rows: BadRows | None = None,
) -> Iterator[list[str]]:
    """Passes `documents` through lazily, and raises at the end if there were none (saying which rows
    were skipped as bad, when there were).

    An empty corpus would otherwise surface much later as an empty or endlessly waiting pipeline.
    """
    empty = True
    for document in documents:
        empty = False
        yield document
    if empty:
        skipped = f" ({bad_rows.summary()})" if bad_rows is not None and bad_rows.count else ""
        raise ValueError(f"{what} yielded no documents{skipped}: check {check}")


def shard_documents(data, shard: int, num_shards: int, bad_rows: BadRows | None = None) -> list[list[str]]:
    """The raw documents of bertjax.data.prepare's output shard `shard`, in a deterministic order: whole
    files j % num_shards == shard when there are at least num_shards files, else (Parquet) row groups,
    else documents i % num_shards == shard. Table rows that are not text are skipped into `bad_rows`."""
    split = get_splitter(data.sentence_splitter)
    if data.source == "text":
        paths = files.expand_pattern(data.input_pattern)
        if len(paths) >= num_shards:
            return list(read_text_documents(paths[shard::num_shards], data.text_format, data.text_field, split=split))
        docs = read_text_documents(paths, data.text_format, data.text_field, split=split)
    elif data.source == "tfds":
        import tensorflow_datasets as tfds

        tfds_split = tfds.even_splits(data.tfds_split, n=num_shards)[shard]
        return list(read_tfds_documents(data.tfds_name, tfds_split, data.tfds_text_feature, data.tfds_data_dir,
                                        split_text=split))
    elif data.source in ("parquet", "hf_datasets"):
        documents, _ = _table_source(
            data.source, data.get("input_pattern"), data.get("hf_dataset_path"), data.get("hf_dataset_name"),
            data.get("hf_dataset_split", "train"), data.get("text_column", "text"), data.get("sentences_column"),
            split, bad_rows, shard=shard, num_shards=num_shards)
        return list(documents)
    elif data.source == "demo":
        docs = demo.demo_documents()
    else:
        raise ValueError(f"data.source={data.source!r} cannot be prepared: use text, parquet, hf_datasets, tfds or "
                         f"demo")
    return [d for i, d in enumerate(docs) if i % num_shards == shard]
