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

Packed training (data.packing, classification / regression / tagging): a step takes the same
batch_size examples of the stream, so steps, epochs and the schedule mean what they mean unpacked, and
packs them into a static num_rows rows (packing.pack_rows on their real token counts). With gradient
accumulation each microbatch of the unpacked step (its examples g::k, as accumulate_gradients splits
a batch) is packed on its own into rows g::k, so every microbatch holds the examples and the example
count it holds unpacked. A packed step is a pure function of (features, batch size, seed, N) too.

Shape legend: N examples, S max_seq_length, R packed rows, K max_sequences_per_row.
"""

import math
from typing import Iterator

import numpy as np

from bertjax.data import packing


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


# --------------------------------------------------------------------------------------------------
# Packed training batches
# --------------------------------------------------------------------------------------------------

# What a packed batch adds to the unpacked keys: [R, S] per token, [R, K] per sequence slot.
PACKED_INPUT_KEYS = ("sequence_ids", "position_ids", "cls_positions")


def example_lengths(features: dict[str, np.ndarray]) -> np.ndarray:
    """Each example's real tokens ([CLS] ... [SEP]): int64 [N]. Rows are right-padded."""
    return np.sum(features["input_mask"] > 0, axis=-1).astype(np.int64)


def _pack_group(lengths: np.ndarray, members: np.ndarray, *, max_seq_length: int, max_sequences: int) -> np.ndarray:
    """The examples `members` [n] packed into rows: example indices int64 [rows, K], -1 after the last."""
    rows = packing.pack_rows(lengths[members], np.zeros(len(members), np.int64), max_tokens=max_seq_length,
                             max_predictions=1, max_sequences=max_sequences, window=len(members))
    return np.where(rows >= 0, members[np.maximum(rows, 0)], -1)


def packed_rows_needed(lengths: np.ndarray, batch_size: int, seed: int, num_steps: int, *, max_seq_length: int,
                       max_sequences: int, grad_accum_steps: int = 1) -> int:
    """The most rows one microbatch of any step in [0, num_steps) packs into (times grad_accum_steps is
    the R that fits every step of the run exactly). About 0.3 ms per step of 32 examples, once per run."""
    num, k = len(lengths), grad_accum_steps
    most = 1
    for step in range(num_steps):
        chosen = train_batch_indices(num, batch_size, seed, step)
        for g in range(k):
            most = max(most, len(_pack_group(lengths, chosen[g::k], max_seq_length=max_seq_length,
                                             max_sequences=max_sequences)))
    return most


def packed_step_plan(lengths: np.ndarray, batch_size: int, seed: int, step: int, *, num_rows: int,
                     max_seq_length: int, max_sequences: int, grad_accum_steps: int = 1) -> np.ndarray:
    """Which examples fill each packed row of `step`: int64 [R, K] (R = num_rows), -1 at empty slots.

    Microbatch g (examples g::k of the unpacked step) fills rows g::k. Raises where a microbatch needs
    more than num_rows / k rows: no example is ever dropped."""
    k = grad_accum_steps
    if num_rows % k:
        raise ValueError(f"data.packed_rows={num_rows} is not divisible by train.grad_accum_steps={k}")
    chosen = train_batch_indices(len(lengths), batch_size, seed, step)
    plan = np.full([num_rows, max_sequences], -1, np.int64)
    per = num_rows // k
    for g in range(k):
        rows = _pack_group(lengths, chosen[g::k], max_seq_length=max_seq_length, max_sequences=max_sequences)
        if len(rows) > per:
            raise ValueError(f"step {step}: {len(chosen[g::k])} examples need {len(rows) * k} packed rows, "
                             f"data.packed_rows={num_rows}: raise it (or leave it unset to derive it)")
        plan[g::k][:len(rows)] = rows
    return plan


def packed_batch(features: dict[str, np.ndarray], plan: np.ndarray, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The rows of a plan [R, K]: `keys` of the features packed, plus PACKED_INPUT_KEYS.

    Token features ([N, S]: input_ids, segment_ids, input_mask, tagging's label and label_weight) are
    laid side by side, zero after a row's last token; example features ([N]: label, example_weight)
    go to their sequence's slot, zero at empty slots (weight 0: they count for nothing). label_weight
    is multiplied by its example's weight, the product the unpacked loss takes."""
    num_rows, k = plan.shape
    seq_len = features["input_ids"].shape[1]
    lengths = example_lengths(features)
    token_keys = [key for key in keys if features[key].ndim == 2]
    out = {key: np.zeros([num_rows, seq_len], features[key].dtype) for key in token_keys}  # [R, S]
    out.update({key: np.zeros([num_rows, k], features[key].dtype) for key in keys if key not in token_keys})  # [R, K]
    out["sequence_ids"] = np.zeros([num_rows, seq_len], np.int32)  # [R, S]
    out["position_ids"] = np.zeros([num_rows, seq_len], np.int32)  # [R, S]
    out["cls_positions"] = np.zeros([num_rows, k], np.int32)  # [R, K]
    for r in range(num_rows):
        start = 0
        for slot in range(k):
            i = int(plan[r, slot])
            if i < 0:
                break
            n = int(lengths[i])
            for key in token_keys:
                out[key][r, start:start + n] = features[key][i, :n]
            for key in keys:
                if key not in token_keys:
                    out[key][r, slot] = features[key][i]
            if "label_weight" in token_keys:
                out["label_weight"][r, start:start + n] *= features["example_weight"][i]
            out["sequence_ids"][r, start:start + n] = slot + 1
            out["position_ids"][r, start:start + n] = np.arange(n)
            out["cls_positions"][r, slot] = start
            start += n
    return out


def packed_train_batches(features: dict[str, np.ndarray], batch_size: int, seed: int, start_step: int = 0, *,
                         keys: tuple[str, ...], num_rows: int, max_sequences: int, grad_accum_steps: int = 1,
                         process_index: int = 0, process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Endless packed training batches from step start_step on: {key: [num_rows / process_count, ...]}."""
    rows = _host_rows(num_rows, process_index, process_count)
    num = num_examples(features)
    if num == 0:
        raise ValueError("no training examples")
    lengths = example_lengths(features)
    step = start_step
    while True:
        plan = packed_step_plan(lengths, batch_size, seed, step, num_rows=num_rows,
                                max_seq_length=features["input_ids"].shape[1], max_sequences=max_sequences,
                                grad_accum_steps=grad_accum_steps)
        yield packed_batch(features, plan[rows], keys)
        step += 1
