"""Examples -> fixed-shape numpy features, the same kind the pretraining pipeline feeds the encoder.

    [CLS] A [SEP] B [SEP] [PAD] ...   segment ids 0 ... 0 1 ... 1 0 ...   input mask 1 ... 1 0 ...

as the tokenizer's template places its special tokens (bertjax/text/templates.py; RoBERTa's
<s> A </s></s> B </s>, all in segment 0).

A pair too long for max_seq_length is cut from the end of the longer segment, one token at a time
(google-research/bert's _truncate_seq_pair), so a short segment keeps all of its tokens. A multiple-
choice example is its context paired with each choice in turn: [C, S] per example.

A set is tokenized once, whole (fine-tuning sets are small); TF runs only the tokenizer
(its encode_arrays): this module imports no TensorFlow, so the task kinds import it freely.

Features (N examples, C choices, S max_seq_length):
  input_ids, segment_ids, input_mask  int32 [N, S] ([N, C, S] for multiple choice)
  label           int32 [N] class or choice index (-1: no label); float32 [N] for regression (nan: none)
  idx             int32 [N] the example's index in its set (what a GLUE submission file names)
  example_weight  float32 [N] 1 for a real example; eval batching pads with 0
"""

import numpy as np

from bertjax.tasks import registry
from bertjax.tasks.examples import ChoiceExample, Example
from bertjax.text.templates import Template


def truncated_lengths(len_a, len_b, max_length):
    """Lengths _truncate_seq_pair leaves: pop from the longer of A and B (B when equal) until the
    pair fits in max_length. Works on scalars or arrays.

    Closed form of that loop: the longer is cut down to the shorter's length s first; if the pair
    still does not fit (2s > max_length) both are cut alternately, leaving A ceil(max/2) and B
    floor(max/2) tokens (ties pop B first).
    """
    len_a, len_b = np.asarray(len_a), np.asarray(len_b)
    shorter = np.minimum(len_a, len_b)
    fits = len_a + len_b <= max_length
    only_longer = 2 * shorter <= max_length  # cutting the longer alone is enough
    a_longer = len_a > len_b
    new_a = np.where(only_longer, np.where(a_longer, max_length - shorter, len_a), (max_length + 1) // 2)
    new_b = np.where(only_longer, np.where(a_longer, len_b, max_length - shorter), max_length // 2)
    new_a = np.where(fits, len_a, new_a)
    new_b = np.where(fits, len_b, new_b)
    return new_a, new_b


def encode_pair(ids_a, ids_b, max_seq_length: int, template: Template, pad_id: int) -> dict:
    """One (A, B or None) of token ids -> input_ids, segment_ids, input_mask: int32 [S] each, the
    special tokens where `template` (the tokenizer's) puts them."""
    ids_a = np.asarray(ids_a, np.int32)
    if ids_b is None:
        ids = np.array(template.single(ids_a[: max_seq_length - template.added()]), np.int32)
        segments = np.zeros(len(ids), np.int32)
    else:
        ids_b = np.asarray(ids_b, np.int32)
        keep_a, keep_b = truncated_lengths(len(ids_a), len(ids_b), max_seq_length - template.added(pair=True))
        ids, segments = template.pair(ids_a[:keep_a], ids_b[:keep_b])
    n = len(ids)
    input_ids = np.full(max_seq_length, pad_id, np.int32)
    input_ids[:n] = ids
    segment_ids = np.zeros(max_seq_length, np.int32)
    segment_ids[:n] = segments
    input_mask = np.zeros(max_seq_length, np.int32)
    input_mask[:n] = 1
    return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask}


def _labels(task: registry.Task, examples) -> np.ndarray:
    if task.kind == registry.REGRESSION:
        return np.array([np.nan if e.label is None else e.label for e in examples], np.float32)
    return np.array([-1 if e.label is None else e.label for e in examples], np.int32)


def featurize(examples: list, task: registry.Task, tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
    """Examples (or ChoiceExamples) of `task` -> the feature dict in the module docstring."""
    least = tokenizer.template.added(pair=True) + 2
    if max_seq_length < least:
        raise ValueError(f"data.max_seq_length={max_seq_length}: needs at least {least} (a token of each text "
                         "and the special tokens around a pair)")
    if not examples:
        raise ValueError(f"task {task.name}: no examples to featurize")
    special = dict(template=tokenizer.template, pad_id=tokenizer.pad_id)
    if task.kind == registry.MULTIPLE_CHOICE:
        if not all(isinstance(e, ChoiceExample) for e in examples):
            raise ValueError(f"task {task.name} is multiple choice: expected ChoiceExamples")
        wrong = next((e for e in examples if len(e.choices) != task.num_choices), None)
        if wrong is not None:
            raise ValueError(f"task {task.name}: example {wrong.idx} has {len(wrong.choices)} choices, "
                             f"expected {task.num_choices}")
        contexts = tokenizer.encode_arrays([e.context for e in examples])
        choices = tokenizer.encode_arrays([c for e in examples for c in e.choices])
        rows, c = [], 0
        for e, context in zip(examples, contexts):
            rows.append([encode_pair(context, choices[c + k], max_seq_length, **special)
                         for k in range(len(e.choices))])
            c += len(e.choices)
        features = {key: np.stack([np.stack([r[key] for r in row]) for row in rows])
                    for key in ("input_ids", "segment_ids", "input_mask")}
    else:
        if not all(isinstance(e, Example) for e in examples):
            raise ValueError(f"task {task.name} takes sentences and pairs: expected Examples")
        texts = tokenizer.encode_arrays([e.text for e in examples])
        pair_at = [i for i, e in enumerate(examples) if e.text_pair is not None]
        pair_ids = dict(zip(pair_at, tokenizer.encode_arrays([examples[i].text_pair for i in pair_at])))
        rows = [encode_pair(a, pair_ids.get(i), max_seq_length, **special) for i, a in enumerate(texts)]
        features = {key: np.stack([r[key] for r in rows]) for key in ("input_ids", "segment_ids", "input_mask")}
    features["label"] = _labels(task, examples)
    features["idx"] = np.array([e.idx for e in examples], np.int32)
    features["example_weight"] = np.ones(len(examples), np.float32)
    return features
