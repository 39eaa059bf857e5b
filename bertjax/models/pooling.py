"""Sentence embeddings from any encoder: pooling of token states, an optional dense projection and L2
normalisation, as sentence-transformers' Pooling, Dense and Normalize modules compute them.

The pooling modes are sentence-transformers' (concatenated in the order given):
  cls                    the text's first pooled token ([CLS], or <s>)
  mean                   the mean of its pooled tokens (special tokens included, as there)
  max                    the elementwise max of its pooled tokens
  mean_sqrt_len_tokens   their sum divided by the square root of their count
  weightedmean           the mean weighted by position within the text (1, 2, ...)
  lasttoken              its last pooled token (decoder-style embedders)
"Pooled tokens" are the text's real tokens, less a prompt ("query: ") where the embedder says its prompt
is not pooled (sentence-transformers' include_prompt=False); the prompt's tokens keep their positions.

One function serves plain and packed rows: texts are marked by sequence_ids [B, S] (k for the k-th text
of a row, 1-based, 0 at padding), so a right-padded batch is sequence_ids = input_mask with K = 1.

Shape legend (as in bertjax/models/bert.py): B batch, S sequence length, H hidden size, K texts per row,
D embedding width.
"""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models.layers import dense

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
ACTIVATIONS = {"identity": lambda x: x, "tanh": jnp.tanh}  # sentence-transformers Dense's usual two


def check_modes(modes: Sequence[str]) -> tuple[str, ...]:
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise ValueError(f"pooling {unknown or 'none'}: choose one or more of {', '.join(MODES)}")
    return modes


def pool(hidden, sequence_ids, num_texts: int, modes: Sequence[str], prompt_lengths=None):
    """Pooled embeddings [B, K, H * len(modes)] of the K texts of each row of hidden [B, S, H].

    prompt_lengths: None, or [B, K] int: how many leading tokens of each text are left out of pooling
    ([CLS] and the prompt's tokens, as sentence-transformers counts a prompt's length)."""
    modes = check_modes(modes)
    hidden = hidden.astype(jnp.float32)  # sums in float32 whatever the compute dtype, as there
    texts = jnp.arange(1, num_texts + 1)
    members = sequence_ids[:, None, :] == texts[None, :, None]  # [B, K, S]: token s is text k's
    position = jnp.cumsum(members, axis=-1) - 1  # [B, K, S]: its position within text k
    pooled = members
    if prompt_lengths is not None:
        pooled = members & (position >= prompt_lengths[:, :, None])  # the prompt's tokens left out
    weights = pooled.astype(jnp.float32)  # [B, K, S]
    count = jnp.maximum(weights.sum(-1, keepdims=True), 1e-9)  # [B, K, 1]
    seq_len = hidden.shape[1]
    first = jnp.argmax(pooled, axis=-1)  # [B, K]: the first pooled token
    last = seq_len - 1 - jnp.argmax(pooled[..., ::-1], axis=-1)  # [B, K]: the last
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(jnp.take_along_axis(hidden, first[..., None], axis=1))
        elif mode == "lasttoken":
            out.append(jnp.take_along_axis(hidden, last[..., None], axis=1))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            summed = jnp.einsum("bks,bsh->bkh", weights, hidden)
            out.append(summed / (count if mode == "mean" else jnp.sqrt(count)))
        elif mode == "weightedmean":
            w = weights * (position + 1)  # [B, K, S]: 1, 2, ... from the text's first token
            out.append(jnp.einsum("bks,bsh->bkh", w, hidden) / jnp.maximum(w.sum(-1, keepdims=True), 1e-9))
        else:  # max: one text slot at a time, so as not to hold [B, K, S, H]
            per_text = jax.lax.map(lambda m: jnp.max(jnp.where(m[..., None], hidden, -jnp.inf), axis=1),
                                   jnp.swapaxes(pooled, 0, 1))  # [K, B, H]
            out.append(jnp.swapaxes(per_text, 0, 1))
    # An empty slot of a packed row (no text) pools to zeros, not to -inf or 0/0: a training step's
    # gradient flows through every slot, and a NaN there would reach the shared weights.
    return jnp.where(count > 0.5, jnp.concatenate(out, axis=-1), 0.0)


def normalize(x, eps: float = 1e-12):
    """x / max(||x||, eps) along the last axis, as torch.nn.functional.normalize. Written with the squared
    norm, so that a zero vector (an empty packed slot) has a zero gradient, not sqrt's NaN at 0."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), eps * eps))


class SentenceEmbedder(nn.Module):
    """BertModel (any family) -> pool -> optional Dense (+ activation) -> optional L2 normalisation.

    Params: {"bert": BertModel's, exactly as in BertForPreTraining, "dense": {"kernel", "bias"} when
    dense_features is set}. Plain rows give [B, D]; packed rows (sequence_ids, position_ids,
    cls_positions as BertModel takes them) give [B, K, D], K = cls_positions' width."""

    config: BertConfig
    modes: tuple = ("mean",)
    dense_features: int | None = None
    dense_bias: bool = True
    dense_activation: str = "tanh"
    normalize: bool = False

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True, sequence_ids=None,
                 position_ids=None, cls_positions=None, prompt_lengths=None):
        packed = sequence_ids is not None
        encoded = bert_model.BertModel(self.config, name="bert")(
            input_ids, segment_ids, input_mask, deterministic, sequence_ids=sequence_ids,
            position_ids=position_ids, cls_positions=cls_positions)
        if packed:
            ids, num_texts = sequence_ids, cls_positions.shape[1]
        else:
            ids, num_texts = (input_mask > 0).astype(jnp.int32), 1
            prompt_lengths = None if prompt_lengths is None else prompt_lengths[:, None]  # [B] -> [B, 1]
        x = pool(encoded["sequence_output"], ids, num_texts, self.modes, prompt_lengths)  # [B, K, H * modes]
        if self.dense_features is not None:
            layer = dense(self.config, self.dense_features, ("embed", None), "dense", use_bias=self.dense_bias)
            x = ACTIVATIONS[self.dense_activation](layer(x.astype(self.config.dtype)).astype(jnp.float32))
        if self.normalize:
            x = normalize(x)
        return x if packed else x[:, 0]
