"""model.attention_impl="splash": the Pallas TPU kernel with segment ids, run here in interpret mode.

The reference is the XLA form (a dense block-diagonal mask, the band of the local layers on positions):
the kernel alone (outputs and gradients), then packed batches through whole networks (ModernBERT
scanned, where a traced flag picks the local or the global kernel; BERT on a 2 x 2 mesh, where the
kernel runs per device under shard_map). `python -m bertjax.plan --config.model.attention_impl=splash`
compiles the real kernel for a TPU.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import synthetic
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models import splash
from bertjax.training import sharding

SEQ, PREDICTIONS, SEQUENCES, VOCAB = 128, 16, 6, 64
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            max_position_embeddings=SEQ, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
MODERNBERT = dict(num_layers=3, position_embedding="rotary", activation="geglu", norm_placement="pre", use_bias=False,
                  type_vocab_size=0, local_attention_window=8, global_attention_every=2, rotary_theta=100.0,
                  global_rotary_theta=1000.0, pooler="gelu_norm", layer_norm_eps=1e-5, scan_layers=True)


def _dense_reference(q, k, v, segments, half_window):
    """softmax over the keys of the query's own segment (and band), by a dense mask: [B, S, N, D]."""
    same = segments[:, :, None] == segments[:, None, :]  # [B, S, S]
    if half_window:
        index = jnp.arange(q.shape[1])
        same = same & (jnp.abs(index[:, None] - index[None, :]) <= half_window)
    logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / np.sqrt(q.shape[-1])
    probs = jax.nn.softmax(jnp.where(same[:, None], logits, -1e30), axis=-1)
    return jnp.einsum("bnqk,bknd->bqnd", probs, v)


def _assert_kernel_is_dense(q, k, v, segments, half_window):
    """The kernel's outputs at real tokens and its gradients (of a loss over the real tokens) against the
    dense mask's."""
    def loss(fn, q, k, v):
        out = fn(q, k, v)
        return jnp.sum(jnp.where(segments[..., None, None] > 0, out, 0.0) ** 2), out

    kernel = lambda q, k, v: splash.splash_attention(q, k, v, segments, half_window=half_window)  # noqa: E731
    dense = lambda q, k, v: _dense_reference(q, k, v, segments, half_window)  # noqa: E731
    grad = lambda fn: jax.jit(jax.value_and_grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2), has_aux=True))  # noqa: E731
    (_, got), grads = grad(kernel)(q, k, v)
    (_, want), want_grads = grad(dense)(q, k, v)
    real = np.asarray(segments > 0)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-4)


@pytest.mark.parametrize("half_window", [0, 8])
def test_the_kernel_keeps_segments_apart_as_the_dense_mask_does(half_window):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, SEQ, 2, 16)), jnp.float32) for _ in range(3))
    segments = jnp.asarray(np.stack([np.repeat([1, 2, 3, 0], [40, 50, 20, 18]), np.repeat([1, 0], [100, 28])]))
    _assert_kernel_is_dense(q, k, v, segments, half_window)


@pytest.mark.parametrize("half_window", [0, 64])
def test_at_8192_tokens_the_kernel_keeps_packed_sequences_and_the_band_as_the_dense_mask_does(half_window):
    """The `:extend` phase's rows: four sequences of a row of 8,192 tokens, across tile boundaries, and
    padding; the kernel's own grid of 64 x 64 tiles (what a TPU runs) against the dense mask."""
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8192, 1, 64)), jnp.float32) for _ in range(3))
    segments = jnp.asarray(np.repeat([1, 2, 3, 4, 0], [3000, 2500, 1800, 592, 300])[None])  # [1, 8192]
    _assert_kernel_is_dense(q, k, v, segments, half_window)


def test_a_tpu_needs_sequences_in_whole_tiles():
    with pytest.raises(ValueError, match="multiple of 128"):
        splash.check_length(96)
    with pytest.raises(ValueError, match="attention_dropout_rate=0.0"):
        BertConfig(attention_impl="splash", attention_dropout_rate=0.1)


def _batch(cfg, packed: bool):
    batch = synthetic.synthetic_batch(0, batch_size=2, max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                                      vocab_size=VOCAB, packed=packed, max_sequences_per_row=SEQUENCES, mask_rate=0.15)
    if cfg.type_vocab_size < 2:
        batch["segment_ids"] = np.zeros_like(batch["segment_ids"])
    return batch


def _logits(cfg, params, batch, packed: bool):
    """The training forward (heads_only: the last layer at the rows the heads read, which take XLA's form
    under splash): masked-LM and sentence logits. The kernel's gradients are checked on their own above."""
    net = bert_model.BertForPreTraining(cfg)
    extra = dict(sequence_ids=batch["sequence_ids"], position_ids=batch["position_ids"],
                 sentence_positions=batch["sentence_positions"]) if packed else {}
    out = net.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                    batch["masked_lm_positions"], deterministic=True, heads_only=True, **extra)
    return out["mlm_logits"], out["nsp_logits"]


def _assert_same(got, want, atol=1e-5):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-4)


def test_a_network_on_splash_computes_what_it_computes_on_xla():
    """ModernBERT, packed and scanned: segment ids, the band of the local layers, and a traced flag picking
    the local or the global kernel in each scan step (BERT's plain case runs in the mesh test)."""
    fields, packed = {**BASE, **MODERNBERT}, True
    xla = BertConfig(**fields)
    params = bert_model.BertForPreTraining(xla).init(jax.random.PRNGKey(0),
                                                     **bert_model.dummy_batch(1, SEQ, PREDICTIONS))["params"]
    batch = _batch(xla, packed)
    want = jax.jit(lambda p: _logits(xla, p, batch, packed))(params)
    got = jax.jit(lambda p: _logits(dataclasses.replace(xla, attention_impl="splash"), p, batch, packed))(params)
    _assert_same(got, want)


@pytest.mark.mesh
def test_splash_on_a_mesh_gives_what_one_device_gives():
    """Batch over data x fsdp, heads over tensor (the config's rules): the kernel runs per device."""
    from test_train import small_config

    cfg = BertConfig(**BASE, attention_impl="splash")
    params = bert_model.BertForPreTraining(cfg).init(jax.random.PRNGKey(0),
                                                     **bert_model.dummy_batch(1, SEQ, PREDICTIONS))["params"]
    batch = _batch(cfg, True)
    want = jax.jit(lambda p: _logits(cfg, p, batch, True))(params)
    mesh = sharding.make_mesh(dict(data=2, fsdp=1, tensor=2), jax.devices()[:4])
    rules = sharding.logical_rules(small_config().logical_axis_rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got = jax.jit(lambda p: _logits(cfg, p, batch, True))(params)
    _assert_same(got, want)
