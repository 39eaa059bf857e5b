"""Random batches of the configured shape, for timing the train step alone: no corpus, no TensorFlow.

Full-length sequences (no padding), two segments, max_predictions_per_seq real predictions at distinct
positions: the most expensive batch the configuration allows. The batch at step N is a pure function
of (seed, N, host), like the real stream's.
"""

from typing import Iterator

import numpy as np


def synthetic_batch(step: int, *, batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                    vocab_size: int, seed: int = 0, shard: int = 0, split: int = 0) -> dict:
    """split: 0 for the training stream, 1 for the held-out one (an independent random stream)."""
    rng = np.random.default_rng([seed, split, step, shard])
    b, s, p = batch_size, max_seq_length, max_predictions_per_seq
    # Ids from 5 on: the first five are the special tokens in both vocabularies bertjax writes.
    input_ids = rng.integers(5, vocab_size, size=(b, s), dtype=np.int32)
    segment_ids = np.broadcast_to((np.arange(s) >= s // 2).astype(np.int32), (b, s)).copy()
    # Distinct positions per row, sorted as the real masking sorts them ([CLS] at 0 is never chosen).
    positions = np.sort(np.argsort(rng.random((b, s - 1)), axis=1)[:, :p] + 1, axis=1).astype(np.int32)
    return {
        "input_ids": input_ids,
        "input_mask": np.ones((b, s), np.int32),
        "segment_ids": segment_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(5, vocab_size, size=(b, p), dtype=np.int32),
        "masked_lm_weights": np.ones((b, p), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=(b,), dtype=np.int32),
    }


def synthetic_batches(start_step: int = 0, **kwargs) -> Iterator[dict]:
    step = start_step
    while True:
        yield synthetic_batch(step, **kwargs)
        step += 1
