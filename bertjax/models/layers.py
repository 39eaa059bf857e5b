"""The building blocks of the encoders: embeddings, feed-forward, and the dropout, initializers, dense and
LayerNorm layers they are made of (attention is models/attention.py; the block and the stack, models/bert.py).

Each block takes the encoder's config (models/bert.py's BertConfig, or a family's config with the same
fields) and reads only the fields it needs, so that a family (RoBERTa, ALBERT, ModernBERT) can be an
option of these blocks rather than a copy of them. Every parameter carries logical axis names, and the
key activations logical constraints and the checkpoint names the remat policies save.

Shape legend: as in models/bert.py (B batch, S sequence, H hidden, N heads, D head size, F feed-forward,
V vocabulary, T segment vocabulary, Q query rows).
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from bertjax.models import fp8


def truncated_normal_init(stddev: float):
    """BERT's initializer: normal(0, stddev) cut at two standard deviations (tf.truncated_normal).

    jax.nn.initializers.truncated_normal rescales so that the *truncated* distribution has `stddev`;
    the original does not, so we draw the unit truncated normal and scale it ourselves.
    """

    def init(key, shape, dtype=jnp.float32):
        return stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)

    return init


def kernel_init(cfg, names):
    return nn.with_logical_partitioning(truncated_normal_init(cfg.initializer_range), names)


def zeros_init(names):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


# torch.nn.LayerNorm's default epsilon, at which transformers' MobileBERT leaves two of its norms (the
# embeddings' and each block's feed-forward output's: it passes layer_norm_eps to the others only).
TORCH_LAYER_NORM_EPS = 1e-5


class NoNorm(nn.Module):
    """MobileBERT's NoNorm: x * scale + bias per feature, without a mean or a variance."""

    use_bias: bool
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x):
        width = (x.shape[-1],)
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)), width,
                           self.param_dtype)
        if not self.use_bias:
            x, scale = nn.dtypes.promote_dtype(x, scale, dtype=self.dtype)
            return x * scale
        bias = self.param("bias", zeros_init(("embed",)), width, self.param_dtype)
        x, scale, bias = nn.dtypes.promote_dtype(x, scale, bias, dtype=self.dtype)
        return x * scale + bias


def layer_norm(cfg, name: str, eps: float | None = None, norm: str | None = None) -> nn.Module:
    """The encoder's norm (`norm` if given, else model.norm): LayerNorm (BERT; without bias for ModernBERT,
    use_bias=False), RMSNorm or MobileBERT's NoNorm; eps: an epsilon other than model.layer_norm_eps."""
    scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
    eps = cfg.layer_norm_eps if eps is None else eps
    norm = norm or cfg.norm
    if norm == "no_norm":
        return NoNorm(cfg.use_bias, cfg.dtype, cfg.param_dtype, name=name)
    if norm == "rmsnorm":
        return nn.RMSNorm(epsilon=eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                          scale_init=scale_init, name=name)
    return nn.LayerNorm(
        epsilon=eps,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        # The exact two-pass variance, as BERT computes it; E[x^2]-E[x]^2 loses digits.
        use_fast_variance=False,
        use_bias=cfg.use_bias,
        scale_init=scale_init,
        bias_init=zeros_init(("embed",)),
        name=name,
    )


def dense(cfg, features: int, names, name: str, use_bias: bool | None = None) -> nn.Dense:
    """nn.Dense with BERT's initializers; under model.matmul_dtype="fp8" its matmul is models/fp8.py's."""
    return nn.Dense(
        features,
        use_bias=cfg.use_bias if use_bias is None else use_bias,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=kernel_init(cfg, names),
        bias_init=zeros_init(names[-1:]),
        dot_general_cls=fp8.dot_general_cls(cfg, features),
        name=name,
    )


def activation(name: str):
    """BERT's exact (erf) GELU, the tanh approximation ALBERT's checkpoints use ("gelu_new"), or MobileBERT's
    ReLU."""
    if name == "relu":
        return nn.relu
    return lambda x: nn.gelu(x, approximate=(name == "gelu_tanh"))


# Dropout draws one 16-bit uniform per element, two from each 32-bit threefry word: half the random-bit
# work of nn.Dropout's 32-bit draws (docs/performance.md), with the rate
# resolved to 1/65536 (0.1 -> 0.100006). The bits of an element depend only on the key and its index,
# so masks do not change with the mesh (jax's partitionable threefry).
DROPOUT_BITS = 16


def dropout_keep_mask(rng, shape: tuple, rate: float):
    """Bool mask of `shape`, True with probability 1 - rate (to 1/65536), from half as many 32-bit words."""
    threshold = np.uint32(round(rate * 2**DROPOUT_BITS))
    if shape[-1] % 2:
        words = jax.random.bits(rng, shape, jnp.uint32)
        return (words >> DROPOUT_BITS) >= threshold
    words = jax.random.bits(rng, (*shape[:-1], shape[-1] // 2), jnp.uint32)
    low, high = words & np.uint32(2**DROPOUT_BITS - 1), words >> DROPOUT_BITS
    return jnp.concatenate([low, high], axis=-1) >= threshold


class Dropout(nn.Module):
    """Inverted dropout (kept values scaled by 1 / (1 - rate)), as nn.Dropout, with 16-bit draws."""

    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0:
            return jnp.zeros_like(x)
        keep = dropout_keep_mask(self.make_rng("dropout"), x.shape, self.rate)
        return jnp.where(keep, x / (1.0 - self.rate), 0).astype(x.dtype)


class Embeddings(nn.Module):
    """Token + segment + learned position embeddings, summed, LayerNorm, dropout.

    Only the word embedding is looked up by index. The position rows are a slice of their table and the
    segment rows a select between the table's rows: the gradient of a gather is a scatter-add, and with
    every sequence of the batch reading the same position and segment rows those updates collide on a
    handful of rows (slow on GPUs). The word embedding is a gather, or with word_embedding="one_hot" a
    one-hot matmul whose gradient is a matmul too.

    Packed rows (several sequences per row) give `position_ids`, each token's position in its own
    sequence: the position rows are then gathered, the one case where a scatter-add gradient is due.

    Family options: no position table (position_embedding "rotary" or "none": positions enter in the
    attention), positions from position_offset (RoBERTa's start after [PAD]'s id), no segment table
    (type_vocab_size 0), and ALBERT's factorised tables of width E = embedding_size, projected to H
    once at the end. MobileBERT's (model.block="mobilebert"): only the word table is E wide, its rows
    (with trigram_input: [next, token, previous], 3E) projected to H before the H-wide position and segment
    rows are added.
    """

    config: Any  # the encoder config (see the module docstring)

    def setup(self):
        cfg = self.config
        width = cfg.embedding_width
        mobile = cfg.block == "mobilebert"
        embed = lambda n, names, width=width: nn.Embed(  # noqa: E731
            n,
            width,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            embedding_init=kernel_init(cfg, names),
        )
        self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"))
        table_width = cfg.hidden_size if mobile else width  # of the position and segment tables
        if cfg.position_embedding == "learned":
            self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"), table_width)
        if cfg.type_vocab_size > 0:
            self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"), table_width)
        self.layer_norm = layer_norm(cfg, "layer_norm", eps=TORCH_LAYER_NORM_EPS if mobile else None)
        self.dropout = Dropout(cfg.hidden_dropout_rate)
        if projects_words(cfg):  # MobileBERT: E or 3E -> H, first
            self.word_projection = dense(cfg, cfg.hidden_size, (None, "embed"), "word_projection")
        elif width != cfg.hidden_size and not mobile:  # ALBERT: E -> H, once, last
            self.projection = dense(cfg, cfg.hidden_size, (None, "embed"), "projection")

    def __call__(self, input_ids, segment_ids, deterministic: bool, position_ids=None):
        # input_ids, segment_ids: [B, S] int; position_ids: None (0 .. S-1) or [B, S] int (packed rows)
        x = self.embed(input_ids, segment_ids, deterministic, position_ids)  # [B, S, E] (MobileBERT: H)
        if self.config.embedding_width != self.config.hidden_size and self.config.block != "mobilebert":
            x = self.projection(x)  # [B, S, H]
        return nn.with_logical_constraint(x, ("batch", "length", "hidden"))

    def embed(self, input_ids, segment_ids, deterministic: bool, position_ids=None):
        """The tables' sum, normed and dropped out, E wide, before any projection: what ELECTRA's
        generator reads from its discriminator's embeddings and projects to its own width (MobileBERT's:
        H wide, its words projected first)."""
        cfg = self.config
        seq_len = input_ids.shape[1]
        if seq_len + cfg.position_offset > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} (+ model.position_offset={cfg.position_offset}) exceeds "
                f"model.max_position_embeddings={cfg.max_position_embeddings}: shorten data.max_seq_length"
            )
        words = self.word_embeddings.embedding.astype(cfg.dtype)  # [V, E]
        if cfg.word_embedding == "one_hot":
            one_hot = jax.nn.one_hot(input_ids, cfg.vocab_size, dtype=cfg.dtype)  # [B, S, V]
            # HIGHEST keeps float32 exact (one product per output); 16-bit products are exact anyway.
            x = jnp.einsum("bsv,vh->bsh", one_hot, words, precision=jax.lax.Precision.HIGHEST)
        else:
            x = jnp.take(words, input_ids, axis=0)  # [B, S, E]
        if cfg.trigram_input:
            x = trigram(x, words[0], position_ids)  # [B, S, 3E]
        if projects_words(cfg):
            x = self.word_projection(x)  # [B, S, H]
        if cfg.position_embedding == "learned":
            start = cfg.position_offset
            table = self.position_embeddings.embedding.astype(cfg.dtype)
            if position_ids is None:
                x = x + table[start:start + seq_len]  # [S, E]
            else:
                x = x + jnp.take(table, position_ids + start, axis=0)  # [B, S, E]
        if cfg.type_vocab_size > 0:
            types = self.token_type_embeddings.embedding.astype(cfg.dtype)  # [T, E]
            segment_rows = types[0]
            for t in range(1, cfg.type_vocab_size):
                segment_rows = jnp.where(segment_ids[..., None] == t, types[t], segment_rows)  # [B, S, E]
            x = x + segment_rows
        x = self.layer_norm(x)
        return self.dropout(x, deterministic=deterministic)  # [B, S, E]

    def word_embedding_table(self):
        return self.word_embeddings.embedding  # [V, E]


def projects_words(cfg) -> bool:
    """Whether the embedding projects the word vectors to H before the sum (MobileBERT's, where they are
    not H wide already)."""
    return cfg.block == "mobilebert" and (cfg.trigram_input or cfg.embedding_width != cfg.hidden_size)


def trigram(x, pad_row, position_ids=None):
    """MobileBERT's trigram input: each token's vector beside its neighbours', [next, token, previous]
    [B, S, 3E] from x [B, S, E], zeros past the row's ends (transformers' padding).

    Packed rows (position_ids [B, S], 0 where a sequence starts) see what each sequence sees alone in a row
    padded after it: zeros before its first token, and after its last the [PAD] row `pad_row` [E] (id 0, as
    bertjax's vocabularies and MobileBERT's put it), not the next sequence's first token.
    """
    following = jnp.pad(x[:, 1:], ((0, 0), (0, 1), (0, 0)))  # [B, S, E]
    preceding = jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))
    if position_ids is not None:
        starts = (position_ids == 0)[..., None]  # [B, S, 1]
        preceding = jnp.where(starts, 0, preceding)
        next_starts = jnp.pad(starts[:, 1:], ((0, 0), (0, 1), (0, 0)))  # the row's last: zeros already
        following = jnp.where(next_starts, pad_row.astype(x.dtype), following)
    return jnp.concatenate([following, x, preceding], axis=-1)


class FeedForward(nn.Module):
    """Dense H->F, GELU, dense F->H; or GeGLU (ModernBERT): dense H->2F, gelu(first half) * second half,
    dense F->H."""

    config: Any  # the encoder config (see the module docstring)

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        glu = cfg.activation == "geglu"
        width = cfg.intermediate_size * (2 if glu else 1)
        h = dense(cfg, width, ("embed", "mlp"), "intermediate")(x)  # [B, S, F] (GeGLU: [B, S, 2F])
        h = checkpoint_name(h, "mlp_in")
        if glu:
            h, gate = jnp.split(h, 2, axis=-1)  # each [B, S, F]
            h = activation(cfg.activation)(h) * gate
        else:
            # BERT's GELU is the exact erf form, not the tanh approximation.
            h = activation(cfg.activation)(h)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)  # [B, S, H]
        return checkpoint_name(nn.with_logical_constraint(h, ("batch", "length", "hidden")), "mlp_out")
