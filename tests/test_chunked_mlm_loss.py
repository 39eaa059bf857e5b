"""model.mlm_loss="chunked" against the logits it never writes out: the NLL, the argmax and the gradients
of models/mlm_loss.chunked_nll equal the dense form's, a model's pretraining loss, metrics and gradients
equal those of mlm_loss="logits", and no [predictions, V] float32 array is left in the gradient's program.

Shape legend: B batch, P predictions, E embedding width, V vocabulary, C chunk.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import bert, mlm_loss
from bertjax.models.config import BertConfig
from bertjax.training import pretraining_step

B, P, E, V = 2, 6, 8, 37


def dense_nll(x, table, bias, labels):
    """The reference: the whole logits in float32, as MaskedLMHead and pretraining_loss compute them."""
    logits = jnp.einsum("bpe,ve->bpv", x, table.astype(x.dtype), preferred_element_type=jnp.float32)
    logits = logits + bias.astype(jnp.float32)  # [B, P, V]
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - label_logit, jnp.argmax(logits, axis=-1) == labels


def close(got, want, rel, scale=None):
    """Equal within rel of the reference's largest magnitude (or of `scale`)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    scale = float(np.max(np.abs(want))) if scale is None else scale
    error = float(np.max(np.abs(got - want)))
    assert error <= rel * scale, (error, scale)


@pytest.fixture(scope="module")
def case():
    """x [B, P, E], table [V, E], bias [V], labels [B, P] and per-prediction weights [B, P], with ties.

    Rows 3 and 20 are equal (a tie across chunks), 8 and 9 (within one), 31 and 36 (31 lies where the
    last chunk of C=7 overlaps the one before it); each tied pair is some prediction's clear maximum,
    labelled with the first index at one prediction and the second at another."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, P, E)).astype(np.float32)
    table = rng.normal(size=(V, E)).astype(np.float32)
    bias = rng.normal(size=(V,)).astype(np.float32)
    labels = rng.integers(0, V, size=(B, P))
    for first, second, row in ((3, 20, 0), (8, 9, 1)):
        table[first] *= 3  # longer than the other rows: the largest logit of x along it
        table[second], bias[second] = table[first], bias[first]
        x[row, 0] = x[row, 1] = table[first]
        labels[row, 0], labels[row, 1] = first, second
    table[31] *= 3
    table[36], bias[36] = table[31], bias[31]
    x[0, 2] = x[1, 2] = table[31]
    labels[0, 2], labels[1, 2] = 31, 36
    labels[0, 3] = V - 1
    weights = rng.uniform(0.5, 2.0, size=(B, P)).astype(np.float32)
    return tuple(jnp.asarray(a) for a in (x, table, bias, labels, weights))


def weighted(nll_fn, labels, weights):
    return lambda x, table, bias: jnp.sum(weights * nll_fn(x, table, bias, labels)[0])


@pytest.mark.parametrize("chunk", [7, 37, 64])  # C does not divide V; C = V; C > V
def test_chunked_nll_and_gradients_equal_the_dense_form(case, chunk):
    x, table, bias, labels, weights = case
    nll, correct = mlm_loss.chunked_nll(x, table, bias, labels, chunk)
    want_nll, want_correct = dense_nll(x, table, bias, labels)
    assert nll.dtype == jnp.float32 and nll.shape == (B, P)
    close(nll, want_nll, 1e-6)
    np.testing.assert_array_equal(correct, want_correct)
    # The ties went to the first index, as jnp.argmax's.
    assert bool(correct[0, 0]) and not bool(correct[0, 1]) and bool(correct[1, 0]) and not bool(correct[1, 1])
    assert bool(correct[0, 2]) and not bool(correct[1, 2])
    grads = jax.grad(weighted(lambda *a: mlm_loss.chunked_nll(*a, chunk), labels, weights), argnums=(0, 1, 2))
    want = jax.grad(weighted(dense_nll, labels, weights), argnums=(0, 1, 2))(x, table, bias)
    for got, expected in zip(grads(x, table, bias), want):
        close(got, expected, 1e-6)


def test_chunked_nll_in_bfloat16(case):
    """bfloat16 hidden states and a float32 table, as a bfloat16 model holds them: the table is cast per chunk."""
    x, table, bias, labels, weights = case
    x = x.astype(jnp.bfloat16)
    nll, correct = mlm_loss.chunked_nll(x, table, bias, labels, 7)
    want_nll, want_correct = dense_nll(x, table, bias, labels)
    assert nll.dtype == jnp.float32
    close(nll, want_nll, 1e-3)
    np.testing.assert_array_equal(correct, want_correct)
    grads = jax.grad(weighted(lambda *a: mlm_loss.chunked_nll(*a, 7), labels, weights), argnums=(0, 1, 2))(
        x, table, bias)
    want = jax.grad(weighted(dense_nll, labels, weights), argnums=(0, 1, 2))(x, table, bias)
    for got, expected, original in zip(grads, want, (x, table, bias)):
        assert got.dtype == original.dtype
        close(got, expected, 2e-2)


def test_chunked_nll_refuses_mismatched_shapes(case):
    x, table, bias, labels, _ = case
    with pytest.raises(ValueError, match="table"):
        mlm_loss.chunked_nll(x, table[:, :4], bias, labels, 8)
    with pytest.raises(ValueError, match="mlm_loss_chunk"):
        mlm_loss.chunked_nll(x, table, bias, labels, 0)


# ----------------------------------------------------------------------------------------------------
# The model: mlm_loss="chunked" against "logits" with the same params
# ----------------------------------------------------------------------------------------------------

TINY = BertConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_position_embeddings=16, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
CHUNKED = dataclasses.replace(TINY, mlm_loss="chunked", mlm_loss_chunk=16)  # 16 does not divide 100


@pytest.fixture(scope="module")
def model_case():
    """(params of TINY, a pretraining batch of B=2 rows of 16 tokens with P=5 predictions, one unweighted)."""
    rng = np.random.default_rng(1)
    batch = {
        "input_ids": rng.integers(5, 100, size=(2, 16)),
        "segment_ids": np.repeat([[0] * 8 + [1] * 8], 2, axis=0),
        "input_mask": np.ones((2, 16)),
        "masked_lm_positions": np.array([[1, 3, 5, 7, 9], [2, 4, 6, 8, 10]]),
        "masked_lm_ids": rng.integers(5, 100, size=(2, 5)),
        "masked_lm_weights": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], np.float32),
        "next_sentence_labels": np.array([0, 1]),
    }
    batch = {k: jnp.asarray(v, jnp.float32 if k == "masked_lm_weights" else jnp.int32) for k, v in batch.items()}
    example = bert.dummy_batch(1, 16, 5)
    params = jax.jit(lambda: bert.BertForPreTraining(TINY).init(jax.random.key(0), **example))()["params"]
    return nn.unbox(params), batch


def loss_and_grads(cfg, params, batch):
    loss = jax.value_and_grad(pretraining_step.loss_fn, has_aux=True)
    return jax.jit(lambda p: loss(p, batch, jax.random.key(2), net=bert.BertForPreTraining(cfg)))(params)


def test_chunked_model_matches_logits(model_case):
    params, batch = model_case
    example = bert.dummy_batch(1, 16, 5)
    chunked_shapes = jax.eval_shape(lambda: bert.BertForPreTraining(CHUNKED).init(jax.random.key(0), **example))
    assert (jax.tree_util.tree_structure(nn.unbox(chunked_shapes["params"]))
            == jax.tree_util.tree_structure(params))  # the same parameter tree, output_bias where it was
    (loss, metrics), grads = loss_and_grads(TINY, params, batch)
    (chunked_loss, chunked_metrics), chunked_grads = loss_and_grads(CHUNKED, params, batch)
    close(chunked_loss, loss, 1e-6)
    assert set(chunked_metrics) == set(metrics)
    for key in metrics:
        close(chunked_metrics[key], metrics[key], 1e-6)
    assert float(metrics["mlm_count"]) == 9
    assert jax.tree_util.tree_structure(chunked_grads) == jax.tree_util.tree_structure(grads)
    # Against the largest gradient of all: some are 0 but for rounding (the attention's key bias).
    scale = max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(grads))
    for want, got in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(chunked_grads)):
        close(got, want, 1e-6, scale)
    head = grads["mlm_head"]["output_bias"], grads["bert"]["embeddings"]["word_embeddings"]["embedding"]
    for want, got in zip(head, (chunked_grads["mlm_head"]["output_bias"],
                                chunked_grads["bert"]["embeddings"]["word_embeddings"]["embedding"])):
        close(got, want, 1e-6)  # the decoder's own, each against its own scale


def test_chunked_model_outputs_no_logits(model_case):
    params, batch = model_case
    out = jax.eval_shape(lambda p: pretraining_step.forward(bert.BertForPreTraining(CHUNKED), p, batch, True), params)
    assert "mlm_logits" not in out
    assert out["mlm_decoder"].hidden.shape == (2, 5, 32) and out["mlm_decoder"].chunk == 16


def test_electra_refuses_chunked():
    from ml_collections import ConfigDict

    config = ConfigDict({"model": dataclasses.asdict(CHUNKED), "electra": {"x": 1}})
    with pytest.raises(ValueError, match="mlm_loss=logits"):
        pretraining_step.setup(config, None, None, jax.random.key(0))


# ----------------------------------------------------------------------------------------------------
# Memory: the gradient's program holds no [predictions, V] float32 array
# ----------------------------------------------------------------------------------------------------


def values(jaxpr) -> list:
    """The avals (shape, dtype) of every value a jaxpr makes, inside its scans, calls and custom rules too."""
    found = []
    for eqn in jaxpr.eqns:
        found += [v.aval for v in eqn.outvars if hasattr(v.aval, "shape")]
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's Jaxpr
                if hasattr(inner, "eqns"):
                    found += values(inner)
    return found


@pytest.mark.parametrize("chunked", [True, False])  # False: the control, showing the check finds them
def test_gradient_holds_no_prediction_by_vocabulary_float32(chunked):
    predictions, vocab, width, chunk = 64, 1000, 16, 128  # [2, 32] predictions; 128 does not divide 1000
    # width < predictions: the table and its gradient ([V, E]) stay under the [predictions, V] line.
    x = jnp.zeros((2, 32, width), jnp.float32)
    table, bias = jnp.zeros((vocab, width), jnp.float32), jnp.zeros((vocab,), jnp.float32)
    labels, weights = jnp.zeros((2, 32), jnp.int32), jnp.ones((2, 32), jnp.float32)
    nll = (lambda *a: mlm_loss.chunked_nll(*a, chunk)) if chunked else dense_nll
    jaxpr = jax.make_jaxpr(jax.grad(weighted(nll, labels, weights), argnums=(0, 1, 2)))(x, table, bias)
    found = values(jaxpr.jaxpr)
    largest = max(int(np.prod(v.shape)) for v in found if v.dtype == jnp.float32)
    if chunked:
        assert any(v.shape == (2, 32, chunk) for v in found)  # the walk reached the chunks' logits
        assert largest == vocab * width  # the table's gradient, nothing [predictions, V]
    else:
        assert largest >= predictions * vocab


@pytest.mark.parametrize("cfg", [CHUNKED, TINY], ids=["chunked", "logits"])  # logits: the control
def test_model_gradient_holds_no_logits(model_case, cfg):
    params, batch = model_case
    loss = functools.partial(pretraining_step.loss_fn, net=bert.BertForPreTraining(cfg))
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: loss(p, batch, jax.random.key(2))[0]))(params)
    logits_like = [v for v in values(jaxpr.jaxpr) if v.shape == (2, 5, cfg.vocab_size)]  # [B, P, V]
    assert bool(logits_like) == (cfg is TINY)
