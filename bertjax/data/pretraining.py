"""Pretraining examples: NSP pairs, SOP pairs or FULL-SENTENCES rows built online, dynamic 80/10/10
masking, an exactly resumable stream.

Objectives (docs/data.md): "nsp" (BERT) pairs a segment with its continuation or a random document's
text; "sop" (ALBERT) pairs two consecutive segments of one document, half of them swapped; "none"
(RoBERTa FULL-SENTENCES, ModernBERT) cuts the corpus, an extra [SEP] between documents, into full rows.

How the stream is laid out, and why it resumes exactly without saving tf.data state:

  * A host holds its shard of the corpus as one flat token array (a `TokenizedCorpus`): sentences are
    contiguous token ranges, documents contiguous sentence ranges.
  * Each epoch has a *plan*: the NSP pairs of create_instances_from_document (Devlin et al.), drawn
    from a generator seeded by (seed, epoch, host), shuffled. A pair is five integers, because every
    segment of a pair -- A, the real continuation B, a random B, each after truncation -- is one
    contiguous range of the flat token array. The plan is light metadata; no token is copied. SOP
    plans are the same rows (A's range first as the model sees it); a FULL-SENTENCES row is one range
    of the flat array with a separator counted after each document.
  * Every epoch has the same length E (the length of epoch 0's plan; later epochs, whose pair counts
    differ by a few percent, are cut or wrapped to E), so example j of the host's stream is
    example j % E of epoch j // E. Resuming at step N builds one plan and skips within it: the cost
    does not grow with N.
  * Masks are drawn in TensorFlow from a stateless RNG keyed by (seed, epoch, index in epoch), so the
    same example gets the same mask in every run and a new one every epoch.
  * Packing (data.packing) adds a *row plan* per epoch: which examples of the epoch's plan share a row,
    found in numpy by best-fit decreasing over windows of consecutive plan rows (packing.py). Every
    epoch has the rows of epoch 0 (cut or wrapped); an example keeps its own key, so its tokens and mask
    are the unpacked stream's, shifted by its offset in the row.

A packed batch (docs/data.md, "Packing"; packing.unpack_row turns a row back into examples):
    input_ids, segment_ids, input_mask    [B, S] int32    as unpacked; segment_ids 0 for A, 1 for B
    sequence_ids                          [B, S] int32    k for the row's k-th sequence (1..K), 0 at padding
    position_ids                          [B, S] int32    position within the token's own sequence
    masked_lm_positions, masked_lm_ids    [B, P] int32    row positions; the row's predictions <= P
    masked_lm_weights                     [B, P] float32
    next_sentence_labels                  [B, K] int32    per sequence slot; 0 in empty slots
    sentence_positions                    [B, K] int32    row position of each sequence's [CLS]
    sentence_weights                      [B, K] float32  1 for a sequence, 0 for an empty slot
Unpacked, a batch has no sequence_ids, position_ids, sentence_* keys, next_sentence_labels is [B], and
P bounds each example's predictions.

Shape legend: B batch, S max_seq_length, P max_predictions_per_seq, K max_sequences_per_row,
n length of an unpadded example, R rows of an epoch.
"""

import dataclasses
import os
import random
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

# `packer`, not `packing`: data.packing is a parameter of the stream.
from bertjax.data import packing as packer

# Columns of a plan row. The label column is NSP's is-random-next, SOP's is-swapped, 0 for "none".
A_START, A_END, B_START, B_END, IS_RANDOM_NEXT = range(5)
LABEL = IS_RANDOM_NEXT
OBJECTIVES = ("nsp", "sop", "none")
# Stream keys for tf.random.experimental.stateless_fold_in: one independent stream per purpose.
_GROUP_ORDER, _MASK_CHOICE, _RANDOM_TOKEN = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """A host's documents, tokenized, in three flat arrays.

    tokens:          [num_tokens] token ids of all sentences, back to back
    sentence_starts: [num_sentences + 1] offset of each sentence in tokens (last = num_tokens)
    doc_starts:      [num_documents + 1] offset of each document in sentences (last = num_sentences)

    The arrays are in memory, or memory-mapped from a prepared corpus (prepared.load_corpus): then
    tokens is an np.memmap, or a prepared.TokenShards over several shards' maps; either is read only
    by len() and [start:stop].
    """

    tokens: np.ndarray
    sentence_starts: np.ndarray
    doc_starts: np.ndarray

    @property
    def in_memory(self) -> bool:
        """The tokens are an array in RAM (not a map of files): the stream may copy them into TensorFlow."""
        return isinstance(self.tokens, np.ndarray) and not isinstance(self.tokens, np.memmap)

    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_starts) - 1

    def document(self, d: int) -> list[np.ndarray]:
        """The sentences of document d, as token arrays (for tests and previews)."""
        s0, s1 = self.doc_starts[d], self.doc_starts[d + 1]
        return [self.tokens[self.sentence_starts[s]:self.sentence_starts[s + 1]] for s in range(s0, s1)]


def corpus_from_lengths(tokens: np.ndarray, sentence_lengths: np.ndarray, sentence_document: np.ndarray,
                        vocab_size: int) -> TokenizedCorpus:
    """All tokens in order, each sentence's length and each sentence's document index -> TokenizedCorpus.

    Sentences without tokens and documents without sentences are dropped: they can take part in no pair.
    """
    kept = sentence_lengths > 0
    doc_sizes = np.bincount(sentence_document[kept], minlength=1)
    doc_sizes = doc_sizes[doc_sizes > 0]
    if not len(doc_sizes):
        raise ValueError("the corpus has no document with a non-empty sentence after tokenization")
    # uint16 halves the host memory of a corpus whenever the vocabulary fits (BERT's 30,522 does).
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    sentence_starts = np.concatenate([[0], np.cumsum(sentence_lengths[kept])]).astype(np.int64)
    doc_starts = np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64)
    return TokenizedCorpus(tokens.astype(dtype), sentence_starts, doc_starts)


def _document_index(documents: Sequence[Sequence]) -> np.ndarray:
    """For each sentence, in order, the index of its document."""
    return np.repeat(np.arange(len(documents)), [len(doc) for doc in documents])


def corpus_from_token_lists(documents: Iterable[Sequence[Sequence[int]]], vocab_size: int) -> TokenizedCorpus:
    """Documents given as lists of sentences of token ids -> TokenizedCorpus (see corpus_from_lengths)."""
    documents = list(documents)
    sentences = [np.asarray(s, np.int64) for doc in documents for s in doc]
    tokens = np.concatenate(sentences) if sentences else np.zeros(0, np.int64)
    lengths = np.array([len(s) for s in sentences], np.int64)
    return corpus_from_lengths(tokens, lengths, _document_index(documents), vocab_size)


def tokenize_documents(documents: Iterable[list[str]], tokenizer, batch_sentences: int = 4096) -> TokenizedCorpus:
    """Documents of sentence strings -> TokenizedCorpus, tokenizing many sentences per TF call and
    keeping the tokenizer's flat output (no per-sentence arrays)."""
    documents = list(documents)
    sentences = [s for doc in documents for s in doc]
    values, lengths = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i in range(0, len(sentences), batch_sentences):
        ragged = tokenizer.tokenize(tf.constant(sentences[i:i + batch_sentences]))
        values.append(ragged.flat_values.numpy())
        lengths.append(np.diff(ragged.row_splits.numpy()))
    return corpus_from_lengths(np.concatenate(values), np.concatenate(lengths), _document_index(documents),
                               tokenizer.vocab_size)


# ----------------------------------------------------------------------------------------------------
# Pairs (create_instances_from_document, planned as token ranges)
# ----------------------------------------------------------------------------------------------------


def _truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """truncate_seq_pair on [start, end) ranges: trim the longer segment, from the front or the back
    with probability 1/2 each, until the pair fits. Trimming the front too keeps the model from
    learning that a segment always ends a sentence."""
    while (a[1] - a[0]) + (b[1] - b[0]) > max_num_tokens:
        seg = a if (a[1] - a[0]) > (b[1] - b[0]) else b
        if rng.random() < 0.5:
            seg[0] += 1
        else:
            seg[1] -= 1


def build_epoch_plan(corpus: TokenizedCorpus, *, seed: int, epoch: int, shard: int, max_seq_length: int,
                     short_seq_prob: float) -> np.ndarray:
    """All NSP pairs of one epoch of this host's shard, shuffled: int64 [num_pairs, 5] token ranges.

    The algorithm is create_instances_from_document of the original release, document by document:
    whole sentences fill a chunk up to a target length (max_seq_length - 3, or with probability
    short_seq_prob a random shorter one, so that the model also sees the short inputs of fine-tuning);
    A is a random prefix of the chunk; B is the rest of the chunk, or -- for half of the pairs, and
    always when the chunk is a single sentence -- text from a random other document of the whole shard,
    in which case the chunk's unused sentences go back to be used by the next pair.
    """
    max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    # random.Random seeded by a string is stable across platforms and Python versions.
    rng = random.Random(f"bertjax-pairs:{seed}:{epoch}:{shard}")
    starts = corpus.sentence_starts.tolist()
    doc_starts = corpus.doc_starts.tolist()
    num_docs = len(doc_starts) - 1
    plan: list[tuple[int, int, int, int, int]] = []
    for d in range(num_docs):
        first, last = doc_starts[d], doc_starts[d + 1]  # sentence range of the document
        target = max_num_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_num_tokens)
        chunk_start, i = first, first
        while i < last:
            chunk_end = i + 1  # the chunk is sentences [chunk_start, chunk_end)
            if chunk_end < last and starts[chunk_end] - starts[chunk_start] < target:
                i += 1
                continue
            num_chunk = chunk_end - chunk_start
            a_end = chunk_start + (rng.randint(1, num_chunk - 1) if num_chunk >= 2 else 1)
            a = [starts[chunk_start], starts[a_end]]
            if num_chunk == 1 or rng.random() < 0.5:
                is_random = 1
                target_b = target - (a[1] - a[0])
                for _ in range(10):  # a different document, if the shard has one
                    other = rng.randint(0, num_docs - 1)
                    if other != d:
                        break
                o_first, o_last = doc_starts[other], doc_starts[other + 1]
                j = rng.randint(o_first, o_last - 1)
                b_first = j
                while True:  # whole sentences until B reaches its target
                    j += 1
                    if starts[j] - starts[b_first] >= target_b or j == o_last:
                        break
                b = [starts[b_first], starts[j]]
                i = a_end  # the chunk's unused sentences are put back
            else:
                is_random = 0
                b = [starts[a_end], starts[chunk_end]]
                i = chunk_end
            _truncate_pair(a, b, max_num_tokens, rng)
            plan.append((a[0], a[1], b[0], b[1], is_random))
            chunk_start = i
    rng.shuffle(plan)
    return np.asarray(plan, dtype=np.int64).reshape(-1, 5)


def build_sop_plan(corpus: TokenizedCorpus, *, seed: int, epoch: int, shard: int, max_seq_length: int,
                   short_seq_prob: float) -> np.ndarray:
    """All sentence-order pairs of one epoch (ALBERT, Lan et al. 2020), shuffled: int64 [num_pairs, 5].

    Chunks, targets, A's split point and truncation are NSP's real-continuation case; B is always the
    rest of the chunk, never another document's text, so that the only signal is the order (a topic
    shift would give NSP's shortcut back). With probability 1/2 the two are swapped: the row then lists
    the later segment first and its label is 1. A chunk of one sentence gives no pair (ALBERT would take
    a random document there); the next chunk starts after it.
    """
    max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    rng = random.Random(f"bertjax-sop:{seed}:{epoch}:{shard}")
    starts = corpus.sentence_starts.tolist()
    doc_starts = corpus.doc_starts.tolist()
    plan: list[tuple[int, int, int, int, int]] = []
    for d in range(len(doc_starts) - 1):
        first, last = doc_starts[d], doc_starts[d + 1]
        target = max_num_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_num_tokens)
        chunk_start = first
        for chunk_end in range(first + 1, last + 1):  # the chunk is sentences [chunk_start, chunk_end)
            if chunk_end < last and starts[chunk_end] - starts[chunk_start] < target:
                continue
            num_chunk = chunk_end - chunk_start
            if num_chunk >= 2:
                a_end = chunk_start + rng.randint(1, num_chunk - 1)
                a, b = [starts[chunk_start], starts[a_end]], [starts[a_end], starts[chunk_end]]
                swapped = rng.random() < 0.5
                if swapped:  # as ALBERT's code: swap, then truncate the pair as the model sees it
                    a, b = b, a
                _truncate_pair(a, b, max_num_tokens, rng)
                plan.append((a[0], a[1], b[0], b[1], int(swapped)))
            chunk_start = chunk_end
    rng.shuffle(plan)
    return np.asarray(plan, dtype=np.int64).reshape(-1, 5)


def document_separators(corpus: TokenizedCorpus) -> np.ndarray:
    """Where the [SEP] between documents stand in the FULL-SENTENCES stream: the flat tokens with one
    separator after every document but the last. int64 [num_documents - 1], ascending."""
    doc_token_ends = corpus.sentence_starts[corpus.doc_starts[1:-1]]
    return doc_token_ends + np.arange(len(doc_token_ends), dtype=np.int64)


def build_full_sentences_plan(corpus: TokenizedCorpus, *, seed: int, epoch: int, shard: int,
                              max_seq_length: int) -> np.ndarray:
    """The FULL-SENTENCES rows of one epoch (RoBERTa, Liu et al. 2019), shuffled: int64 [num_rows, 5].

    The corpus, an extra separator between documents, is cut into consecutive blocks of
    max_seq_length - 2 tokens ([CLS] ... [SEP]): every row is full but the corpus's last, and rows cross
    document boundaries instead of padding. A row is [start, end) in that stream (A_START, A_END); the
    other columns are 0. Cut points are the same every epoch; the order and the masks are not.
    """
    budget = max_seq_length - 2
    total = len(corpus.tokens) + corpus.num_documents - 1
    plan = np.zeros([-(-total // budget), 5], np.int64)
    plan[:, A_START] = np.arange(0, total, budget)
    plan[:, A_END] = np.minimum(plan[:, A_START] + budget, total)
    order = list(range(len(plan)))
    random.Random(f"bertjax-full-sentences:{seed}:{epoch}:{shard}").shuffle(order)
    return plan[order]


# ----------------------------------------------------------------------------------------------------
# Examples and masking, in TensorFlow ops (eager or inside tf.data)
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """What masking needs to know about the vocabulary and the recipe."""

    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    replacement_ids: np.ndarray  # ids a "random token" is drawn from: the vocabulary without specials
    word_start: np.ndarray  # bool [vocab_size]: the token begins a word (whole-word masking)
    max_predictions_per_seq: int
    mask_rate: float = 0.15  # share of an example's tokens to predict (BERT 0.15, ModernBERT 0.30)
    whole_word_masking: bool = False
    # Of the predicted positions: this share becomes [MASK], this one a random token, the rest stay.
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1

    def __post_init__(self):
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"data.mask_rate={self.mask_rate} must lie in (0, 1) (BERT 0.15, ModernBERT 0.3)")
        m, r = self.mask_token_fraction, self.random_token_fraction
        if min(m, r) < 0.0 or m + r > 1.0:
            raise ValueError(f"data.mask_token_fraction={m} and data.random_token_fraction={r} must be >= 0 "
                             f"and add up to at most 1 (BERT: 0.8 and 0.1)")

    @classmethod
    def from_tokenizer(cls, tokenizer, **recipe) -> "MaskingSpec":
        return cls(
            cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, pad_id=tokenizer.pad_id, mask_id=tokenizer.mask_id,
            replacement_ids=np.asarray(tokenizer.replacement_ids, np.int32),
            word_start=np.asarray(tokenizer.word_start, bool), **recipe,
        )


def example_key(seed: int, epoch, index):
    """The stateless RNG key of one example: a pure function of (seed, epoch, index in epoch)."""
    key = tf.constant([seed, 0x5EED], tf.int64)
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64))


def _greedy_fill(sizes, budget):
    """Which groups the original takes, visiting them in order: a group is taken when it still fits in
    the budget, else skipped for good. sizes: [G] int32 in visiting order -> [G] bool.

    Done in passes over the whole vector instead of one group at a time: each pass takes the longest
    prefix that fits, then drops every group larger than what is left (the first one that did not fit
    among them); what remains is visited by the next pass exactly as the sequential loop would.
    """
    def body(taken, alive, total):
        s = tf.where(alive, sizes, 0)
        fits = alive & (total + tf.cumsum(s) <= budget)
        total += tf.reduce_sum(tf.where(fits, s, 0))
        taken |= fits
        alive &= ~fits & (sizes <= budget - total)
        return taken, alive, total

    taken = tf.zeros_like(sizes, tf.bool)
    alive = sizes > 0
    taken, _, _ = tf.while_loop(
        lambda taken, alive, total: (total < budget) & tf.reduce_any(alive),
        body, (taken, alive, tf.constant(0, sizes.dtype)),
    )
    return taken


def mask_tokens(ids, key, spec: MaskingSpec):
    """BERT's masked-LM corruption of one unpadded example.

    ids: [n] int32 ([CLS] A [SEP] B [SEP]); key: stateless RNG key.
    Returns (masked ids [n], masked_lm_positions [P], masked_lm_ids [P], masked_lm_weights [P]).

    num_to_predict = min(P, max(1, round(n * mask_rate))) positions, never [CLS]/[SEP], are
    chosen at random (whole words together under whole-word masking, skipping a word that would
    overshoot, as the original does). Of those, 80% become [MASK], 10% a random token, 10% stay
    (spec.mask_token_fraction and spec.random_token_fraction):
    the model cannot rely on [MASK] marking every position it is asked about, so it must keep a
    useful representation of every token -- and [MASK] never appears at fine-tuning time.
    """
    ids = tf.cast(ids, tf.int32)
    n = tf.shape(ids)[0]
    max_predictions = spec.max_predictions_per_seq
    candidate = (ids != spec.cls_id) & (ids != spec.sep_id) & (ids != spec.pad_id)
    # tf.round rounds half to even, like Python's round() in the original.
    num_to_predict = tf.cast(tf.round(tf.cast(n, tf.float32) * spec.mask_rate), tf.int32)
    num_to_predict = tf.minimum(max_predictions, tf.maximum(1, num_to_predict))
    chosen = _chosen_positions(ids, candidate, num_to_predict, key, spec)
    masked = tf.where(chosen, _replacements(ids, key, spec), ids)

    positions = tf.cast(tf.where(chosen)[:, 0], tf.int32)  # ascending, as the original sorts them
    labels = tf.gather(ids, positions)
    count = tf.shape(positions)[0]
    pad = [[0, max_predictions - count]]
    return (
        masked,
        tf.pad(positions, pad),
        tf.pad(labels, pad),
        tf.pad(tf.ones([count], tf.float32), pad),
    )


def _chosen_positions(ids, candidate, num_to_predict, key, spec: MaskingSpec):
    """[n] bool: the positions to predict, whole groups at a time, visited in a random order."""
    # Groups of positions chosen together: single tokens, or whole words. A group starts at a candidate
    # that begins a word or follows a non-candidate ([CLS], [SEP]): a "##" piece right after [SEP]
    # (B cut mid-word) starts its own group instead of joining the last word of A.
    if spec.whole_word_masking:
        begins_word = tf.gather(tf.constant(spec.word_start), ids)
        after_candidate = tf.concat([[False], candidate[:-1]], 0)
        starts = candidate & (begins_word | ~after_candidate)
    else:
        starts = candidate
    group = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # [n], group index at candidates
    num_groups = tf.reduce_sum(tf.cast(starts, tf.int32))
    sizes = tf.math.unsorted_segment_sum(
        tf.cast(candidate, tf.int32), tf.where(candidate, group, num_groups), num_groups + 1
    )[:num_groups]
    # A random visiting order of the groups (the original shuffles its candidate list).
    scores = tf.random.stateless_uniform([num_groups], tf.random.experimental.stateless_fold_in(key, _GROUP_ORDER))
    order = tf.argsort(scores)
    taken_in_order = _greedy_fill(tf.gather(sizes, order), num_to_predict)
    taken = tf.scatter_nd(order[:, None], taken_in_order, [num_groups])
    return candidate & tf.gather(tf.concat([taken, [False]], 0), tf.where(candidate, group, num_groups))


def _replacements(ids, key, spec: MaskingSpec):
    """[n] int32: what each position becomes if chosen: [MASK], itself, or a random token."""
    n = tf.shape(ids)[0]
    u = tf.random.stateless_uniform([n], tf.random.experimental.stateless_fold_in(key, _MASK_CHOICE))
    random_index = tf.random.stateless_uniform(
        [n], tf.random.experimental.stateless_fold_in(key, _RANDOM_TOKEN),
        minval=0, maxval=len(spec.replacement_ids), dtype=tf.int32,
    )
    random_tokens = tf.gather(tf.constant(spec.replacement_ids, tf.int32), random_index)
    # u < mask share: [MASK]; then unchanged up to 1 - random share; the top random share: a random token.
    keep_below = 1.0 - spec.random_token_fraction
    return tf.where(u < spec.mask_token_fraction, spec.mask_id, tf.where(u < keep_below, ids, random_tokens))


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


def _padded_example(ids, segment_ids, label, key, spec: MaskingSpec, max_seq_length: int) -> dict:
    """An unmasked example -> masked, padded to S and P."""
    n = tf.shape(ids)[0]
    masked, positions, labels, weights = mask_tokens(ids, key, spec)
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
    return _padded_example(*pair_ids(tokens, pair, spec), key, spec, max_seq_length)


def make_packed_row(sequence_fn, key_fn, members, rows, spec: MaskingSpec, max_seq_length: int) -> dict:
    """Several plan rows -> one packed row of S tokens (the contract in the module docstring).

    sequence_fn: plan row [5] -> (unmasked ids [n], segment ids [n], label), pair_ids or
    full_sentences_ids; key_fn: index in the epoch's plan -> the example's RNG key; members: [K] int64
    indices in the epoch's plan, ascending, -1 after the last; rows: [K, 5] int64 their plan rows.
    Each sequence is masked exactly as unpacked (its own key and budget); the row plan guarantees that
    the tokens fit in S and the predictions in P.
    """
    s, p, k_max = max_seq_length, spec.max_predictions_per_seq, members.shape[0]
    count = tf.reduce_sum(tf.cast(members >= 0, tf.int32))

    def body(k, offset, pieces):
        ids, segment_ids, label = sequence_fn(rows[k])
        masked, positions, labels, weights = mask_tokens(ids, key_fn(members[k]), spec)
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
    return {key: tf.ensure_shape(row[key], [size.get(key, s)]) for key in packer.PACKED_KEYS}


# ----------------------------------------------------------------------------------------------------
# Packing: the plan's example lengths (the packer itself is bertjax/data/packing.py, without TF)
# ----------------------------------------------------------------------------------------------------


def example_lengths(plan: np.ndarray, objective: str) -> np.ndarray:
    """Each plan row's length in tokens, special tokens included: int64 [N]."""
    if objective == "none":
        return plan[:, A_END] - plan[:, A_START] + 2  # [CLS] ... [SEP]
    return plan[:, A_END] - plan[:, A_START] + plan[:, B_END] - plan[:, B_START] + 3  # [CLS] A [SEP] B [SEP]


# ----------------------------------------------------------------------------------------------------
# The stream
# ----------------------------------------------------------------------------------------------------


def _rebased_full_sentences(read, separators: tf.Tensor, spec: "MaskingSpec"):
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


def _map_sequence_fn(tokens: np.memmap, objective: str, separators: tf.Tensor, spec: "MaskingSpec"):
    """_sequence_fn over one token map: the in-memory path's ops on a tensor of the map's pages, read
    from a variable each row (value() aliases, never copies; a gather straight on the variable would
    switch it to copying)."""
    variable = _map_variable(_map_tensor(tokens))

    def read(begin, end):
        return tf.cast(variable.value()[begin:end], tf.int32)

    def pair(row):
        return pair_ids(variable.value(), row, spec)

    return _rebased_full_sentences(read, separators, spec) if objective == "none" else pair


def _shards_sequence_fn(parts: list[np.memmap], objective: str, separators: tf.Tensor, spec: "MaskingSpec",
                        max_row_tokens: int):
    """_sequence_fn over several shards' token maps (prepared.TokenShards): a TensorList of a tensor per
    map, held by a variable; a range is read from the shard(s) it lies in, and what was read goes through
    segments_ids (pair_ids' own ops) or full_sentences_ids, so the examples are the in-memory path's."""
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

    return _rebased_full_sentences(read, separators, spec) if objective == "none" else pair


def batched(elements: tf.data.Dataset, batch_size: int, threads: int | None = None) -> tf.data.Dataset:
    """A stream's elements in deterministic batches, prefetched; threads caps tf.data's worker threads."""
    ds = elements.batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.deterministic = True
    if threads:
        options.threading.private_threadpool_size = threads
        options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def _is_count(value) -> bool:
    """A whole number of at least 1 (not a bool, not a float)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


class PretrainingStream:
    """A host's infinite, deterministic stream of pretraining examples or packed rows, startable at any step.

    The batch at step N is a pure function of (corpus shard, recipe, seed, N): nothing else is stored
    to resume. packing: several examples per row (nsp, sop; "none" rows are full already and stay one
    sequence each, in the packed format); max_sequences_per_row: K; packing_window: examples the packer
    sees at once.
    """

    def __init__(self, corpus: TokenizedCorpus, spec: MaskingSpec, *, seed: int, max_seq_length: int,
                 short_seq_prob: float = 0.1, shard: int = 0, objective: str = "nsp", packing: bool = False,
                 max_sequences_per_row: int = 8, packing_window: int = 1000):
        if objective not in OBJECTIVES:
            raise ValueError(f"data.objective={objective!r}: choose {', '.join(OBJECTIVES)}")
        if max_seq_length < 5:
            raise ValueError(f"data.max_seq_length={max_seq_length}: needs at least 5 ([CLS] A [SEP] B [SEP])")
        # Full-length sequences would be capped below the rate: BERT uses 20 at 128, MLPerf 76 at 512.
        needed = int(max_seq_length * spec.mask_rate)
        if spec.max_predictions_per_seq < max(1, needed):
            raise ValueError(
                f"data.max_predictions_per_seq={spec.max_predictions_per_seq} is too small for "
                f"{spec.mask_rate:.0%} of data.max_seq_length={max_seq_length}: set it to at least {needed}"
            )
        if not isinstance(packing, (bool, np.bool_)):
            raise ValueError(f"data.packing={packing!r}: set True or False")
        if not _is_count(max_sequences_per_row):
            raise ValueError(f"data.max_sequences_per_row={max_sequences_per_row!r}: set a whole number of at least "
                             f"1 (sequences sharing a packed row; 8 at seq 128, 16 at seq 512)")
        if not _is_count(packing_window):
            raise ValueError(f"data.packing_window={packing_window!r}: set a whole number of at least 1 (examples "
                             f"the packer sees at once; 1000 packs the demo corpus to 99% real tokens at seq 128)")
        if objective == "sop" and np.all(np.diff(corpus.doc_starts) < 2):
            raise ValueError("data.objective='sop' pairs two segments of one document, and every document here "
                             "has one sentence: split documents into sentences, or set data.objective='none'")
        self.corpus, self.spec, self.seed, self.shard = corpus, spec, seed, shard
        self.max_seq_length, self.short_seq_prob, self.objective = max_seq_length, short_seq_prob, objective
        self.packing, self.max_sequences_per_row = bool(packing), int(max_sequences_per_row)
        self.packing_window = int(packing_window)
        # The uncut plans of the last two epochs asked for (tf.data reads epoch e while preparing e + 1).
        self._plans = {0: self._build_plan(0)}
        self.examples_per_epoch = len(self._plans[0])
        if self.examples_per_epoch == 0:
            raise ValueError(f"the corpus yields no examples for data.objective={objective!r}: give longer "
                             f"documents or another data.objective")
        self._row_plans = {0: self._build_row_plan(0)} if self.packing else {}
        # Dataset elements (examples, or packed rows) per epoch: every epoch has epoch 0's.
        self.rows_per_epoch = len(self._row_plans[0]) if self.packing else self.examples_per_epoch
        if self.packing and objective == "none":
            logging.info("data.packing with data.objective='none': FULL-SENTENCES rows are full already (%.2f%% "
                         "real tokens), so each row stays one sequence; the batches have the packed keys",
                         100 * self.real_token_share(self.rows_per_epoch))

    def _build_plan(self, epoch: int) -> np.ndarray:
        common = dict(seed=self.seed, epoch=epoch, shard=self.shard, max_seq_length=self.max_seq_length)
        if self.objective == "none":
            return build_full_sentences_plan(self.corpus, **common)
        build = build_sop_plan if self.objective == "sop" else build_epoch_plan
        return build(self.corpus, short_seq_prob=self.short_seq_prob, **common)

    def _build_row_plan(self, epoch: int) -> np.ndarray:
        """The epoch's uncut plan packed into rows: int64 [rows, K] indices in it, -1 padded."""
        plan = self.uncut_plan(epoch)
        k = self.max_sequences_per_row
        if self.objective == "none":  # full rows: one sequence each
            rows = np.full([len(plan), k], -1, np.int64)
            rows[:, 0] = np.arange(len(plan))
            return rows
        lengths = example_lengths(plan, self.objective)
        predictions = packer.num_predictions(lengths, self.spec.mask_rate, self.spec.max_predictions_per_seq)
        return packer.pack_rows(lengths, predictions, max_tokens=self.max_seq_length,
                                max_predictions=self.spec.max_predictions_per_seq, max_sequences=k,
                                window=self.packing_window)

    def _sequence_fn(self):
        """plan row -> (unmasked ids, segment ids, label), for this objective.

        A corpus in memory becomes one tf.constant that the rows slice; a mapped one a tensor over the
        map's pages, held by a variable (no copy: the pages a row reads are read from disk then); several
        shards' maps are read shard by shard. The same ops on the same values: the same examples.
        """
        spec = self.spec
        separators = tf.constant(document_separators(self.corpus), tf.int64)
        if hasattr(self.corpus.tokens, "parts"):  # prepared.TokenShards: several shards' maps
            return _shards_sequence_fn(self.corpus.tokens.parts, self.objective, separators, spec,
                                       self.max_seq_length)
        if not self.corpus.in_memory:
            return _map_sequence_fn(self.corpus.tokens, self.objective, separators, spec)
        tokens = tf.constant(self.corpus.tokens)

        # Named functions, not lambdas: autograph finds a lambda's source by its line, and mixes up two.
        def read(begin, end):
            return tf.cast(tokens[begin:end], tf.int32)

        def pair(row):
            return pair_ids(tokens, row, spec)

        return _rebased_full_sentences(read, separators, spec) if self.objective == "none" else pair

    def _example_fn(self):
        """(epoch, index, row) -> example (unpacked), or (epoch, members, rows) -> packed row."""
        sequence_fn = self._sequence_fn()
        spec, seed, max_seq_length = self.spec, self.seed, self.max_seq_length

        def example(epoch, index, row):
            return _padded_example(*sequence_fn(row), example_key(seed, epoch, index), spec, max_seq_length)

        def packed_row(epoch, members, rows):
            def key(index):
                return example_key(seed, epoch, index)

            return make_packed_row(sequence_fn, key, members, rows, spec, max_seq_length)

        return packed_row if self.packing else example

    def uncut_plan(self, epoch: int) -> np.ndarray:
        """All the epoch's pairs (their number varies a little from epoch to epoch)."""
        if epoch not in self._plans:
            self._plans = {e: p for e, p in self._plans.items() if e == max(self._plans)}
            self._plans[epoch] = self._build_plan(epoch)
        return self._plans[epoch]

    def plan(self, epoch: int) -> np.ndarray:
        """The epoch's pairs, cut or wrapped to the length of epoch 0."""
        plan = self.uncut_plan(epoch)
        return plan if len(plan) == self.examples_per_epoch else plan[np.arange(self.examples_per_epoch) % len(plan)]

    def row_plan(self, epoch: int) -> np.ndarray:
        """The epoch's packed rows (data.packing): all its pairs (uncut_plan) packed, then the rows cut or
        wrapped to the rows of epoch 0, which varies less than cutting pairs first (the corpus's tokens are
        the same every epoch, the number of pairs they make is not). int64 [R, K], indices in
        uncut_plan(epoch), ascending within a row, -1 after its last sequence."""
        if not self.packing:
            raise ValueError("row_plan needs a packed stream (data.packing=True)")
        if epoch not in self._row_plans:
            rows = self._build_row_plan(epoch)
            if len(rows) != self.rows_per_epoch:
                rows = rows[np.arange(self.rows_per_epoch) % len(rows)]
            self._row_plans = {e: r for e, r in self._row_plans.items() if e == max(self._row_plans)}
            self._row_plans[epoch] = rows
        return self._row_plans[epoch]

    def _packed_epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(row plan [R, K], the plan rows of its members [R, K, 5]) of one epoch."""
        members = self.row_plan(epoch)
        return members, self.uncut_plan(epoch)[np.maximum(members, 0)]

    def locate(self, row: int) -> tuple[int, int]:
        """Element number in the host's stream (an example, or a packed row) -> (epoch, index in the epoch)."""
        return divmod(row, self.rows_per_epoch)

    def row_lengths(self, epoch: int) -> np.ndarray:
        """Real tokens of each dataset element of the epoch (examples, or packed rows): int64 [R]."""
        if not self.packing:
            return example_lengths(self.plan(epoch), self.objective)
        lengths = example_lengths(self.uncut_plan(epoch), self.objective)
        members = self.row_plan(epoch)
        return np.where(members >= 0, lengths[np.maximum(members, 0)], 0).sum(1)

    def real_token_share(self, num_rows: int, start_row: int = 0) -> float:
        """The share of the positions that are real tokens (not padding) in the stream's rows
        [start_row, start_row + num_rows): what input_mask.mean() of those batches gives, from the plans."""
        real, row = 0, start_row
        while row < start_row + num_rows:
            epoch, index = self.locate(row)
            take = min(self.rows_per_epoch - index, start_row + num_rows - row)
            real += int(self.row_lengths(epoch)[index:index + take].sum())
            row += take
        return real / (num_rows * self.max_seq_length)

    def dataset(self, batch_size: int, start_step: int = 0, threads: int | None = None) -> tf.data.Dataset:
        """Batches of `batch_size` examples (packed: rows) from step `start_step` on.

        Built from the plan of the epoch the step falls in: resuming at step 1,000,000 costs what
        starting at step 0 costs. threads: cap tf.data's worker threads (benchmarks per core).
        """
        return batched(self.elements(start_step * batch_size), batch_size, threads)

    def elements(self, start: int = 0) -> tf.data.Dataset:
        """The stream's examples (packed: rows), unbatched and infinite, from element `start` on (element
        i of the host's stream is batch i // B's example i % B): what a mixture of streams interleaves."""
        first_epoch, offset = self.locate(start)
        r, k = self.rows_per_epoch, self.max_sequences_per_row

        def epoch_examples(epoch):
            plan = tf.numpy_function(lambda e: self.plan(int(e)), [epoch], tf.int64, stateful=False)
            plan = tf.ensure_shape(plan, [r, 5])
            index = tf.range(r, dtype=tf.int64)
            return tf.data.Dataset.from_tensor_slices((tf.fill([r], epoch), index, plan))

        def epoch_rows(epoch):
            members, rows = tf.numpy_function(lambda e: self._packed_epoch(int(e)), [epoch], (tf.int64, tf.int64),
                                              stateful=False)
            members, rows = tf.ensure_shape(members, [r, k]), tf.ensure_shape(rows, [r, k, 5])
            return tf.data.Dataset.from_tensor_slices((tf.fill([r], epoch), members, rows))

        def epoch_elements(epoch):
            elements = epoch_rows(epoch) if self.packing else epoch_examples(epoch)
            skip = tf.where(epoch == first_epoch, tf.constant(offset, tf.int64), tf.constant(0, tf.int64))
            return elements.skip(skip)

        epochs = tf.data.Dataset.range(first_epoch, np.iinfo(np.int64).max)
        ds = epochs.flat_map(epoch_elements)
        return ds.map(self._example_fn(), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
