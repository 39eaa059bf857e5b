"""Reading a memory-mapped corpus's tokens in TensorFlow without copying them: a tensor over the map's
pages (DLPack), held by a variable, so that a tf.data function captures it by reference. One map, or
several shards' maps read shard by shard (prepared.TokenShards). The rows go through the in-memory
path's ops (bertjax/data/instances.py), so they are the same examples (docs/data.md, "Preparing").
"""

import os

import numpy as np

from bertjax.data.instances import pair_ids, rebased_full_sentences, segments_ids
from bertjax.data.masking import MaskingSpec
from bertjax.data.plans import A_END, A_START, B_END, B_START, LABEL
from bertjax.text import tf_cpu

tf = tf_cpu.import_tensorflow()


def _map_variable(value: tf.Tensor) -> tf.Variable:
    """A variable holding `value` without a copy of it: what a tf.data function captures by reference.
    A tensor it captured itself would be serialized into the pipeline's graph (a copy of every page)."""
    return tf.Variable(value, trainable=False, name="mapped_tokens")


def _map_tensor(array: np.memmap) -> tf.Tensor:
    """A tensor over a memory-mapped array's pages, not a copy of them (DLPack). DLPack exports only
    writable arrays, so the file is mapped again copy-on-write; nothing writes to it."""
    size = (os.path.getsize(array.filename) - array.offset) // array.itemsize
    if array.ndim != 1 or len(array) != size:
        raise ValueError(f"{array.filename}: a whole one-dimensional .npy map is needed, not a part of one")
    writable = np.memmap(array.filename, dtype=array.dtype, mode="c", offset=array.offset, shape=array.shape)
    if writable.ctypes.data % 64:  # TensorFlow's kernels assume 64-byte aligned buffers (np.save aligns)
        raise ValueError(f"{array.filename}: its data does not start at a multiple of 64 bytes: prepare it again")
    return tf.experimental.dlpack.from_dlpack(writable.__dlpack__())


def map_sequence_fn(tokens: np.memmap, pairs: bool, separators: tf.Tensor, spec: MaskingSpec):
    """plan row -> (unmasked ids, segment ids, label) over one token map: the in-memory path's ops on a
    tensor of the map's pages, read from a variable each row (value() aliases, never copies; a gather
    straight on the variable would switch it to copying). pairs: the objective's rows are pairs."""
    variable = _map_variable(_map_tensor(tokens))

    def read(begin, end):
        return tf.cast(variable.value()[begin:end], tf.int32)

    def pair(row):
        return pair_ids(variable.value(), row, spec)

    return pair if pairs else rebased_full_sentences(read, separators, spec)


def shards_sequence_fn(parts: list[np.memmap], pairs: bool, separators: tf.Tensor, spec: MaskingSpec,
                        max_row_tokens: int):
    """map_sequence_fn over several shards' token maps (prepared.TokenShards): a TensorList of a tensor
    per map, held by a variable; a range is read from the shard(s) it lies in, and what was read goes
    through segments_ids (pair_ids' own ops) or full_sentences_ids, so the examples are the in-memory
    path's. max_row_tokens: the most tokens a row reads."""
    dtype = tf.as_dtype(parts[0].dtype)
    shards = tf.raw_ops.EmptyTensorList(element_shape=tf.constant([-1], tf.int32), max_num_elements=-1,
                                        element_dtype=dtype)
    for part in parts:
        shards = tf.raw_ops.TensorListPushBack(input_handle=shards, tensor=_map_tensor(part))
    variable = _map_variable(shards)
    starts = tf.constant(np.cumsum([0] + [len(p) for p in parts]), tf.int64)  # [K + 1]
    last_shard = len(parts) - 1

    def shard_of(position):
        k = tf.searchsorted(starts, position[None], side="right")[0] - 1
        return tf.minimum(k, last_shard)  # the end of the last shard: an empty read from it

    def part_of(k):  # shard k's tokens
        return tf.raw_ops.TensorListGetItem(input_handle=variable.value(), index=tf.cast(k, tf.int32),
                                            element_shape=tf.constant([-1], tf.int32), element_dtype=dtype)

    def piece(k, begin, end):  # the part of [begin, end) in shard k
        return tf.cast(part_of(k)[tf.maximum(begin, starts[k]) - starts[k]:tf.minimum(end, starts[k + 1]) - starts[k]],
                       tf.int32)

    def within(k, begin, end):  # [begin, end) inside shard k -> int32 [end - begin]: no clipping
        local = begin - starts[k]
        return tf.cast(part_of(k)[local:local + (end - begin)], tf.int32)

    def read_one(begin, end):  # [begin, end) inside one shard
        return within(shard_of(begin), begin, end)

    def read_two(begin, end):  # [begin, end) within two neighbouring shards -> int32 [end - begin]
        k = shard_of(begin)

        def across():  # a row over a boundary: this shard's end and the next shard's start
            return tf.concat([piece(k, begin, end), piece(k + 1, starts[k + 1], end)], 0)

        return tf.cond(end <= starts[k + 1], lambda: within(k, begin, end), across)  # most rows: one read

    def read_any(begin, end):  # [begin, end) across any number of shards -> int32 [end - begin]
        def body(k, out):
            return k + 1, tf.concat([out, piece(k, begin, end)], 0)

        _, out = tf.while_loop(lambda k, out: (k <= last_shard) & (starts[k] < end), body,
                               (shard_of(begin), tf.zeros([0], tf.int32)),
                               shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])))
        return out

    # A row spans at most two shards unless a shard is shorter than a row: no loop then.
    read = read_two if min(len(p) for p in parts) >= max_row_tokens else read_any

    def pair(row):
        # A segment lies in one document, so in one shard: one read each, no loop.
        return segments_ids(read_one(row[A_START], row[A_END]), read_one(row[B_START], row[B_END]), row[LABEL], spec)

    return pair if pairs else rebased_full_sentences(read, separators, spec)
