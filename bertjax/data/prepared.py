"""The prepared-corpus format: tokenized documents in sharded TFRecord files.

    DIR/metadata.json                     tokenizer kind, vocabulary file, lower_case, number of shards
    DIR/<vocabulary file>                 a copy, so the directory is self-contained
    DIR/train-00003-of-00016.tfrecord     one tf.train.Example per document:
    DIR/eval-00003-of-00016.tfrecord        tokens (int64 list), sentence_lengths (int64 list)

Host p of P reads the shards k with k % P == p, so a host reads only what it trains on. The per-sentence
lengths are what the pairing plan needs; nothing else about sentences is kept.
"""

import json
import os

import numpy as np
import tensorflow as tf

from bertjax.data import pretraining as pt

METADATA = "metadata.json"
SPLITS = ("train", "eval")


def shard_path(directory: str, split: str, shard: int, num_shards: int) -> str:
    return os.path.join(directory, f"{split}-{shard:05d}-of-{num_shards:05d}.tfrecord")


def write_shard(path: str, corpus: pt.TokenizedCorpus | None) -> None:
    """One shard file: a record per document of the corpus (none for None). Written beside and renamed,
    so a shard file that exists is complete."""
    tmp = path + ".tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for d in range(corpus.num_documents if corpus is not None else 0):
            s0, s1 = corpus.doc_starts[d], corpus.doc_starts[d + 1]
            t0, t1 = corpus.sentence_starts[s0], corpus.sentence_starts[s1]
            features = {
                "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=corpus.tokens[t0:t1].tolist())),
                "sentence_lengths": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=np.diff(corpus.sentence_starts[s0:s1 + 1]).tolist())
                ),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_metadata(directory: str, *, tokenizer: str, vocab_name: str, lower_case: bool, num_shards: int,
                   eval_fraction: float) -> None:
    meta = dict(tokenizer=tokenizer, vocab=vocab_name, lower_case=lower_case, num_shards=num_shards,
                eval_fraction=eval_fraction)
    with tf.io.gfile.GFile(os.path.join(directory, METADATA), "w") as f:
        json.dump(meta, f, indent=2)


def read_metadata(directory: str) -> dict:
    path = os.path.join(directory, METADATA)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} is missing: is data.prepared_dir a directory written by bertjax.data.prepare?")
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def vocab_file(directory: str, meta: dict) -> str:
    return os.path.join(directory, meta["vocab"])


def load_corpus(directory: str, split: str, process_index: int, process_count: int) -> pt.TokenizedCorpus:
    """This host's shards of one split -> TokenizedCorpus (documents in shard order, then file order)."""
    meta = read_metadata(directory)
    num_shards = meta["num_shards"]
    if num_shards < process_count:
        raise ValueError(
            f"{directory} has {num_shards} shards for {process_count} processes: prepare it again with "
            f"--num_shards a multiple of {process_count}"
        )
    paths = [shard_path(directory, split, k, num_shards) for k in range(process_index, num_shards, process_count)]
    missing = [p for p in paths if not tf.io.gfile.exists(p)]
    if missing:
        raise FileNotFoundError(f"prepared shard {missing[0]} is missing ({len(missing)} of {len(paths)} missing)")
    spec = {
        "tokens": tf.io.RaggedFeature(tf.int64),
        "sentence_lengths": tf.io.RaggedFeature(tf.int64),
    }
    # Batched parsing: one parse op per thousand documents, not one per document.
    records = tf.data.TFRecordDataset(paths).batch(1024).map(lambda x: tf.io.parse_example(x, spec))
    tokens, lengths, doc_sizes = [], [], []
    for batch in records:  # eager RaggedTensors: as_numpy_iterator would make object arrays of them
        tokens.append(batch["tokens"].flat_values.numpy())
        lengths.append(batch["sentence_lengths"].flat_values.numpy())
        doc_sizes.append(batch["sentence_lengths"].row_lengths().numpy())
    if not doc_sizes or sum(len(d) for d in doc_sizes) == 0:
        raise ValueError(f"the {split} shards {paths[0]} ... of host {process_index} hold no documents")
    flat, doc_sizes = np.concatenate(tokens), np.concatenate(doc_sizes)
    sentence_document = np.repeat(np.arange(len(doc_sizes)), doc_sizes)
    # The shards record no vocabulary size: the largest id present decides the token dtype.
    return pt.corpus_from_lengths(flat, np.concatenate(lengths), sentence_document, int(flat.max(initial=0)) + 1)
