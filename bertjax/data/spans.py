"""Masking units longer than a word, in TensorFlow ops: spans of whole words (SpanBERT, Joshi et al.
2020), n-grams of whole words (ALBERT, Lan et al. 2020), and lexicon units (phrases, entities, words of
scripts written without spaces: ERNIE's knowledge masking, Chinese whole-word masking).

Each function returns which word starts also start a unit; bertjax/data/masking.py then treats a unit as
one group (chosen whole, with one 80/10/10 decision), within the same token budget.

Spans and n-grams partition an example's words into consecutive units whose lengths (in words) are drawn
i.i.d. from the strategy's distribution, cut short where a special token ends a run of words; the greedy
fill then visits the units in a random order. The lengths are drawn as a whole vector and placed by a
cumulative sum: no per-word loop.

Shape legend: n length of an unpadded example, W words in it, L longest unit (in words).
"""

import numpy as np

from bertjax.data.units import BASE_POWERS, INVERSE_POWERS, MODULUS
from bertjax.text import tf_cpu

tf = tf_cpu.import_tensorflow()

_UNIT_LENGTHS = 4  # stream key (see masking.py's): the unit lengths' draws
_UNROLLED_PASSES = 2  # of the leftmost-longest fixed point, before its loop


def span_length_probs(p: float, max_words: int) -> np.ndarray:
    """SpanBERT's span length in words: geometric with parameter p, clipped (renormalised) at max_words.
    float64 [max_words], entry l - 1 the probability of l words."""
    lengths = np.arange(1, max_words + 1)
    probs = p * (1 - p) ** (lengths - 1)
    return probs / probs.sum()


def ngram_length_probs(max_n: int) -> np.ndarray:
    """ALBERT's n-gram length: p(n) proportional to 1/n for n = 1..max_n. float64 [max_n]."""
    probs = 1.0 / np.arange(1, max_n + 1)
    return probs / probs.sum()


def drawn_unit_starts(ids, candidate, word_start: np.ndarray, probs: np.ndarray, key):
    """[n] bool: the positions where a unit of i.i.d. drawn length (probs[l - 1] for l words) begins.

    ids: [n] int32; candidate: [n] bool (not a special token); word_start: bool [vocab_size]; key: the
    example's RNG key. Words are whole-word masking's; a unit also begins after every special token.
    Written with as few ops as it takes: it runs once per example inside tf.data.
    """
    not_after = ~tf.concat([[False], candidate[:-1]], 0)  # a candidate here follows [CLS] / [SEP]
    words = candidate & (tf.gather(tf.constant(word_start), ids) | not_after)  # [n] whole-word starts
    word = tf.cumsum(tf.cast(words, tf.int32), exclusive=True)  # [n] at a word start: its word index
    # Inverse CDF: a uniform draw u has length l where cdf[l - 2] <= u < cdf[l - 1]; n draws are enough.
    u = tf.random.stateless_uniform(tf.shape(ids), tf.random.experimental.stateless_fold_in(key, _UNIT_LENGTHS))
    # Bucketize: tf.searchsorted(cdf, u, side="right") in one op, the cdf a list of float32s.
    cdf = [float(c) for c in np.cumsum(probs)[:-1].astype(np.float32)]
    lengths = 1 + tf.raw_ops.Bucketize(input=u, boundaries=cdf)  # [n]
    starts = tf.cumsum(lengths, exclusive=True)  # [n] word index where each unit begins, ascending
    # starts[k] >= k, so the lookup of any word index w < n lands inside the array.
    begins = tf.gather(starts, _lower_bound(starts, word)) == word
    return words & (begins | not_after)


def _lower_bound(sorted_values, values):
    """tf.searchsorted(sorted_values, values, out_type=tf.int32) of two vectors, without the reshapes its
    wrapper adds (a dozen ops, each costly per example inside tf.data)."""
    return tf.raw_ops.LowerBound(sorted_inputs=tf.expand_dims(sorted_values, 0), values=tf.expand_dims(values, 0),
                                 out_type=tf.int32)[0]


# --- Lexicon units: longest match over words, by a hash of the unit's token ids (units.py) ----------

def lexicon_unit_starts(ids, candidate, word_starts, unit_hashes: np.ndarray, max_words: int):
    """[n] bool: the word starts that begin a unit, by longest match from the left: at the first word not
    inside an earlier unit, the longest run of words the lexicon holds (else the word alone).

    ids: [n] int32; candidate: [n] bool (not a special token); word_starts: [n] bool, the whole-word
    group starts. A unit never crosses a special token: its words must be contiguous.
    """
    n = tf.shape(ids)[0]
    positions = tf.cast(tf.where(word_starts)[:, 0], tf.int32)  # [W] token position of each word
    num_words = tf.shape(positions)[0]
    word = tf.cumsum(tf.cast(word_starts, tf.int32)) - 1  # [n]
    sizes = tf.math.unsorted_segment_sum(tf.cast(candidate, tf.int32), tf.where(candidate, word, num_words),
                                         num_words + 1)[:num_words]  # [W] tokens of each word
    ends = positions + sizes  # [W] one past each word's last token
    words_before = tf.concat([[0], tf.cumsum(sizes)], 0)  # [W + 1]
    # Prefix hashes over the example: prefix[k] = sum_(i<k) (id_i + 1) * BASE^i mod M.
    terms = (tf.cast(ids, tf.int64) + 1) * tf.constant(BASE_POWERS[:-1])[:n] % MODULUS
    prefix = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(terms) % MODULUS], 0)  # [n + 1]
    sorted_hashes = tf.constant(unit_hashes if len(unit_hashes) else np.array([-1], np.int64), tf.int64)
    # Every (first word w, length m) at once: [W, L - 1] for m = 2..L.
    m = tf.range(2, max_words + 1)[None, :]  # [1, L - 1]
    first = tf.range(num_words)[:, None]  # [W, 1]
    last = tf.minimum(first + m - 1, num_words - 1)  # [W, L - 1]
    a = tf.broadcast_to(positions[:, None], tf.shape(last))
    b = tf.gather(ends, last)  # token range [a, b) of words w .. w + m - 1
    # Contiguous: no special token between the words (their tokens fill the range exactly).
    contiguous = (first + m <= num_words) & (tf.gather(words_before, last + 1) - words_before[:-1, None] == b - a)
    h = (tf.gather(prefix, b) - tf.gather(prefix, a)) % MODULUS * tf.gather(INVERSE_POWERS, a) % MODULUS
    h = h * 64 + tf.cast(tf.minimum(b - a, 63), tf.int64)
    where = tf.minimum(tf.searchsorted(sorted_hashes, tf.reshape(h, [-1])), tf.size(sorted_hashes) - 1)
    match = contiguous & (tf.reshape(tf.gather(sorted_hashes, where), tf.shape(h)) == h)  # [W, L - 1]
    longest = 1 + tf.reduce_max(tf.where(match, m - 1, 0), axis=1)  # [W] words of the longest match
    chosen = _leftmost_longest(longest, max_words)  # [W]
    return word_starts & tf.scatter_nd(positions[:, None], chosen, [n])


def _leftmost_longest(longest, max_words: int):
    """[W] bool: the words that begin a unit when matching from the left: word w begins one unless an
    earlier beginning word j covers it (j + longest[j] > w).

    The recurrence runs left to right; solved here by iterating the whole vector to its fixed point, which
    is the recurrence's solution (after pass t the first t words are settled) and is reached after as
    many passes as the longest chain of overlapping matches, not as many as there are words. [W] bool.
    """
    num_words = tf.shape(longest)[0]
    d = tf.range(1, max_words)[None, :]  # [1, L - 1] how far back an earlier word is
    earlier = tf.range(num_words)[:, None] - d  # [W, L - 1]
    # Earlier words whose match reaches word w; only those can cover it.
    reaches = (earlier >= 0) & (tf.gather(longest, tf.maximum(earlier, 0)) > d)

    def covered(chosen):
        return tf.reduce_any(reaches & tf.gather(chosen, tf.maximum(earlier, 0)), axis=1)

    # Unrolled passes settle what natural lexicons give (overlapping matches are rare and short); a
    # loop (costly to enter inside tf.data) runs only on the chain of overlaps they leave unsettled.
    chosen = ~covered(tf.ones([num_words], tf.bool))
    for _ in range(_UNROLLED_PASSES - 1):
        chosen = ~covered(chosen)

    def body(chosen, _):
        new = ~covered(chosen)
        return new, tf.reduce_any(new != chosen)

    chosen, _ = tf.while_loop(lambda chosen, changed: changed, body, body(chosen, None))
    return chosen
