"""Packed fine-tuning (data.packing): a packed batch's loss and gradients are the same examples' unpacked
ones (classification, regression, tagging, gradient accumulation); the packing plan covers every example
of an epoch once, within its budgets, and is a pure function of the step; unset, packing is on where it
applies.
The fine-tuning runs of tests/test_finetune.py pack by default: their training, dev metrics and exact
resume are a packed run's."""

import functools

import jax
import numpy as np
import pytest

from bertjax.runs import task_data
from bertjax.tasks import steps
from bertjax.models.config import BertConfig
from bertjax.models import heads
from bertjax.tasks import batches
from bertjax.training import optim
from configs.finetune import common as finetune_configs

S, K, VOCAB = 32, 4, 100


def synthetic_features(n, kind, seed=0):
    """n examples of 4..14 real tokens ([CLS] first, [SEP] last) in rows of S, labelled for `kind`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 15, n)
    input_ids = np.zeros([n, S], np.int32)
    segment_ids = np.zeros([n, S], np.int32)
    input_mask = np.zeros([n, S], np.int32)
    for i, length in enumerate(lengths):
        input_ids[i, :length] = np.concatenate([[2], rng.integers(5, VOCAB, length - 2), [3]])
        segment_ids[i, length // 2:length] = 1  # a pair: segment B from the middle on
        input_mask[i, :length] = 1
    features = {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask,
                "idx": np.arange(n, dtype=np.int32), "example_weight": np.ones(n, np.float32)}
    if kind == "classification":
        features["label"] = rng.integers(0, 3, n).astype(np.int32)
    elif kind == "regression":
        features["label"] = rng.uniform(0, 5, n).astype(np.float32)
    else:  # tagging: a tag at some real tokens, never at [CLS] or [SEP]
        features["label"] = rng.integers(0, 3, [n, S]).astype(np.int32)
        weight = (rng.uniform(size=[n, S]) < 0.6).astype(np.float32)
        features["label_weight"] = weight * (np.arange(S) >= 1) * (np.arange(S) < (lengths - 1)[:, None])
    return features


def tiny_config():
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                 max_position_embeddings=S, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)


def train_keys(features):
    return steps.TRAIN_KEYS + tuple(k for k in ("label_weight",) if k in features)


@pytest.mark.parametrize("kind,grad_accum_steps", [("classification", 1), ("regression", 1), ("tagging", 1),
                                                   ("classification", 2)])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_examples_unpacked(kind, grad_accum_steps):
    features = synthetic_features(12, kind)
    net = heads.network(kind, tiny_config(), 1 if kind == "regression" else 3)
    params = net.init(jax.random.key(0), **heads.dummy_inputs(kind, 1, S))["params"]
    keys = train_keys(features)
    chosen = batches.train_batch_indices(12, 12, 0, 1)
    unpacked = {k: features[k][chosen] for k in keys}
    lengths = batches.example_lengths(features)
    plan = batches.packed_step_plan(lengths, 12, 0, 1, num_rows=6, max_seq_length=S, max_sequences=K,
                                    grad_accum_steps=grad_accum_steps)
    assert (plan >= 0).sum(axis=1).max() > 1  # examples share rows
    packed = batches.packed_batch(features, plan, keys)
    assert packed["cls_positions"].shape == (6, K) and packed["sequence_ids"].shape == (6, S)
    loss = functools.partial(steps.task_loss, net=net, loss=heads.head(kind).loss)
    grad_fn = jax.jit(lambda p, b: optim.accumulate_gradients(jax.value_and_grad(loss, has_aux=True), p, b,
                                                              grad_accum_steps, jax.random.key(1)))
    (loss_u, sums_u), grads_u = grad_fn(params, unpacked)
    (loss_p, sums_p), grads_p = grad_fn(params, packed)
    assert np.isfinite(float(loss_p))
    np.testing.assert_allclose(float(loss_p), float(loss_u), rtol=1e-5, atol=1e-6)
    for name in sums_u:
        np.testing.assert_allclose(float(sums_p[name]), float(sums_u[name]), rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grads_p), jax.tree_util.tree_leaves(grads_u)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_the_packing_plan_covers_each_epoch_once_within_budgets_and_is_a_function_of_the_step():
    features = synthetic_features(50, "classification", seed=1)
    lengths = batches.example_lengths(features)
    batch_size, steps = 8, 25  # four epochs of 50 (a step crosses each epoch's end)
    rows = batches.packed_rows_needed(lengths, batch_size, 3, steps, max_seq_length=S, max_sequences=K)
    assert rows < batch_size
    stream = batches.packed_train_batches(features, batch_size, 3, keys=train_keys(features), num_rows=rows,
                                          max_sequences=K)
    seen = []
    for step in range(steps):
        plan = batches.packed_step_plan(lengths, batch_size, 3, step, num_rows=rows, max_seq_length=S,
                                        max_sequences=K)
        members = plan[plan >= 0]
        assert sorted(members) == sorted(batches.train_batch_indices(50, batch_size, 3, step))
        assert all(lengths[row[row >= 0]].sum() <= S for row in plan)  # tokens; K slots by shape
        seen.extend(members.tolist())
        batch = next(stream)
        assert batch["example_weight"].sum() == batch_size and batch["input_mask"].sum() == lengths[members].sum()
        # Each example's tokens, at its [CLS], with positions from 0 and its own label.
        for r, slot in zip(*np.nonzero(plan >= 0)):
            i, start = plan[r, slot], batch["cls_positions"][r, slot]
            n = lengths[i]
            np.testing.assert_array_equal(batch["input_ids"][r, start:start + n], features["input_ids"][i, :n])
            np.testing.assert_array_equal(batch["position_ids"][r, start:start + n], np.arange(n))
            assert (batch["sequence_ids"][r, start:start + n] == slot + 1).all()
            assert batch["label"][r, slot] == features["label"][i]
        if step == 13:
            fresh = next(batches.packed_train_batches(features, batch_size, 3, 13, keys=train_keys(features),
                                                      num_rows=rows, max_sequences=K))
            assert all(np.array_equal(fresh[k], batch[k]) for k in batch)
    assert np.array_equal(np.bincount(seen, minlength=50), np.full(50, 4))  # four epochs: each example 4 times
    with pytest.raises(ValueError, match="data.packed_rows"):
        batches.packed_step_plan(lengths, batch_size, 3, 0, num_rows=1, max_seq_length=S, max_sequences=K)


def test_packing_is_on_where_it_applies_and_refused_where_asked_for_and_it_cannot():
    """data.packing unset (the default) packs classification, regression and tagging, not multiple choice
    or the feature-based tagger; True there is one line. (The fine-tuning runs of tests/test_finetune.py,
    classification, train packed by default: their exact resume is the packed run's.)"""
    def settings(task, feature_based=False, **data):
        config = finetune_configs.finetune_config(task)
        config.data.update(**data)
        return task_data.packing_settings(config, task_data.task_from_config(config), feature_based)

    assert settings("classification", labels=("a", "b")) == (16, None)
    assert settings("tagging", labels=("O", "B-X")) == (16, None)
    assert settings("tagging", True, labels=("O", "B-X")) is None
    assert settings("multiple_choice", num_choices=2) is None
    assert settings("classification", labels=("a", "b"), packing=False) is None
    with pytest.raises(ValueError, match="data.packing"):
        settings("multiple_choice", num_choices=2, packing=True)
