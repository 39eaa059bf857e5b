"""Attention: the head projections, rotary positions, the padding record, the kernels (XLA, cuDNN with
lengths or packed offsets, splash, blockwise) and SelfAttention, which picks one by the config and the row's
length.

Shape legend: as in models/bert.py (B batch, S sequence, H hidden, N heads, D head size, Q query rows,
K sequence slots of a packed row).
"""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.nn import dot_product_attention  # a module name, so that the tests can stand XLA in for cuDNN

from bertjax.models import blockwise, fp8
from bertjax.models.layers import Dropout, kernel_init, zeros_init


class HeadProjection(nn.Module):
    """A dense layer whose kernel keeps the head axes apart: [H, N, D] for q/k/v, [N, D, H] for the output.

    Written as an einsum rather than nn.DenseGeneral, which initialises a flattened 2-D kernel and so
    cannot carry the 3-axis logical names through a sharded init. Under model.matmul_dtype="fp8" the
    einsum is models/fp8.py's.
    """

    config: Any  # the encoder config (see the module docstring)
    kernel_shape: tuple
    kernel_names: tuple
    bias_rank: int  # the bias covers the last bias_rank axes of the kernel (the output features)
    equation: str

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        kernel, bias = head_params(self, cfg, self.kernel_shape, self.kernel_names, self.bias_rank)
        einsum = fp8.einsum if cfg.matmul_dtype == "fp8" else jnp.einsum
        if bias is None:
            x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=cfg.dtype)
            return einsum(self.equation, x, kernel)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.dtype)
        return einsum(self.equation, x, kernel) + bias


def head_params(module: nn.Module, cfg, kernel_shape: tuple, kernel_names: tuple, bias_rank: int):
    """(kernel, bias or None) declared in `module`'s scope: a head projection's params, the one place they
    are named and initialised (HeadProjection applies them, HeadParams hands them to the fused q/k/v)."""
    kernel = module.param("kernel", kernel_init(cfg, kernel_names), kernel_shape, cfg.param_dtype)
    if not cfg.use_bias:
        return kernel, None
    return kernel, module.param("bias", zeros_init(kernel_names[-bias_rank:]), kernel_shape[-bias_rank:],
                                cfg.param_dtype)


class HeadParams(nn.Module):
    """The kernel (and bias) of a HeadProjection, declared alike but not applied: what the fused q/k/v
    projection stacks (model.fused_qkv), so that its params are the unfused ones by name and shape."""

    config: Any  # the encoder config (see the module docstring)
    kernel_shape: tuple
    kernel_names: tuple
    bias_rank: int

    @nn.compact
    def __call__(self):
        return head_params(self, self.config, self.kernel_shape, self.kernel_names, self.bias_rank)


def rotary_tables(theta: float, positions, dim: int):
    """(cos, sin) of RoPE's angles position * theta^(-2d/D), each [B, S, 1, D] float32, for positions
    [B, S] int. Separate from rotary() so that a scanned stack computes them once, not per layer."""
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))  # [D/2]
    freqs = positions[..., None].astype(jnp.float32) * inv_freq  # [B, S, D/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, S, 1, D]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x, tables):
    """x: [B, S, N, D] turned by rotary_tables' (cos, sin), "rotate half" (non-interleaved) as GPT-NeoX
    and ModernBERT: the pairs (d, d + D/2). Computed in float32."""
    cos, sin = tables
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def rotary(x, theta: float, positions):
    """RoPE on x [B, S, N, D] at positions [B, S] int, with base theta."""
    return apply_rotary(x, rotary_tables(theta, positions, x.shape[-1]))


class Padding(NamedTuple):
    """Which keys each query may see, in the forms the attention kernels take.

    mask: [B, 1, 1, S] bool (one sequence per row: its real tokens) or [B, 1, S, S] (packed rows: the
      tokens of the query's own sequence, block-diagonal); lengths: [B] int32, real tokens per
      right-padded row, or None where the mask says more than padding; positions: None (0 .. S-1) or
      [B, S] int, each token's position in its own sequence (rotary angles, local windows); segments:
      [B, S] int, the sequence of each token (0 at padding), for kernels that take segment ids.
    """

    mask: Any
    lengths: Any
    positions: Any
    segments: Any = None  # [B, S] int: the sequence of each token, 0 at padding (the splash kernel's form)
    # Packed rows: [B, K] int, each sequence slot's [CLS] position; its static width K bounds the sequences
    # of a row, which cuDNN's packed form takes as offsets (packed_offsets). None for one sequence a row.
    slots: Any = None


def fused_attention(q, k, v, *, mask, kv_lengths, implementation: str):
    """softmax(q k^T / sqrt(D)) v over the keys a query may see, by jax.nn.dot_product_attention.

    q: [B, Q, N, D]; k, v: [B, S, N, D]; mask: [B, 1, 1 or Q, S] bool, True at keys a query may attend
    to; kv_lengths: None or [B] int32, the number of real keys of each row when padding is on the right
    and nothing else is masked. Given, the padding goes to the kernel as lengths (the form cuDNN's flash
    attention takes, which then skips padded blocks), else as the mask (which cuDNN adds as a bias).
    Sliding windows go as masks too: JAX's cuDNN call takes only a left (causal) window.
    """
    rows = q.shape[1]
    if implementation == "cudnn" and rows % 2:
        # JAX's cuDNN call refuses an odd number of query rows when differentiated (its check for a bias
        # counts the placeholder it passes for none), and the last layer's output rows, [CLS] and BERT's
        # 20 masked positions, are 21. One query row of zeros more, its output dropped, changes no other
        # row and adds no gradient.
        q = jnp.pad(q, ((0, 0), (0, 1), (0, 0), (0, 0)))
        if mask.shape[2] > 1:  # a mask per query: the new row repeats the last one's
            mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 1), (0, 0)), mode="edge")
        return fused_attention(q, k, v, mask=mask, kv_lengths=kv_lengths, implementation=implementation)[:, :rows]
    if kv_lengths is not None:
        return dot_product_attention(q, k, v, key_value_seq_lengths=kv_lengths, implementation=implementation)
    return dot_product_attention(q, k, v, mask=mask, implementation=implementation)


def packed_offsets(segments, num_slots: int):
    """(lengths [B, K], starts [B, K + 1]) int32 of the packed sequences 1 .. K of each row, from segments
    [B, S] (k at the k-th sequence's tokens, contiguous; 0 at padding): the form cuDNN's packed attention
    takes, -1 for an empty slot and after the last start."""
    ids = jnp.arange(1, num_slots + 1, dtype=segments.dtype)  # [K]
    member = segments[:, None, :] == ids[None, :, None]  # [B, K, S]
    lengths = jnp.sum(member, axis=-1, dtype=jnp.int32)  # [B, K]
    starts = jnp.argmax(member, axis=-1).astype(jnp.int32)  # [B, K]: the first token of each sequence
    lengths, starts = jnp.where(lengths > 0, lengths, -1), jnp.where(lengths > 0, starts, -1)
    return lengths, jnp.pad(starts, ((0, 0), (0, 1)), constant_values=-1)


def cudnn_packed_attention(q, k, v, lengths, starts):
    """Attention within each packed sequence by cuDNN's fused kernel, which skips the tiles that pair two
    sequences (a mask as a bias cannot). q, k, v: [B, S, N, D]; lengths [B, K], starts [B, K + 1] as
    packed_offsets gives them. JAX's public dot_product_attention has no packed form; its cuDNN module's
    own call does (q_offsets / kv_offsets)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # GPU-only, and private: loaded where used

    return cudnn.dot_product_attention(q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=starts,
                                       kv_offsets=starts, scale=float(1.0 / np.sqrt(q.shape[-1])),
                                       mask_type=cudnn.MaskType.PADDING)


def local_and_global_rotary_tables(cfg, positions):
    """(local, global) rotary_tables at positions [B or 1, S] int, each (cos, sin) [B or 1, S, 1, D]
    float32: what a scanned stack of alternating local and global layers computes once, each layer
    selecting one."""
    local = rotary_tables(cfg.rotary_theta, positions, cfg.head_dim)
    return local, rotary_tables(cfg.global_rotary_theta or cfg.rotary_theta, positions, cfg.head_dim)


def check_scores_available(attention_impl: str) -> None:
    """The scores before softmax exist only where attention is computed by XLA's einsums: the fused kernels
    never write them out."""
    if attention_impl != "xla":
        raise ValueError(f"model.attention_impl={attention_impl!r} never materialises the attention scores: set "
                         "model.attention_impl=xla for attention distillation")


class SelfAttention(nn.Module):
    """Multi-head self-attention with a padding mask and an output projection; optionally rotary
    positions on q and k and a sliding window (`local`: the layer is one of the local ones; or, in a
    scanned stack, the traced `is_local`)."""

    config: Any  # the encoder config (see the module docstring)
    deterministic: bool
    local: bool = False
    heads: int = 0  # N of this layer (fewer where pruning removed heads); 0: config.num_heads
    # Also return the scores before softmax [B, N, Q, S] (attention distillation): attention_impl="xla" only,
    # the one path that materialises them; the layer then attends through exactly those scores.
    output_scores: bool = False

    @nn.compact
    def __call__(self, x, padding, queries=None, rows=None, is_local=None, rope_tables=None, head_mask=None):
        # x: [B, S, H]; padding: Padding (mask [B, 1, 1, S] or, for packed rows, [B, 1, S, S] bool, True
        # at keys a query may attend to; lengths [B] int32 or None; positions [B, S] int or None).
        # queries: [B, Q, H] rows to compute outputs for (default x itself, Q = S), at row indices rows
        # [B, Q] int (default 0 .. S-1); keys and values always come from every position of x.
        # is_local: None (self.local decides) or a [] bool, this layer's kind in a scanned stack;
        # rope_tables: with is_local and rotary positions, local_and_global_rotary_tables(), of which it
        # selects one. head_mask: None or [N] float, each head's context multiplied by its entry.
        cfg = self.config
        queries = x if queries is None else queries
        if is_local is not None and (self.local or queries is not x
                                     or (cfg.position_embedding == "rotary" and rope_tables is None)):
            raise ValueError("SelfAttention: a traced is_local needs every query row, local=False and the "
                             "rope_tables of rotary positions")
        if self.output_scores:
            check_scores_available(cfg.attention_impl)
        q, k, v, query_positions, key_positions, mask = self._qkv(x, queries, padding, rows, is_local, rope_tables)
        if self.output_scores:
            if self.local or is_local is not None:
                mask = mask & self._band(query_positions, key_positions, is_local, x.shape[1])[:, None]
            context, scores = self._attend_with_scores(q, k, v, mask)
            return self._output(context, head_mask), scores
        impl = self._implementation(x.shape[1])
        if impl == "splash" and queries is x:
            # Segment ids and a static band, in the kernel's own form.
            from bertjax.models import splash  # Pallas' TPU kernel, slow to load: only splash attention needs it

            window = cfg.local_attention_window // 2 if (self.local or is_local is not None) else 0
            context = splash.splash_attention(q, k, v, padding.segments, half_window=window, is_local=is_local)
            return self._output(context, head_mask)
        if impl == "blockwise":
            return self._output(self._attend_blockwise(q, k, v, padding, rows, query_positions, key_positions,
                                                       is_local), head_mask)
        lengths = padding.lengths
        banded = mask
        if self.local or is_local is not None:
            banded = mask & self._band(query_positions, key_positions, is_local, x.shape[1])[:, None]  # [B, 1, Q, S]
            lengths = None  # no longer padding alone
        if impl == "cudnn" and padding.slots is not None and queries is x and not self.local:
            # Packed rows: the global layers attend within each sequence by offsets; cuDNN's window is a left
            # (causal) one, so the local layers' two-sided band still goes as a mask.
            packed = lambda: self._attend_packed(q, k, v, padding)  # noqa: E731
            if is_local is None:
                return self._output(packed(), head_mask)
            context = jax.lax.cond(is_local, lambda: self._attend(q, k, v, banded, None, impl), packed)
            return self._output(context, head_mask)
        return self._output(self._attend(q, k, v, banded, lengths, impl), head_mask)

    def _implementation(self, length: int) -> str:
        """The attention kernel for rows of `length` tokens: model.attention_impl, or blockwise from
        model.blockwise_from tokens on (scores for distillation are XLA's at any length)."""
        cfg = self.config
        if cfg.blockwise_from and length >= cfg.blockwise_from and not self.output_scores:
            return "blockwise"
        return cfg.attention_impl

    def _project(self, name: str, source):
        """source [B, S, H] -> [B, S, N, D] by the projection `name` (query, key or value)."""
        cfg = self.config
        return HeadProjection(
            cfg, (cfg.hidden_size, self.heads or cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"), 2,
            "bsh,hnd->bsnd", name=name,
        )(source)

    def _project_fused(self, x, queries):
        """q [B, Q, N, D], k, v [B, S, N, D] by one matmul with the kernels stacked [H, 3, N, D] (k and v by
        one [H, 2, N, D] where the queries are other rows than x): one kernel launch instead of three, while
        the params stay the three kernels query, key and value that checkpoints name."""
        cfg = self.config
        shape = (cfg.hidden_size, self.heads or cfg.num_heads, cfg.head_dim)
        kernels, biases = zip(*(HeadParams(cfg, shape, ("embed", "heads", "kv"), 2, name=name)()
                                for name in ("query", "key", "value")))

        # Under model.matmul_dtype="fp8" the one matmul has one scaling state (its own, not the three's).
        einsum = fp8.einsum if cfg.matmul_dtype == "fp8" else jnp.einsum

        def project(source, which: slice):
            kernel = jnp.stack(kernels[which], axis=1)  # [H, K, N, D], K of q, k, v
            source, kernel = nn.dtypes.promote_dtype(source, kernel, dtype=cfg.dtype)
            out = einsum("bsh,hknd->bsknd", source, kernel)  # [B, S, K, N, D]
            if cfg.use_bias:
                out = out + jnp.stack(biases[which]).astype(out.dtype)  # [K, N, D]
            return [out[:, :, i] for i in range(out.shape[2])]

        if queries is x:
            return tuple(project(x, slice(0, 3)))
        return (*project(queries, slice(0, 1)), *project(x, slice(1, 3)))

    def _qkv(self, x, queries, padding, rows, is_local, rope_tables):
        """q [B, Q, N, D] and k, v [B, S, N, D] (rotary positions applied), the positions of the query rows
        [B, Q] and of the keys [B, S], and the mask of the query rows."""
        mask, positions = padding.mask, padding.positions
        if self.config.fused_qkv:
            q, k, v = self._project_fused(x, queries)
        else:
            q = self._project("query", queries)  # [B, Q, N, D]
            k, v = self._project("key", x), self._project("value", x)  # each [B, S, N, D]
        # Each token's position in its own sequence (packed rows restart at 0), at the keys and the queries.
        key_positions = jnp.broadcast_to(jnp.arange(x.shape[1]) if positions is None else positions, x.shape[:2])
        query_positions = key_positions
        if rows is not None:
            query_positions = jnp.take_along_axis(key_positions, rows, axis=1)  # [B, Q]
            if mask.shape[2] > 1:  # a mask per query (packed rows): the rows' own
                mask = jnp.take_along_axis(mask, rows[:, None, :, None], axis=2)  # [B, 1, Q, S]
        q, k = self._rotate(q, k, query_positions, key_positions, is_local, rope_tables)
        q = checkpoint_name(nn.with_logical_constraint(q, ("batch", "length", "heads", "kv")), "qkv")
        k = checkpoint_name(nn.with_logical_constraint(k, ("batch", "length", "heads", "kv")), "qkv")
        v = checkpoint_name(nn.with_logical_constraint(v, ("batch", "length", "heads", "kv")), "qkv")
        return q, k, v, query_positions, key_positions, mask

    def _rotate(self, q, k, query_positions, key_positions, is_local, rope_tables):
        """q and k turned by their positions where the model's positions are rotary."""
        cfg = self.config
        if cfg.position_embedding != "rotary":
            return q, k
        if is_local is None:
            # Local layers (and every layer when global_rotary_theta is 0) turn at rotary_theta.
            theta = cfg.rotary_theta if self.local else (cfg.global_rotary_theta or cfg.rotary_theta)
            return rotary(q, theta, query_positions), rotary(k, theta, key_positions)
        # One of the two tables the stack computed once.
        tables = jax.tree_util.tree_map(lambda a, b: jnp.where(is_local, a, b), *rope_tables)
        return apply_rotary(q, tables), apply_rotary(k, tables)

    def _band(self, query_positions, key_positions, is_local, length: int):
        """[B, Q, S] bool: |query - key| <= window / 2 in positions, and [CLS] with model.global_cls
        (blockwise.within_reach; within one sequence positions are its offsets, across sequences the mask
        already says no). A traced is_local widens it to everything on global layers: an iota compare that
        XLA fuses into the masking."""
        half = self.config.local_attention_window // 2
        reach = half if is_local is None else jnp.where(is_local, half, length)
        return blockwise.within_reach(query_positions, key_positions, reach, self.config.global_cls)

    def _attend_blockwise(self, q, k, v, padding, rows, query_positions, key_positions, is_local):
        """The context [B, Q, N, D] by models/blockwise.py: the masks of its tiles from the segment ids and
        positions (a local layer's reach window / 2; a traced is_local widens it to the row on global layers)."""
        cfg = self.config
        reach = None
        if self.local or is_local is not None:
            half = cfg.local_attention_window // 2
            reach = half if is_local is None else jnp.where(is_local, half, key_positions.shape[1])
        segments = padding.segments  # [B, S]
        query_segments = segments if rows is None else jnp.take_along_axis(segments, rows, axis=1)  # [B, Q]
        return blockwise.blockwise_attention(q, k, v, query_segments, segments, query_positions, key_positions,
                                             reach=reach, block_size=cfg.attention_block_size,
                                             global_first=cfg.global_cls and reach is not None)

    def _attend_packed(self, q, k, v, padding):
        """The context [B, S, N, D] of packed rows by cuDNN's packed form (cudnn_packed_attention), zero at
        padding: no sequence owns those rows, and a kernel may leave them unwritten."""
        lengths, starts = packed_offsets(padding.segments, padding.slots.shape[1])
        context = cudnn_packed_attention(q, k, v, lengths, starts)
        return jnp.where((padding.segments > 0)[:, :, None, None], context, 0).astype(q.dtype)

    def _attend(self, q, k, v, mask, lengths, impl: str):
        """The context [B, Q, N, D]: softmax(q k^T / sqrt(D)) v over the keys the mask lets each query see,
        by the kernel `impl`."""
        cfg = self.config
        if self.deterministic or cfg.attention_dropout_rate == 0.0:
            use_lengths = impl == "cudnn" and lengths is not None
            # The last layer's few query rows (output_rows) take XLA's form under splash: its tiles need all S.
            return fused_attention(q, k, v, mask=mask, kv_lengths=lengths if use_lengths else None,
                                   implementation="xla" if impl == "splash" else impl)
        # jax.nn.dot_product_attention has no dropout on the attention probabilities, which BERT
        # trains with (rate 0.1); this is the same computation with the dropout in the middle.
        logits = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)  # [B, N, Q, S]
        logits = logits / np.sqrt(cfg.head_dim).astype(np.float32)
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(cfg.dtype)
        probs = Dropout(cfg.attention_dropout_rate)(probs, deterministic=False)
        return jnp.einsum("bnqk,bknd->bqnd", probs, v)  # [B, Q, N, D]

    def _attend_with_scores(self, q, k, v, mask):
        """(context [B, Q, N, D], scores [B, N, Q, S] float32): the scaled q.k, the keys a query may not see
        at float32's lowest value (as _attend's own masking), and the context computed from exactly them."""
        cfg = self.config
        scores = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)  # [B, N, Q, S]
        scores = scores / np.sqrt(cfg.head_dim).astype(np.float32)
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
        if not self.deterministic and cfg.attention_dropout_rate > 0.0:
            probs = Dropout(cfg.attention_dropout_rate)(probs, deterministic=False)
        return jnp.einsum("bnqk,bknd->bqnd", probs, v), scores

    def _output(self, context, head_mask):
        cfg = self.config
        if head_mask is not None:  # as transformers' head_mask: a multiplier on each head's attention output
            context = context * head_mask.astype(context.dtype)[:, None]  # [N, 1] on [B, Q, N, D]
        context = checkpoint_name(nn.with_logical_constraint(context, ("batch", "length", "heads", "kv")), "context")
        out = HeadProjection(
            cfg, (self.heads or cfg.num_heads, cfg.head_dim, cfg.hidden_size), ("heads", "kv", "embed"), 1,
            "bsnd,ndh->bsh", name="output",
        )(context)  # [B, Q, H]
        return checkpoint_name(nn.with_logical_constraint(out, ("batch", "length", "hidden")), "attention_out")
