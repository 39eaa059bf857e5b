"""ELECTRA (Clark et al. 2020): a small generator (a masked LM) fills the masked positions with tokens
sampled from its softmax, and the discriminator, the model that is kept, tells for every real token
whether it was replaced.

The discriminator is BertModel under `bert` (its params are what fine-tuning, bertjax.load and export
read, as a BertForPreTraining checkpoint's), with model.pooler="gelu" (ELECTRA's classification head)
and ALBERT's factorised embedding width E where model.embedding_size says so. The generator is a
narrower BertModel under `generator` that shares the discriminator's token, position and segment
tables and their norm, and projects them E -> its own width; its masked-LM head decodes with the shared
word table (Hugging Face's ElectraForMaskedLM, tied).

Shape legend: B batch, S sequence, H discriminator width, G generator width, E embedding width,
P masked-LM predictions per sequence, V vocabulary.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert, layers
from bertjax.models.config import BertConfig


def generator_config(discriminator: BertConfig, hidden_size: int, num_layers: int, num_heads: int,
                     intermediate_size: int) -> BertConfig:
    """The generator's network: the discriminator's options at its own depth and width, reading the
    shared E-wide embeddings (embedding_size E, projected to its width where they differ)."""
    if hidden_size > discriminator.hidden_size:
        raise ValueError(f"electra.generator_hidden_size={hidden_size} is wider than the discriminator's "
                         f"model.hidden_size={discriminator.hidden_size}: ELECTRA's generator is 1/4 to 1/3 of it")
    return dataclasses.replace(discriminator, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                               intermediate_size=intermediate_size, embedding_size=discriminator.embedding_width,
                               num_hidden_groups=0, layer_heads=(), head_size=0, pooler="tanh")


class DiscriminatorHead(nn.Module):
    """Dense H -> H, the activation, dense H -> 1: a replaced-token logit per position (Hugging Face's
    discriminator_predictions.{dense, dense_prediction})."""

    config: BertConfig

    @nn.compact
    def __call__(self, x):
        # x: [B, S, H] -> float32 logits [B, S]
        cfg = self.config
        x = layers.activation(cfg.activation)(layers.dense(cfg, cfg.hidden_size, ("embed", None), "dense")(x))
        logits = layers.dense(cfg, 1, ("embed", None), "prediction")(x)[..., 0].astype(jnp.float32)
        return nn.with_logical_constraint(logits, ("batch", "length"))


def replace_tokens(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, sampled_ids):
    """The discriminator's input and labels. At each real prediction (weight > 0) the input token becomes
    the sampled one; a position is replaced (label 1) only where the sample differs from the original.

    input_ids [B, S] (the masked input), masked_lm_positions/ids/weights [B, P], sampled_ids [B, P].
    Returns (corrupted_ids [B, S] int32, labels [B, S] float32)."""
    seq_len = input_ids.shape[1]
    # A [B, P, S] one-hot of the predicted positions instead of a scatter: P x S is small, and it stays
    # element-wise under any sharding of the batch.
    hit = (masked_lm_positions[:, :, None] == jnp.arange(seq_len)) & (masked_lm_weights > 0)[:, :, None]
    predicted = jnp.any(hit, axis=1)  # [B, S]
    original = jnp.where(predicted, jnp.sum(jnp.where(hit, masked_lm_ids[:, :, None], 0), axis=1), input_ids)
    sampled = jnp.sum(jnp.where(hit, sampled_ids[:, :, None], 0), axis=1)  # [B, S]
    corrupted = jnp.where(predicted, sampled, input_ids).astype(jnp.int32)
    return corrupted, (corrupted != original).astype(jnp.float32)


class ElectraForPreTraining(nn.Module):
    """The generator and the discriminator, one forward pass: generator logits at the P masked positions,
    a token sampled from them (the "sample" RNG stream, temperature 1, no gradient through it), the
    corrupted sequence and the discriminator's logit at every position."""

    config: BertConfig  # the discriminator
    generator: BertConfig  # generator_config(...)

    def setup(self):
        self.bert = bert.BertModel(self.config)
        self.discriminator_head = DiscriminatorHead(self.config)
        # Flax shares a module passed to another: its params stay under bert/embeddings.
        self.generator_model = bert.BertModel(self.generator, shared_embeddings=self.bert.embeddings,
                                              name="generator")
        self.generator_head = bert.MaskedLMHead(self.generator)

    def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions, masked_lm_ids, masked_lm_weights,
                 deterministic: bool = True, heads_only: bool = True, sequence_ids=None, position_ids=None,
                 sentence_positions=None):
        # input_ids (masked), segment_ids, input_mask: [B, S] int; masked_lm_*: [B, P]. Packed rows as
        # BertForPreTraining takes them. heads_only: the generator's last block only at the P positions.
        packing = dict(sequence_ids=sequence_ids, position_ids=position_ids, cls_positions=sentence_positions)
        rows = dict(output_rows=masked_lm_positions) if heads_only else {}
        generated = self.generator_model(input_ids, segment_ids, input_mask, deterministic, **rows, **packing)
        gathered = generated["sequence_output"]  # [B, P, G] (or [B, S, G])
        if not heads_only:
            gathered = jnp.take_along_axis(gathered, masked_lm_positions[..., None], axis=1)
        mlm_logits = self.generator_head(gathered, self.bert.word_embedding_table())  # [B, P, V] f32
        if self.is_initializing():  # no "sample" stream at init; the shapes are what matters
            sampled = masked_lm_ids
        else:
            sampled = jax.random.categorical(self.make_rng("sample"), jax.lax.stop_gradient(mlm_logits), axis=-1)
        corrupted, labels = replace_tokens(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights,
                                           sampled)
        corrupted = jax.lax.stop_gradient(corrupted)
        outputs = self.bert(corrupted, segment_ids, input_mask, deterministic, **packing)
        disc_logits = self.discriminator_head(outputs["sequence_output"])  # [B, S]
        return {"mlm_logits": mlm_logits, "disc_logits": disc_logits, "corrupted_ids": corrupted,
                "disc_labels": labels}


    def discriminator_logits(self, input_ids, segment_ids, input_mask):
        """The discriminator alone on given tokens: [B, S] logits (ElectraForPreTraining's)."""
        outputs = self.bert(input_ids, segment_ids, input_mask, True)
        return self.discriminator_head(outputs["sequence_output"])

    def generator_logits(self, input_ids, segment_ids, input_mask):
        """The generator alone at every position: [B, S, V] logits (ElectraForMaskedLM's)."""
        outputs = self.generator_model(input_ids, segment_ids, input_mask, True)
        return self.generator_head(outputs["sequence_output"], self.bert.word_embedding_table())


def electra_loss(mlm_logits, disc_logits, disc_labels, masked_lm_ids, masked_lm_weights, input_mask,
                 discriminator_weight: float):
    """Generator masked-LM NLL (the mean over the real predictions) + discriminator_weight x the
    discriminator's binary cross-entropy (the mean over the real tokens: input_mask 1, packed rows'
    padding excluded).

    input              shape / dtype     meaning
    mlm_logits         [B, P, V] float   the generator's logits at the masked positions
    disc_logits        [B, S] float      the discriminator's replaced-token logits
    disc_labels        [B, S] float      1 where the token was replaced (replace_tokens' labels)
    masked_lm_ids      [B, P] int        the original tokens at the masked positions
    masked_lm_weights  [B, P] float      1 for a real prediction, 0 for padding
    input_mask         [B, S] int        1 for a real token, 0 for padding
    Returns (loss: a float32 scalar, metrics): pretraining_loss's mlm_* (objective "none"), disc_loss (a
    mean), and disc_correct, disc_count and replaced (sums over the real tokens).
    Example: loss, metrics = electra_loss(mlm_logits, disc_logits, disc_labels, ids, weights, input_mask, 50.0)
    """
    mlm_loss, metrics = bert.pretraining_loss(mlm_logits, None, masked_lm_ids, masked_lm_weights, None,
                                              objective="none")
    real = (input_mask > 0).astype(jnp.float32)
    logits = disc_logits.astype(jnp.float32)
    # -log sigmoid(z) for label 1, -log(1 - sigmoid(z)) for 0: softplus(z) - label * z, stable everywhere.
    bce = jax.nn.softplus(logits) - disc_labels * logits  # [B, S]
    count = jnp.sum(real)
    disc_loss = jnp.sum(real * bce) / jnp.maximum(count, 1.0)
    metrics.update(disc_loss=disc_loss, disc_correct=jnp.sum(real * ((logits > 0) == (disc_labels > 0))),
                   disc_count=count, replaced=jnp.sum(real * disc_labels))
    return mlm_loss + discriminator_weight * disc_loss, metrics


def dummy_batch(batch_size: int, seq_len: int, max_predictions: int) -> dict:
    """Zero inputs of ElectraForPreTraining's shapes, for init and jax.eval_shape."""
    preds = jnp.zeros((batch_size, max_predictions), jnp.int32)
    return dict(bert.dummy_batch(batch_size, seq_len, max_predictions), masked_lm_ids=preds,
                masked_lm_weights=preds.astype(jnp.float32))
