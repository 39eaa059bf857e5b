"""The memory-mapped prepared corpus: the same batches as in memory, a resumable prepare, clear refusals."""

import json
import os
import pathlib
import runpy

import numpy as np
import pytest

from bertjax.data import prepared, preparing
from bertjax.data.corpus import TokenizedCorpus, corpus_from_token_lists
from bertjax.data.masking import MaskingSpec
from bertjax.data.settings import DataSettings
from bertjax.data.stream import PretrainingStream

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 300
SPECIALS = dict(pad_id=0, cls_id=2, sep_id=3, mask_id=4)
WORDS = ("the river city north old museum built century king village church music long bridge water "
         "school road first new large small known several people many early later during because").split()


def random_documents(num_docs, seed, vocab=VOCAB):
    """Documents of 1-9 sentences of 1-20 ids (no special ids), as lists of lists."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(5, vocab, size=rng.integers(1, 21)).tolist() for _ in range(rng.integers(1, 10))]
            for _ in range(num_docs)]


def masking_spec(vocab=VOCAB, predictions=10):
    return MaskingSpec(replacement_ids=np.arange(5, vocab, dtype=np.int32), word_start=np.ones(vocab, bool),
                       max_predictions_per_seq=predictions, **SPECIALS)


def write_prepared(directory, shards_of_documents, vocab=VOCAB, split="train"):
    """Shards of token-id documents written as prepare writes them (the other split empty)."""
    dtype = prepared.token_dtype(vocab)
    n = len(shards_of_documents)
    for k, documents in enumerate(shards_of_documents):
        corpus = corpus_from_token_lists(documents, vocab) if documents else None
        prepared.write_shard(str(directory), split, k, n, corpus, dtype)
        other = "eval" if split == "train" else "train"
        prepared.write_shard(str(directory), other, k, n, None, dtype)
    prepared.write_metadata(str(directory), dict(format_version=prepared.FORMAT_VERSION, tokenizer="wordpiece",
                                                 vocab="vocab.txt", lower_case=True, num_shards=n, eval_fraction=0.0,
                                                 dtype=dtype.name))


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory):
    """60 documents in two prepared shards (the second with an empty one between), and the same in memory."""
    documents = random_documents(60, seed=0)
    directory = tmp_path_factory.mktemp("mapped")
    write_prepared(directory, [documents[:25], [], documents[25:]])
    mapped = prepared.load_corpus(str(directory), "train", 0, 1)
    return mapped, corpus_from_token_lists(documents, VOCAB)


def test_shards_map_to_the_corpus_without_loading_it(two_shards):
    mapped, in_memory = two_shards
    assert not mapped.in_memory and in_memory.in_memory
    assert isinstance(mapped.tokens, prepared.TokenShards)
    assert all(isinstance(p, np.memmap) and p.dtype == np.uint16 for p in mapped.tokens.parts)
    np.testing.assert_array_equal(np.asarray(mapped.tokens), in_memory.tokens)
    np.testing.assert_array_equal(mapped.sentence_starts, in_memory.sentence_starts)
    np.testing.assert_array_equal(mapped.doc_starts, in_memory.doc_starts)
    # Ranges read across the shard boundary as numpy slices them.
    n = len(in_memory.tokens)
    cut = int(mapped.tokens.starts[1])
    for start, stop in [(0, n), (cut - 3, cut + 4), (cut, cut), (cut - 1, cut), (n - 2, n + 5), (5, 2)]:
        np.testing.assert_array_equal(mapped.tokens[start:stop], in_memory.tokens[start:stop])
    assert mapped.tokens[cut] == in_memory.tokens[cut] and mapped.tokens[-1] == in_memory.tokens[-1]
    # One shard of a host: its own maps, nothing joined.
    single = prepared.load_corpus(os.path.dirname(mapped.tokens.parts[0].filename), "train", 0, 3)
    assert isinstance(single.tokens, np.memmap) and isinstance(single.sentence_starts, np.memmap)
    assert single.num_documents == 25


@pytest.mark.parametrize("objective,packing", [("nsp", False), ("sop", False), ("none", False), ("nsp", True)])
def test_mapped_batches_are_the_in_memory_batches(two_shards, objective, packing):
    """Tokens read through the maps, one plan row at a time, give bit for bit the batches of the
    tf.constant path, at a later step too (FULL-SENTENCES rows cross documents and shards)."""
    mapped, in_memory = two_shards
    spec = masking_spec()
    streams = [PretrainingStream(corpus, spec, seed=3, max_seq_length=32, objective=objective, packing=packing,
                                 max_sequences_per_row=4) for corpus in (mapped, in_memory)]
    step = 2 if packing else 7  # 7 * 16 examples: past the first epoch for every objective
    batch = 16
    if objective == "none":  # the whole second epoch: its rows cross every document and the shards
        batch, step = streams[0].rows_per_epoch, 1
    a, b = (next(s.dataset(batch, start_step=step).as_numpy_iterator()) for s in streams)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    if objective == "none":
        # Against the FULL-SENTENCES stream built here in numpy: documents joined by [SEP], each row
        # [CLS] + its range + [SEP]; the masked positions take their labels back.
        sep, cls = SPECIALS["sep_id"], SPECIALS["cls_id"]
        documents = [in_memory.tokens[in_memory.sentence_starts[in_memory.doc_starts[d]]:
                                      in_memory.sentence_starts[in_memory.doc_starts[d + 1]]]
                     for d in range(in_memory.num_documents)]
        flat = np.concatenate([np.append(doc, sep) for doc in documents])[:-1].astype(np.int32)
        original = a["input_ids"].copy()
        for i in range(batch):
            weights = a["masked_lm_weights"][i] > 0
            original[i, a["masked_lm_positions"][i][weights]] = a["masked_lm_ids"][i][weights]
            epoch, index = streams[1].locate(step * batch + i)
            start, end = streams[1].plan(epoch)[index, :2]
            expected = np.concatenate([[cls], flat[start:end], [sep]])
            np.testing.assert_array_equal(original[i, :len(expected)], expected)
        assert ((a["input_ids"] == sep).sum(1) > 1).any()  # rows that cross a document


def test_rows_longer_than_shards_read_across_all_of_them(tmp_path):
    """A document of 20 tokens a shard, rows of 126: a FULL-SENTENCES row spans six shards."""
    rng = np.random.default_rng(4)
    documents = [[rng.integers(5, VOCAB, 10).tolist() for _ in range(2)] for _ in range(24)]
    write_prepared(tmp_path, [[d] for d in documents])
    mapped = prepared.load_corpus(str(tmp_path), "train", 0, 1)
    assert len(mapped.tokens.parts) == 24
    spec = masking_spec(predictions=20)
    a, b = (next(PretrainingStream(corpus, spec, seed=2, max_seq_length=128, objective="none")
              .dataset(4).as_numpy_iterator()) for corpus in (mapped, corpus_from_token_lists(documents, VOCAB)))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_one_uint32_map_gives_the_in_memory_batches(tmp_path):
    """A large vocabulary's ids are stored as uint32; a host of one shard reads its one map."""
    documents = random_documents(12, seed=1, vocab=70_000)
    write_prepared(tmp_path, [documents], vocab=70_000)
    corpus = prepared.load_corpus(str(tmp_path), "train", 0, 1)
    in_memory = corpus_from_token_lists(documents, 70_000)
    assert isinstance(corpus.tokens, np.memmap) and corpus.tokens.dtype == np.uint32
    assert int(np.max(corpus.tokens)) >= 65_536 and prepared.token_dtype(65_536) == np.uint16
    np.testing.assert_array_equal(corpus.tokens, in_memory.tokens)
    spec = masking_spec(vocab=70_000)
    for objective in ("nsp", "none"):
        a, b = (next(PretrainingStream(c, spec, seed=1, max_seq_length=32, objective=objective)
                     .dataset(8, start_step=1).as_numpy_iterator()) for c in (corpus, in_memory))
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_old_tfrecord_directories_and_missing_shards_are_refused(tmp_path):
    (tmp_path / "metadata.json").write_text(json.dumps(dict(tokenizer="wordpiece", vocab="vocab.txt", num_shards=2)))
    (tmp_path / "train-00000-of-00002.tfrecord").write_bytes(b"")
    with pytest.raises(ValueError, match="older format .* run python -m bertjax.prepare again"):
        prepared.load_corpus(str(tmp_path), "train", 0, 1)
    write_prepared(tmp_path, [random_documents(3, seed=2)] * 2)
    os.remove(prepared.array_path(str(tmp_path), "eval", 1, 2, "doc_starts"))
    with pytest.raises(FileNotFoundError, match="1 of 2 shards incomplete"):
        prepared.load_corpus(str(tmp_path), "train", 0, 1)
    with pytest.raises(ValueError, match="must be on a local"):
        prepared.load_corpus("gs://bucket/corpus", "train", 0, 1)


# ----------------------------------------------------------------------------------------------------
# prepare
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    """Three sentence-per-line files and a whole-word vocabulary for them."""
    root = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    for f in range(3):
        lines = []
        for _ in range(40):
            lines += [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) + " ." for _ in range(rng.integers(1, 8))]
            lines.append("")
        (root / f"part-{f}.txt").write_text("\n".join(lines), encoding="utf-8")
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS) + "\n")
    return root


def data_config(root, **overrides):
    data = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]().data
    data.source, data.input_pattern, data.vocab_path = "text", str(root / "part-*.txt"), str(root / "vocab.txt")
    data.eval_fraction = 0.2
    for key, value in overrides.items():
        setattr(data, key, value)
    return DataSettings.from_config(data)


def file_bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(directory).iterdir())}


def test_prepare_resumes_to_the_bytes_of_an_uninterrupted_run(text_corpus, tmp_path, monkeypatch):
    from bertjax.data import inputs

    lines = []
    monkeypatch.setattr(preparing.logging, "info", lambda message, *args: lines.append(message % args))
    whole = preparing.run(data_config(text_corpus), str(tmp_path / "whole"), num_shards=4, num_workers=0,
                        progress_seconds=0.0)
    # Progress: documents, tokens, megabytes, rate and, the files' sizes being known, the time left.
    assert lines and all("documents" in s and "tokens" in s and "MB/s" in s and "ETA" in s for s in lines)
    assert whole["skipped"] == 0 and whole["bytes"] > 0 and sum(whole["train"][:1] + whole["eval"][:1]) == 120

    # A run killed part-way: one shard's files never got renamed in, another has only some of its files,
    # a third a half-written temporary, and metadata.json has no counts yet.
    cut = tmp_path / "cut"
    preparing.run(data_config(text_corpus), str(cut), num_shards=4, num_workers=0)
    for name in os.listdir(cut):
        if name.startswith(("train-00001", "eval-00001")) or name == "eval-00002-of-00004.doc_starts.npy":
            os.remove(cut / name)
    (cut / "train-00003-of-00004.tokens.npy.tmp").write_bytes(b"\x93NUMPY half")
    meta = json.loads((cut / "metadata.json").read_text())
    del meta["counts"]
    prepared.write_metadata(str(cut), meta)
    resumed = preparing.run(data_config(text_corpus), str(cut), num_shards=4, num_workers=0)
    assert resumed["skipped"] == 2 and resumed["train"] == whole["train"] and resumed["eval"] == whole["eval"]
    os.remove(cut / "train-00003-of-00004.tokens.npy.tmp")  # a stray temporary is never read
    assert file_bytes(cut) == file_bytes(tmp_path / "whole")
    counts = json.loads((cut / "metadata.json").read_text())["counts"]
    assert [counts[s]["documents"] for s in ("train", "eval")] == [whole["train"][0], whole["eval"][0]]

    # Each host maps the documents the in-memory path gives it (documents i with i % 2 == host: shards
    # 0 and 2, or 1 and 3), in shard order.
    config = data_config(text_corpus, max_seq_length=64, max_predictions_per_seq=10)
    prepared_config = data_config(text_corpus, source="prepared", prepared_dir=str(cut), input_pattern=None,
                                  vocab_path=None, max_seq_length=64, max_predictions_per_seq=10)
    for host in range(2):
        a = inputs.build_inputs(config, workdir=None, process_index=host, process_count=2)
        b = inputs.build_inputs(prepared_config, workdir=None, process_index=host, process_count=2)
        assert not b.train.corpus.in_memory
        for split in ("train", "eval"):
            assert documents_of(getattr(a, split).corpus) == documents_of(getattr(b, split).corpus)
        assert next(b.train.dataset(8, start_step=3).as_numpy_iterator())["input_ids"].shape == (8, 64)


def documents_of(corpus):
    documents = [tuple(tuple(s.tolist()) for s in corpus.document(d)) for d in range(corpus.num_documents)]
    assert len(set(documents)) == len(documents)  # no repeated document, so a set compares them all
    return set(documents)


def test_prepare_refuses_other_settings_and_empty_corpora(text_corpus, tmp_path):
    out = str(tmp_path / "out")
    preparing.run(data_config(text_corpus), out, num_shards=2, num_workers=0)
    with pytest.raises(ValueError, match=r"num_shards=2 \(now 4\).*use a fresh --output_dir"):
        preparing.run(data_config(text_corpus), out, num_shards=4, num_workers=0)
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text((text_corpus / "vocab.txt").read_text() + "extra\n")
    with pytest.raises(ValueError, match="the vocabulary vocab.txt.*use a fresh --output_dir"):
        preparing.run(data_config(text_corpus, vocab_path=str(other_vocab)), out, num_shards=2, num_workers=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no document"):
        preparing.run(data_config(text_corpus, input_pattern=str(empty / "*.txt")), str(tmp_path / "e"), num_shards=2,
                    num_workers=0)


def test_prepare_counts_bad_rows_by_file_and_row(text_corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # A file per shard: each shard reads only its own file's rows.
    pq.write_table(pa.table({"text": ["the river city . the old museum ."] * 5 + [None]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["the king village .", None, "a bridge ."]}), tmp_path / "b.parquet")
    summary = preparing.run(data_config(text_corpus, source="parquet", input_pattern=str(tmp_path / "*.parquet")),
                          str(tmp_path / "out"), num_shards=2, num_workers=0)
    assert summary["bad_rows"].count == 2
    assert "a.parquet:5" in summary["bad_rows"].summary() and "b.parquet:1" in summary["bad_rows"].summary()
    assert summary["train"][0] + summary["eval"][0] == 7


def resident_anonymous_mb():
    """This process's resident memory that is not a file's pages (a copy of the tokens would be)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def test_a_mapped_corpus_is_not_copied_into_memory(two_shards, tmp_path):
    """200 MB of tokens: building the stream and drawing a batch leaves them in the file's pages (a
    tensor captured by the tf.data function would be serialized with its graph: a copy of them all)."""
    num_tokens, doc_tokens = 100_000_000, 1_000_000  # documents of one long sentence
    corpus = TokenizedCorpus(np.random.default_rng(0).integers(5, VOCAB, num_tokens, dtype=np.uint16),
                             np.arange(0, num_tokens + 1, doc_tokens, dtype=np.int64),
                             np.arange(0, num_tokens // doc_tokens + 1, dtype=np.int64))
    for split in prepared.SPLITS:
        prepared.write_shard(str(tmp_path), split, 0, 1, corpus, np.dtype(np.uint16))
    prepared.write_metadata(str(tmp_path), dict(format_version=prepared.FORMAT_VERSION, num_shards=1,
                                                dtype="uint16", vocab="vocab.txt"))
    del corpus
    spec = masking_spec(predictions=80)
    # A first pipeline of the kind: TensorFlow's own allocations. (Pairs read the map the same way.)
    next(PretrainingStream(two_shards[1], spec, seed=0, max_seq_length=512, objective="none")
         .dataset(4).as_numpy_iterator())
    # The plan first (200k rows at seq 512), then the pipeline and a batch.
    stream = PretrainingStream(prepared.load_corpus(str(tmp_path), "train", 0, 1), spec, seed=0,
                               max_seq_length=512, objective="none")
    before = resident_anonymous_mb()
    batch = next(stream.dataset(4).as_numpy_iterator())
    assert batch["input_mask"].sum() == 4 * 512
    assert resident_anonymous_mb() - before < 100
