"""The corpus backends (bertjax/data/backends) and bertjax.text.files: text files in every format, TFDS
(mocked, offline), the configured source and the held-out split (bertjax/data/splits.py).

Every test writes its own small files into tmp_path; nothing is downloaded.
"""

import gzip
import json
import random
import re
import socket
import time

import pytest

from bertjax.data import backends
from bertjax.data.backends.backend import require_documents
from bertjax.data.backends.text_files import read_text_documents
from bertjax.data.backends.tfds_datasets import read_tfds_documents
from bertjax.data.settings import DataSettings
from bertjax.data.splits import is_eval_document
from bertjax.text.files import expand_pattern


def read_documents(source, **keys):
    """The documents of a source configured by these data keys."""
    return backends.read_documents(DataSettings(source=source, **keys))

# --------------------------------------------------------------------------------------------------
# Text files
# --------------------------------------------------------------------------------------------------


def write(path, text, compress=False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def read(paths, text_format, **kwargs):
    return list(read_text_documents([str(p) for p in paths], text_format, **kwargs))


def test_sentences_format_blank_lines_and_file_ends_separate_documents(tmp_path):
    a = write(tmp_path / "a.txt", "First doc, one.\nFirst doc, two.\n\n\n  \nSecond doc.\n   \n")
    # b.txt ends without a blank line, even without a newline: its document ends with the file.
    b = write(tmp_path / "b.txt", "  Third   doc.  \nStill third.")
    c = write(tmp_path / "c.txt", "Fourth doc.\n")
    assert read([a, b, c], "sentences") == [
        ["First doc, one.", "First doc, two."],
        ["Second doc."],
        ["Third doc.", "Still third."],
        ["Fourth doc."],
    ]


def test_documents_format(tmp_path):
    path = write(
        tmp_path / "docs.txt",
        "The cat sat. Dr. Who watched.\n\n   \nOnly one sentence here\nA second doc. It ends.\n",
    )
    assert read([path], "documents") == [
        ["The cat sat.", "Dr. Who watched."],
        ["Only one sentence here"],
        ["A second doc.", "It ends."],
    ]


def test_jsonl_format_with_text_field(tmp_path):
    lines = [
        json.dumps({"id": 1, "body": "First article. It has two sentences.\n\nA new paragraph"}),
        "",
        json.dumps({"id": 2, "body": "   "}),  # no sentences: skipped, not an empty document
        json.dumps({"id": 3, "body": "Ünïcödé text. Ok."}, ensure_ascii=False),
    ]
    path = write(tmp_path / "data.jsonl", "\n".join(lines) + "\n")
    assert read([path], "jsonl", text_field="body") == [
        ["First article.", "It has two sentences.", "A new paragraph"],
        ["Ünïcödé text.", "Ok."],
    ]


def test_document_per_file_format(tmp_path):
    a = write(
        tmp_path / "a.txt",
        "A hard-wrapped paragraph that\ncontinues here. And ends.\n\nA second paragraph\n",
    )
    b = write(tmp_path / "b.txt", "Another file. Another document.")
    empty = write(tmp_path / "empty.txt", "\n\n")
    assert read([a, empty, b], "document_per_file") == [
        ["A hard-wrapped paragraph that continues here.", "And ends.", "A second paragraph"],
        ["Another file.", "Another document."],
    ]


@pytest.mark.parametrize("name", ["corpus.txt.gz", "corpus.txt"])  # by suffix, or by magic bytes
@pytest.mark.parametrize("text_format", ["sentences", "documents", "document_per_file"])
def test_gzip_files(tmp_path, name, text_format):
    text = "Gzip works. Even here.\n\nSecond part.\n"
    plain = write(tmp_path / "plain.txt", text)
    compressed = write(tmp_path / name, text, compress=True)
    assert read([compressed], text_format) == read([plain], text_format)
    assert read([compressed], text_format)  # not trivially empty


def test_gzip_jsonl(tmp_path):
    path = write(tmp_path / "x.jsonl.gz", '{"text": "Compressed. JSON."}\n', compress=True)
    assert read([path], "jsonl") == [["Compressed.", "JSON."]]


def test_broken_gzip_is_named(tmp_path):
    plain = write(tmp_path / "plain.txt.gz", "Not compressed at all.\n")
    data = gzip.compress(b"Some text. More text.\n" * 2000)
    truncated = write(tmp_path / "truncated.gz", data[: len(data) // 2])
    for path in (plain, truncated):
        with pytest.raises(ValueError, match=re.escape(f"{path}: not a readable gzip file")):
            read([path], "sentences")


def test_windows_line_breaks_and_byte_order_mark(tmp_path):
    path = write(tmp_path / "win.txt", b"\xef\xbb\xbfFirst.\r\nSecond.\r\n\r\nThird.\r\n")
    assert read([path], "sentences") == [["First.", "Second."], ["Third."]]


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, compress):
    latin1 = "Fine.\nAlso fine.\nCaf\xe9 au lait.\n".encode("latin-1")
    path = write(tmp_path / "latin1.txt", latin1, compress)
    message = r"latin1\.txt line 3: invalid UTF-8 at byte 3 .*re-encode the file as UTF-8"
    with pytest.raises(ValueError, match=message):
        read([path], "sentences")


def test_missing_file_is_named(tmp_path):
    present = write(tmp_path / "present.txt", "Here.\n")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_text_documents([present, str(tmp_path / "missing.txt")], "sentences")  # raised eagerly


def test_unknown_text_format():
    with pytest.raises(ValueError, match="data.text_format='csv' is not one of"):
        read_text_documents([], "csv")


def test_huge_single_line_is_an_error_not_a_hang(tmp_path):
    path = tmp_path / "binary.txt"
    path.write_bytes(b"x" * 6_000_000)  # > 4 bytes per allowed character: detected without decoding
    start = time.perf_counter()
    message = r"binary\.txt line 1: a single line of more than 1,000,000 characters"
    with pytest.raises(ValueError, match=message):
        read([path], "sentences")
    assert time.perf_counter() - start < 5
    small = write(tmp_path / "small.txt", "Short.\n" + "y" * 1500 + "\n")
    message = r"small\.txt line 2: a single line of 1,500 characters: is this file really text"
    with pytest.raises(ValueError, match=message):
        read([small], "documents", max_line_chars=1000)


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"text": "unterminated', r"bad\.jsonl line 2: invalid JSON"),
        ("[1, 2]", r"bad\.jsonl line 2: a JSON list, not an object"),
        (
            '{"body": "x", "id": 3}',
            r"bad\.jsonl line 2: no 'text' field \(fields: 'body', 'id'\): set data.text_field",
        ),
        ('{"text": 42}', r"bad\.jsonl line 2: field 'text' is a JSON int, not a string"),
    ],
)
def test_bad_jsonl(tmp_path, line, message):
    path = write(tmp_path / "bad.jsonl", '{"text": "Good line."}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        read([path], "jsonl")


def test_expand_pattern(tmp_path):
    for name in ["b.txt", "a.txt", "c.jsonl", "sub/d.txt"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        write(tmp_path / name, "x\n")
    files = expand_pattern(f"{tmp_path}/*.txt, {tmp_path}/sub/*.txt,{tmp_path}/a.*")
    assert files == sorted(str(tmp_path / n) for n in ["a.txt", "b.txt", "sub/d.txt"])
    assert expand_pattern(f"{tmp_path}/**/*.txt") == files  # recursive; directories never listed
    with pytest.raises(FileNotFoundError, match=r"no files match data.input_pattern='.*\*\.csv'$"):
        expand_pattern(f"{tmp_path}/*.csv")
    with pytest.raises(FileNotFoundError, match=r"its part '.*\*\.csv' matches nothing"):
        expand_pattern(f"{tmp_path}/*.txt,{tmp_path}/*.csv")
    with pytest.raises(ValueError, match="only local files"):
        expand_pattern("gs://bucket/*.txt")
    with pytest.raises(FileNotFoundError,
                       match=r"'.*sub' is a directory; give a glob of its files, e.g. '.*sub/\*\.txt'"):
        expand_pattern(f"{tmp_path}/sub")


# --------------------------------------------------------------------------------------------------
# read_documents: the configured source, checked early, never silently empty
# --------------------------------------------------------------------------------------------------


def test_read_documents_text(tmp_path):
    write(tmp_path / "a.txt", "One. Two.\n")
    write(tmp_path / "b.txt", "Three.\n")
    documents = read_documents("text", input_pattern=f"{tmp_path}/*.txt", text_format="documents")
    assert list(documents) == [["One.", "Two."], ["Three."]]


@pytest.mark.parametrize("content", ["", "\n \n\n"])
def test_empty_corpus_is_an_error(tmp_path, content):
    write(tmp_path / "empty.txt", content)
    documents = read_documents("text", input_pattern=f"{tmp_path}/empty.txt")  # lazy: no error yet
    message = r"empty\.txt' with data.text_format='sentences' yielded no documents: check"
    with pytest.raises(ValueError, match=message):
        list(documents)


def test_require_documents_is_lazy():
    seen = []
    documents = require_documents(iter([["a."], ["b."]]), "two documents")
    for document in documents:
        seen.append(document)
    assert seen == [["a."], ["b."]]
    empty = require_documents(iter([]), "data.source='nothing'")  # nothing raised before iteration
    with pytest.raises(ValueError, match="data.source='nothing' yielded no documents: check"):
        next(empty)


@pytest.mark.parametrize(
    "source,kwargs,message",
    [
        ("wiki", {}, "data.source='wiki' is not one of 'demo', 'text', 'tfds'"),
        ("text", {}, "data.source='text' needs data.input_pattern, a glob of text files"),
        ("tfds", {}, "data.source='tfds' needs data.tfds_name"),
        ("demo", {"input_pattern": "a.txt"}, "data.input_pattern='a.txt' is set but data.sou"),
        ("text", {"input_pattern": "*.txt", "tfds_name": "c4/en"}, "data.tfds_name='c4/en' is set but"),
    ],
)
def test_read_documents_bad_settings_name_the_key(source, kwargs, message):
    with pytest.raises(ValueError, match=message):
        read_documents(source, **kwargs)  # raised at the call, before any iteration


def test_every_backend_module_is_one_row_of_the_table():
    """A source is one module of bertjax/data/backends exporting BACKEND, and one row of BACKENDS."""
    import importlib
    import pkgutil

    shared = {"backend", "tables"}  # the record, and what the table sources share
    names = [m.name for m in pkgutil.iter_modules(backends.__path__) if m.name not in shared]
    rows = {importlib.import_module(f"bertjax.data.backends.{name}").BACKEND.name for name in names}
    assert rows == set(backends.BACKENDS) and len(names) == len(backends.BACKENDS)
    assert backends.DOCUMENT_SOURCES == ("demo", "text", "tfds", "parquet", "hf_datasets")


# --------------------------------------------------------------------------------------------------
# TFDS, mocked: no download, no network
# --------------------------------------------------------------------------------------------------

ARTICLES = [
    "Anarchism is a political philosophy. It is sceptical of authority.\n\nHistory\n"
    "The earliest anarchist themes can be found in the 6th century BC.",
    "   ",  # an article with no text yields no document
    "Autism is a neurodevelopmental condition.\nIt was first described in 1943.",
]


@pytest.fixture
def mock_tfds(monkeypatch):
    """tfds.load of any registered dataset returns ARTICLES, and any socket connection fails."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    def no_network(*args, **kwargs):
        raise AssertionError("the TFDS test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)

    def as_dataset(self, *args, **kwargs):
        ids = list(range(len(ARTICLES)))
        titles = [f"title {i}" for i in ids]
        return tf.data.Dataset.from_tensor_slices({"title": titles, "text": ARTICLES, "id": ids})

    with tfds.testing.mock_data(
        num_examples=len(ARTICLES), as_dataset_fn=as_dataset, policy=tfds.testing.MockPolicy.USE_CODE
    ):
        yield


def test_tfds_documents(mock_tfds):
    documents = read_tfds_documents("wikipedia/20230601.en", "train", "text", data_dir="/nonexistent")
    assert list(documents) == [
        [
            "Anarchism is a political philosophy.",
            "It is sceptical of authority.",
            "History",
            "The earliest anarchist themes can be found in the 6th century BC.",
        ],
        ["Autism is a neurodevelopmental condition.", "It was first described in 1943."],
    ]
    via_config = read_documents("tfds", tfds_name="wikipedia/20230601.en", tfds_split="train[:10]")
    assert len(list(via_config)) == 2


def test_tfds_unknown_feature_lists_available(mock_tfds):
    message = r"no feature 'content' \(features: id, text, title\): set data.tfds_text_feature"
    with pytest.raises(ValueError, match=message):
        read_tfds_documents("wikipedia/20230601.en", "train", "content")
    with pytest.raises(ValueError, match="feature 'id' is .* not a single string"):
        read_tfds_documents("wikipedia/20230601.en", "train", "id")


# --------------------------------------------------------------------------------------------------
# Held-out split
# --------------------------------------------------------------------------------------------------


def synthetic_documents(n, seed=0):
    rng = random.Random(seed)
    return [
        [f"Document {i} sentence {j} {rng.random()}." for j in range(rng.randint(1, 4))]
        for i in range(n)
    ]


def test_eval_fraction_is_approximately_right():
    documents = synthetic_documents(5000)
    held_out = sum(is_eval_document(d, 0.1) for d in documents)
    assert 0.08 * 5000 <= held_out <= 0.12 * 5000
    assert not any(is_eval_document(d, 0.0) for d in documents)
    assert all(is_eval_document(d, 1.0) for d in documents)


def test_eval_split_is_stable_and_independent_of_order():
    documents = synthetic_documents(2000, seed=1)
    held_out = {tuple(d) for d in documents if is_eval_document(d, 0.2)}
    shuffled = list(documents)
    random.Random(2).shuffle(shuffled)
    assert {tuple(d) for d in shuffled if is_eval_document(d, 0.2)} == held_out
    # A duplicate, or the same text read into a fresh list, lands on the same side.
    assert all(is_eval_document(list(d), 0.2) for d in held_out)
    # A fixed value: the hash must not change between runs, machines or versions of this code,
    # or a resumed run would train on documents it held out before.
    expected = [True, True, True, True, False, True, False, True, True, True, False, False]
    assert [is_eval_document([f"Sentence {i}."], 0.5) for i in range(12)] == expected


def test_eval_fraction_out_of_range():
    with pytest.raises(ValueError, match="eval_fraction=1.5 must be between 0 and 1"):
        is_eval_document(["x"], 1.5)



def test_read_documents_uses_the_configured_splitter(tmp_path):
    pytest.importorskip("blingfire")
    path = tmp_path / "zh.txt"
    path.write_text("我喜欢猫。你喜欢狗吗？\n", encoding="utf-8")
    default = read_documents("text", input_pattern=str(path), text_format="documents")
    assert list(default) == [["我喜欢猫。你喜欢狗吗？"]]
    multilingual = read_documents("text", input_pattern=str(path), text_format="documents",
                                  sentence_splitter="multilingual")
    assert list(multilingual) == [["我喜欢猫。", "你喜欢狗吗？"]]
