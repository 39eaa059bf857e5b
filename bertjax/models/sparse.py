"""SPLADE (Formal et al. 2021, 2022): each text as a vector over the vocabulary from the model's own masked-LM
head, w_j = max over the text's tokens i of log(1 + ReLU(logit_ij)), as sentence-transformers' SparseEncoder
computes it (a fill-mask Transformer, then SpladePooling("max", activation "relu")); and the inference-free
variant's query side (SparseStaticEmbedding): one learned weight per vocabulary token, initialised to ones,
a query's vector holding the weight of each token it has (once, however often it has it; no ReLU, no log).

Params keep BertForPreTraining's names, {"bert", "mlm_head"}, plus {"static_query": {"weight" [V]}} for the
static query side: a pretraining checkpoint starts the whole model, its masked-LM head included
(with_pretrained_mlm_head); a start without one is one line.

Memory: the logits of every token are V wide, [R, S, V] float32 for R rows of S tokens (1 GB at R = 64,
S = 128, V = 30,522). They are computed chunk_rows rows at a time (chunk c holds rows c::n, so every
data-parallel device works in every chunk), and the backward pass recomputes a chunk's logits instead of
keeping them: what exists at once is [chunk_rows, S, V] and the texts' vectors [R, K, V].

Plain and packed rows as models/pooling.py reads them: sequence_ids [R, S] mark the K texts of each row
(1-based, 0 at padding); a right-padded batch is sequence_ids = input_mask with K = 1.

Shape legend (as in bertjax/models/bert.py): R rows, S row width, E the masked-LM head's width, V vocabulary,
K texts per row, C chunk_rows, n chunks.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models.mlm_loss import DecoderInputs

CHUNK_ROWS = 8  # rows whose V-wide logits exist at a time (contrastive.splade_chunk_rows in training)


def _chunk_vectors(x, sequence_ids, table, bias, num_texts: int):
    """[C, S, E] head outputs and their [C, S] sequence ids -> each text's max of log(1 + ReLU(logits))
    [C, K, V] float32 (0 for an empty slot)."""
    logits = jnp.einsum("cse,ve->csv", x, table.astype(x.dtype), preferred_element_type=jnp.float32)
    values = jnp.log1p(jax.nn.relu(logits + bias.astype(jnp.float32)))  # [C, S, V], >= 0
    # Segment 0 is padding; an empty segment's max is -inf, and every real value is >= 0: clamped to 0.
    per_text = jax.vmap(lambda v, s: jax.ops.segment_max(v, s, num_segments=num_texts + 1))(values, sequence_ids)
    return jnp.maximum(per_text[:, 1:], 0.0)


def splade_vectors(decoder: DecoderInputs, sequence_ids, num_texts: int, chunk_rows: int = CHUNK_ROWS):
    """The SPLADE vector of every text, [R, K, V] float32, from the head's decoder inputs (MaskedLMHead with
    project=False: hidden [R, S, E], the tied table [V, E] and bias [V]) and sequence_ids [R, S].
    chunk_rows: rows projected to the vocabulary at a time (module docstring)."""
    x, rows = decoder.hidden, decoder.hidden.shape[0]
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows}: at least 1 row a chunk (contrastive.splade_chunk_rows)")
    n = -(-rows // chunk_rows)
    if n == 1:
        return _chunk_vectors(x, sequence_ids, decoder.table, decoder.bias, num_texts)
    pad = n * chunk_rows - rows  # zero rows (sequence id 0: no text) to fill the last chunk
    x = jnp.pad(x, ((0, pad), (0, 0), (0, 0)))
    sequence_ids = jnp.pad(sequence_ids, ((0, pad), (0, 0)))
    strided = lambda a: jnp.swapaxes(a.reshape(chunk_rows, n, *a.shape[1:]), 0, 1)  # noqa: E731  chunk c: rows c::n
    body = jax.checkpoint(functools.partial(_chunk_vectors, num_texts=num_texts))  # the backward recomputes
    out = jax.lax.map(lambda xs: body(xs[0], xs[1], decoder.table, decoder.bias), (strided(x), strided(sequence_ids)))
    return jnp.swapaxes(out, 0, 1).reshape(n * chunk_rows, num_texts, -1)[:rows]  # [R, K, V]


def static_vectors(weight, input_ids, sequence_ids, num_texts: int):
    """SparseStaticEmbedding's vectors [R, K, V] float32: weight[j] where text k of the row has token j, else 0.
    weight [V]; input_ids, sequence_ids [R, S] (a text's tokens are the ones it is embedded from: the caller
    leaves out special tokens, as sentence-transformers tokenizes a static query without them)."""
    rows = jnp.arange(input_ids.shape[0])[:, None]
    present = jnp.zeros((input_ids.shape[0], num_texts + 1, weight.shape[0]), jnp.float32)
    present = present.at[rows, sequence_ids, input_ids].max(1.0)  # [R, K + 1, V]; segment 0 is padding
    return present[:, 1:] * weight.astype(jnp.float32)


class StaticQueryTable(nn.Module):
    """The inference-free query side: a weight per vocabulary token (param "weight" [V], ones at first)."""

    vocab_size: int
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, input_ids, sequence_ids, num_texts: int):
        init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("vocab",))
        weight = self.param("weight", init, (self.vocab_size,), self.param_dtype)
        return static_vectors(weight, input_ids, sequence_ids, num_texts)


class SpladeEncoder(nn.Module):
    """BertModel -> MaskedLMHead at every token -> each text's SPLADE vector; with static_queries, also the
    static query table, which static=True embeds the given tokens with instead (no encoder).

    Called as pooling.SentenceEmbedder is: plain rows give [R, V], packed rows (sequence_ids, position_ids,
    cls_positions as BertModel takes them) [R, K, V]. prompt_lengths is not read: SPLADE pools every token of
    a text (SpladePooling has no include_prompt)."""

    config: BertConfig
    static_queries: bool = False
    chunk_rows: int = CHUNK_ROWS

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True, sequence_ids=None,
                 position_ids=None, cls_positions=None, prompt_lengths=None, static: bool = False):
        cfg = self.config
        packed = sequence_ids is not None
        texts = sequence_ids if packed else (input_mask > 0).astype(jnp.int32)  # [R, S]
        num_texts = cls_positions.shape[1] if packed else 1
        table = StaticQueryTable(cfg.vocab_size, cfg.param_dtype, name="static_query") if self.static_queries else None
        if static:
            if table is None:
                raise ValueError("static=True embeds with the static query table: this SpladeEncoder has none "
                                 "(static_queries=False)")
            out = table(input_ids, texts, num_texts)
        else:
            bert = bert_model.BertModel(cfg, name="bert")
            encoded = bert(input_ids, segment_ids, input_mask, deterministic, sequence_ids=sequence_ids,
                           position_ids=position_ids, cls_positions=cls_positions)
            head = bert_model.MaskedLMHead(cfg, name="mlm_head")
            decoder = head(encoded["sequence_output"], bert.word_embedding_table(), project=False)
            out = splade_vectors(decoder, texts, num_texts, self.chunk_rows)
            if table is not None and self.is_initializing():  # the table's params are made with the rest
                table(input_ids, texts, num_texts)
        out = nn.with_logical_constraint(out, ("batch", None, "vocab"))
        return out if packed else out[:, 0]


def with_pretrained_mlm_head(params: dict, pretrained: dict) -> dict:
    """SpladeEncoder params (boxed, as init returns them, or plain) with the masked-LM head of `pretrained`
    (BertForPreTraining's params, or a SPLADE model's); a start without one is one line."""
    pretrained = nn.meta.unbox(pretrained)
    pretrained = pretrained.get("params", pretrained)
    if "mlm_head" not in pretrained:
        raise ValueError(f"train.init_from has no masked-LM head (its params: {', '.join(sorted(pretrained))}; an "
                         "embedder's or a classifier's): contrastive.representation=splade reads the model's own "
                         "MLM head, so start from a pretraining checkpoint or a masked-LM Hugging Face directory")
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731

    def take(leaf, value):
        shape = (leaf.unbox() if is_box(leaf) else leaf).shape
        if value.shape != shape:
            raise ValueError(f"the pretrained masked-LM head has a param of shape {value.shape} where the model's "
                             f"is {shape}: same model config?")
        return leaf.replace_boxed(value) if is_box(leaf) else value

    head = jax.tree_util.tree_map(take, params["mlm_head"], pretrained["mlm_head"], is_leaf=is_box)
    return {**params, "mlm_head": head}
