"""Packed training batches of a rerank task (data.packing): the (query, candidate) pairs of a step share rows.

A step takes the same train.batch_size queries as unpacked (bertjax/tasks/batches.py's stream: steps, epochs,
the schedule and exact resume mean what they mean unpacked). Their real pairs ([CLS] query [SEP] candidate
[SEP], empty slots left out) are packed by their real token counts (packing.pack_rows) into a static R rows
of S tokens, K pairs at most a row, each pair with positions from 0 and attention only within itself
(sequence_ids, position_ids, cls_positions, as the other kinds pack). The queries' own features (label,
label_weight x example_weight, example_weight) stay [B, C] in the unpacked order, and pair_slots [B, C] is
each candidate's flat index into the R x K scores of the packed rows (row * K + slot; an empty slot points at
0 and, weight 0, counts for nothing): the step gathers the scores back to [B, C] and takes the loss there.

R is data.packed_rows, or unset the most rows any step of the run needs (rounded up to what the data-parallel
devices divide). A step that does not fit a set data.packed_rows is an error naming the key, never a pair
dropped. Gradient accumulation splits a batch's rows, not its queries: it is not offered packed.

Shape legend: N queries of the set, C candidate slots per query, B queries of a step, R packed rows, S row
width (data.max_seq_length), K pairs per row (data.max_sequences_per_row).
"""

from typing import Iterator

import numpy as np

from bertjax.tasks import batches

ROW_KEYS = ("input_ids", "segment_ids", "input_mask") + batches.PACKED_INPUT_KEYS
QUERY_KEYS = ("label", "label_weight", "example_weight", "pair_slots")  # [B, ...] in the unpacked order
BATCH_KEYS = ROW_KEYS + QUERY_KEYS


def pair_lengths(features: dict) -> np.ndarray:
    """Each pair's real tokens: int64 [N * C] (empty slots counted as they are; they are never packed)."""
    return np.sum(features["input_mask"] > 0, axis=-1).reshape(-1).astype(np.int64)


def _step_pairs(features: dict, batch_size: int, seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The step's queries [B] and their real pairs' flat indices (query * C + slot) in the unpacked order."""
    chosen = batches.train_batch_indices(batches.num_examples(features), batch_size, seed, step)
    slots = features["label_weight"].shape[1]
    pairs = chosen[:, None] * slots + np.arange(slots)[None, :]  # [B, C]
    return chosen, pairs[features["label_weight"][chosen] > 0]


def packed_rows_needed(features: dict, batch_size: int, seed: int, num_steps: int, *, max_sequences: int) -> int:
    """The most rows the pairs of any step in [0, num_steps) pack into."""
    lengths, width = pair_lengths(features), features["input_ids"].shape[-1]
    most = 1
    for step in range(num_steps):
        _, members = _step_pairs(features, batch_size, seed, step)
        most = max(most, len(batches._pack_group(lengths, members, max_seq_length=width,
                                                 max_sequences=max_sequences)))
    return most


def packed_step(features: dict, lengths: np.ndarray, batch_size: int, seed: int, step: int, *, num_rows: int,
                max_sequences: int) -> dict:
    """The packed batch of `step`: ROW_KEYS [R, ...], QUERY_KEYS [B, C] (example_weight [B])."""
    chosen, members = _step_pairs(features, batch_size, seed, step)
    seq_len = features["input_ids"].shape[-1]
    rows = batches._pack_group(lengths, members, max_seq_length=seq_len, max_sequences=max_sequences)
    if len(rows) > num_rows:
        raise ValueError(f"step {step}: the pairs of {batch_size} queries need {len(rows)} packed rows, "
                         f"data.packed_rows={num_rows}: raise it (or leave it unset to derive it)")
    plan = np.full([num_rows, max_sequences], -1, np.int64)
    plan[:len(rows)] = rows
    flat = {k: features[k].reshape(-1, seq_len) for k in ("input_ids", "segment_ids", "input_mask")}
    flat["example_weight"] = np.ones(len(flat["input_ids"]), np.float32)  # packed_batch reads it; unused here
    out = batches.packed_batch(flat, plan, ("input_ids", "segment_ids", "input_mask"))
    slot_of = {int(pair): r * max_sequences + s for (r, s), pair in np.ndenumerate(plan) if pair >= 0}
    slots = features["label_weight"].shape[1]
    out["pair_slots"] = np.array([[slot_of.get(int(q) * slots + c, 0) for c in range(slots)] for q in chosen],
                                 np.int32)  # [B, C]
    out["example_weight"] = features["example_weight"][chosen]
    out["label"] = features["label"][chosen]
    out["label_weight"] = features["label_weight"][chosen] * out["example_weight"][:, None]
    return out


def packed_train_batches(features: dict, batch_size: int, seed: int, start_step: int = 0, *, num_rows: int,
                         max_sequences: int, process_index: int = 0, process_count: int = 1) -> Iterator[dict]:
    """Endless packed training batches from step start_step on: each process keeps its share of the rows
    [R / process_count, ...] and of the queries [B / process_count, ...] (slot indices stay global)."""
    rows = batches._host_rows(num_rows, process_index, process_count)
    queries = batches._host_rows(batch_size, process_index, process_count)
    if batches.num_examples(features) == 0:
        raise ValueError("no training examples")
    lengths = pair_lengths(features)
    step = start_step
    while True:
        batch = packed_step(features, lengths, batch_size, seed, step, num_rows=num_rows,
                            max_sequences=max_sequences)
        yield {key: value[rows] if key in ROW_KEYS else value[queries] for key, value in batch.items()}
        step += 1
