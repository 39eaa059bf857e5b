"""bertjax/models/pooling.py against sentence-transformers' Pooling and Normalize modules (torch), every
mode and their concatenation, with and without the prompt pooled; a packed row pools each of its texts
as that text alone."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sentence_transformers.sentence_transformer.modules import Pooling

from bertjax.models import pooling

B, S, H = 4, 9, 6
LENGTHS = [9, 3, 6, 1]


def padded_batch(seed=0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(B, S, H)).astype(np.float32)  # [B, S, H]
    mask = (np.arange(S)[None] < np.array(LENGTHS)[:, None]).astype(np.int64)  # [B, S], right-padded
    return hidden, mask


def reference(hidden, mask, modes, prompt_length=None):
    module = Pooling(H, pooling_mode=modes, include_prompt=prompt_length is None)
    features = {"token_embeddings": torch.tensor(hidden), "attention_mask": torch.tensor(mask)}
    if prompt_length is not None:
        features["prompt_length"] = prompt_length
    return module(features)["sentence_embedding"].numpy()


@pytest.mark.parametrize("modes", [*pooling.MODES, ("cls", "mean", "max")])
def test_each_mode_pools_as_sentence_transformers(modes):
    hidden, mask = padded_batch()
    ours = pooling.pool(jnp.asarray(hidden), jnp.asarray(mask), 1, modes)[:, 0]  # [B, D]
    np.testing.assert_allclose(np.asarray(ours), reference(hidden, mask, modes), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("modes", ["mean", "max", "weightedmean", "cls", "lasttoken"])
def test_a_prompt_left_out_of_pooling(modes):
    hidden, mask = padded_batch(1)
    mask[3] = (np.arange(S) < 4)  # every text longer than the prompt
    prompt = 2  # [CLS] and one prompt token
    ours = pooling.pool(jnp.asarray(hidden), jnp.asarray(mask), 1, modes, jnp.full((B, 1), prompt))[:, 0]
    np.testing.assert_allclose(np.asarray(ours), reference(hidden, mask, modes, prompt), rtol=1e-6, atol=1e-6)


def test_a_packed_row_pools_each_text_as_alone():
    hidden, mask = padded_batch(2)
    alone = pooling.pool(jnp.asarray(hidden), jnp.asarray(mask), 1, pooling.MODES)[:, 0]  # [B, D]
    # Rows 1 and 2 (lengths 3 and 6) side by side in one row of 9; rows 3 (length 1) then padding in another.
    row = np.zeros((2, S, H), np.float32)
    ids = np.zeros((2, S), np.int32)
    row[0, :3], row[0, 3:9], ids[0, :3], ids[0, 3:9] = hidden[1, :3], hidden[2, :6], 1, 2
    row[1, :1], ids[1, :1] = hidden[3, :1], 1
    packed = pooling.pool(jnp.asarray(row), jnp.asarray(ids), 2, pooling.MODES)  # [2, K=2, D]
    np.testing.assert_allclose(np.asarray(packed[0]), np.asarray(alone[1:3]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(packed[1, 0]), np.asarray(alone[3]), rtol=1e-6, atol=1e-6)


def test_normalize_as_torch():
    x = np.random.default_rng(3).normal(size=(5, 7)).astype(np.float32)
    x[2] = 0.0  # a zero vector stays zero
    expected = torch.nn.functional.normalize(torch.tensor(x), dim=-1).numpy()
    np.testing.assert_allclose(np.asarray(pooling.normalize(jnp.asarray(x))), expected, rtol=1e-6, atol=1e-7)


def test_an_unknown_mode_is_one_clear_error():
    with pytest.raises(ValueError, match="pooling \\['avg'\\]: choose one or more of cls, max, mean"):
        pooling.check_modes(["avg"])
