"""data.source=text: local text files by comma-separated globs, plain or gzip, in one of four layouts
(data.text_format):

    sentences          one sentence per line, a blank line between documents (the original BERT
                       format); the end of a file also ends a document.
    documents          one document per line, split into sentences here.
    jsonl              one JSON object per line, its text field (data.text_field) split into sentences here.
    document_per_file  each file is one document: paragraphs on blank lines, then sentences.

Hosts read every file (the held-out check and a learned vocabulary need every document); prepare's
output shard k reads files j with j % N == k when there are at least N files, else every file and
keeps documents i with i % N == k.
"""

import json
import os
from collections.abc import Callable, Iterable, Iterator

from bertjax.data import splits
from bertjax.data.backends.backend import Backend, BadRows, require_documents
from bertjax.text import files
from bertjax.text.sentences import split_sentences

TEXT_FORMATS = ("sentences", "documents", "jsonl", "document_per_file")


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
        raise ValueError(f"data.text_format={text_format!r} is not one of {', '.join(map(repr, TEXT_FORMATS))}")
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


def _paths(settings) -> list[str]:
    if not settings.input_pattern:
        raise ValueError("data.source='text' needs data.input_pattern, a glob of text files")
    return files.expand_pattern(settings.input_pattern)


def shard_documents(settings, split, shard: int, num_shards: int, bad_rows: BadRows) -> Iterator[list[str]]:
    """Output shard `shard` of `num_shards`: whole files when there are enough of them, else documents."""
    paths = _paths(settings)
    if len(paths) >= num_shards:
        return read_text_documents(list(splits.share(paths, shard, num_shards)), settings.text_format,
                                   settings.text_field, split=split)
    documents = read_text_documents(paths, settings.text_format, settings.text_field, split=split)
    return splits.share(documents, shard, num_shards)


def documents(settings, split, bad_rows: BadRows) -> Iterator[list[str]]:
    return require_documents(
        shard_documents(settings, split, 0, 1, bad_rows),
        f"data.input_pattern={settings.input_pattern!r} with data.text_format={settings.text_format!r}",
        check="that the files are not empty and that data.text_format matches their layout",
    )


BACKEND = Backend(
    name="text", reads="text files, plain or gzip: sentence per line, document per line, JSON lines or a document "
                       "per file", keys=("input_pattern", "text_format", "text_field", "sentence_splitter"),
    documents=documents, shard=shard_documents, locate=_paths,
)
