"""A weighted mixture of pretraining streams (data.mixture), as exactly resumable as one stream.

The mixed stream is cut into blocks of M elements (data.mixture_block_size). Every block holds the
same count of each source's elements: M x weight, rounded by largest remainder so that the counts add
up to M. Within block b they come in an order drawn from a generator seeded by (seed, b). Hence, with
c_s the count of source s per block:

    element i  = block b = i // M, place j = i % M;   source s(i) = order_b[j]
    position of source s at element i = b * c_s + (elements of s in order_b[:j])

Both are closed forms in (counts, seed, i): starting at step N builds one block order per source and
skips nothing, and element i is element position(i) of its own source's stream. Each source keeps its
own PretrainingStream (own corpus, own seed), so its examples and masks are those it would have alone.

Shape legend: M block size, S number of sources.
"""

import numpy as np

from bertjax.data.stream import PretrainingStream, batched
from bertjax.text import tf_cpu

tf = tf_cpu.import_tensorflow()


def block_counts(weights, block_size: int) -> np.ndarray:
    """Elements of each source in a block of `block_size`: block_size x normalized weight, rounded by
    largest remainder (ties to the earlier source) so that they add up to block_size. int64 [S]."""
    weights = np.asarray(weights, np.float64)
    if weights.ndim != 1 or len(weights) == 0:
        raise ValueError("data.mixture needs at least one source")
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError(f"data.mixture weights {weights.tolist()}: every weight must be a number above 0")
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"data.mixture_block_size={block_size!r}: set a whole number of at least 1")
    exact = block_size * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    remainders = exact - counts
    # Stable sort on the negated remainders: the largest first, ties in source order.
    for s in np.argsort(-remainders, kind="stable")[: block_size - counts.sum()]:
        counts[s] += 1
    if np.any(counts == 0):
        s = int(np.argmin(counts))
        raise ValueError(f"data.mixture[{s}] gets no element of a block of data.mixture_block_size={block_size} "
                         f"(weight share {weights[s] / weights.sum():.4f}): raise data.mixture_block_size to at "
                         f"least {int(np.ceil(weights.sum() / weights[s]))}, or raise its weight")
    return counts


class MixtureStream:
    """Interleaves the elements (examples, or packed rows) of several PretrainingStreams by weight.

    The streams must make elements of one structure (one recipe: max_seq_length, objective, packing,
    predictions per row); the batch at step N is a pure function of (the streams, weights, block size,
    seed, N). Offers what callers read of a PretrainingStream: dataset, elements, real_token_share,
    rows_per_epoch, packing, objective, max_seq_length.
    """

    def __init__(self, streams: list[PretrainingStream], weights, *, seed: int, block_size: int):
        self.streams = list(streams)
        self.counts = block_counts(weights, block_size)
        if len(self.counts) != len(self.streams):
            raise ValueError(f"{len(self.streams)} streams but {len(self.counts)} weights")
        first = self.streams[0]
        for s, stream in enumerate(self.streams[1:], 1):
            for key in ("max_seq_length", "objective", "packing", "max_sequences_per_row"):
                if getattr(stream, key) != getattr(first, key):
                    raise ValueError(f"data.mixture[{s}] has {key}={getattr(stream, key)!r}, data.mixture[0] "
                                     f"{getattr(first, key)!r}: the sources of a mixture share one recipe")
            if stream.spec.max_predictions_per_seq != first.spec.max_predictions_per_seq:
                raise ValueError("the sources of a mixture share data.max_predictions_per_seq")
        self.seed, self.block_size = int(seed), int(block_size)
        self.packing, self.objective, self.max_seq_length = first.packing, first.objective, first.max_seq_length
        self.max_sequences_per_row = first.max_sequences_per_row
        self.spec = first.spec  # the recipe's masking, shared by the sources (the preview names it)
        # A mixture "epoch": the elements before any source starts its second epoch.
        self.rows_per_epoch = int(min(s.rows_per_epoch // c for s, c in zip(self.streams, self.counts))
                                  * self.block_size) or int(self.block_size)
        self._base = np.repeat(np.arange(len(self.streams), dtype=np.int64), self.counts)  # [M], sources in order

    def block_order(self, block: int) -> np.ndarray:
        """The source of each place of block `block`: int64 [M], each source c_s times."""
        return np.random.default_rng([self.seed, int(block)]).permutation(self._base)

    def source_of(self, element: int) -> int:
        """Which source element `element` of the mixed stream comes from."""
        block, place = divmod(int(element), self.block_size)
        return int(self.block_order(block)[place])

    def positions(self, element: int) -> np.ndarray:
        """Elements each source has given before element `element` of the mixed stream: int64 [S]. Element
        `element` is element positions(element)[s] of source s = source_of(element)'s stream."""
        block, place = divmod(int(element), self.block_size)
        before = np.bincount(self.block_order(block)[:place], minlength=len(self.streams))
        return block * self.counts + before

    def elements(self, start: int = 0) -> tf.data.Dataset:
        """The mixed elements, unbatched and infinite, from element `start` on."""
        first_block, place = divmod(int(start), self.block_size)
        m = self.block_size

        def block_sources(block):
            order = tf.numpy_function(lambda b: self.block_order(int(b)), [block], tf.int64, stateful=False)
            order = tf.ensure_shape(order, [m])
            skip = tf.where(block == first_block, tf.constant(place, tf.int64), tf.constant(0, tf.int64))
            return tf.data.Dataset.from_tensor_slices(order).skip(skip)

        choices = tf.data.Dataset.range(first_block, np.iinfo(np.int64).max // m).flat_map(block_sources)
        starts = self.positions(start)
        sources = [stream.elements(int(s)) for stream, s in zip(self.streams, starts)]
        return tf.data.Dataset.choose_from_datasets(sources, choices)

    def dataset(self, batch_size: int, start_step: int = 0, threads: int | None = None) -> tf.data.Dataset:
        """Batches of `batch_size` mixed elements from step `start_step` on (as PretrainingStream.dataset)."""
        return batched(self.elements(start_step * batch_size), batch_size, threads)

    def real_token_share(self, num_rows: int, start_row: int = 0) -> float:
        """The share of real tokens in the mixed rows [start_row, start_row + num_rows), from each source's
        plans over the rows it gives there."""
        begin, end = self.positions(start_row), self.positions(start_row + num_rows)
        real = sum(stream.real_token_share(int(n), int(b)) * int(n)
                   for stream, b, n in zip(self.streams, begin, end - begin) if n)
        return real / num_rows
