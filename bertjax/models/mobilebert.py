"""MobileBERT (Sun et al. 2020, "MobileBERT: a Compact Task-Agnostic BERT for Resource-Limited Devices"):
the block that model.block="mobilebert" selects, and its widened masked-LM decoder. Its embedding (trigram
input, words projected to H first) is models/layers.py's Embeddings; models/config.py's BertConfig
describes the options.

Between layers the state is H wide (512 in the published model); inside a layer the work is W wide
(intra_bottleneck_size, 128): a dense H -> W and a norm make the layer's input, attention at width W adds to
it, num_feedforward_networks feed-forward networks W -> F -> W follow, and a dense W -> H adds to the
layer's own input. Thin layers keep the FLOPs of a phone's budget while the wide residual carries what a
BERT-Large-shaped teacher's layers carry (the paper's point). Post-norm throughout, with NoNorm
(model.norm="no_norm") in the published model.

Shape legend (as in models/bert.py): B batch, S sequence, H hidden (between layers), W the bottleneck width
(H without one), N heads, D head size W/N, F feed-forward, E embedding, V vocabulary, Q query rows.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bertjax.models import attention, layers
from bertjax.models.config import BertConfig


def inner_config(cfg: BertConfig) -> BertConfig:
    """The config a block's W-wide parts are built with: BERT's attention and feed-forward network, at
    hidden_size W."""
    return dataclasses.replace(cfg, hidden_size=cfg.true_hidden_size, intra_bottleneck_size=0,
                               key_query_shared_bottleneck=False, use_bottleneck_attention=False)


class BottleneckAttention(attention.SelfAttention):
    """SelfAttention at width W (its config: inner_config) whose values may come from another tensor than its
    queries and keys: the block's H-wide input, under key_query_shared_bottleneck. SelfAttention projects
    keys and values from one tensor, so the two sources go in side by side, [B, S, W + H], and each
    projection reads its own part (XLA folds the slices of the concatenation away). The kernels keep
    SelfAttention's names and layout; the value kernel is [H, N, D]."""

    value_width: int = 0  # H: the input's last H features are the values' source; 0: one source for all

    def _project(self, name: str, source):
        cfg = self.config
        if self.value_width:
            source = source[..., cfg.hidden_size:] if name == "value" else source[..., :cfg.hidden_size]
        shape = (source.shape[-1], self.heads or cfg.num_heads, cfg.head_dim)
        return attention.HeadProjection(cfg, shape, ("embed", "heads", "kv"), 2, "bsh,hnd->bsnd", name=name)(source)

    def _project_fused(self, x, queries):
        if not self.value_width:
            return super()._project_fused(x, queries)
        # Sources of two widths: three projections, under the names the fused one's params have too.
        return self._project("query", queries), self._project("key", x), self._project("value", x)


class MobileBertBlock(nn.Module):
    """One MobileBERT layer in TransformerBlock's interface (models/bert.py): the Encoder runs either, unrolled
    or scanned, with output rows, hidden states, attention scores and remat alike. `local` and `first` are
    there for that interface only: MobileBERT attends globally, and its layer 0 is as the others.

        a = norm(dense_HW(x))                      the layer's input, with a bottleneck (else x)   [B, S, W]
        queries, keys: norm(dense'_HW(x)) (key_query_shared_bottleneck), a (use_bottleneck_attention), or x;
        values: x, a, x alike
        h = norm(a + attention)                    (dropout before the sum without a bottleneck)
        h = norm(h + ffn_j(h))                     for j < num_feedforward_networks - 1
        h = norm(h + ffn(h))                       at torch's eps (layers.TORCH_LAYER_NORM_EPS); dropout
                                                   before the sum without a bottleneck
        y = norm(x + dropout(dense_WH(h)))         with a bottleneck (else h)                       [B, S, H]
    """

    config: BertConfig
    deterministic: bool
    output_hidden_states: bool = False
    local: bool = False
    first: bool = False
    heads: int = 0  # attention heads (0: config.num_heads; MobileBERT has no pruned layers)
    output_attention_scores: bool = False

    @nn.compact
    def __call__(self, x, padding, rows=None, is_local=None, rope_tables=None, head_mask=None):
        # x: [B, S, H]; padding, rows, head_mask as TransformerBlock takes them; is_local and rope_tables are
        # always None (no windows, no rotary positions). Returns [B, S, H], or [B, Q, H] with rows.
        cfg, inner = self.config, inner_config(self.config)
        at_rows = (lambda y: y) if rows is None else (lambda y: jnp.take_along_axis(y, rows[..., None], axis=1))
        dropout = layers.Dropout(cfg.hidden_dropout_rate)
        bottleneck = cfg.intra_bottleneck_size > 0
        # Without a bottleneck the sub-layers drop out before their residual sums, as BERT's; with one only
        # the output bottleneck does (transformers' MobileBERT).
        inside = (lambda y: y) if bottleneck else (lambda y: dropout(y, deterministic=self.deterministic))
        layer_input = self._bottleneck(x, "bottleneck_input") if bottleneck else x  # [B, S, W]
        if cfg.key_query_shared_bottleneck:
            queries_and_keys, values = self._bottleneck(x, "bottleneck_attention"), x
        else:
            queries_and_keys, values = (layer_input if cfg.use_bottleneck_attention else x), None
        attended, scores = self._attend(inner, queries_and_keys, values, padding, rows, head_mask)  # [B, Q, W]
        h = layers.layer_norm(inner, "attention_layer_norm")(inside(attended) + at_rows(layer_input))
        for j in range(cfg.num_feedforward_networks - 1):
            h = layers.layer_norm(inner, f"mlp_{j}_layer_norm")(layers.FeedForward(inner, name=f"mlp_{j}")(h) + h)
        out = layers.FeedForward(inner, name="mlp")(h)  # [B, Q, W]
        h = layers.layer_norm(inner, "mlp_layer_norm", eps=layers.TORCH_LAYER_NORM_EPS)(inside(out) + h)
        if bottleneck:
            out = layers.dense(cfg, cfg.hidden_size, (None, "embed"), "output_bottleneck")(h)  # [B, Q, H]
            h = layers.layer_norm(cfg, "output_bottleneck_layer_norm")(
                dropout(out, deterministic=self.deterministic) + at_rows(x))
        h = checkpoint_name(nn.with_logical_constraint(h, ("batch", "length", "hidden")), "block_out")
        return h, (h if self.output_hidden_states else None, scores)

    def _bottleneck(self, x, name: str):
        """norm(dense H -> W (x)): [B, S, H] -> [B, S, W]."""
        cfg = self.config
        y = layers.dense(cfg, cfg.intra_bottleneck_size, ("embed", None), name)(x)
        return layers.layer_norm(cfg, f"{name}_layer_norm")(y)

    def _attend(self, inner: BertConfig, queries_and_keys, values, padding, rows, head_mask):
        """(the attention's output [B, Q, W], its scores before softmax [B, N, Q, S] or None)."""
        source = queries_and_keys
        if values is not None:
            source = jnp.concatenate([queries_and_keys, values.astype(queries_and_keys.dtype)], axis=-1)
        module = BottleneckAttention(inner, self.deterministic, heads=self.heads,
                                     output_scores=self.output_attention_scores,
                                     value_width=0 if values is None else values.shape[-1], name="attention")
        queries = None if rows is None else jnp.take_along_axis(source, rows[..., None], axis=1)
        out = module(source, padding, queries, rows, head_mask=head_mask)
        return out if self.output_attention_scores else (out, None)


def decoder_table(module: nn.Module, cfg: BertConfig, word_embeddings):
    """MobileBERT's masked-LM decoder [V, H]: the word table [V, E] widened by the H - E columns of the param
    decoder_extension (declared in `module`, the head), as its head's transform is H wide."""
    width = cfg.hidden_size - cfg.embedding_width
    extension = module.param("decoder_extension", layers.kernel_init(cfg, ("vocab", None)),
                             (cfg.vocab_size, width), cfg.param_dtype)
    return jnp.concatenate([word_embeddings, extension.astype(word_embeddings.dtype)], axis=-1)
