"""The BERT encoder with its pretraining heads (masked LM and next sentence), in Flax linen.

Faithful to Devlin et al. 2018 and the original TensorFlow release: summed token + segment + learned
position embeddings with LayerNorm (eps 1e-12), post-LN Transformer blocks with exact (erf) GELU, a tanh
pooler on [CLS], and a masked-LM head whose decoder is the transposed word-embedding matrix plus a bias,
evaluated only at the gathered masked positions.

Every parameter carries logical axis names and the key activations carry logical constraints; the
config's one rules table (configs/common.py) maps them onto the mesh axes (data, fsdp, tensor).

Shape legend:
  B batch           S sequence length      H hidden size          N attention heads
  D head size H/N   F feed-forward size    P masked-LM predictions per sequence (max_predictions_per_seq)
  V vocabulary      L layers               T segment (token type) vocabulary
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

# (layers, hidden) of the published BERT sizes; heads = hidden / 64, feed-forward = 4 * hidden.
# tiny, mini, small, medium: Turc et al. 2019, "Well-Read Students Learn Better" (Table 6 grid).
# base, large: Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers".
SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

# Logical axis names used below. Parameters: vocab, embed, mlp, heads, kv, layers (scan axis).
# Activations: batch, length, hidden, heads, mlp, vocab. The hidden size of activations is named
# "hidden" rather than "embed" so that FSDP can shard parameters over "embed" while the batch of the
# activations takes the same mesh axis.

# Activations a remat policy may keep, tagged with jax.ad_checkpoint.checkpoint_name in the block.
#   qkv: the query/key/value projections [B, S, N, D] each    context: attention output [B, S, N, D]
#   attention_out: after the output projection [B, S, H]      mlp_in: feed-forward pre-activation [B, S, F]
#   mlp_out: the feed-forward output [B, S, H]                block_out: the block's output [B, S, H]
CHECKPOINT_NAMES = ("qkv", "context", "attention_out", "mlp_in", "mlp_out", "block_out")

# Activation-rematerialisation policies for nn.remat, by config name.
REMAT_POLICIES = {
    "none": None,
    # Save nothing: recompute the whole block in the backward pass (least memory).
    "full": jax.checkpoint_policies.nothing_saveable,
    # Save every matmul output: recompute only the cheap element-wise work.
    "dots": jax.checkpoint_policies.checkpoint_dots,
    # Save matmul outputs without batch dimensions (the dense layers), recompute attention scores.
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # Save the H-wide and attention tensors, recompute the F-wide (4H) feed-forward activation, the
    # largest per token, from the saved attention output: one F-wide matmul more per layer.
    "save_attention": jax.checkpoint_policies.save_only_these_names("qkv", "context", "attention_out", "mlp_out"),
    # Save every named tensor: recompute only element-wise work (GELU, dropout, LayerNorm).
    "save_named": jax.checkpoint_policies.save_only_these_names(*CHECKPOINT_NAMES),
    # Save only the block outputs: recompute each block once in the backward pass, like "full", but
    # without recomputing the attention projections of the block boundaries twice.
    "save_block_out": jax.checkpoint_policies.save_only_these_names("block_out"),
}

ATTENTION_IMPLS = ("xla", "cudnn")
WORD_EMBEDDINGS = ("gather", "one_hot")

# What "auto" means per platform (jax.default_backend()), for the fields that are a matter of speed
# on a given chip and not of the network: bfloat16 compute on accelerators; cuDNN flash attention on
# NVIDIA GPUs (where, as JAX's public API has no dropout for it, attention-probability dropout is off:
# docs/performance.md); the word embedding as a one-hot matmul on TPUs, which prefer it to a gather.
PLATFORM_DEFAULTS = {
    "cpu": dict(dtype="float32", attention_impl="xla", word_embedding="gather"),
    "gpu": dict(dtype="bfloat16", attention_impl="cudnn", word_embedding="gather"),
    "tpu": dict(dtype="bfloat16", attention_impl="xla", word_embedding="one_hot"),
    "rocm": dict(dtype="bfloat16", attention_impl="xla", word_embedding="gather"),  # AMD GPUs: no cuDNN
}


def current_platform() -> str:
    """The key of PLATFORM_DEFAULTS for the backend JAX runs on."""
    backend = jax.default_backend()
    if backend == "gpu" and "rocm" in getattr(jax.devices()[0].client, "platform_version", "").lower():
        return "rocm"
    return backend if backend in PLATFORM_DEFAULTS else "cpu"
# Fields that choose how the network is computed, not what it is: a checkpoint loads under any of them.
COMPUTE_FIELDS = ("dtype", "attention_impl", "word_embedding", "remat_policy")


def resolve_platform(fields: dict, platform: str | None = None) -> dict:
    """The model fields with every "auto" replaced by PLATFORM_DEFAULTS[platform] (default: the backend
    JAX runs on). cuDNN attention needs 16-bit compute and has no dropout: "auto" picks it only for
    16-bit compute, and then trains without attention-probability dropout."""
    platform = platform or current_platform()
    if platform not in PLATFORM_DEFAULTS:
        raise ValueError(f"platform {platform!r} is unknown: choose one of {sorted(PLATFORM_DEFAULTS)}")
    defaults = PLATFORM_DEFAULTS[platform]
    out = dict(fields)
    auto_attention = out.get("attention_impl") == "auto"
    for name, value in defaults.items():
        if out.get(name) == "auto":
            out[name] = value
    if auto_attention and out["attention_impl"] == "cudnn":
        if jnp.dtype(out.get("dtype", "float32")).itemsize != 2:
            out["attention_impl"] = "xla"
        else:
            out["attention_dropout_rate"] = 0.0
    return out


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Everything that defines the network. Hashable, so it can be a static jit argument."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    dtype: str = "float32"  # compute dtype of matmuls and activations ("bfloat16" on accelerators)
    param_dtype: str = "float32"  # storage dtype of the parameters (and so of the optimizer state)
    attention_impl: str = "xla"  # "xla" or "cudnn" (flash attention on NVIDIA GPUs; padding as lengths)
    word_embedding: str = "gather"  # "gather" or "one_hot" (a [B, S, V] x [V, H] matmul: what TPUs prefer)
    remat_policy: str = "none"  # a key of REMAT_POLICIES
    scan_layers: bool = False  # nn.scan over the blocks: one compiled block, params stacked on "layers"
    pre_layer_norm: bool = False  # LayerNorm before each sub-layer plus a final one (not original BERT)

    def __post_init__(self):
        autos = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) == "auto"]
        if autos:
            raise ValueError(f"model fields {autos} are 'auto': resolve them with BertConfig.from_dict "
                             "(or model.resolve_platform) for the platform the model runs on")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"model.attention_impl={self.attention_impl!r}: choose one of {ATTENTION_IMPLS}")
        if self.attention_impl == "cudnn" and self.attention_dropout_rate > 0:
            raise ValueError(
                "model.attention_impl='cudnn' has no attention-probability dropout in "
                "jax.nn.dot_product_attention: set model.attention_dropout_rate=0.0 or model.attention_impl='xla'"
            )
        if self.word_embedding not in WORD_EMBEDDINGS:
            raise ValueError(f"model.word_embedding={self.word_embedding!r}: choose one of {WORD_EMBEDDINGS}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"model.remat_policy={self.remat_policy!r}: choose one of {sorted(REMAT_POLICIES)}")
        for name in ("dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))  # raises on an unknown dtype name

    @classmethod
    def from_size(cls, size: str, **overrides: Any) -> "BertConfig":
        if size not in SIZES:
            raise ValueError(f"model size {size!r} is unknown: choose one of {list(SIZES)}")
        layers, hidden = SIZES[size]
        fields = dict(num_layers=layers, hidden_size=hidden, num_heads=hidden // 64, intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**resolve_platform(fields))

    @classmethod
    def from_dict(cls, fields: dict, platform: str | None = None) -> "BertConfig":
        """From the config's model section, "auto" fields resolved for `platform` (default: the backend
        JAX runs on); an unknown key is an error, not silently ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}: valid keys are {sorted(known)}")
        return cls(**resolve_platform(dict(fields), platform))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def bert_init(stddev: float):
    """BERT's initializer: normal(0, stddev) cut at two standard deviations (tf.truncated_normal).

    jax.nn.initializers.truncated_normal rescales so that the *truncated* distribution has `stddev`;
    the original does not, so we draw the unit truncated normal and scale it ourselves.
    """

    def init(key, shape, dtype=jnp.float32):
        return stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)

    return init


def _kernel(cfg: BertConfig, names):
    return nn.with_logical_partitioning(bert_init(cfg.initializer_range), names)


def _zeros(names):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        # The exact two-pass variance, as BERT computes it; E[x^2]-E[x]^2 loses digits.
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=_zeros(("embed",)),
        name=name,
    )


def _dense(cfg: BertConfig, features: int, names, name: str) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_kernel(cfg, names),
        bias_init=_zeros(names[-1:]),
        name=name,
    )


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
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        embed = lambda n, names: nn.Embed(  # noqa: E731
            n,
            cfg.hidden_size,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            embedding_init=_kernel(cfg, names),
        )
        self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"))
        self.position_embeddings = embed(cfg.max_position_embeddings, (None, "embed"))
        self.token_type_embeddings = embed(cfg.type_vocab_size, (None, "embed"))
        self.layer_norm = _layer_norm(cfg, "layer_norm")
        self.dropout = Dropout(cfg.hidden_dropout_rate)

    def __call__(self, input_ids, segment_ids, deterministic: bool):
        # input_ids, segment_ids: [B, S] int
        cfg = self.config
        seq_len = input_ids.shape[1]
        if seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds model.max_position_embeddings="
                f"{cfg.max_position_embeddings}: shorten data.max_seq_length"
            )
        words = self.word_embeddings.embedding.astype(cfg.dtype)  # [V, H]
        if cfg.word_embedding == "one_hot":
            one_hot = jax.nn.one_hot(input_ids, cfg.vocab_size, dtype=cfg.dtype)  # [B, S, V]
            # HIGHEST keeps float32 exact (one product per output); 16-bit products are exact anyway.
            x = jnp.einsum("bsv,vh->bsh", one_hot, words, precision=jax.lax.Precision.HIGHEST)
        else:
            x = jnp.take(words, input_ids, axis=0)  # [B, S, H]
        x = x + self.position_embeddings.embedding[:seq_len].astype(cfg.dtype)  # [S, H] broadcast over B
        types = self.token_type_embeddings.embedding.astype(cfg.dtype)  # [T, H]
        segment_rows = types[0]
        for t in range(1, cfg.type_vocab_size):
            segment_rows = jnp.where(segment_ids[..., None] == t, types[t], segment_rows)  # [B, S, H]
        x = x + segment_rows
        x = self.layer_norm(x)
        x = self.dropout(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "hidden"))

    def word_embedding_table(self):
        return self.word_embeddings.embedding  # [V, H]


class HeadProjection(nn.Module):
    """A dense layer whose kernel keeps the head axes apart: [H, N, D] for q/k/v, [N, D, H] for the output.

    Written as an einsum rather than nn.DenseGeneral, which initialises a flattened 2-D kernel and so
    cannot carry the 3-axis logical names through a sharded init.
    """

    config: BertConfig
    kernel_shape: tuple
    kernel_names: tuple
    bias_rank: int  # the bias covers the last bias_rank axes of the kernel (the output features)
    equation: str

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        kernel = self.param("kernel", _kernel(cfg, self.kernel_names), self.kernel_shape, cfg.param_dtype)
        bias = self.param(
            "bias", _zeros(self.kernel_names[-self.bias_rank:]), self.kernel_shape[-self.bias_rank:], cfg.param_dtype
        )
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.dtype)
        return jnp.einsum(self.equation, x, kernel) + bias


def fused_attention(q, k, v, *, mask, kv_lengths, implementation: str):
    """softmax(q k^T / sqrt(D)) v over the real keys, by jax.nn.dot_product_attention.

    q: [B, Q, N, D]; k, v: [B, S, N, D]; mask: [B, 1, 1, S] bool, True at real keys; kv_lengths: None or
    [B] int32, the number of real keys of each row when padding is on the right. Given, the padding goes
    to the kernel as lengths (the form cuDNN's flash attention takes, which then skips padded blocks),
    else as the mask. The two forms are the same function for right-padded rows.
    """
    if kv_lengths is not None:
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=kv_lengths, implementation=implementation)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a padding mask and an output projection."""

    config: BertConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x, padding, queries=None):
        # x: [B, S, H]; padding: (mask [B, 1, 1, S] bool, True at keys that may be attended to; lengths [B]
        # int32, real tokens per row, which are right-padded). queries: [B, Q, H] rows to compute
        # outputs for (default x itself, Q = S); keys and values always come from every position of x.
        cfg = self.config
        mask, lengths = padding
        queries = x if queries is None else queries

        def project(name, source):
            return HeadProjection(
                cfg, (cfg.hidden_size, cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"), 2,
                "bsh,hnd->bsnd", name=name,
            )(source)

        q = project("query", queries)  # [B, Q, N, D]
        k, v = project("key", x), project("value", x)  # each [B, S, N, D]
        q = checkpoint_name(nn.with_logical_constraint(q, ("batch", "length", "heads", "kv")), "qkv")
        k = checkpoint_name(nn.with_logical_constraint(k, ("batch", "length", "heads", "kv")), "qkv")
        v = checkpoint_name(nn.with_logical_constraint(v, ("batch", "length", "heads", "kv")), "qkv")

        if self.deterministic or cfg.attention_dropout_rate == 0.0:
            kv_lengths = lengths if cfg.attention_impl == "cudnn" else None
            context = fused_attention(q, k, v, mask=mask, kv_lengths=kv_lengths, implementation=cfg.attention_impl)
        else:
            # jax.nn.dot_product_attention has no dropout on the attention probabilities, which BERT
            # trains with (rate 0.1); this is the same computation with the dropout in the middle.
            logits = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)  # [B, N, Q, S]
            logits = logits / np.sqrt(cfg.head_dim).astype(np.float32)
            logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(logits, axis=-1).astype(cfg.dtype)
            probs = Dropout(cfg.attention_dropout_rate)(probs, deterministic=False)
            context = jnp.einsum("bnqk,bknd->bqnd", probs, v)  # [B, Q, N, D]
        context = checkpoint_name(nn.with_logical_constraint(context, ("batch", "length", "heads", "kv")), "context")

        out = HeadProjection(
            cfg, (cfg.num_heads, cfg.head_dim, cfg.hidden_size), ("heads", "kv", "embed"), 1,
            "bsnd,ndh->bsh", name="output",
        )(context)  # [B, Q, H]
        return checkpoint_name(nn.with_logical_constraint(out, ("batch", "length", "hidden")), "attention_out")


class FeedForward(nn.Module):
    """Dense H->F, exact GELU, dense F->H."""

    config: BertConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        h = _dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x)  # [B, S, F]
        h = checkpoint_name(h, "mlp_in")
        # BERT's GELU is the exact erf form, not the tanh approximation.
        h = nn.gelu(h, approximate=False)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = _dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)  # [B, S, H]
        return checkpoint_name(nn.with_logical_constraint(h, ("batch", "length", "hidden")), "mlp_out")


class TransformerBlock(nn.Module):
    """One encoder block. Post-LN as in BERT: x = LN(x + Dropout(SubLayer(x))).

    With `rows` ([B, Q] positions) the block computes its output only at those positions: attention
    still reads keys and values at every position, and everything after it (residual, LayerNorms,
    feed-forward) is per position. Exactly the rows of the full block's output, for 2 of its 12 H^2
    per token at the other positions (only the key and value projections).

    Returns (x, x or None) so that nn.scan can stack the per-layer outputs when they are wanted.
    """

    config: BertConfig
    deterministic: bool
    output_hidden_states: bool = False

    @nn.compact
    def __call__(self, x, padding, rows=None):
        # x: [B, S, H]; padding: (mask, lengths) as SelfAttention takes it; rows: None or [B, Q] int.
        # Returns [B, S, H], or [B, Q, H] with rows.
        cfg = self.config
        at_rows = (lambda y: y) if rows is None else (lambda y: jnp.take_along_axis(y, rows[..., None], axis=1))
        attention = SelfAttention(cfg, self.deterministic, name="attention")
        feed_forward = FeedForward(cfg, name="mlp")
        attention_norm = _layer_norm(cfg, "attention_layer_norm")
        mlp_norm = _layer_norm(cfg, "mlp_layer_norm")
        dropout = Dropout(cfg.hidden_dropout_rate)
        if cfg.pre_layer_norm:
            normed = attention_norm(x)
            x = at_rows(x) + dropout(attention(normed, padding, at_rows(normed)), deterministic=self.deterministic)
            x = x + dropout(feed_forward(mlp_norm(x)), deterministic=self.deterministic)
        else:
            x = attention_norm(at_rows(x) + dropout(attention(x, padding, at_rows(x)), deterministic=self.deterministic))
            x = mlp_norm(x + dropout(feed_forward(x), deterministic=self.deterministic))
        x = checkpoint_name(nn.with_logical_constraint(x, ("batch", "length", "hidden")), "block_out")
        return x, (x if self.output_hidden_states else None)


class Encoder(nn.Module):
    """L blocks, either unrolled (params layers_0 ... layers_{L-1}) or scanned (params stacked on axis 0).

    With `rows` ([B, Q] positions) only those rows of the output are returned. Unrolled, the last block
    computes only them; scanned, every block is the same compiled body, so the rows are taken after it.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x, padding, deterministic: bool, output_hidden_states: bool = False, rows=None):
        cfg = self.config
        block = TransformerBlock
        if cfg.remat_policy != "none":
            # Under scan, CSE across iterations cannot happen, so prevent_cse (which costs speed) is off.
            block = nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers)
        if cfg.scan_layers:
            stack = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, per_layer = stack(cfg, deterministic, output_hidden_states, name="layers")(x, padding)
            layer_outputs = list(per_layer) if output_hidden_states else []  # L x [B, S, H]
            if rows is not None:
                x = jnp.take_along_axis(x, rows[..., None], axis=1)  # [B, Q, H]
        else:
            layer_outputs = []
            for i in range(cfg.num_layers):
                last_rows = rows if i == cfg.num_layers - 1 else None
                x, out = block(cfg, deterministic, output_hidden_states, name=f"layers_{i}")(x, padding, last_rows)
                layer_outputs.append(out)
        if cfg.pre_layer_norm:
            x = _layer_norm(cfg, "final_layer_norm")(x)
        return x, layer_outputs


class BertModel(nn.Module):
    """Embeddings + encoder + tanh pooler on [CLS]: what BertModel is in every BERT implementation."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.pooler = _dense(cfg, cfg.hidden_size, ("embed", None), "pooler")

    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
                 output_hidden_states: bool = False, output_rows=None):
        # input_ids, segment_ids, input_mask: [B, S] int; input_mask is 1 at real tokens, 0 at padding.
        # output_rows: None, or [B, Q] int positions: sequence_output is then [B, Q, H], those rows
        # only, and the last block (unrolled) computes just them and [CLS] (for the pooler).
        if output_rows is not None and output_hidden_states:
            raise ValueError("output_rows and output_hidden_states exclude each other: the last layer's "
                             "hidden state would hold only some rows")
        x = self.embeddings(input_ids, segment_ids, deterministic)  # [B, S, H]
        mask = (input_mask > 0)[:, None, None, :]  # [B, 1, 1, S]
        lengths = jnp.sum(input_mask > 0, axis=-1, dtype=jnp.int32)  # [B]: rows are right-padded
        rows = None
        if output_rows is not None:
            rows = jnp.concatenate([jnp.zeros_like(output_rows[:, :1]), output_rows], axis=1)  # [B, 1+Q]: [CLS] first
        encoded, layer_outputs = self.encoder(x, (mask, lengths), deterministic, output_hidden_states, rows)
        pooled_output = jnp.tanh(self.pooler(encoded[:, 0]))  # [B, H]
        sequence_output = encoded if rows is None else encoded[:, 1:]  # [B, S, H] or [B, Q, H]
        outputs = {"sequence_output": sequence_output, "pooled_output": pooled_output}
        if output_hidden_states:
            outputs["hidden_states"] = [x] + layer_outputs  # L+1 x [B, S, H], embeddings first
        return outputs

    def word_embedding_table(self):
        return self.embeddings.word_embedding_table()


class MaskedLMHead(nn.Module):
    """Dense H->H, GELU, LayerNorm, then the tied word-embedding decoder plus a per-token bias."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, word_embeddings):
        # x: [B, P, H] hidden states at the masked positions; word_embeddings: [V, H]
        cfg = self.config
        x = _dense(cfg, cfg.hidden_size, ("embed", None), "transform")(x)
        x = nn.gelu(x, approximate=False)
        x = _layer_norm(cfg, "layer_norm")(x)
        # Accumulate in float32: the softmax over V = 30k entries is where bf16 loses most.
        logits = jnp.einsum(
            "bph,vh->bpv", x, word_embeddings.astype(cfg.dtype), preferred_element_type=jnp.float32
        )  # [B, P, V]
        bias = self.param("output_bias", _zeros(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
        logits = logits + bias.astype(jnp.float32)
        return nn.with_logical_constraint(logits, ("batch", None, "vocab"))


class BertForPreTraining(nn.Module):
    """BertModel with the masked-LM head (at gathered positions) and the next-sentence head."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.bert = BertModel(cfg)
        self.mlm_head = MaskedLMHead(cfg)
        self.nsp_head = _dense(cfg, 2, ("embed", None), "nsp_head")

    def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions, deterministic: bool = True,
                 heads_only: bool = False):
        # masked_lm_positions: [B, P] int, padded with 0 where there are fewer predictions (weight 0).
        # Only the P gathered positions go through the head: V-wide logits at every one of S positions
        # would cost (S/P) times more in the largest matmul of the model.
        # heads_only (what training and evaluation use): the last block, too, runs only at the rows the
        # heads read ([CLS] and the P positions); the same numbers, and sequence_output holds those P
        # rows ([B, P, H]) instead of all S. For mini that is a sixth of the encoder's work.
        if heads_only:
            outputs = self.bert(input_ids, segment_ids, input_mask, deterministic, output_rows=masked_lm_positions)
            gathered = outputs["sequence_output"]  # [B, P, H]
        else:
            outputs = self.bert(input_ids, segment_ids, input_mask, deterministic)
            gathered = jnp.take_along_axis(outputs["sequence_output"], masked_lm_positions[..., None], axis=1)
        outputs["mlm_logits"] = self.mlm_head(gathered, self.bert.word_embedding_table())  # [B, P, V] f32
        outputs["nsp_logits"] = self.nsp_head(outputs["pooled_output"]).astype(jnp.float32)  # [B, 2]
        return outputs


def pretraining_loss(mlm_logits, nsp_logits, masked_lm_ids, masked_lm_weights, next_sentence_labels):
    """BERT's loss: weighted masked-LM NLL over the real predictions plus mean NSP cross-entropy.

    mlm_logits: [B, P, V]; nsp_logits: [B, 2]; masked_lm_ids: [B, P] int; masked_lm_weights: [B, P] float
    (1 for a real prediction, 0 for padding); next_sentence_labels: [B] int (0 IsNext, 1 NotNext).
    Returns (loss, metrics) with metrics holding sums and counts so that they add across microbatches.
    """
    weights = masked_lm_weights.astype(jnp.float32)
    logits = mlm_logits.astype(jnp.float32)
    # NLL = logsumexp(logits) - logit[label], the label's logit picked by a one-hot select rather than
    # a gather: the gradient (softmax - one-hot) is then one fused element-wise pass over [B, P, V]
    # instead of a zero-filled [B, P, V] buffer plus a scatter.
    is_label = jnp.arange(logits.shape[-1]) == masked_lm_ids[..., None]  # [B, P, V] bool
    label_logit = jnp.sum(jnp.where(is_label, logits, 0.0), axis=-1)  # [B, P]
    mlm_nll = jax.nn.logsumexp(logits, axis=-1) - label_logit  # [B, P]
    # The 1e-5 keeps a batch without predictions finite, as in the original.
    mlm_loss = jnp.sum(weights * mlm_nll) / (jnp.sum(weights) + 1e-5)
    nsp_logp = jax.nn.log_softmax(nsp_logits.astype(jnp.float32), axis=-1)
    nsp_nll = -jnp.take_along_axis(nsp_logp, next_sentence_labels[:, None], axis=-1)[:, 0]  # [B]
    nsp_loss = jnp.mean(nsp_nll)
    metrics = {
        "mlm_loss": mlm_loss,
        "nsp_loss": nsp_loss,
        "mlm_correct": jnp.sum(weights * (jnp.argmax(mlm_logits, -1) == masked_lm_ids)),
        "mlm_count": jnp.sum(weights),
        "nsp_correct": jnp.sum((jnp.argmax(nsp_logits, -1) == next_sentence_labels).astype(jnp.float32)),
        "nsp_count": jnp.asarray(next_sentence_labels.shape[0], jnp.float32),
    }
    return mlm_loss + nsp_loss, metrics


def check_input_shapes(cfg: BertConfig, max_seq_length: int, max_predictions_per_seq: int) -> None:
    """Fail early, with what to change, on sequences the model cannot take."""
    if not 8 <= max_seq_length <= cfg.max_position_embeddings:
        raise ValueError(f"data.max_seq_length={max_seq_length} must lie in [8, model.max_position_embeddings="
                         f"{cfg.max_position_embeddings}]")
    # [CLS] and two [SEP] are never predicted.
    if not 1 <= max_predictions_per_seq <= max_seq_length - 3:
        raise ValueError(f"data.max_predictions_per_seq={max_predictions_per_seq} must lie in [1, "
                         f"data.max_seq_length - 3 = {max_seq_length - 3}] (20 at seq 128, 80 at seq 512)")


def dummy_batch(batch_size: int, seq_len: int, max_predictions: int) -> dict:
    """Zero inputs of the right shapes and dtypes, for init and jax.eval_shape."""
    ids = jnp.zeros((batch_size, seq_len), jnp.int32)
    preds = jnp.zeros((batch_size, max_predictions), jnp.int32)
    return {
        "input_ids": ids,
        "segment_ids": ids,
        "input_mask": jnp.ones_like(ids),
        "masked_lm_positions": preds,
    }


def count_params(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def stack_layers(encoder_params: dict, num_layers: int) -> dict:
    """Unrolled encoder params {layers_0: p0, ...} -> scanned {layers: stack(p0..p_{L-1})}."""
    rest = {k: v for k, v in encoder_params.items() if not k.startswith("layers_")}
    layers = [encoder_params[f"layers_{i}"] for i in range(num_layers)]
    rest["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
    return rest


def unstack_layers(encoder_params: dict, num_layers: int) -> dict:
    """Scanned encoder params {layers: stacked} -> unrolled {layers_0: p0, ...}."""
    rest = {k: v for k, v in encoder_params.items() if k != "layers"}
    for i in range(num_layers):
        rest[f"layers_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], encoder_params["layers"])
    return rest
