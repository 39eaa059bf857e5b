"""data.source=parquet: Parquet files, local or gs://, by comma-separated globs; one row per document
(bertjax/data/backends/tables.py), read a row group at a time, only the one column.

Documents come in file order (the sorted glob), then row order. Prepare's output shard k reads whole
files j % N == k when there are at least N files, else row groups g % N == k (numbered over all
files) when there are at least N of those, else every file, keeping documents i % N == k.
"""

import itertools
from collections.abc import Callable, Iterable, Iterator

from bertjax.data import splits
import bertjax.data.backends.tables as tables  # the module, not the package: the package imports this one
from bertjax.data.backends.backend import Backend, BadRows, require_documents
from bertjax.text.sentences import split_sentences


def _parquet_batches(pieces: list[tuple[str, list[int] | None]], column: str, sentences: bool):
    """(file, first row, values) of the column, batch by batch, for each (file, row groups or None for
    all) in order; each file's footer is read and its column checked when its turn comes."""
    pq = tables.pyarrow().parquet
    for path, groups in pieces:
        with tables.open_binary(path) as f:
            parquet = _parquet_file(pq, path, f)
            tables.check_column(path, parquet.schema_arrow, column, sentences)
            sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
            starts = [0, *itertools.accumulate(sizes)]
            for group in range(parquet.num_row_groups) if groups is None else groups:
                row = starts[group]
                for batch in parquet.iter_batches(batch_size=tables.TABLE_BATCH_ROWS, row_groups=[group],
                                                  columns=[column]):
                    values = batch.column(0).to_pylist()
                    yield path, row, values
                    row += len(values)


def _parquet_file(pq, path: str, f):
    try:
        return pq.ParquetFile(f)
    except tables.pyarrow().ArrowInvalid as e:
        raise ValueError(f"{path}: not a readable Parquet file ({e}): data.input_pattern should match Parquet "
                         f"files only") from None


def parquet_row_groups(paths: list[str]) -> list[tuple[str, int]]:
    """(file, row group) of every row group of the files, in order (their footers only are read)."""
    pq = tables.pyarrow().parquet
    groups = []
    for path in paths:
        with tables.open_binary(path) as f:
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
    return tables.table_documents(_parquet_batches(pieces, sentences_column or text_column, sentences),
                                  sentences, split, bad_rows)


def shard_documents(settings, split, shard: int, num_shards: int, bad_rows: BadRows) -> Iterable[list[str]]:
    """Output shard `shard` of `num_shards`: whole files, else row groups, else documents (module docstring)."""
    if not settings.input_pattern:
        raise ValueError("data.source='parquet' needs data.input_pattern, a glob of Parquet files")
    paths = tables.table_files(settings.input_pattern)
    columns = dict(text_column=settings.text_column, sentences_column=settings.sentences_column, split=split,
                   bad_rows=bad_rows)
    if num_shards > 1 and len(paths) < num_shards:
        groups = parquet_row_groups(paths)
        if len(groups) >= num_shards:
            mine = list(splits.share(groups, shard, num_shards))
            chosen = [path for path in paths if any(p == path for p, _ in mine)]
            selected = [[g for p, g in mine if p == path] for path in chosen]
            return read_parquet_documents(chosen, row_groups=selected, **columns)
    if num_shards > 1 and len(paths) >= num_shards:
        return read_parquet_documents(list(splits.share(paths, shard, num_shards)), **columns)
    return splits.share(read_parquet_documents(paths, **columns), shard, num_shards)


def documents(settings, split, bad_rows: BadRows) -> Iterator[list[str]]:
    return require_documents(shard_documents(settings, split, 0, 1, bad_rows),
                             f"data.input_pattern={settings.input_pattern!r}",
                             check=f"{tables.column_setting(settings)} and that the rows hold text", bad_rows=bad_rows)


BACKEND = Backend(
    name="parquet", reads="Parquet files, local or gs://, one row per document",
    keys=("input_pattern", "text_column", "sentences_column", "sentence_splitter"),
    documents=documents, shard=shard_documents,
    locate=lambda settings: tables.table_files(settings.input_pattern or ""),
)
