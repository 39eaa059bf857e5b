"""data.source=hf_datasets: a Hugging Face `datasets` directory written by save_to_disk (a Dataset, or a
DatasetDict and its split), read through its Arrow files with pyarrow alone; or a dataset the `datasets`
cache holds (data.hf_dataset_name, through datasets.load_dataset). One row per document
(bertjax/data/backends/tables.py).

Prepare's output shard k reads whole Arrow files j % N == k when there are at least N, else every file,
keeping documents i % N == k (always so for a dataset by name).
"""

import json
from collections.abc import Callable, Iterable, Iterator

from etils import epath

from bertjax.data import splits
import bertjax.data.backends.tables as tables  # the module, not the package: the package imports this one
from bertjax.data.backends.backend import Backend, BadRows, require_documents
from bertjax.text import files
from bertjax.text.sentences import split_sentences


def hf_arrow_files(path: str, split: str = "train") -> list[str]:
    """The Arrow files of a directory written by datasets' save_to_disk, in order: a Dataset's, or a
    DatasetDict's split `split` (data.hf_dataset_split). The directory's JSON files say which."""
    directory = epath.Path(path)
    if (directory / "dataset_dict.json").exists():
        splits_written = json.loads((directory / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits_written:
            raise ValueError(f"data.hf_dataset_path={path!r} has the splits {', '.join(map(repr, splits_written))}, "
                             f"not {split!r}: set data.hf_dataset_split")
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
    pa = tables.pyarrow()
    for path in paths:
        source = pa.memory_map(path) if not files.is_remote(path) else tables.open_binary(path)
        with source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid as e:
                raise ValueError(f"{path}: not an Arrow file of datasets.save_to_disk ({e})") from None
            tables.check_column(path, reader.schema, column, sentences)
            row = 0
            for batch in reader:
                values = batch.column(column)
                for start in range(0, len(values), tables.TABLE_BATCH_ROWS):
                    chunk = values.slice(start, tables.TABLE_BATCH_ROWS).to_pylist()
                    yield path, row, chunk
                    row += len(chunk)


def read_hf_arrow_documents(paths: list[str], text_column: str = "text", sentences_column: str | None = None, *,
                            split: Callable[[str], list[str]] = split_sentences,
                            bad_rows: BadRows | None = None) -> Iterator[list[str]]:
    """One document per row of save_to_disk's Arrow files `paths` (hf_arrow_files), as
    parquet_files.read_parquet_documents reads Parquet files."""
    sentences = bool(sentences_column)
    batches = _arrow_stream_batches([str(p) for p in paths], sentences_column or text_column, sentences)
    return tables.table_documents(batches, sentences, split, bad_rows)


def load_hf_dataset(name: str, split: str = "train"):
    """datasets.load_dataset(name, split), from the local cache when it holds it; one line when the
    package is missing or the dataset cannot be loaded."""
    try:
        import datasets  # an optional dependency: only data.hf_dataset_name needs it
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
    tables.check_column(where, dataset.features.arrow_schema, column, sentences)

    def batches():
        row = 0
        for table in dataset.select_columns([column]).with_format("arrow").iter(batch_size=tables.TABLE_BATCH_ROWS):
            values = table.column(column).to_pylist()
            yield where, row, values
            row += len(values)

    return tables.table_documents(batches(), sentences, split, bad_rows)


def _where(settings) -> str:
    """Which dataset the settings name, for a line about it."""
    if settings.hf_dataset_name:
        return f"data.hf_dataset_name={settings.hf_dataset_name!r} split {settings.hf_dataset_split!r}"
    return f"data.hf_dataset_path={settings.hf_dataset_path!r} split {settings.hf_dataset_split!r}"


def _locate(settings) -> None:
    """One of the two names is set; a save_to_disk directory has the split's Arrow files."""
    if bool(settings.hf_dataset_path) == bool(settings.hf_dataset_name):
        raise ValueError("data.source='hf_datasets' needs one of data.hf_dataset_path (a save_to_disk "
                         "directory) and data.hf_dataset_name (a dataset in the datasets cache)")
    if settings.hf_dataset_path:
        hf_arrow_files(settings.hf_dataset_path, settings.hf_dataset_split)


def shard_documents(settings, split, shard: int, num_shards: int, bad_rows: BadRows) -> Iterable[list[str]]:
    """Output shard `shard` of `num_shards`: whole Arrow files, else documents (module docstring)."""
    if bool(settings.hf_dataset_path) == bool(settings.hf_dataset_name):
        raise ValueError("data.source='hf_datasets' needs one of data.hf_dataset_path (a save_to_disk "
                         "directory) and data.hf_dataset_name (a dataset in the datasets cache)")
    columns = dict(text_column=settings.text_column, sentences_column=settings.sentences_column, split=split,
                   bad_rows=bad_rows)
    if settings.hf_dataset_name:
        dataset = load_hf_dataset(settings.hf_dataset_name, settings.hf_dataset_split)
        where = f"{settings.hf_dataset_name}[{settings.hf_dataset_split}]"
        return splits.share(read_hf_dataset_documents(dataset, where, **columns), shard, num_shards)
    paths = hf_arrow_files(settings.hf_dataset_path, settings.hf_dataset_split)
    if num_shards > 1 and len(paths) >= num_shards:
        return read_hf_arrow_documents(list(splits.share(paths, shard, num_shards)), **columns)
    return splits.share(read_hf_arrow_documents(paths, **columns), shard, num_shards)


def documents(settings, split, bad_rows: BadRows) -> Iterator[list[str]]:
    return require_documents(shard_documents(settings, split, 0, 1, bad_rows), _where(settings),
                             check=f"{tables.column_setting(settings)} and that the rows hold text", bad_rows=bad_rows)


BACKEND = Backend(
    name="hf_datasets", reads="a Hugging Face datasets save_to_disk directory, or a dataset the datasets cache "
                              "holds; one row per document",
    keys=("hf_dataset_path", "hf_dataset_name", "hf_dataset_split", "text_column", "sentences_column",
          "sentence_splitter"),
    documents=documents, shard=shard_documents, locate=_locate,
)
