"""Corpus backends behind one table: data.source names a row of BACKENDS, and each row is the record
(backend.Backend) its module exports: what it reads, the keys it reads, how it is split across hosts
and prepare's shards, its one-line errors.

A new source is one module in this package exporting BACKEND, and one row below. Training, prepare,
mixtures and the settings' check of data.source all read the table.
"""

import dataclasses
from collections.abc import Iterator

from bertjax.data.backends import (demo_corpus, hf_datasets, parquet_files, prepared_shards, synthetic_batches,
                                   text_files, tfds_datasets)
from bertjax.data.backends.backend import Backend, BadRows
from bertjax.text import files
from bertjax.text.sentences import get_splitter

BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (
    demo_corpus.BACKEND,
    text_files.BACKEND,
    tfds_datasets.BACKEND,
    parquet_files.BACKEND,
    hf_datasets.BACKEND,
    prepared_shards.BACKEND,
    synthetic_batches.BACKEND,
)}
# The sources of raw documents: what a data.mixture entry and python -m bertjax.prepare may read.
DOCUMENT_SOURCES = tuple(name for name, backend in BACKENDS.items() if backend.documents is not None)


def get(source: str) -> Backend:
    """The backend of data.source, or one line naming the choices."""
    if source not in BACKENDS:
        raise ValueError(f"data.source={source!r} is not one of {', '.join(map(repr, BACKENDS))}")
    return BACKENDS[source]


def read_documents(settings, bad_rows: BadRows | None = None) -> Iterator[list[str]]:
    """The documents of the source the settings (a DataSettings) name, in order.

    Settings are checked now (a key the source does not read, or a wrong combination, names the key to
    change); documents are read lazily, and a source that turns out to hold none raises at the end
    instead of training on nothing. Table rows that are not readable text are skipped into `bad_rows`.
    """
    backend = get(settings.source)
    if backend.documents is None:
        raise ValueError(f"data.source={settings.source!r} gives no documents ({backend.reads}): choose one of "
                         f"{', '.join(DOCUMENT_SOURCES)}")
    _check_unread_keys(settings, backend)
    split = get_splitter(settings.sentence_splitter)
    return backend.documents(settings, split, BadRows() if bad_rows is None else bad_rows)


def shard_documents(settings, shard: int, num_shards: int, bad_rows: BadRows | None = None) -> list[list[str]]:
    """The documents of python -m bertjax.prepare's output shard `shard` of `num_shards`, in a
    deterministic order (each backend says how it splits: whole files, row groups, or documents).
    Table rows that are not text are skipped into `bad_rows`."""
    backend = get(settings.source)
    if backend.shard is None:
        raise ValueError(f"data.source={settings.source!r} cannot be prepared: use one of "
                         f"{', '.join(name for name, b in BACKENDS.items() if b.shard)}")
    split = get_splitter(settings.sentence_splitter)
    return list(backend.shard(settings, split, shard, num_shards, BadRows() if bad_rows is None else bad_rows))


def check_inputs(settings) -> None:
    """What the settings' source (and each source of a mixture) reads is there, and the vocabulary named
    is: found now, in one line, before a run builds anything."""
    for one in [settings, *(entry.settings for entry in settings.mixture)]:
        backend = get(one.source)
        _check_unread_keys(one, backend)
        if backend.locate is not None:
            backend.locate(one)
    if settings.vocab_path and not files.path(settings.vocab_path).exists():
        raise FileNotFoundError(f"data.vocab_path={settings.vocab_path} does not exist")


def _check_unread_keys(settings, backend: Backend) -> None:
    """A path or name another document source reads (a key unset by default), set for one that does not."""
    read_elsewhere = {key for other in BACKENDS.values() if other.documents is not None for key in other.keys}
    for field in dataclasses.fields(settings):
        key, value = field.name, getattr(settings, field.name)
        if key in read_elsewhere and key not in backend.keys and field.default is None and value not in (None, ""):
            raise ValueError(f"data.{key}={value!r} is set but data.source={settings.source!r} does not read it: "
                             f"set data.source or clear data.{key} (--config.data.{key}=)")
