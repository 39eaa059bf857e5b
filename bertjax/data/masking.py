"""Dynamic masked-LM corruption, in TensorFlow ops (eager or inside tf.data): BERT's 80/10/10 at a
recipe's rate, drawn from a stateless RNG keyed by (seed, epoch, index in epoch), so the same example
gets the same mask in every run and a new one every epoch.

A masking strategy says which positions are chosen together (GROUPINGS: single tokens, whole words,
spans and n-grams of whole words, lexicon units; the last three in bertjax/data/spans.py, lexicon units
also as marks the stream finds once per corpus: marked_unit_starts); the budget,
the greedy fill and the replacements are shared; each group longer than a word gets one 80/10/10
decision (a whole word's tokens decide one by one, as in the original). A new
strategy is its grouping function and one row of GROUPINGS.

Shape legend: n length of an unpadded example, P max_predictions_per_seq, G groups.
"""

import dataclasses

import numpy as np

from bertjax.data import spans
from bertjax.text import tf_cpu

tf = tf_cpu.import_tensorflow()

# Whole words are chosen together but each of their tokens gets its own 80/10/10 decision, as in
# google-research/bert's create_masked_lm_predictions; the longer units (spans, n-grams, lexicon units) get
# one decision each, as SpanBERT decides per span.
PER_TOKEN_DECISIONS = ("token", "whole_word")
# Stream keys for tf.random.experimental.stateless_fold_in: one independent stream per purpose.
_GROUP_ORDER, _MASK_CHOICE, _RANDOM_TOKEN = 1, 2, 3  # 4: spans.py's


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """What masking needs to know about the vocabulary and the recipe (checked by bertjax/data/settings.py
    when it comes from a config)."""

    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    replacement_ids: np.ndarray  # ids a "random token" is drawn from: the vocabulary without specials
    word_start: np.ndarray  # bool [vocab_size]: the token begins a word (whole-word masking)
    max_predictions_per_seq: int
    mask_rate: float = 0.15  # share of an example's tokens to predict (BERT 0.15, ModernBERT 0.30)
    whole_word_masking: bool = False  # older form of masking="whole_word"
    masking: str = "token"  # a row of GROUPINGS
    span_p: float = 0.2  # span: geometric parameter of the length in words (SpanBERT 0.2)
    span_max_words: int = 10  # span: lengths clipped here (SpanBERT 10)
    ngram_max_n: int = 3  # ngram: n = 1..max_n with p(n) proportional to 1/n (ALBERT 3)
    unit_hashes: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int64))  # units: lexicon
    unit_max_words: int = 1  # units: the most words a lexicon unit has
    # Of the predicted positions: this share becomes [MASK], this one a random token, the rest stay.
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1

    @property
    def grouping(self) -> str:
        """The row of GROUPINGS this spec masks by."""
        return "whole_word" if self.whole_word_masking and self.masking == "token" else self.masking

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


def token_groups(ids, candidate, key, spec: MaskingSpec):
    """Every candidate position is a group of its own."""
    return candidate


def whole_word_groups(ids, candidate, key, spec: MaskingSpec):
    """All pieces of a word together ("##" continuations for WordPiece, "▁" word starts for
    SentencePiece). A group starts at a candidate that begins a word or follows a non-candidate ([CLS],
    [SEP]): a "##" piece right after [SEP] (B cut mid-word) starts its own group instead of joining the
    last word of A."""
    begins_word = tf.gather(tf.constant(spec.word_start), ids)
    after_candidate = tf.concat([[False], candidate[:-1]], 0)
    return candidate & (begins_word | ~after_candidate)


def span_groups(ids, candidate, key, spec: MaskingSpec):
    """SpanBERT: units of whole words with geometric lengths (spec.span_p, clipped at spec.span_max_words)."""
    return spans.drawn_unit_starts(ids, candidate, spec.word_start,
                                   spans.span_length_probs(spec.span_p, spec.span_max_words), key)


def ngram_groups(ids, candidate, key, spec: MaskingSpec):
    """ALBERT: n-grams of whole words, n = 1..spec.ngram_max_n with p(n) proportional to 1/n."""
    return spans.drawn_unit_starts(ids, candidate, spec.word_start, spans.ngram_length_probs(spec.ngram_max_n), key)


def unit_groups(ids, candidate, key, spec: MaskingSpec):
    """ERNIE / Chinese whole-word masking: the lexicon's units (longest match from the left over words),
    every other word a unit of its own."""
    words = whole_word_groups(ids, candidate, key, spec)
    if spec.unit_max_words < 2:
        return words
    return spans.lexicon_unit_starts(ids, candidate, words, spec.unit_hashes, spec.unit_max_words)


def marked_unit_starts(candidate, unit_starts):
    """unit_groups from the corpus's own marks (bertjax/data/units.py's corpus_unit_starts, read with the
    tokens: [n] bool, true where a unit begins): a unit also begins after every special token, where a
    segment cut by truncation starts inside a unit or a word."""
    after_candidate = tf.concat([[False], candidate[:-1]], 0)
    return candidate & (unit_starts | ~after_candidate)


# name -> (ids [n] int32, candidate [n] bool, key, spec) -> [n] bool: the candidates that start a group;
# a group runs to the next start (non-candidates belong to none). key: the example's RNG key, for
# strategies that draw their groups.
GROUPINGS = {"token": token_groups, "whole_word": whole_word_groups, "span": span_groups, "ngram": ngram_groups,
             "units": unit_groups}
# name -> passes of the greedy fill made before its loop, where one is not enough for most examples (units
# of one size always settle in one; docs/data.md, "Masking strategies"): otherwise 1.
FILL_PASSES = {"span": 2, "ngram": 2}


def _greedy_fill(sizes, budget, unrolled_passes: int = 1):
    """Which groups the original takes, visiting them in order: a group is taken when it still fits in
    the budget, else skipped for good. sizes: [G] int32 in visiting order -> [G] bool.

    Done in passes over the whole vector instead of one group at a time: each pass takes the longest
    prefix that fits, then drops every group larger than what is left (the first one that did not fit
    among them); what remains is visited by the next pass exactly as the sequential loop would.
    """
    def body(taken, alive, left):
        s = tf.where(alive, sizes, 0)
        beyond = tf.cumsum(s) > left  # from the first group that does not fit on
        fits = alive & ~beyond
        left -= tf.reduce_sum(tf.where(fits, s, 0))
        return taken | fits, alive & beyond & (sizes <= left), left

    def unsettled(taken, alive, left):
        return (left > 0) & tf.reduce_any(alive)

    state = (tf.zeros_like(sizes, tf.bool), sizes > 0, tf.cast(budget, sizes.dtype))
    # Unrolled passes settle most examples (token masking's first pass always does; a pass leaves a
    # settled state as it is); the loop, costly to enter inside tf.data, runs only where they did not.
    for _ in range(unrolled_passes):
        state = body(*state)
    return tf.cond(unsettled(*state), lambda: tf.while_loop(unsettled, body, state)[0], lambda: state[0])


def mask_tokens(ids, key, spec: MaskingSpec, mask_rate=None, unit_starts=None):
    """BERT's masked-LM corruption of one unpadded example.

    ids: [n] int32 ([CLS] A [SEP] B [SEP]); key: stateless RNG key; mask_rate: a scalar rate for this
    example (a rate schedule's, by step), else spec.mask_rate; unit_starts: [n] bool, the units found
    once per corpus (marked_unit_starts), else units masking finds them in the example (unit_groups).
    Returns (masked ids [n], masked_lm_positions [P], masked_lm_ids [P], masked_lm_weights [P]).

    num_to_predict = min(P, max(1, round(n * mask_rate))) positions, never [CLS]/[SEP], are
    chosen at random (whole groups together, skipping a group that would overshoot, as the original
    does with whole words). Of those, 80% become [MASK], 10% a random token, 10% stay
    (spec.mask_token_fraction and spec.random_token_fraction):
    the model cannot rely on [MASK] marking every position it is asked about, so it must keep a
    useful representation of every token -- and [MASK] never appears at fine-tuning time.
    """
    ids = tf.cast(ids, tf.int32)
    n = tf.shape(ids)[0]
    max_predictions = spec.max_predictions_per_seq
    candidate = (ids != spec.cls_id) & (ids != spec.sep_id) & (ids != spec.pad_id)
    # tf.round rounds half to even, like Python's round() in the original.
    rate = tf.cast(spec.mask_rate if mask_rate is None else mask_rate, tf.float32)
    num_to_predict = tf.cast(tf.round(tf.cast(n, tf.float32) * rate), tf.int32)
    num_to_predict = tf.minimum(max_predictions, tf.maximum(1, num_to_predict))
    chosen, first = _chosen_positions(ids, candidate, num_to_predict, key, spec, unit_starts)
    masked = tf.where(chosen, _replacements(ids, first, key, spec), ids)

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


def _chosen_positions(ids, candidate, num_to_predict, key, spec: MaskingSpec, unit_starts=None):
    """([n] bool: the positions to predict, whole groups at a time, visited in a random order;
    [n] int32: the first position of each position's group, where its 80/10/10 decision is drawn).

    Units longer than a word are taken whole or skipped, as the original skips a whole word that would
    overshoot: no unit is ever cut, and the budget left unspent is a fraction of a token per example on
    average (docs/data.md, "Strategies").
    """
    if unit_starts is not None and spec.grouping == "units":
        starts = marked_unit_starts(candidate, unit_starts)
    else:
        starts = GROUPINGS[spec.grouping](ids, candidate, key, spec)
    group = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # [n], group index at candidates
    num_groups = tf.reduce_sum(tf.cast(starts, tf.int32))
    segment = tf.where(candidate, group, num_groups)  # [n], non-candidates in segment G
    sizes = tf.math.unsorted_segment_sum(tf.cast(candidate, tf.int32), segment, num_groups + 1)[:num_groups]
    # A random visiting order of the groups (the original shuffles its candidate list).
    scores = tf.random.stateless_uniform([num_groups], tf.random.experimental.stateless_fold_in(key, _GROUP_ORDER))
    order = tf.argsort(scores)
    taken_in_order = _greedy_fill(tf.gather(sizes, order), num_to_predict, FILL_PASSES.get(spec.grouping, 1))
    taken = tf.scatter_nd(order[:, None], taken_in_order, [num_groups])
    chosen = candidate & tf.gather(tf.concat([taken, [False]], 0), segment)
    positions = tf.range(tf.shape(ids)[0])
    if spec.grouping in PER_TOKEN_DECISIONS:
        return chosen, positions
    # A group's first position is its least; segment G's (the special tokens') is never chosen.
    return chosen, tf.gather(tf.math.unsorted_segment_min(positions, segment, num_groups + 1), segment)


def _replacements(ids, first, key, spec: MaskingSpec):
    """[n] int32: what each position becomes if chosen: [MASK], itself, or a random token; one decision per
    group (drawn at its first position, so token masking draws exactly as before), a random token of its
    own for each position of a group that is replaced."""
    n = tf.shape(ids)[0]
    u = tf.random.stateless_uniform([n], tf.random.experimental.stateless_fold_in(key, _MASK_CHOICE))
    u = tf.gather(u, first)
    random_index = tf.random.stateless_uniform(
        [n], tf.random.experimental.stateless_fold_in(key, _RANDOM_TOKEN),
        minval=0, maxval=len(spec.replacement_ids), dtype=tf.int32,
    )
    random_tokens = tf.gather(tf.constant(spec.replacement_ids, tf.int32), random_index)
    # u < mask share: [MASK]; then unchanged up to 1 - random share; the top random share: a random token.
    keep_below = 1.0 - spec.random_token_fraction
    return tf.where(u < spec.mask_token_fraction, spec.mask_id, tf.where(u < keep_below, ids, random_tokens))
