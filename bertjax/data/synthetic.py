"""Random batches of the configured shape, for timing the train step alone: no corpus, no TensorFlow.

Unpacked: full-length sequences (no padding), two segments, max_predictions_per_seq real predictions at
distinct positions: the most expensive batch the configuration allows. Packed (packed=True): rows of
the packed contract (bertjax/data/instances.py), filled by the stream's own packer from example
lengths drawn like the demo corpus's, so that a packed step is timed on a realistic mix. The
batch at step N is a pure function of (seed, N, host), like the real stream's. `from_settings` offers
them as bertjax.data.inputs offers a corpus's batches, from the data section's record.

Shape legend: B batch, S max_seq_length, P max_predictions_per_seq, K max_sequences_per_row.
"""

import dataclasses
from typing import Iterator

import numpy as np

from bertjax.data import packing

# Example lengths like the demo corpus's NSP pairs: their quantiles 0%, 5%, ..., 100% as fractions of S,
# at seq 128 and 512 (docs/data.md, "Packing"). At 128 half the pairs fill the row; at 512 most are
# cut short by the end of their document.
DEMO_LENGTH_QUANTILES = {
    128: (0.086, 0.234, 0.297, 0.359, 0.422, 0.492, 0.578, 0.664, 0.758, 0.859, 0.969) + (1.0,) * 10,
    512: (0.023, 0.057, 0.072, 0.088, 0.105, 0.123, 0.145, 0.166, 0.191, 0.221, 0.254, 0.301, 0.352, 0.418,
          0.504, 0.598, 0.711, 0.861, 1.0, 1.0, 1.0),
}
MIN_EXAMPLE_LENGTH = 5  # [CLS] A [SEP] B [SEP] with one token each


def synthetic_lengths(rng: np.random.Generator, count: int, max_seq_length: int) -> np.ndarray:
    """[count] example lengths drawn from the demo corpus's length quantiles at the nearest of 128 and 512."""
    nearest = min(DEMO_LENGTH_QUANTILES, key=lambda s: abs(np.log(s / max_seq_length)))
    table = DEMO_LENGTH_QUANTILES[nearest]
    fractions = np.interp(rng.random(count) * (len(table) - 1), np.arange(len(table)), table)
    return np.clip(np.round(fractions * max_seq_length), MIN_EXAMPLE_LENGTH, max_seq_length).astype(np.int64)


def synthetic_batch(step: int, *, batch_size: int, max_seq_length: int, max_predictions_per_seq: int,
                    vocab_size: int, seed: int = 0, shard: int = 0, split: int = 0, packed: bool = False,
                    max_sequences_per_row: int = 8, mask_rate: float = 0.15, padded: bool = False) -> dict:
    """split: 0 for the training stream, 1 for the held-out one (an independent random stream).
    packed: rows of several sequences (max_sequences_per_row of them at most, each with
    round(mask_rate x length) predictions, as the real masking asks). padded: one example per row, of
    the demo corpus's lengths, padded at the right: the unpacked stream's rows, which packing is timed
    against."""
    rng = np.random.default_rng([seed, split, step, shard])
    if packed:
        return _packed_batch(rng, batch_size, max_seq_length, max_predictions_per_seq, vocab_size,
                             max_sequences_per_row, mask_rate)
    if padded:
        return _padded_batch(rng, batch_size, max_seq_length, max_predictions_per_seq, vocab_size, mask_rate)
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


def _padded_batch(rng, b: int, s: int, p: int, vocab_size: int, mask_rate: float) -> dict:
    """B rows of one example each, demo-like lengths n, padded at the right; min(P, round(rate x n))
    predictions at distinct positions inside each example (never its [CLS])."""
    lengths = synthetic_lengths(rng, b, s)  # [B]
    wanted = packing.num_predictions(lengths, mask_rate, p)  # [B]
    real = np.arange(s)[None, :] < lengths[:, None]  # [B, S]
    batch = {
        "input_ids": np.where(real, rng.integers(5, vocab_size, size=(b, s)), 0).astype(np.int32),
        "input_mask": real.astype(np.int32),
        "segment_ids": (real & (np.arange(s)[None, :] >= np.maximum(2, lengths[:, None] // 2))).astype(np.int32),
        "masked_lm_positions": np.zeros((b, p), np.int32),
        "masked_lm_ids": np.zeros((b, p), np.int32),
        "masked_lm_weights": np.zeros((b, p), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=(b,), dtype=np.int32),
    }
    for row, (n, c) in enumerate(zip(lengths.tolist(), wanted.tolist())):
        batch["masked_lm_positions"][row, :c] = np.sort(rng.permutation(n - 1)[:c] + 1)
        batch["masked_lm_ids"][row, :c] = rng.integers(5, vocab_size, size=c)
        batch["masked_lm_weights"][row, :c] = 1.0
    return batch


def _packed_batch(rng, b: int, s: int, p: int, vocab_size: int, k: int, mask_rate: float) -> dict:
    """B packed rows: random lengths, packed as the stream packs them, the first B rows kept."""
    # Enough examples for more than B rows, so that the first B rows by first example are not the
    # window's leftovers (the last, least full rows best-fit leaves).
    lengths = synthetic_lengths(rng, 6 * b, s)
    wanted = packing.num_predictions(lengths, mask_rate, p)
    members = packing.pack_rows(lengths, wanted, max_tokens=s, max_predictions=p, max_sequences=k,
                             window=len(lengths))[:b]  # [B, K]
    if len(members) < b:  # a few sequences per row at most: only K = 1 with a tiny batch gets here
        members = np.concatenate([members, np.full([b - len(members), k], -1, np.int64)])
    batch = {
        "input_ids": np.zeros((b, s), np.int32),  # [B, S]
        "input_mask": np.zeros((b, s), np.int32),
        "segment_ids": np.zeros((b, s), np.int32),
        "sequence_ids": np.zeros((b, s), np.int32),
        "position_ids": np.zeros((b, s), np.int32),
        "masked_lm_positions": np.zeros((b, p), np.int32),  # [B, P]
        "masked_lm_ids": np.zeros((b, p), np.int32),
        "masked_lm_weights": np.zeros((b, p), np.float32),
        "next_sentence_labels": np.zeros((b, k), np.int32),  # [B, K]
        "sentence_positions": np.zeros((b, k), np.int32),
        "sentence_weights": np.zeros((b, k), np.float32),
    }
    for row in range(b):
        offset = predicted = 0
        for slot, example in enumerate(members[row][members[row] >= 0].tolist()):
            n, c = int(lengths[example]), int(wanted[example])
            span = slice(offset, offset + n)
            batch["input_ids"][row, span] = rng.integers(5, vocab_size, size=n)
            batch["input_mask"][row, span] = 1
            batch["segment_ids"][row, offset + max(2, n // 2):offset + n] = 1  # B: the second half
            batch["sequence_ids"][row, span] = slot + 1
            batch["position_ids"][row, span] = np.arange(n)
            # Distinct positions within the sequence, never its [CLS]; ascending, as the real masking.
            chosen = np.sort(rng.permutation(n - 1)[:c] + 1)
            batch["masked_lm_positions"][row, predicted:predicted + c] = offset + chosen
            batch["masked_lm_ids"][row, predicted:predicted + c] = rng.integers(5, vocab_size, size=c)
            batch["masked_lm_weights"][row, predicted:predicted + c] = 1.0
            batch["next_sentence_labels"][row, slot] = rng.integers(0, 2)
            batch["sentence_positions"][row, slot] = offset
            batch["sentence_weights"][row, slot] = 1.0
            offset += n
            predicted += c
    return batch


def synthetic_batches(start_step: int = 0, **kwargs) -> Iterator[dict]:
    step = start_step
    while True:
        yield synthetic_batch(step, **kwargs)
        step += 1


@dataclasses.dataclass(frozen=True)
class SyntheticInputs:
    """Synthetic batches with what programs read of bertjax.data.inputs.PretrainingInputs: train_batches,
    eval_batches, and no tokenizer or vocabulary. recipe: synthetic_batch's keywords but the batch size."""

    recipe: dict
    tokenizer = None
    vocab_path = None

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[dict]:
        """This host's batches from step start_step on, without end."""
        return synthetic_batches(start_step, batch_size=batch_size, **self.recipe)

    def eval_batches(self, batch_size: int, num_batches: int) -> list[dict]:
        """The fixed held-out batches: an independent random stream (split 1)."""
        return [synthetic_batch(i, split=1, batch_size=batch_size, **self.recipe) for i in range(num_batches)]


def from_settings(settings, *, vocab_size: int, shard: int = 0) -> SyntheticInputs:
    """Synthetic batches of the shape a DataSettings (bertjax/data/settings.py) configures: its lengths,
    seed, packing and mask rate. vocab_size: the model's (there is no vocabulary); shard: this host."""
    return SyntheticInputs(dict(
        max_seq_length=settings.max_seq_length, max_predictions_per_seq=settings.max_predictions_per_seq,
        vocab_size=vocab_size, seed=settings.seed, shard=shard, packed=settings.packing,
        max_sequences_per_row=settings.max_sequences_per_row, mask_rate=settings.mask_rate,
    ))
