"""Corpus sources -> documents of sentences: text files, TFDS datasets, the built-in demo corpus.

A document is a `list[str]` of sentences, each non-empty, stripped, with whitespace runs collapsed
to one space: the unit next-sentence prediction pairs are drawn from.

Text files (data.source="text") come in one of four layouts (data.text_format):
    sentences          one sentence per line, a blank line between documents (the original BERT
                       format); the end of a file also ends a document.
    documents          one document per line, split into sentences here.
    jsonl              one JSON object per line, its text field split into sentences here.
    document_per_file  each file is one document: paragraphs on blank lines, then sentences.
TFDS (data.source="tfds") reads any dataset with a text feature (wikipedia/20230601.en, c4/en).

The held-out split (`is_eval_document`) hashes a document's own text, so however the corpus is cut
up, training never sees an eval document.
"""

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator

from bertjax.data import demo
from bertjax.text import files
from bertjax.text.sentences import get_splitter, split_sentences

TEXT_FORMATS = ("sentences", "documents", "jsonl", "document_per_file")
SOURCES = ("demo", "text", "tfds")

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
    sentence_splitter: str = "default",
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
    if not tfds_name:
        raise ValueError("data.source='tfds' needs data.tfds_name, e.g. 'wikipedia/20230601.en'")
    documents = read_tfds_documents(tfds_name, tfds_split, tfds_text_feature, tfds_data_dir,
                                    split_text=split)
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


def shard_documents(data, shard: int, num_shards: int):
    """The raw documents of bertjax.data.prepare's output shard `shard`, in a deterministic order."""
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
    elif data.source == "demo":
        docs = demo.demo_documents()
    else:
        raise ValueError(f"data.source={data.source!r} cannot be prepared: use text, tfds or demo")
    return [d for i, d in enumerate(docs) if i % num_shards == shard]
