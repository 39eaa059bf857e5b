"""Numpy batches of task features: shuffled training batches, ordered padded evaluation batches.

Training reads the set as an endless stream of epochs, each a permutation drawn from (seed, epoch)
alone; a batch may run across the end of an epoch into the next, so every example is seen exactly
once per epoch and none is dropped, even from a set smaller than a batch. The batch of step N is a
pure function of (features, batch size, seed, N): resuming at step N needs nothing else.

Evaluation keeps the set's order; the last partial batch is filled up with copies of the first
example at example_weight 0, so every batch has the compiled shape and padding counts for nothing.

batch_size is the global batch. With several processes each computes the same global batch and
keeps its contiguous share of rows (process_index of process_count), the host batch that
bertjax.training.sharding assembles into the global array.
"""

import math
from typing import Iterator

import numpy as np


def num_examples(features: dict[str, np.ndarray]) -> int:
    return len(features["example_weight"])


def num_train_steps(num_train_examples: int, batch_size: int, epochs: float) -> int:
    """Steps that show each example `epochs` times (the last batch may start the next epoch)."""
    return math.ceil(num_train_examples * epochs / batch_size)


def epoch_order(num: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of epoch `epoch`: int64 [num], a pure function of (num, seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(num)


def train_batch_indices(num: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Which examples make up the (global) training batch of `step`: int64 [batch_size]."""
    positions = step * batch_size + np.arange(batch_size)  # in the endless stream of epochs
    epochs, offsets = np.divmod(positions, num)
    out = np.empty(batch_size, np.int64)
    for epoch in np.unique(epochs):  # one epoch, two at a boundary, more only if num < batch_size
        here = epochs == epoch
        out[here] = epoch_order(num, seed, int(epoch))[offsets[here]]
    return out


def _host_rows(batch_size: int, process_index: int, process_count: int) -> slice:
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: needs at least 1")
    if batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} does not divide among {process_count} processes: "
                         "make it a multiple of the process count")
    share = batch_size // process_count
    return slice(process_index * share, (process_index + 1) * share)


def train_batches(features: dict[str, np.ndarray], batch_size: int, seed: int, start_step: int = 0, *,
                  process_index: int = 0, process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Endless training batches from step start_step on: {key: array [batch_size / process_count, ...]}."""
    rows = _host_rows(batch_size, process_index, process_count)
    num = num_examples(features)
    if num == 0:
        raise ValueError("no training examples")
    step = start_step
    while True:
        chosen = train_batch_indices(num, batch_size, seed, step)[rows]
        yield {key: value[chosen] for key, value in features.items()}
        step += 1


def eval_batches(features: dict[str, np.ndarray], batch_size: int, *, process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """The whole set in order, ceil(N / batch_size) batches; padding rows have example_weight 0."""
    rows = _host_rows(batch_size, process_index, process_count)
    num = num_examples(features)
    for start in range(0, num, batch_size):
        positions = np.arange(start, start + batch_size)[rows]
        real = positions < num
        batch = {key: value[np.where(real, positions, 0)] for key, value in features.items()}
        batch["example_weight"] = np.where(real, batch["example_weight"], 0).astype(np.float32)
        yield batch
