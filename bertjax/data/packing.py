"""Packing several examples into one row: the packer (numpy, on example lengths) and its inverse.

No TensorFlow here, so the synthetic batches and the model's tests can use it. The stream
(bertjax/data/stream.py) packs each epoch's plan with pack_rows, and bertjax/data/instances.py builds
the rows; the batch contract is written in its docstring and in docs/data.md ("Packing").

Shape legend: N examples, R rows, K max_sequences_per_row, S max_seq_length, P max_predictions_per_seq.
"""

import numpy as np

# A packed batch's keys, in order: [B, S] per token, [B, P] per prediction, [B, K] per sequence slot.
PACKED_KEYS = ("input_ids", "input_mask", "segment_ids", "sequence_ids", "position_ids", "masked_lm_positions",
               "masked_lm_ids", "masked_lm_weights", "next_sentence_labels", "sentence_positions", "sentence_weights")


def num_predictions(lengths: np.ndarray, mask_rate: float, max_predictions_per_seq: int) -> np.ndarray:
    """How many positions mask_tokens asks for in an example of each length: int64 [N].

    The same float32 product and round-half-to-even as mask_tokens, so the budget the packer counts is
    the one masking spends (whole-word masking may spend less, never more).
    """
    wanted = np.round(lengths.astype(np.float32) * np.float32(mask_rate)).astype(np.int64)
    return np.minimum(max_predictions_per_seq, np.maximum(1, wanted))


def pack_rows(lengths: np.ndarray, predictions: np.ndarray, *, max_tokens: int, max_predictions: int,
              max_sequences: int, window: int) -> np.ndarray:
    """Which examples share a row: best-fit decreasing over consecutive windows. int64 [R, K].

    lengths, predictions: [N] each example's tokens and predictions (each within its budget). Within a
    window of `window` consecutive examples, taken longest first (ties: in order), an example goes to
    the open row with the least room left in which it fits all three budgets (tokens <= max_tokens,
    predictions <= max_predictions, sequences <= max_sequences; ties: the row opened first), and opens
    a row only when none fits. A row lists its examples ascending, -1 after the last; rows are ordered
    by their first example, so the plan's (shuffled) order is kept as far as rows allow.
    """
    n, k = len(lengths), max_sequences
    if n and (lengths.max() > max_tokens or predictions.max() > max_predictions):
        raise ValueError(f"an example of {lengths.max()} tokens or {predictions.max()} predictions exceeds a row's "
                         f"{max_tokens} tokens or {max_predictions} predictions")
    rows = []
    for w0 in range(0, n, window):
        w1 = min(n, w0 + window)
        order = w0 + np.argsort(-lengths[w0:w1], kind="stable")
        smallest = int(lengths[w0:w1].min())
        members = np.full([w1 - w0, k], -1, np.int64)  # [rows of the window, K]
        sizes = np.zeros([w1 - w0], np.int64)
        # Rows that can still take an example: room in tokens (-1 once closed), predictions, sequences.
        row_of = np.zeros([w1 - w0], np.int64)  # open row slot -> row
        room = np.zeros([w1 - w0], np.int64)
        room_predictions = np.zeros([w1 - w0], np.int64)
        num_rows = num_open = 0
        for i in order.tolist():
            length, wanted = int(lengths[i]), int(predictions[i])
            slot = -1
            if num_open:
                fits = (room[:num_open] >= length) & (room_predictions[:num_open] >= wanted)
                if fits.any():
                    slot = int(np.argmin(np.where(fits, room[:num_open], max_tokens + 1)))
            if slot < 0:
                r = num_rows
                num_rows += 1
                left = max_tokens - length
                if left >= smallest and k > 1 and max_predictions - wanted >= 1:  # else it is closed at once
                    slot = num_open
                    num_open += 1
                    row_of[slot], room[slot], room_predictions[slot] = r, max_tokens, max_predictions
            else:
                r = int(row_of[slot])
            members[r, sizes[r]] = i
            sizes[r] += 1
            if slot >= 0:
                room[slot] -= length
                room_predictions[slot] -= wanted
                if sizes[r] == k or room[slot] < smallest or room_predictions[slot] < 1:
                    room[slot] = -1
        members = members[:num_rows]
        members = np.sort(np.where(members < 0, n, members), axis=1)  # ascending, padding last
        members[members == n] = -1
        rows.append(members[np.argsort(members[:, 0], kind="stable")])
    return np.concatenate(rows) if rows else np.zeros([0, k], np.int64)


def unpack_row(row: dict, *, pad_id: int) -> list[dict]:
    """One packed row (numpy arrays without the batch axis) -> its examples, each as the unpacked stream
    gives it: input_ids, input_mask, segment_ids [S], masked_lm_* [P], next_sentence_labels (scalar)."""
    s, p = len(row["input_ids"]), len(row["masked_lm_positions"])
    examples = []
    for k in np.flatnonzero(row["sentence_weights"] > 0).tolist():
        start = int(row["sentence_positions"][k])
        n = int(np.sum(row["sequence_ids"] == k + 1))
        predicted = (row["masked_lm_weights"] > 0) & (row["masked_lm_positions"] >= start) & (
            row["masked_lm_positions"] < start + n)
        c = int(predicted.sum())
        positions = np.zeros([p], np.int32)
        ids = np.zeros([p], np.int32)
        weights = np.zeros([p], np.float32)
        positions[:c] = row["masked_lm_positions"][predicted] - start
        ids[:c] = row["masked_lm_ids"][predicted]
        weights[:c] = row["masked_lm_weights"][predicted]
        example = {
            "input_ids": np.full([s], pad_id, np.int32),
            "input_mask": np.zeros([s], np.int32),
            "segment_ids": np.zeros([s], np.int32),
            "masked_lm_positions": positions,
            "masked_lm_ids": ids,
            "masked_lm_weights": weights,
            "next_sentence_labels": np.int32(row["next_sentence_labels"][k]),
        }
        example["input_ids"][:n] = row["input_ids"][start:start + n]
        example["input_mask"][:n] = 1
        example["segment_ids"][:n] = row["segment_ids"][start:start + n]
        examples.append(example)
    return examples


def unpack_batch(batch: dict, *, pad_id: int) -> list[dict]:
    """A packed batch -> the examples of all its rows, row after row (see unpack_row)."""
    return [ex for b in range(len(batch["input_ids"])) for ex in unpack_row({k: v[b] for k, v in batch.items()},
                                                                             pad_id=pad_id)]
