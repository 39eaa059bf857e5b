"""Plan rows into model inputs, in TensorFlow ops (eager or inside tf.data): a row's unmasked ids
(a pair, or a FULL-SENTENCES row), one masked example padded to S, one packed row of several.

A packed row (docs/data.md, "Packing"; packing.unpack_row turns a row back into examples):
    input_ids, segment_ids, input_mask    [S] int32    as unpacked; segment_ids 0 for A, 1 for B
    sequence_ids                          [S] int32    k for the row's k-th sequence (1..K), 0 at padding
    position_ids                          [S] int32    position within the token's own sequence
    masked_lm_positions, masked_lm_ids    [P] int32    row positions; the row's predictions <= P
    masked_lm_weights                     [P] float32
    next_sentence_labels                  [K] int32    per sequence slot; 0 in empty slots
    sentence_positions                    [K] int32    row position of each sequence's [CLS]
    sentence_weights                      [K] float32  1 for a sequence, 0 for an empty slot
Unpacked, an example has no sequence_ids, position_ids, sentence_* keys, next_sentence_labels is a
scalar, and P bounds each example's predictions.

Shape legend: S max_seq_length, P max_predictions_per_seq, K max_sequences_per_row, n length of an
unpadded example, D documents.
"""

from bertjax.data import packing
from bertjax.data.masking import MaskingSpec, mask_tokens
from bertjax.data.plans import A_END, A_START, B_END, B_START, LABEL
from bertjax.text import tf_cpu

tf = tf_cpu.import_tensorflow()


def pair_ids(tokens, pair, spec: MaskingSpec):
    """One pair's unmasked tokens: ([CLS] A [SEP] B [SEP] [n] int32, segment ids [n] int32, label)."""
    a = tf.cast(tokens[pair[A_START]:pair[A_END]], tf.int32)
    b = tf.cast(tokens[pair[B_START]:pair[B_END]], tf.int32)
    return segments_ids(a, b, pair[LABEL], spec)


def segments_ids(a, b, label, spec: MaskingSpec):
    """pair_ids of the two segments' tokens a [n_a], b [n_b] int32, as read."""
    ids = tf.concat([[spec.cls_id], a, [spec.sep_id], b, [spec.sep_id]], 0)  # [n]
    segment_ids = tf.concat([tf.zeros([tf.shape(a)[0] + 2], tf.int32), tf.ones([tf.shape(b)[0] + 1], tf.int32)], 0)
    # NSP, the original's convention: 0 = IsNext, 1 = NotNext (B from a random document).
    # SOP: 0 = in the document's order, 1 = swapped.
    return ids, segment_ids, tf.cast(label, tf.int32)


def full_sentences_ids(tokens, separators, row, spec: MaskingSpec):
    """One FULL-SENTENCES row's unmasked tokens: ([CLS] ... [SEP] [n] int32, segment ids [n] (all 0), label 0).

    separators: [D - 1] int64 document_separators(); row: [5] int64 plan row, A_START/A_END a range of
    the stream with separators. The separators are [SEP] ids, so masking never picks them.
    """
    position = tf.range(row[A_START], row[A_END], dtype=tf.int64)  # [n - 2] in the stream
    before = tf.searchsorted(separators, position, side="left", out_type=tf.int64)  # separators before it
    padded = tf.concat([separators, [-1]], 0)  # so that the last document's positions gather a miss
    is_separator = tf.gather(padded, before) == position
    flat = tf.minimum(position - before, tf.shape(tokens, out_type=tf.int64)[0] - 1)  # a separator's: any
    body = tf.where(is_separator, spec.sep_id, tf.cast(tf.gather(tokens, flat), tf.int32))
    ids = tf.concat([[spec.cls_id], body, [spec.sep_id]], 0)  # [n]
    return ids, tf.zeros_like(ids), tf.constant(0, tf.int32)


def padded_example(ids, segment_ids, label, key, spec: MaskingSpec, max_seq_length: int, mask_rate=None,
                   unit_starts=None) -> dict:
    """An unmasked example -> masked (at mask_rate, else spec.mask_rate; unit_starts: [n] bool, the corpus's
    unit marks of its tokens, or None), padded to S and P."""
    n = tf.shape(ids)[0]
    masked, positions, labels, weights = mask_tokens(ids, key, spec, mask_rate, unit_starts)
    pad = [[0, max_seq_length - n]]
    return {
        "input_ids": tf.ensure_shape(tf.pad(masked, pad, constant_values=spec.pad_id), [max_seq_length]),
        "input_mask": tf.ensure_shape(tf.pad(tf.ones([n], tf.int32), pad), [max_seq_length]),
        "segment_ids": tf.ensure_shape(tf.pad(segment_ids, pad), [max_seq_length]),
        "masked_lm_positions": tf.ensure_shape(positions, [spec.max_predictions_per_seq]),
        "masked_lm_ids": tf.ensure_shape(labels, [spec.max_predictions_per_seq]),
        "masked_lm_weights": tf.ensure_shape(weights, [spec.max_predictions_per_seq]),
        "next_sentence_labels": label,
    }


def make_example(tokens, pair, key, spec: MaskingSpec, max_seq_length: int) -> dict:
    """One plan row -> one padded, masked pretraining example (a dict of fixed-shape tensors).

    tokens: the host's flat token array; pair: [5] int64 plan row; key: the example's RNG key.
    """
    return padded_example(*pair_ids(tokens, pair, spec), key, spec, max_seq_length)


def make_packed_row(sequence_fn, key_fn, members, rows, spec: MaskingSpec, max_seq_length: int,
                    mask_rate=None, unit_starts_fn=None) -> dict:
    """Several plan rows -> one packed row of S tokens (the contract in the module docstring).

    sequence_fn: plan row [5] -> (unmasked ids [n], segment ids [n], label), pair_ids or
    full_sentences_ids; key_fn: index in the epoch's plan -> the example's RNG key; unit_starts_fn: plan row
    -> the corpus's unit marks of its tokens [n] bool (units masking), or None; members: [K] int64
    indices in the epoch's plan, ascending, -1 after the last; rows: [K, 5] int64 their plan rows.
    Each sequence is masked exactly as unpacked (its own key and budget, at mask_rate, else
    spec.mask_rate); the row plan guarantees that the tokens fit in S and the predictions in P.
    """
    s, p, k_max = max_seq_length, spec.max_predictions_per_seq, members.shape[0]
    count = tf.reduce_sum(tf.cast(members >= 0, tf.int32))

    def body(k, offset, pieces):
        ids, segment_ids, label = sequence_fn(rows[k])
        unit_starts = unit_starts_fn(rows[k]) if unit_starts_fn else None
        masked, positions, labels, weights = mask_tokens(ids, key_fn(members[k]), spec, mask_rate, unit_starts)
        n = tf.shape(ids)[0]
        c = tf.math.count_nonzero(weights, dtype=tf.int32)  # predictions fill the first c slots
        new = (masked, segment_ids, positions[:c] + offset, labels[:c], n[None], label[None])
        return k + 1, offset + n, tuple(array.write(k, piece) for array, piece in zip(pieces, new))

    # One piece per sequence of each: ids [n], segment ids [n], row positions [c], labels [c], n, label.
    pieces = tuple(tf.TensorArray(tf.int32, size=count, infer_shape=False, element_shape=[None]) for _ in range(6))
    zero = tf.constant(0, tf.int32)
    _, n, pieces = tf.while_loop(lambda k, *_: k < count, body, (zero, zero, pieces))
    ids, segment_ids, positions, labels, lengths, nsp_labels = (array.concat() for array in pieces)
    starts = tf.cumsum(lengths, exclusive=True)  # [count] row position of each [CLS]
    c = tf.shape(positions)[0]
    pad_s, pad_p, pad_k = [[0, s - n]], [[0, p - c]], [[0, k_max - count]]
    row = {
        "input_ids": tf.pad(ids, pad_s, constant_values=spec.pad_id),  # [S]
        "input_mask": tf.pad(tf.ones([n], tf.int32), pad_s),
        "segment_ids": tf.pad(segment_ids, pad_s),
        "sequence_ids": tf.pad(tf.repeat(tf.range(1, count + 1), lengths), pad_s),
        "position_ids": tf.pad(tf.range(n) - tf.repeat(starts, lengths), pad_s),
        "masked_lm_positions": tf.pad(positions, pad_p),  # [P]
        "masked_lm_ids": tf.pad(labels, pad_p),
        "masked_lm_weights": tf.pad(tf.ones([c], tf.float32), pad_p),
        "next_sentence_labels": tf.pad(nsp_labels, pad_k),  # [K]
        "sentence_positions": tf.pad(starts, pad_k),
        "sentence_weights": tf.pad(tf.ones([count], tf.float32), pad_k),
    }
    size = {"masked_lm_positions": p, "masked_lm_ids": p, "masked_lm_weights": p,
            "next_sentence_labels": k_max, "sentence_positions": k_max, "sentence_weights": k_max}
    return {key: tf.ensure_shape(row[key], [size.get(key, s)]) for key in packing.PACKED_KEYS}


def rebased_full_sentences(read, separators: tf.Tensor, spec: MaskingSpec):
    """row -> full_sentences_ids of it, given read(begin, end): the flat tokens [begin, end) as int32.

    Only the row's own tokens and separators are handed over, the row re-based to 0: the same example
    as full_sentences_ids on the whole corpus, without its per-row copy of all D separators.
    """
    def full_sentences(row):
        start, end = row[A_START], row[A_END]
        first, last = tf.unstack(tf.searchsorted(separators, tf.stack([start, end]), side="left", out_type=tf.int64))
        flat_start = start - first  # the stream position less the separators before it
        real = read(flat_start, flat_start + (end - start) - (last - first))  # the row's tokens, no separator
        local = tf.stack([tf.constant(0, tf.int64), end - start, 0, 0, 0])
        return full_sentences_ids(real, separators[first:last] - start, local, spec)

    return full_sentences
