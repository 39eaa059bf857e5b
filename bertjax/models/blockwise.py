"""Self-attention over blocks of keys and queries, in memory linear in the sequence: model.attention_impl=
"blockwise", for any platform (CPUs with long packed rows are what it is for).

Each block of queries walks the blocks of keys with the online-softmax recurrence (Rabe & Staats 2021,
"Self-attention does not need O(n^2) memory"; Dao et al. 2022, FlashAttention): a running maximum and
running sum per query rescale what was accumulated before a block whose logits are larger. Only a
[Bq, Bk] tile of logits exists at a time, and the mask of a tile is computed from the segment ids and
positions of its rows and columns, never as an [S, S] array. A tile whose mask is empty (another packed
sequence, padding, outside a local window) is skipped by `lax.cond`, so packed rows of short sequences
and ModernBERT's local layers cost about the tiles they need.

The backward pass is FlashAttention's, by a custom VJP: the forward pass keeps only its output and the
log-sum-exp of each query row, and the backward pass recomputes each tile's probabilities from them
(one more q k^T per tile), accumulating dq per query block and dk, dv over the query blocks. Nothing
[S, S] is stored or built in either direction; autodiff through the scans instead (with jax.checkpoint
to bound what they keep) would recompute the forward pass twice.

No attention-probability dropout (models/config.py refuses a rate above 0 with it), as cuDNN and splash.

Shapes: B batch, Q query rows, S sequence (keys), N heads, D head size; Bq, Bk the query and key block
sizes, Nq, Nk the number of query and key blocks.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

MASKED = np.float32(np.finfo(np.float32).min)  # the logit of a key a query may not see
NO_WINDOW = np.iinfo(np.int32).max  # the reach of full attention


def _blocks(x, block: int, count: int):
    """x [B, L, ...] zero-padded to count * block rows and split: [count, B, block, ...]."""
    pad = count * block - x.shape[1]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((x.shape[0], count, block) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _unblock(x, length: int):
    """[count, B, block, ...] -> [B, length, ...]: _blocks undone."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])[:, :length]


def within_reach(q_pos, k_pos, reach, global_first: bool):
    """[B, Q, K] bool: |query - key| <= reach in positions ([B, Q], [B, K] int); with global_first, also
    wherever either of the two is the first of its sequence (position 0: Longformer's global [CLS]). The
    one definition of a local layer's window, for the dense masks and for the tiles here alike."""
    near = jnp.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= reach
    if global_first:
        near = near | (q_pos == 0)[:, :, None] | (k_pos == 0)[:, None, :]
    return near


def _allowed(q_seg, q_pos, k_seg, k_pos, reach, global_first: bool):
    """[B, 1, Bq, Bk] bool: the query's own sequence (not padding) and within_reach."""
    same = (q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] > 0)
    return (same & within_reach(q_pos, k_pos, reach, global_first))[:, None]


def _logits(qb, kb, allowed):
    """[B, N, Bq, Bk] float32: q k^T / sqrt(D), MASKED where a key is not allowed."""
    logits = jnp.einsum("bqnd,bknd->bnqk", qb, kb, preferred_element_type=jnp.float32)
    return jnp.where(allowed, logits * np.float32(1.0 / np.sqrt(qb.shape[-1])), MASKED)


def _forward(q, k, v, q_seg, k_seg, q_pos, k_pos, reach, block_size: int, global_first: bool):
    """(context [B, Q, N, D] in q's dtype, log-sum-exp [B, N, Q] float32; 0 for a query that sees no key)."""
    batch, num_queries, num_heads, head_dim = q.shape
    q_block, k_block = min(block_size, num_queries), min(block_size, k.shape[1])
    q_count, k_count = -(-num_queries // q_block), -(-k.shape[1] // k_block)
    # Padded rows are segment 0, so the masks drop them like padding.
    queries = [_blocks(a, q_block, q_count) for a in (q, q_seg, q_pos)]  # [Nq, B, Bq, N, D], [Nq, B, Bq] x 2
    keys = [_blocks(a, k_block, k_count) for a in (k, v, k_seg, k_pos)]  # [Nk, B, Bk, N, D] x 2, [Nk, B, Bk] x 2

    def query_block(rows):
        qb, q_seg, q_pos = rows

        def key_step(carry, key_rows):
            kb, vb, k_seg, k_pos = key_rows
            allowed = _allowed(q_seg, q_pos, k_seg, k_pos, reach, global_first)

            def fold(carry):
                top, total, acc = carry  # [B, N, Bq], [B, N, Bq], [B, N, Bq, D]: max, sum, weighted values
                logits = _logits(qb, kb, allowed)
                new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
                # The where (not only MASKED) keeps a row that has seen no key at weight 0.
                weights = jnp.where(allowed, jnp.exp(logits - new_top[..., None]), 0.0)
                rescale = jnp.exp(top - new_top)
                acc = acc * rescale[..., None] + jnp.einsum("bnqk,bknd->bnqd", weights.astype(vb.dtype), vb,
                                                            preferred_element_type=jnp.float32)
                return new_top, total * rescale + jnp.sum(weights, axis=-1), acc

            return jax.lax.cond(jnp.any(allowed), fold, lambda c: c, carry), None

        shape = (batch, num_heads, q_block)
        init = (jnp.full(shape, MASKED), jnp.zeros(shape, jnp.float32), jnp.zeros(shape + (head_dim,), jnp.float32))
        top, total, acc = jax.lax.scan(key_step, init, keys)[0]
        seen = total > 0
        context = acc / jnp.where(seen, total, 1.0)[..., None]
        return jnp.swapaxes(context, 1, 2).astype(q.dtype), jnp.where(seen, top + jnp.log(total), 0.0)

    context, lse = jax.lax.map(query_block, queries)  # [Nq, B, Bq, N, D], [Nq, B, N, Bq]
    return _unblock(context, num_queries), jnp.moveaxis(_unblock(jnp.moveaxis(lse, 3, 2), num_queries), 1, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _attention(q, k, v, q_seg, k_seg, q_pos, k_pos, reach, block_size, global_first):
    return _forward(q, k, v, q_seg, k_seg, q_pos, k_pos, reach, block_size, global_first)[0]


def _attention_fwd(q, k, v, q_seg, k_seg, q_pos, k_pos, reach, block_size, global_first):
    context, lse = _forward(q, k, v, q_seg, k_seg, q_pos, k_pos, reach, block_size, global_first)
    return context, (q, k, v, q_seg, k_seg, q_pos, k_pos, reach, context, lse)


def _attention_bwd(block_size, global_first, residuals, grad):
    """FlashAttention's backward pass: per tile, the probabilities from the saved log-sum-exp, then dv, dp,
    ds = p (dp - rowsum(dO * O)), dq and dk; dq summed over the key blocks, dk and dv over the query blocks."""
    q, k, v, q_seg, k_seg, q_pos, k_pos, reach, context, lse = residuals
    num_queries, seq_len, head_dim = q.shape[1], k.shape[1], q.shape[-1]
    q_block, k_block = min(block_size, num_queries), min(block_size, seq_len)
    q_count, k_count = -(-num_queries // q_block), -(-seq_len // k_block)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    delta = jnp.einsum("bqnd,bqnd->bnq", grad.astype(jnp.float32), context.astype(jnp.float32))  # [B, N, Q]
    row_stats = [jnp.swapaxes(a, 1, 2) for a in (lse, delta)]  # [B, Q, N] each, blocked by rows below
    queries = [_blocks(a, q_block, q_count) for a in (q, q_seg, q_pos, grad, *row_stats)]
    keys = [_blocks(a, k_block, k_count) for a in (k, v, k_seg, k_pos)]

    def query_block(dkv, rows):
        qb, q_seg, q_pos, gb, lse_b, delta_b = rows
        lse_b, delta_b = (jnp.swapaxes(a, 1, 2)[..., None] for a in (lse_b, delta_b))  # [B, N, Bq, 1]

        def key_step(dq, key_rows):
            kb, vb, k_seg, k_pos = key_rows
            allowed = _allowed(q_seg, q_pos, k_seg, k_pos, reach, global_first)

            def tile(dq):
                probs = jnp.where(allowed, jnp.exp(_logits(qb, kb, allowed) - lse_b), 0.0)  # [B, N, Bq, Bk]
                dv = jnp.einsum("bnqk,bqnd->bknd", probs, gb, preferred_element_type=jnp.float32)
                dprobs = jnp.einsum("bqnd,bknd->bnqk", gb, vb, preferred_element_type=jnp.float32)
                dlogits = probs * (dprobs - delta_b) * scale
                dq = dq + jnp.einsum("bnqk,bknd->bqnd", dlogits, kb, preferred_element_type=jnp.float32)
                return dq, jnp.einsum("bnqk,bqnd->bknd", dlogits, qb, preferred_element_type=jnp.float32), dv

            zeros = jnp.zeros(kb.shape, jnp.float32)
            dq, dk, dv = jax.lax.cond(jnp.any(allowed), tile, lambda dq: (dq, zeros, zeros), dq)
            return dq, (dk, dv)

        dq, (dk, dv) = jax.lax.scan(key_step, jnp.zeros(qb.shape, jnp.float32), keys)  # dk, dv [Nk, B, Bk, N, D]
        return (dkv[0] + dk, dkv[1] + dv), dq

    zeros = jnp.zeros(keys[0].shape, jnp.float32)
    (dk, dv), dq = jax.lax.scan(query_block, (zeros, zeros), queries)
    return (_unblock(dq, num_queries).astype(q.dtype), _unblock(dk, seq_len).astype(k.dtype),
            _unblock(dv, seq_len).astype(v.dtype), None, None, None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def blockwise_attention(q, k, v, query_segments, key_segments, query_positions, key_positions, *, reach=None,
                        block_size: int = 512, global_first: bool = False):
    """softmax(q k^T / sqrt(D)) v over the keys of each query's own sequence (and window), block by block.

    q: [B, Q, N, D]; k, v: [B, S, N, D]; query_segments [B, Q], key_segments [B, S] int: the sequence each
    token belongs to, 0 at padding (a query sees the keys of its own sequence > 0: padding sees nothing
    and its output is 0); query_positions [B, Q], key_positions [B, S] int: positions within the
    sequences, read only with `reach`; reach: None (no window), or an int or traced [] int, the largest
    |query - key| in positions a query sees (ModernBERT's local layers: window / 2). block_size: the
    rows of a query block and of a key block (Q and S need not be multiples of it). Returns [B, Q, N, D]
    in q's dtype; the logits, the running statistics and the sums are float32. global_first: the first
    token of each sequence (position 0) sees its whole sequence and is seen by all of it, whatever the
    reach (Longformer's global attention for [CLS]).
    """
    reach = jnp.asarray(NO_WINDOW if reach is None else reach, jnp.int32)
    ints = [jnp.asarray(a, jnp.int32) for a in (query_segments, key_segments, query_positions, key_positions)]
    return _attention(q, k, v, *ints, reach, block_size, global_first)
