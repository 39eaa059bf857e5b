"""The fused residual + dropout + LayerNorm kernel (models/fused_norm.py) in Pallas' interpret mode, against
the unfused form: outputs, gradients, its hashed dropout mask, and the model under norm_kernel="pallas".

Shapes: R rows, H hidden (96: not a power of two, so the kernel's padded columns are exercised).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import bert, fused_norm
from bertjax.models.config import BertConfig

EPS = 1e-12
LEADING, HIDDEN = (4, 5), 96  # R = 20 rows: with block_rows=8, three blocks, the last one partial
BLOCK_ROWS = 8


@pytest.fixture(scope="module")
def inputs():
    """y, residual [4, 5, H], scale, bias [H] (float32), and the cotangent [4, 5, H] the losses weigh by."""
    k = jax.random.split(jax.random.key(0), 5)
    shape = (*LEADING, HIDDEN)
    return dict(y=jax.random.normal(k[0], shape), residual=2.0 + jax.random.normal(k[1], shape),
                scale=1.0 + 0.1 * jax.random.normal(k[2], (HIDDEN,)), bias=0.1 * jax.random.normal(k[3], (HIDDEN,)),
                weights=jax.random.normal(k[4], shape))


def kernel(y, residual, scale, bias, rate=0.0, seed=0):
    return fused_norm.residual_dropout_norm(y, residual, scale, bias, rate=rate, seed=jnp.uint32(seed), eps=EPS,
                                            interpret=True, block_rows=BLOCK_ROWS)


def unfused(y, residual, scale, bias):
    """LayerNorm(residual + y) as the xla path computes it (layers.layer_norm: two-pass variance)."""
    norm = nn.LayerNorm(epsilon=EPS, dtype=y.dtype, use_fast_variance=False, use_bias=bias is not None)
    params = {"scale": scale} if bias is None else {"scale": scale, "bias": bias}
    return norm.apply({"params": params}, residual + y)


def value_and_grads(fn, inputs, dtype, with_bias=True):
    """fn's output and the gradients of sum(output * weights) w.r.t. y, residual, scale (and bias)."""
    y, residual = inputs["y"].astype(dtype), inputs["residual"].astype(dtype)
    args = (y, residual, inputs["scale"], inputs["bias"] if with_bias else None)

    def loss(*args):
        return jnp.sum(fn(*args).astype(jnp.float32) * inputs["weights"])

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3) if with_bias else (0, 1, 2)))(*args)
    return jax.jit(fn)(*args), grads


def assert_close(got, want, tol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, with_bias, tol", [(jnp.float32, True, 1e-5), (jnp.float32, False, 1e-5),
                                                   (jnp.bfloat16, True, 2e-2)])
def test_kernel_matches_unfused_layer_norm(inputs, dtype, with_bias, tol):
    # bfloat16: the unfused form rounds residual + y to bfloat16 before its float32 statistics, the kernel
    # sums in float32; the difference is bfloat16's rounding of values of a few units.
    got = value_and_grads(kernel, inputs, dtype, with_bias)
    want = value_and_grads(unfused, inputs, dtype, with_bias)
    assert got[0].dtype == dtype
    assert_close(got, want, tol)


def test_dropout_matches_reference_mask_exactly(inputs):
    def reference(y, residual, scale, bias):
        return fused_norm.reference_residual_dropout_norm(y, residual, scale, bias, rate=0.1,
                                                          seed=jnp.uint32(7), eps=EPS)

    got = value_and_grads(lambda *a: kernel(*a, rate=0.1, seed=7), inputs, jnp.float32)
    want = value_and_grads(reference, inputs, jnp.float32)
    assert_close(got, want, 1e-5)
    # d out / d y is 0 exactly where the kernel dropped y: its mask, bit for bit keep_mask's.
    kept = np.asarray(got[1][0]).reshape(-1, HIDDEN) != 0
    np.testing.assert_array_equal(kept, np.asarray(fused_norm.keep_mask(jnp.uint32(7), 20, HIDDEN, 0.1)))
    # Rate 1 drops all of y: LayerNorm(residual).
    dropped_all = kernel(inputs["y"], inputs["residual"], inputs["scale"], inputs["bias"], rate=1.0)
    assert_close(dropped_all, unfused(jnp.zeros_like(inputs["y"]), inputs["residual"], inputs["scale"],
                                      inputs["bias"]), 1e-5)


def test_keep_mask_share_and_seeds(inputs):
    rows, hidden, rate = 64, 128, 0.1
    masks = [np.asarray(fused_norm.keep_mask(jnp.uint32(seed), rows, hidden, rate)) for seed in (1, 2, 1)]
    n = rows * hidden
    for mask in masks[:2]:  # the keep share within 4 binomial standard deviations of 0.9
        assert abs(mask.mean() - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_array_equal(masks[0], masks[2])
    # Two seeds: independent masks agree on 0.9^2 + 0.1^2 = 0.82 of the elements.
    assert abs((masks[0] == masks[1]).mean() - 0.82) < 0.03
    # Rate just below 1 keeps (almost) nothing rather than wrapping the threshold to keep everything.
    assert fused_norm._threshold(1 - 1e-12) == 2**32 - 1
    assert not np.asarray(fused_norm.keep_mask(jnp.uint32(1), rows, hidden, 1 - 1e-12)).any()
    # The kernel: the same seed gives the same output, another seed another one.
    outputs = [np.asarray(kernel(inputs["y"], inputs["residual"], inputs["scale"], inputs["bias"], 0.1, seed))
               for seed in (3, 3, 4)]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert not np.array_equal(outputs[0], outputs[2])


def test_kernel_lowers_to_triton():
    """The compiled form, lowered for CUDA without a GPU: every op has a Triton lowering and every block
    is a power of two (H = 768 runs as 1024, masked). Compiling and running it needs a GPU."""
    y = jnp.zeros((3, 5, 768), jnp.bfloat16)

    def loss(y, residual, scale, bias):
        out = fused_norm.residual_dropout_norm(y, residual, scale, bias, rate=0.1, seed=jnp.uint32(1), eps=EPS,
                                               interpret=False)
        return out.astype(jnp.float32).sum()

    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
        y, y, jnp.ones((768,)), jnp.zeros((768,))).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("__gpu$xla.gpu.triton") == 2  # the forward and the backward kernel


# ----------------------------------------------------------------------------------------------------
# The model under norm_kernel="pallas"
# ----------------------------------------------------------------------------------------------------

def tiny_config(norm_kernel: str) -> BertConfig:
    return BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_position_embeddings=16, norm_kernel=norm_kernel)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 64, size=(2, 12)).astype(np.int32)
    mask = (np.arange(12)[None] < np.array([[12], [8]])).astype(np.int32)
    return dict(input_ids=jnp.asarray(ids * mask), segment_ids=jnp.asarray((np.arange(12)[None] >= 6) * mask),
                input_mask=jnp.asarray(mask), masked_lm_positions=jnp.asarray([[1, 3, 5], [2, 4, 6]], jnp.int32))


def model_loss(cfg, params, batch, deterministic, rngs=None, heads_only=False):
    outputs = bert.BertForPreTraining(cfg).apply({"params": params}, **batch, deterministic=deterministic,
                                                 heads_only=heads_only, rngs=rngs)
    # Masked-LM plus next-sentence cross-entropy, written out: the test's own, whatever the losses module does.
    mlm = jax.nn.log_softmax(outputs["mlm_logits"].astype(jnp.float32))  # [B, P, V]
    nsp = jax.nn.log_softmax(outputs["nsp_logits"].astype(jnp.float32))  # [B, 2]
    ids = jnp.asarray([[7, 8, 9], [10, 11, 12]])
    return -(jnp.take_along_axis(mlm, ids[..., None], axis=-1).mean() + nsp[jnp.arange(2), jnp.asarray([0, 1])].mean())


def test_model_pallas_matches_xla(batch):
    xla, pallas = tiny_config("xla"), tiny_config("pallas")
    shapes = [jax.eval_shape(lambda c=c: bert.BertForPreTraining(c).init(jax.random.key(0), **batch))["params"]
              for c in (xla, pallas)]
    # The same tree: names, shapes, dtypes and logical axis names (checkpoints load under either kernel).
    assert jax.tree_util.tree_structure(shapes[0]) == jax.tree_util.tree_structure(shapes[1])
    assert jax.tree_util.tree_leaves(shapes[0]) == jax.tree_util.tree_leaves(shapes[1])
    norm = shapes[1]["bert"]["encoder"]["layers_0"]["attention_layer_norm"]
    assert norm["scale"].names == norm["bias"].names == ("embed",)

    params = nn.unbox(jax.jit(lambda: bert.BertForPreTraining(xla).init(jax.random.key(0), **batch))()["params"])
    # heads_only: the last block's residual and norm at the gathered rows only.
    grad = jax.value_and_grad(lambda p, c: model_loss(c, p, batch, True, heads_only=True))
    want = jax.jit(grad, static_argnums=1)(params, xla)
    got = jax.jit(grad, static_argnums=1)(params, pallas)
    assert_close(got, want, 2e-5)

    # Training mode: the kernel path, its dropout drawn from the "dropout" stream.
    train = jax.jit(lambda p, k: model_loss(pallas, p, batch, False, rngs={"dropout": k}))
    assert "pallas_call" in str(jax.make_jaxpr(train)(params, jax.random.key(1)))
    losses = [float(train(params, jax.random.key(k))) for k in (1, 2)]
    assert np.all(np.isfinite(losses)) and losses[0] != losses[1] != float(got[0])
