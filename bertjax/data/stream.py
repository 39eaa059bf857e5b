"""A host's pretraining stream: infinite, deterministic, startable at any step without saved state.

  * Each epoch has a *plan* (bertjax/data/plans.py): its examples as token ranges, drawn from a generator
    seeded by (seed, epoch, host), shuffled.
  * Every epoch has the same length E (the length of epoch 0's plan; later epochs, whose pair counts
    differ by a few percent, are cut or wrapped to E), so example j of the host's stream is
    example j % E of epoch j // E. Resuming at step N builds one plan and skips within it: the cost
    does not grow with N.
  * Masks are drawn from a stateless RNG keyed by (seed, epoch, index in epoch) (bertjax/data/masking.py),
    at the rate of the element's step where a rate schedule has phases (step = element // batch size).
    Lexicon units (data.masking="units") are found once per corpus, when the stream is built, and read
    as a mark per token with the tokens (units.corpus_unit_starts).
  * Packing (data.packing) adds a *row plan* per epoch: which examples of the epoch's plan share a row,
    found in numpy by best-fit decreasing over windows of consecutive plan rows (packing.py). Every
    epoch has the rows of epoch 0 (cut or wrapped); an example keeps its own key, so its tokens and mask
    are the unpacked stream's, shifted by its offset in the row.

The batch contract is bertjax/data/instances.py's (and docs/data.md's), with a batch axis B in front.

Shape legend: B batch, S max_seq_length, K max_sequences_per_row, R rows of an epoch.
"""

import dataclasses

import numpy as np
from absl import logging

from bertjax.data import mapped, objectives, units
from bertjax.data import packing as packer  # `packer`, not `packing`: data.packing is a parameter of the stream
from bertjax.data.corpus import TokenizedCorpus
from bertjax.data.instances import make_packed_row, padded_example, pair_ids, rebased_full_sentences
from bertjax.data.masking import MaskingSpec, example_key
from bertjax.data.plans import A_END, A_START, B_END, B_START, document_separators
from bertjax.text import tf_cpu

tf = tf_cpu.import_tensorflow()


def batched(elements: tf.data.Dataset, batch_size: int, threads: int | None = None) -> tf.data.Dataset:
    """A stream's elements in deterministic batches, prefetched; threads caps tf.data's worker threads."""
    ds = elements.batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.deterministic = True
    if threads:
        options.threading.private_threadpool_size = threads
        options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


class PretrainingStream:
    """A host's infinite, deterministic stream of pretraining examples or packed rows, startable at any step.

    The batch at step N is a pure function of (corpus shard, recipe, seed, N): nothing else is stored
    to resume. packing: several examples per row (nsp, sop; "none" rows are full already and stay one
    sequence each, in the packed format); max_sequences_per_row: K; packing_window: examples the packer
    sees at once.
    """

    def __init__(self, corpus: TokenizedCorpus, spec: MaskingSpec, *, seed: int, max_seq_length: int,
                 short_seq_prob: float = 0.1, shard: int = 0, objective: str = "nsp", packing: bool = False,
                 max_sequences_per_row: int = 8, packing_window: int = 1000,
                 mask_rate_schedule: tuple[tuple[int, float], ...] = ()):
        # A schedule's highest rate sizes every budget (predictions per example, the packer's rows).
        self.mask_rate_schedule = tuple((int(start), float(rate)) for start, rate in mask_rate_schedule)
        if self.mask_rate_schedule:
            spec = dataclasses.replace(spec, mask_rate=max(rate for _, rate in self.mask_rate_schedule))
        self._objective = objectives.get(objective)
        if max_seq_length < 5:
            raise ValueError(f"data.max_seq_length={max_seq_length}: needs at least 5 ([CLS] A [SEP] B [SEP])")
        # Full-length sequences would be capped below the rate: BERT uses 20 at 128, MLPerf 76 at 512.
        needed = int(max_seq_length * spec.mask_rate)
        if spec.max_predictions_per_seq < max(1, needed):
            raise ValueError(
                f"data.max_predictions_per_seq={spec.max_predictions_per_seq} is too small for "
                f"{spec.mask_rate:.0%} of data.max_seq_length={max_seq_length}: set it to at least {needed}"
            )
        if objective == "sop" and np.all(np.diff(corpus.doc_starts) < 2):
            raise ValueError("data.objective='sop' pairs two segments of one document, and every document here "
                             "has one sentence: split documents into sentences, or set data.objective='none'")
        self.corpus, self.spec, self.seed, self.shard = corpus, spec, seed, shard
        self.max_seq_length, self.short_seq_prob, self.objective = max_seq_length, short_seq_prob, objective
        self.packing, self.max_sequences_per_row = bool(packing), int(max_sequences_per_row)
        self.packing_window = int(packing_window)
        # bool [num_tokens]: where a lexicon unit begins; None unless units longer than a word are masked.
        self.unit_starts = None
        if spec.grouping == "units" and spec.unit_max_words >= 2:
            self.unit_starts = units.corpus_unit_starts(corpus, np.asarray(spec.word_start, bool), spec.unit_hashes,
                                                        spec.unit_max_words)
        # The uncut plans of the last two epochs asked for (tf.data reads epoch e while preparing e + 1).
        self._plans = {0: self._build_plan(0)}
        self.examples_per_epoch = len(self._plans[0])
        if self.examples_per_epoch == 0:
            raise ValueError(f"the corpus yields no examples for data.objective={objective!r}: give longer "
                             f"documents or another data.objective")
        self._row_plans = {0: self._build_row_plan(0)} if self.packing else {}
        # Dataset elements (examples, or packed rows) per epoch: every epoch has epoch 0's.
        self.rows_per_epoch = len(self._row_plans[0]) if self.packing else self.examples_per_epoch
        if self.packing and not self._objective.pairs:
            logging.info("data.packing with data.objective='none': FULL-SENTENCES rows are full already (%.2f%% "
                         "real tokens), so each row stays one sequence; the batches have the packed keys",
                         100 * self.real_token_share(self.rows_per_epoch))

    def _build_plan(self, epoch: int) -> np.ndarray:
        return self._objective.plan(self.corpus, seed=self.seed, epoch=epoch, shard=self.shard,
                                    max_seq_length=self.max_seq_length, short_seq_prob=self.short_seq_prob)

    def _build_row_plan(self, epoch: int) -> np.ndarray:
        """The epoch's uncut plan packed into rows: int64 [rows, K] indices in it, -1 padded."""
        plan = self.uncut_plan(epoch)
        k = self.max_sequences_per_row
        if not self._objective.pairs:  # full rows: one sequence each
            rows = np.full([len(plan), k], -1, np.int64)
            rows[:, 0] = np.arange(len(plan))
            return rows
        lengths = objectives.example_lengths(plan, self.objective)
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
            return mapped.shards_sequence_fn(self.corpus.tokens.parts, self._objective.pairs, separators, spec,
                                             self.max_seq_length)
        if not self.corpus.in_memory:
            return mapped.map_sequence_fn(self.corpus.tokens, self._objective.pairs, separators, spec)
        tokens = tf.constant(self.corpus.tokens)

        # Named functions, not lambdas: autograph finds a lambda's source by its line, and mixes up two.
        def read(begin, end):
            return tf.cast(tokens[begin:end], tf.int32)

        def pair(row):
            return pair_ids(tokens, row, spec)

        return pair if self._objective.pairs else rebased_full_sentences(read, separators, spec)

    def _unit_starts_fn(self):
        """plan row -> [n] bool: the row's unit marks laid out as its tokens (at [CLS], [SEP] and document
        separators any value: they are never candidates); None when there are none to read."""
        if self.unit_starts is None:
            return None
        variable = tf.Variable(self.unit_starts, trainable=False, name="unit_starts")  # captured, not copied
        spec = self.spec

        def pair(row):  # [CLS] A [SEP] B [SEP], as pair_ids lays out the tokens
            marks = variable.value()
            return tf.concat([[False], marks[row[A_START]:row[A_END]], [False], marks[row[B_START]:row[B_END]],
                              [False]], 0)

        def read(begin, end):
            return tf.cast(variable.value()[begin:end], tf.int32)

        full_sentences = rebased_full_sentences(read, tf.constant(document_separators(self.corpus), tf.int64), spec)

        def full_sentences_marks(row):  # separators read as [SEP]'s id: true, and never a candidate
            return tf.cast(full_sentences(row)[0], tf.bool)

        return pair if self._objective.pairs else full_sentences_marks

    def _rate_fn(self, batch_size: int | None):
        """(epoch, index in epoch) -> the mask rate of that element's step (a scalar tensor), or None for
        the spec's constant rate."""
        if not self.mask_rate_schedule:
            return lambda epoch, index: None
        if not batch_size:
            raise ValueError("a mask rate schedule needs the batch size: the rate is chosen by step")
        starts = tf.constant([start for start, _ in self.mask_rate_schedule], tf.int64)
        rates = tf.constant([rate for _, rate in self.mask_rate_schedule], tf.float32)
        r = self.rows_per_epoch

        def rate(epoch, index):
            step = (tf.cast(epoch, tf.int64) * r + tf.cast(index, tf.int64)) // batch_size
            return rates[tf.searchsorted(starts, step[None], side="right")[0] - 1]

        return rate

    def _example_fn(self, batch_size: int | None = None):
        """(epoch, index, row) -> example (unpacked), or (epoch, index, members, rows) -> packed row."""
        sequence_fn, unit_starts_fn = self._sequence_fn(), self._unit_starts_fn()
        spec, seed, max_seq_length = self.spec, self.seed, self.max_seq_length
        rate_at = self._rate_fn(batch_size)

        def example(epoch, index, row):
            return padded_example(*sequence_fn(row), example_key(seed, epoch, index), spec, max_seq_length,
                                  mask_rate=rate_at(epoch, index),
                                  unit_starts=unit_starts_fn(row) if unit_starts_fn else None)

        def packed_row(epoch, index, members, rows):
            def key(member):
                return example_key(seed, epoch, member)

            return make_packed_row(sequence_fn, key, members, rows, spec, max_seq_length,
                                   mask_rate=rate_at(epoch, index), unit_starts_fn=unit_starts_fn)

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
            return objectives.example_lengths(self.plan(epoch), self.objective)
        lengths = objectives.example_lengths(self.uncut_plan(epoch), self.objective)
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
        return batched(self.elements(start_step * batch_size, batch_size), batch_size, threads)

    def elements(self, start: int = 0, batch_size: int | None = None) -> tf.data.Dataset:
        """The stream's examples (packed: rows), unbatched and infinite, from element `start` on (element
        i of the host's stream is batch i // B's example i % B): what a mixture of streams interleaves.
        batch_size: B, which a mask rate schedule needs (its phases are by step)."""
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
            index = tf.range(r, dtype=tf.int64)
            return tf.data.Dataset.from_tensor_slices((tf.fill([r], epoch), index, members, rows))

        def epoch_elements(epoch):
            elements = epoch_rows(epoch) if self.packing else epoch_examples(epoch)
            skip = tf.where(epoch == first_epoch, tf.constant(offset, tf.int64), tf.constant(0, tf.int64))
            return elements.skip(skip)

        # Written in TensorFlow's own control flow (tf.while_loop, tf.cond), so AutoGraph has nothing to
        # convert: skipping it saves seconds of tracing at every start (the preview's and training's).
        plain = tf.autograph.experimental.do_not_convert
        epochs = tf.data.Dataset.range(first_epoch, np.iinfo(np.int64).max)
        ds = epochs.flat_map(plain(epoch_elements))
        return ds.map(plain(self._example_fn(batch_size)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
