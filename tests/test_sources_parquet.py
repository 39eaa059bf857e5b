"""Parquet files and Hugging Face datasets as corpora: the same documents, corpora and batches as the same
text through text files, the host and prepare splits, bad rows, and a short training run on Parquet."""

import json
import pathlib
import runpy

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data import backends, demo, inputs
from bertjax.data.backends import tables
from bertjax.data.backends.backend import BadRows
from bertjax.data.settings import DataSettings
from bertjax.text import vocab_learning as vocabularies

import test_workdir  # a sibling test module (pytest puts tests/ on the path)

REPO = pathlib.Path(__file__).resolve().parents[1]
gcs, BUCKET = test_workdir.gcs, test_workdir.BUCKET  # the in-memory GCS emulator fixture and its bucket
NUM_DOCUMENTS = 240
FILE_SIZES = (120, 70, 50)  # documents per file; the first file's Parquet has row groups of 16 rows
ROW_GROUP_ROWS = 16


@pytest.fixture(scope="module")
def documents():
    return demo.demo_documents(NUM_DOCUMENTS)


def file_parts(documents):
    bounds = np.cumsum((0,) + FILE_SIZES)
    return [documents[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.fixture(scope="module")
def corpus(documents, tmp_path_factory):
    """The same documents as sentence-per-line text, JSON lines, Parquet and a save_to_disk directory."""
    import datasets

    root = tmp_path_factory.mktemp("tables")
    for name in ("sentences", "jsonl", "parquet"):
        (root / name).mkdir()
    for i, part in enumerate(file_parts(documents)):
        (root / "sentences" / f"part-{i}.txt").write_text("\n\n".join("\n".join(d) for d in part) + "\n")
        (root / "jsonl" / f"part-{i}.jsonl").write_text(
            "".join(json.dumps({"id": n, "text": " ".join(d)}) + "\n" for n, d in enumerate(part)))
        table = pa.table({"id": list(range(len(part))), "text": [" ".join(d) for d in part],
                          "sentences": part})
        pq.write_table(table, root / "parquet" / f"part-{i}.parquet",
                       row_group_size=ROW_GROUP_ROWS if i == 0 else len(part))
    dataset = datasets.Dataset.from_dict({"text": [" ".join(d) for d in documents], "sentences": documents})
    dataset.save_to_disk(str(root / "hf"), num_shards=2)
    datasets.DatasetDict(train=dataset, validation=dataset.select(range(10))).save_to_disk(str(root / "hf_dict"))
    vocabularies.learn_wordpiece_vocab((s for d in documents for s in d), 600, True, str(root / "vocab.txt"))
    return root


def data_config(corpus, **overrides):
    config = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    config.data.update(vocab_path=str(corpus / "vocab.txt"), eval_fraction=0.1, max_seq_length=64,
                       max_predictions_per_seq=10, **overrides)
    return config.data


def read_documents(source, bad_rows=None, **keys):
    """The documents of a source configured by these data keys."""
    return backends.read_documents(DataSettings(source=source, **keys), bad_rows)


def shard_documents(data, shard, num_shards):
    return backends.shard_documents(DataSettings.from_config(data), shard, num_shards)


SOURCES = {  # the data keys of each way of reading the corpus
    "text sentences": dict(source="text", text_format="sentences", input_pattern="sentences/*.txt"),
    "text jsonl": dict(source="text", text_format="jsonl", input_pattern="jsonl/*.jsonl"),
    "parquet text": dict(source="parquet", input_pattern="parquet/*.parquet"),
    "parquet sentences": dict(source="parquet", input_pattern="parquet/*.parquet", sentences_column="sentences"),
    "hf text": dict(source="hf_datasets", hf_dataset_path="hf"),
    "hf sentences": dict(source="hf_datasets", hf_dataset_path="hf", sentences_column="sentences"),
    "hf dict sentences": dict(source="hf_datasets", hf_dataset_path="hf_dict", hf_dataset_split="train",
                              sentences_column="sentences"),
}


def source_config(corpus, name, **overrides):
    keys = dict(SOURCES[name])
    for key in ("input_pattern", "hf_dataset_path"):
        if key in keys:
            keys[key] = str(corpus / keys[key])
    return data_config(corpus, **keys, **overrides)


def read(corpus, name, bad_rows=None):
    return list(backends.read_documents(DataSettings.from_config(source_config(corpus, name)), bad_rows))


def test_tables_give_the_documents_of_the_text_files(corpus, documents):
    """Sentences columns read as sentence-per-line files; text columns as the JSON-lines text field,
    split by the same splitter; the sentence lists are the demo corpus's own."""
    assert read(corpus, "text sentences") == documents
    for name in ("parquet sentences", "hf sentences", "hf dict sentences"):
        assert read(corpus, name) == documents, name
    split_text = read(corpus, "text jsonl")
    assert read(corpus, "parquet text") == split_text
    assert read(corpus, "hf text") == split_text


def test_a_dataset_name_the_datasets_cache_holds(corpus, documents, tmp_path, monkeypatch):
    """data.hf_dataset_name through datasets.load_dataset, offline: a local directory of Parquet files
    becomes a dataset in a fresh cache, read as the same files are read through data.source=parquet."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    name = str(corpus / "parquet")
    got = list(read_documents("hf_datasets", hf_dataset_name=name, sentences_column="sentences"))
    assert got == documents
    assert shard_documents(data_config(corpus, source="hf_datasets", hf_dataset_name=name), 1, 3) == \
        read(corpus, "parquet text")[1::3]


def test_tables_on_an_object_store(corpus, gcs):
    """gs:// globs, Parquet files and a save_to_disk directory (an in-memory GCS emulator, as
    tests/test_workdir.py runs it) read as local ones."""
    from etils import epath

    for path in sorted((corpus / "parquet").glob("*.parquet")):
        epath.Path(f"gs://{BUCKET}/tables/{path.name}").write_bytes(path.read_bytes())
    epath.Path(f"gs://{BUCKET}/tables/notes.txt").write_text("not matched by the glob")
    remote = f"gs://{BUCKET}/tables/part-*.parquet"
    assert tables.table_files(remote) == [f"gs://{BUCKET}/tables/part-{i}.parquet" for i in range(3)]
    got = list(read_documents("parquet", input_pattern=remote, sentences_column="sentences"))
    assert got == read(corpus, "parquet sentences")
    with pytest.raises(FileNotFoundError, match="no files match"):
        tables.table_files(f"gs://{BUCKET}/elsewhere/*.parquet")
    for path in (corpus / "hf").iterdir():
        epath.Path(f"gs://{BUCKET}/hf/{path.name}").write_bytes(path.read_bytes())
    got = list(read_documents("hf_datasets", hf_dataset_path=f"gs://{BUCKET}/hf", sentences_column="sentences"))
    assert got == read(corpus, "hf sentences")


def corpus_arrays(stream):
    c = stream.corpus
    return c.tokens, c.sentence_starts, c.doc_starts


@pytest.mark.parametrize("table, text", [("parquet sentences", "text sentences"), ("hf text", "text jsonl")])
def test_same_corpora_and_batches_as_text_files_on_each_host(corpus, table, text):
    for host in range(2):
        a = inputs.build_inputs(source_config(corpus, table), workdir=None, process_index=host, process_count=2)
        b = inputs.build_inputs(source_config(corpus, text), workdir=None, process_index=host, process_count=2)
        for split in ("train", "eval"):
            for x, y in zip(corpus_arrays(getattr(a, split)), corpus_arrays(getattr(b, split))):
                np.testing.assert_array_equal(x, y)
        assert a.train.corpus.num_documents > 50
    first_a, first_b = next(a.train_batches(8, start_step=3)), next(b.train_batches(8, start_step=3))
    assert first_a.keys() == first_b.keys()
    for key in first_a:
        np.testing.assert_array_equal(first_a[key], first_b[key])


def test_prepare_shards_files_then_row_groups_then_documents(corpus, documents):
    parts = file_parts(documents)
    parquet, text = source_config(corpus, "parquet sentences"), source_config(corpus, "text sentences")
    # At least as many files as shards: file j goes to shard j % n, as text files do.
    for k in range(3):
        assert shard_documents(parquet, k, 3) == parts[k] == shard_documents(text, k, 3)
    assert shard_documents(parquet, 1, 2) == parts[1]
    # Fewer files than shards: row groups, numbered over the files (8 in the first, 1 in each other).
    groups = [parts[0][i:i + ROW_GROUP_ROWS] for i in range(0, FILE_SIZES[0], ROW_GROUP_ROWS)] + parts[1:]
    assert len(groups) == 10
    for k in range(4):
        expected = [d for g in groups[k::4] for d in g]
        assert shard_documents(parquet, k, 4) == expected
    # Fewer row groups than shards (the save_to_disk directory's 2 files): documents i % n.
    hf = source_config(corpus, "hf sentences")
    assert shard_documents(hf, 1, 2) == documents[NUM_DOCUMENTS // 2:]
    assert shard_documents(hf, 2, 5) == documents[2::5]


@pytest.fixture(scope="module")
def bad_table(tmp_path_factory):
    """Binary and list<binary> columns with nulls and bytes that are not UTF-8."""
    path = tmp_path_factory.mktemp("bad") / "bad.parquet"
    text = [b"A first good document. It has two sentences.", None, b"Caf\xe9 is latin-1, not UTF-8.",
            b"The last good one."]
    sentences = [[b"One."], [b"Two.", None], None, [b"  Three   spaced.  ", b"", b"\xff"]]
    pq.write_table(pa.table({"text": pa.array(text, pa.binary()),
                             "sentences": pa.array(sentences, pa.list_(pa.binary()))}), path)
    return path


def test_bad_rows_are_skipped_and_reported_with_file_and_row(bad_table):
    bad_rows = BadRows()
    got = list(read_documents("parquet", input_pattern=str(bad_table), bad_rows=bad_rows))
    assert got == [["A first good document.", "It has two sentences."], ["The last good one."]]
    assert bad_rows.count == 2
    summary = bad_rows.summary()
    assert "\n" not in summary and summary.startswith("skipped 2 bad rows")
    assert f"{bad_table}:1: null text" in summary and f"{bad_table}:2: invalid UTF-8 in the text at byte 3" in summary

    bad_rows = BadRows()
    got = list(read_documents("parquet", input_pattern=str(bad_table), sentences_column="sentences",
                                      bad_rows=bad_rows))
    assert got == [["One."]]
    assert bad_rows.count == 3
    for row, reason in ((1, "null sentence"), (2, "null sentences list"), (3, "invalid UTF-8 in the sentence")):
        assert f"{bad_table}:{row}: {reason}" in bad_rows.summary()


def test_a_corpus_of_bad_rows_and_wrong_settings_are_one_line(corpus, bad_table, tmp_path):
    all_bad = tmp_path / "all-bad.parquet"
    pq.write_table(pa.table({"text": pa.array([None, b"\xfe\xff"], pa.binary()), "n": [1, 2]}), all_bad)

    def error(**keys):
        with pytest.raises((ValueError, FileNotFoundError)) as e:
            list(read_documents(**keys))
        assert "\n" not in str(e.value)
        return str(e.value)

    message = error(source="parquet", input_pattern=str(all_bad))
    assert "yielded no documents" in message and "skipped 2 bad rows" in message and "all-bad.parquet:0" in message
    assert "set data.text_column" in error(source="parquet", input_pattern=str(all_bad), text_column="body")
    assert "int64, not text" in error(source="parquet", input_pattern=str(all_bad), text_column="n")
    assert "not a list of strings" in error(source="parquet", input_pattern=str(bad_table), sentences_column="text")
    (tmp_path / "not.parquet").write_text("plain text\n")
    assert "not a readable Parquet file" in error(source="parquet", input_pattern=str(tmp_path / "not.parquet"))
    assert "no files match" in error(source="parquet", input_pattern=str(tmp_path / "none-*.parquet"))
    assert "set data.hf_dataset_split" in error(source="hf_datasets", hf_dataset_path=str(corpus / "hf_dict"),
                                                hf_dataset_split="test")
    assert "save_to_disk" in error(source="hf_datasets", hf_dataset_path=str(tmp_path))
    assert "needs one of" in error(source="hf_datasets")
    assert "does not read it" in error(source="text", input_pattern=str(all_bad), sentences_column="x")


@pytest.mark.slow  # compiling the training and eval steps is most of it (the second run reuses them)
@pytest.mark.parametrize("name", ("parquet sentences", "hf sentences"))
def test_a_short_training_run_on_a_table(corpus, name, tmp_path):
    from bertjax.runs import pretraining

    config = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    config.model.update(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=600,
                        max_position_embeddings=32)
    config.data = source_config(corpus, name)
    config.data.update(max_seq_length=32, max_predictions_per_seq=5)
    config.train.update(batch_size=8, num_steps=2)
    config.schedule.warmup_steps = 1
    config.logging.update(log_every=1, eval_every=2, eval_batches=1)
    config.checkpoint.every_steps = 2
    pretraining.pretrain(config, str(tmp_path))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "split" not in line] == [1, 2]
    assert all(np.isfinite(line["loss"]) for line in lines)
    assert any(line.get("split") == "eval" for line in lines)
