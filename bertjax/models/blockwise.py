"""Self-attention over blocks of keys and queries, in memory linear in the sequence: model.attention_impl=
"blockwise", for any platform (CPUs with long packed rows are what it is for).

Each block of queries walks the blocks of keys with the online-softmax recurrence (Rabe & Staats 2021,
"Self-attention does not need O(n^2) memory"; Dao et al. 2022, FlashAttention): a running maximum and
running sum per query rescale what was accumulated before a block whose logits are larger. Only a
[Bq, Bk] tile of logits exists at a time, and the mask of a tile is computed from the segment ids and
positions of its rows and columns, never as an [S, S] array. A tile whose mask is empty (another packed
sequence, padding, outside a local window) is skipped by `lax.cond`, so packed rows of short sequences
and ModernBERT's local layers cost about the tiles they need.

The backward pass recomputes instead of storing: `jax.checkpoint` around the work of one query block
(its residuals are then its inputs) and around the step of one key block (its residuals are the running
statistics, [Bq, N, D + 2] per key block). The gradient of one query block is taken at a time, so the
backward pass, too, holds O(S x block) per head. This costs the attention's forward matmuls twice more
than a stored [S, S]; a custom VJP with FlashAttention's backward would save one of the two.

No attention-probability dropout (models/config.py refuses a rate above 0 with it), as cuDNN and splash.

Shapes: B batch, Q query rows, S sequence (keys), N heads, D head size; Bq, Bk the query and key block
sizes, Nq, Nk the number of query and key blocks.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _blocks(x, block: int, count: int):
    """x [B, L, ...] zero-padded to count * block rows and split: [count, B, block, ...]."""
    pad = count * block - x.shape[1]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((x.shape[0], count, block) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def blockwise_attention(q, k, v, query_segments, key_segments, query_positions, key_positions, *, reach=None,
                        block_size: int = 512):
    """softmax(q k^T / sqrt(D)) v over the keys of each query's own sequence (and window), block by block.

    q: [B, Q, N, D]; k, v: [B, S, N, D]; query_segments [B, Q], key_segments [B, S] int: the sequence each
    token belongs to, 0 at padding (a query sees the keys of its own sequence > 0: padding sees nothing
    and its output is 0); query_positions [B, Q], key_positions [B, S] int: positions within the
    sequences, read only with `reach`; reach: None (no window), or an int or traced [] int, the largest
    |query - key| in positions a query sees (ModernBERT's local layers: window / 2). block_size: the
    rows of a query block and of a key block (Q and S need not be multiples of it). Returns [B, Q, N, D]
    in q's dtype; the logits, the running statistics and the sums are float32.
    """
    batch, num_queries, num_heads, head_dim = q.shape
    seq_len = k.shape[1]
    q_block, k_block = min(block_size, num_queries), min(block_size, seq_len)
    q_count, k_count = -(-num_queries // q_block), -(-seq_len // k_block)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    # Blocks of rows: padded rows are segment 0, so the masks drop them like padding.
    queries = (_blocks(q, q_block, q_count), _blocks(query_segments, q_block, q_count),
               _blocks(query_positions, q_block, q_count))  # [Nq, B, Bq, N, D], [Nq, B, Bq] x 2
    keys = (_blocks(k, k_block, k_count), _blocks(v, k_block, k_count), _blocks(key_segments, k_block, k_count),
            _blocks(key_positions, k_block, k_count))  # [Nk, B, Bk, N, D] x 2, [Nk, B, Bk] x 2
    masked = np.float32(jnp.finfo(jnp.float32).min)

    def key_step(q_rows, carry, key_rows):
        """One key block folded into the running (max, sum, weighted values) of one query block."""
        qb, q_seg, q_pos = q_rows
        kb, vb, k_seg, k_pos = key_rows
        allowed = (q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] > 0)  # [B, Bq, Bk]
        if reach is not None:
            allowed = allowed & (jnp.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= reach)
        allowed = allowed[:, None]  # [B, 1, Bq, Bk]

        def fold(carry):
            top, total, acc = carry  # [B, N, Bq], [B, N, Bq], [B, N, Bq, D]
            logits = jnp.einsum("bqnd,bknd->bnqk", qb, kb, preferred_element_type=jnp.float32) * scale
            logits = jnp.where(allowed, logits, masked)  # [B, N, Bq, Bk]
            new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
            # The where (not only the masked value) keeps a row with no key yet at weight 0.
            weights = jnp.where(allowed, jnp.exp(logits - new_top[..., None]), 0.0)
            rescale = jnp.exp(top - new_top)
            total = total * rescale + jnp.sum(weights, axis=-1)
            acc = acc * rescale[..., None] + jnp.einsum("bnqk,bknd->bnqd", weights.astype(vb.dtype), vb,
                                                        preferred_element_type=jnp.float32)
            return new_top, total, acc

        return jax.lax.cond(jnp.any(allowed), fold, lambda c: c, carry), None

    def query_block(q_rows):
        """The context of one query block: [B, N, Bq, D] float32."""
        shape = (batch, num_heads, q_block)
        init = (jnp.full(shape, masked), jnp.zeros(shape, jnp.float32), jnp.zeros(shape + (head_dim,), jnp.float32))
        step = jax.checkpoint(lambda carry, key_rows: key_step(q_rows, carry, key_rows))
        _, total, acc = jax.lax.scan(step, init, keys)[0]
        return acc / jnp.where(total > 0, total, 1.0)[..., None]

    context = jax.lax.map(jax.checkpoint(query_block), queries)  # [Nq, B, N, Bq, D]
    context = jnp.moveaxis(context, 0, 2).reshape(batch, num_heads, q_count * q_block, head_dim)
    return jnp.swapaxes(context[:, :, :num_queries], 1, 2).astype(q.dtype)  # [B, Q, N, D]
