"""Packed training batches of a contrastive task (data.packing): the texts of a step's pairs share rows.

A step takes the same train.batch_size pairs as unpacked (bertjax/tasks/batches.py's stream: steps,
epochs, the schedule and exact resume mean what they mean unpacked). Its texts (each query, positive
and present hard negative; a scored pair's two texts; distill_mse's text) are packed by their real token
counts (packing.pack_rows) into a static R rows of W tokens, K texts at most a row, each text with
positions from 0 and attention only within itself (sequence_ids, position_ids, cls_positions, as
fine-tuning and LoadedBert.embed pack). A pair's own features (score, example_weight, negative_present,
target, teacher_scores) stay [B, ...] in the unpacked order, and each text's place is one flat index into
the R x K embeddings the packed rows give: query_slot [B], passage_slot [B], negative_slot [B, G] (row * K + slot;
a missing negative points at slot 0 and, negative_present 0, counts for nothing).

GradCache (train.contrastive_microbatch, k microbatches of pairs c::k): microbatch c's texts are packed
on their own into rows c::k, so each microbatch's rows hold exactly its texts.

ColBERT (features with score masks): its documents (positives, negatives) are packed and each one's token
vectors gathered from its slot's span; its queries stay one a row, [B, Sq] pair features beside the rows.
A query's [MASK] expansion attends to its text without being attended to (attend_expansion=False), which
packed rows cannot say: they attend by sequence id alone. Nor would packing queries save anything: with
expansion every query is exactly Sq tokens.

R is data.packed_rows, or unset the most rows any microbatch of the run needs (times k, rounded up to
what the data-parallel devices divide): every step fits. A step that does not fit a set data.packed_rows
is an error naming the key, never a text dropped. Each text is already cut to its feature's length.

Shape legend: N pairs of the set, B pairs of a step, G hard negatives per pair, T texts of a step, R packed
rows, W row width (the widest text feature: data.max_seq_length), K texts per row
(data.max_sequences_per_row), k GradCache microbatches, Dt the teacher's width.
"""

import dataclasses
from typing import Iterator

import numpy as np

from bertjax.data import packing
from bertjax.tasks import batches

ROLES = ("query", "passage", "negative")
ROW_KEYS = ("input_ids", "input_mask", "sequence_ids", "position_ids", "cls_positions", "prompt_lengths")
SLOT_KEYS = ("query_slot", "passage_slot", "negative_slot")
PAIR_KEYS = ("score", "example_weight", "negative_present", "target", "teacher_scores")  # [B, ...] as unpacked
# ColBERT's features: the tokens MaxSim scores of each role's texts, [N, L] ([N, G, L] for negatives).
SCORE_MASK_KEYS = ("query_score_mask", "passage_score_mask", "negative_score_mask")
COLBERT_QUERY_KEYS = ("query_ids", "query_mask", "query_score_mask")  # its queries, unpacked pair features
SKIP_KEYS = {"query": "query_skip", "passage": "passage_skip", "negative": "passage_skip"}  # include_prompt=False


@dataclasses.dataclass(frozen=True)
class Texts:
    """The texts of one step, parallel arrays [T]: role (0 query, 1 passage, 2 negative), the pair's place
    in the step's batch, the negative's index g, the pair's example index and the text's real tokens."""

    role: np.ndarray
    pair: np.ndarray
    g: np.ndarray
    example: np.ndarray
    length: np.ndarray


def packed_roles(features: dict) -> tuple:
    """The roles whose texts share rows: every role the features have, but ColBERT's queries (module docstring)."""
    roles = tuple(role for role in ROLES if f"{role}_ids" in features)
    return roles[1:] if "query_score_mask" in features else roles


def pair_keys(features: dict) -> tuple:
    """The features a packed batch keeps [B, ...] in pair order (ColBERT: its queries and score masks too)."""
    keys = PAIR_KEYS + (COLBERT_QUERY_KEYS + SCORE_MASK_KEYS[1:] if "query_score_mask" in features else ())
    return tuple(key for key in keys if key in features)


def text_lengths(features: dict) -> dict:
    """Each packed text's real tokens ([CLS] ... [SEP]) by role (packed_roles): query [N], passage [N],
    negative [N, G] (0 where the pair has no such negative)."""
    roles = packed_roles(features)
    out = {"query": np.sum(features["query_mask"] > 0, axis=-1).astype(np.int64)} if "query" in roles else {}
    if "passage_mask" in features:
        out["passage"] = np.sum(features["passage_mask"] > 0, axis=-1).astype(np.int64)
    if "negative_mask" in features:
        present = features["negative_present"] > 0
        out["negative"] = np.where(present, np.sum(features["negative_mask"] > 0, axis=-1), 0).astype(np.int64)
    return out


def row_width(features: dict) -> int:
    """W: the widest packed text feature."""
    return max(features[f"{role}_ids"].shape[-1] for role in packed_roles(features))


def step_texts(lengths: dict, chosen: np.ndarray, positions: np.ndarray) -> Texts:
    """The texts of the pairs `chosen` [b] (example indices) at batch places `positions` [b]: every query,
    then every positive, then every present negative."""
    parts = []
    for r, role in enumerate(ROLES):
        if role not in lengths:
            continue
        if role == "negative":
            n = lengths[role][chosen]  # [b, G]
            j, g = np.nonzero(n > 0)
            parts.append((np.full(len(j), r), positions[j], g, chosen[j], n[j, g]))
        else:
            parts.append((np.full(len(chosen), r), positions, np.zeros(len(chosen), np.int64), chosen,
                          lengths[role][chosen]))
    return Texts(*(np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(5)))


def _pack(texts: Texts, width: int, max_sequences: int) -> np.ndarray:
    """texts packed into rows: text indices int64 [rows, K], -1 after a row's last."""
    return packing.pack_rows(texts.length, np.zeros(len(texts.length), np.int64), max_tokens=width, max_predictions=1,
                             max_sequences=max_sequences, window=max(len(texts.length), 1))


def _microbatches(chosen: np.ndarray, k: int):
    """(example indices, batch places) of microbatch c = pairs c::k, for each c."""
    places = np.arange(len(chosen))
    return [(chosen[c::k], places[c::k]) for c in range(k)]


def packed_rows_needed(features: dict, batch_size: int, seed: int, num_steps: int, *, max_sequences: int,
                       num_chunks: int = 1) -> int:
    """The most rows one microbatch of any step in [0, num_steps) packs into (times num_chunks: the R that
    fits every step of the run)."""
    lengths, width, num = text_lengths(features), row_width(features), batches.num_examples(features)
    most = 1
    for step in range(num_steps):
        chosen = batches.train_batch_indices(num, batch_size, seed, step)
        for members, places in _microbatches(chosen, num_chunks):
            most = max(most, len(_pack(step_texts(lengths, members, places), width, max_sequences)))
    return most


def packed_step_plan(features: dict, lengths: dict, batch_size: int, seed: int, step: int, *, num_rows: int,
                     max_sequences: int, num_chunks: int = 1) -> tuple:
    """(chosen [B], Texts, plan int64 [R, K] of text indices, -1 at empty slots) of `step`; microbatch c
    fills rows c::k. A microbatch needing more than R / k rows is a ValueError: no text is dropped."""
    k = num_chunks
    if num_rows % k:
        raise ValueError(f"data.packed_rows={num_rows} is not divisible by the {k} microbatches of "
                         "train.contrastive_microbatch")
    chosen = batches.train_batch_indices(batches.num_examples(features), batch_size, seed, step)
    width, per = row_width(features), num_rows // k
    plan = np.full([num_rows, max_sequences], -1, np.int64)
    parts, offset = [], 0
    for c, (members, places) in enumerate(_microbatches(chosen, k)):
        texts = step_texts(lengths, members, places)
        rows = _pack(texts, width, max_sequences)
        if len(rows) > per:
            raise ValueError(f"step {step}: the {len(texts.length)} texts of {len(members)} pairs need {len(rows) * k} "
                             f"packed rows, data.packed_rows={num_rows}: raise it (or leave it unset to derive it)")
        plan[c::k][:len(rows)] = np.where(rows >= 0, rows + offset, -1)
        parts.append(texts)
        offset += len(texts.length)
    texts = Texts(*(np.concatenate([getattr(t, f.name) for t in parts]) for f in dataclasses.fields(Texts)))
    return chosen, texts, plan


def packed_batch(features: dict, chosen: np.ndarray, texts: Texts, plan: np.ndarray, keys: tuple) -> dict:
    """A step's packed arrays (module docstring): the rows of `plan`, each text's slot index, and the
    pair features among `keys` of the pairs `chosen`."""
    num_rows, k = plan.shape
    width = row_width(features)
    out = {key: features[key][chosen] for key in pair_keys(features) if key in keys}
    out["input_ids"] = np.zeros([num_rows, width], np.int32)
    for key in ("input_mask", "sequence_ids", "position_ids"):
        out[key] = np.zeros([num_rows, width], np.int32)
    out["cls_positions"] = np.zeros([num_rows, k], np.int32)
    skips = "query_skip" in features
    if skips:
        out["prompt_lengths"] = np.zeros([num_rows, k], np.int32)
    b = len(chosen)
    slots = {role: np.zeros([b, features["negative_ids"].shape[1]] if role == "negative" else [b], np.int32)
             for role in packed_roles(features)}
    for r in range(num_rows):
        start = 0
        for slot in range(k):
            t = int(plan[r, slot])
            if t < 0:
                break
            role, i, g, n = ROLES[texts.role[t]], texts.example[t], texts.g[t], int(texts.length[t])
            ids = features[f"{role}_ids"][i, g] if role == "negative" else features[f"{role}_ids"][i]
            out["input_ids"][r, start:start + n] = ids[:n]
            out["input_mask"][r, start:start + n] = 1
            out["sequence_ids"][r, start:start + n] = slot + 1
            out["position_ids"][r, start:start + n] = np.arange(n)
            out["cls_positions"][r, slot] = start
            if skips:
                out["prompt_lengths"][r, slot] = features[SKIP_KEYS[role]][i]
            if role == "negative":
                slots[role][texts.pair[t], g] = r * k + slot
            else:
                slots[role][texts.pair[t]] = r * k + slot
            start += n
    out.update({f"{role}_slot": value for role, value in slots.items()})
    return out


def batch_keys(features: dict) -> tuple:
    """The keys of a packed batch of these features (what goes to the devices)."""
    keys = ROW_KEYS if "query_skip" in features else ROW_KEYS[:-1]
    keys += tuple(f"{role}_slot" for role in packed_roles(features))
    return keys + pair_keys(features)


def packed_train_batches(features: dict, batch_size: int, seed: int, start_step: int = 0, *, num_rows: int,
                         max_sequences: int, num_chunks: int = 1, process_index: int = 0,
                         process_count: int = 1) -> Iterator[dict]:
    """Endless packed training batches from step start_step on: each process keeps its share of the rows
    [R / process_count, ...] and of the pairs [B / process_count, ...] (slot indices stay global)."""
    rows = batches._host_rows(num_rows, process_index, process_count)
    pairs = batches._host_rows(batch_size, process_index, process_count)
    if batches.num_examples(features) == 0:
        raise ValueError("no training examples")
    lengths, keys = text_lengths(features), batch_keys(features)
    step = start_step
    while True:
        chosen, texts, plan = packed_step_plan(features, lengths, batch_size, seed, step, num_rows=num_rows,
                                               max_sequences=max_sequences, num_chunks=num_chunks)
        batch = packed_batch(features, chosen, texts, plan, keys)
        yield {key: value[rows] if key in ROW_KEYS else value[pairs] for key, value in batch.items()}
        step += 1
