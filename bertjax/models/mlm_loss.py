"""The masked-LM loss in its two forms (model.mlm_loss): "logits", from the [B, P, V] float32 logits the
head writes out; "chunked", the vocabulary projection fused with the cross-entropy and run over chunks of
C rows of the word table, forward and backward, so that no more than [B, P, C] of logits ever exists.
At B x P = 5,120 predictions and V = 30,522 the logits are 625 MB in float32, and their gradient as much.

Where "chunked" applies: the pretraining loss, in training and in held-out evaluation
(training/pretraining_step.py). What reads the logits themselves keeps them: bertjax.load (fill_mask,
and the SavedModel's fill_mask built from it) computes logits whatever the checkpoint's config says;
ELECTRA (its generator samples from its logits) and general distillation (soft targets from both
models' logits) refuse mlm_loss="chunked".

Shape legend: B batch, P predictions per sequence, E embedding width (the head's output), V vocabulary,
C chunk (table rows per step), K chunks (ceil(V / C)).
"""

import functools

import flax
import jax
import jax.numpy as jnp
from jax import lax


@flax.struct.dataclass
class DecoderInputs:
    """What the chunked loss reads in place of the logits: the head's hidden states and the decoder's
    tied table and bias, the params left where they live (the word table in the embeddings, output_bias
    in the head)."""

    hidden: jax.Array  # [B, P, E] in the compute dtype
    table: jax.Array  # [V, E] as stored
    bias: jax.Array  # [V]
    chunk: int = flax.struct.field(pytree_node=False)  # C

    def nll(self, labels):
        return chunked_nll(self.hidden, self.table, self.bias, labels, self.chunk)


def logits_nll(logits, labels):
    """The masked-LM loss per prediction from the logits (model.mlm_loss="logits").

    input   shape / dtype       meaning
    logits  [B, P, V] float     the head's logits at the P predicted positions (cast to float32 here)
    labels  [B, P] int          the original token ids (masked_lm_ids)
    Returns (NLL [B, P] float32, whether the argmax is the label [B, P] bool); unweighted.
    Example: nll, correct = logits_nll(mlm_logits, batch["masked_lm_ids"])
    """
    logits = logits.astype(jnp.float32)
    # The label's logit picked by a one-hot select rather than a gather: the gradient (softmax - one-hot)
    # is then one fused element-wise pass over [B, P, V] instead of a zero-filled buffer plus a scatter.
    is_label = jnp.arange(logits.shape[-1]) == labels[..., None]  # [B, P, V] bool
    label_logit = jnp.sum(jnp.where(is_label, logits, 0.0), axis=-1)  # [B, P]
    return jax.nn.logsumexp(logits, axis=-1) - label_logit, jnp.argmax(logits, axis=-1) == labels


def chunked_nll(x, table, bias, labels, chunk: int):
    """logits_nll of the logits x @ table.T + bias, computed C table rows at a time (model.mlm_loss="chunked").

    input   shape / dtype         meaning
    x       [B, P, E] compute     the head's hidden states; the table is cast to their dtype, chunk by
                                  chunk, and the products accumulate in float32, as MaskedLMHead's einsum
    table   [V, E] as stored      the tied word table (the decoder's weights)
    bias    [V]                   the decoder's output_bias
    labels  [B, P] int            the original token ids, in [0, V)
    chunk   int                   C, table rows per step (model.mlm_loss_chunk); more than V is taken as V
    Returns (NLL [B, P] float32, argmax == label [B, P] bool; a tie goes to the first index, as jnp.argmax).
    Example: nll, correct = chunked_nll(hidden, table, bias, batch["masked_lm_ids"], chunk=8192)
    The backward pass recomputes each chunk's logits rather than keeping them.
    """
    vocab = table.shape[0]
    if table.ndim != 2 or x.shape[-1] != table.shape[1] or bias.shape != (vocab,):
        raise ValueError(f"chunked_nll takes x [..., E], table [V, E] and bias [V]: got x {x.shape}, table "
                         f"{table.shape}, bias {bias.shape}")
    if chunk < 1:
        raise ValueError(f"chunked_nll: chunk={chunk} must be >= 1 (model.mlm_loss_chunk, 8192 by default)")
    return _chunked(min(int(chunk), vocab), x, table, bias, labels)


def _chunk_logits(x, table, bias, labels, k, chunk: int):
    """Chunk k's logits [B, P, C] float32, which of them is the label's [B, P, C] bool, the vocabulary id
    of its first row, and its table rows [C, E] in the compute dtype.

    The last chunk is the table's last C rows, overlapping the chunk before it where C does not divide V
    (no padded copy of the table): its logits at rows an earlier chunk already had are -inf, so that they
    neither count in the sum nor win the argmax, and their gradient is 0."""
    vocab = table.shape[0]
    start = jnp.minimum(k * chunk, vocab - chunk)
    rows = lax.dynamic_slice_in_dim(table, start, chunk).astype(x.dtype)  # [C, E]
    ids = start + jnp.arange(chunk)  # [C]
    logits = jnp.einsum("...e,ce->...c", x, rows, preferred_element_type=jnp.float32)  # [B, P, C]
    logits = logits + lax.dynamic_slice_in_dim(bias, start, chunk).astype(jnp.float32)
    fresh = ids >= k * chunk  # [C]
    is_label = (ids == labels[..., None]) & fresh  # [B, P, C]
    return jnp.where(fresh, logits, -jnp.inf), is_label, start, rows


def _num_chunks(table, chunk: int) -> int:
    return -(-table.shape[0] // chunk)  # K


def _forward(chunk: int, x, table, bias, labels):
    """(NLL, correct) and the largest logit and sum of exp(logit - largest) [B, P] each (for the backward),
    by an online logsumexp."""

    def step(carry, k):
        top, total, label_logit, best = carry  # [B, P] each: running max, sum of exp(logit - top), ...
        logits, is_label, start, _ = _chunk_logits(x, table, bias, labels, k, chunk)
        chunk_top = jnp.max(logits, axis=-1)
        new_top = jnp.maximum(top, chunk_top)
        total = total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(logits - new_top[..., None]), axis=-1)
        label_logit = label_logit + jnp.sum(jnp.where(is_label, logits, 0.0), axis=-1)
        # Strictly greater: on a tie the earlier chunk, the lower index, keeps it.
        best = jnp.where(chunk_top > top, (start + jnp.argmax(logits, axis=-1)).astype(jnp.int32), best)
        return (new_top, total, label_logit, best), None

    zeros = jnp.zeros(labels.shape, jnp.float32)
    init = (jnp.full(labels.shape, -jnp.inf, jnp.float32), zeros, zeros, jnp.zeros(labels.shape, jnp.int32))
    (top, total, label_logit, best), _ = lax.scan(step, init, jnp.arange(_num_chunks(table, chunk), dtype=jnp.int32))
    return (top + jnp.log(total) - label_logit, best == labels), (top, total)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked(chunk: int, x, table, bias, labels):
    return _forward(chunk, x, table, bias, labels)[0]


def _chunked_fwd(chunk: int, x, table, bias, labels):
    out, partition = _forward(chunk, x, table, bias, labels)
    return out, (x, table, bias, labels, partition)


def _chunked_bwd(chunk: int, residuals, cotangents):
    """d_x summed over the chunks; each chunk's rows of d_table and d_bias from its own (softmax - one-hot)."""
    x, table, bias, labels, (top, total) = residuals
    g = cotangents[0].astype(jnp.float32)  # [B, P]: the NLL's; the correct flags have none

    def step(carry, k):
        d_x, d_table, d_bias = carry
        logits, is_label, start, rows = _chunk_logits(x, table, bias, labels, k, chunk)
        # exp(logit - top) / total rather than exp(logit - logsumexp): the logsumexp's rounding (a few
        # units in its last place, large beside logits near 0) would reach every probability.
        probs = jnp.exp(logits - top[..., None]) / total[..., None]  # [B, P, C], 0 at rows an earlier chunk had
        d_logits = (probs - is_label) * g[..., None]  # [B, P, C] float32
        # The matmuls take the compute dtype and accumulate in float32, as the forward's.
        d_low = d_logits.astype(x.dtype)
        d_x = d_x + jnp.einsum("...c,ce->...e", d_low, rows, preferred_element_type=jnp.float32)
        d_rows = jnp.einsum("...c,...e->ce", d_low, x, preferred_element_type=jnp.float32)  # [C, E]
        # Added, not written: the overlapped rows of the last chunk hold an earlier chunk's gradient.
        d_table = lax.dynamic_update_slice_in_dim(
            d_table, lax.dynamic_slice_in_dim(d_table, start, chunk) + d_rows, start, axis=0)
        d_row_bias = jnp.sum(d_logits.reshape(-1, chunk), axis=0)  # [C]
        d_bias = lax.dynamic_update_slice_in_dim(
            d_bias, lax.dynamic_slice_in_dim(d_bias, start, chunk) + d_row_bias, start, axis=0)
        return (d_x, d_table, d_bias), None

    init = (jnp.zeros(x.shape, jnp.float32), jnp.zeros(table.shape, jnp.float32),
            jnp.zeros(bias.shape, jnp.float32))
    (d_x, d_table, d_bias), _ = lax.scan(step, init, jnp.arange(_num_chunks(table, chunk), dtype=jnp.int32))
    return d_x.astype(x.dtype), d_table.astype(table.dtype), d_bias.astype(bias.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)
