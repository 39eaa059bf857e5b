"""The BiLSTM student of task distillation (Tang et al. 2019, "Distilling Task-Specific Knowledge from BERT into
Simple Neural Networks"): word embeddings, one bidirectional LSTM, its states max-pooled over the real tokens, a
ReLU layer and the output layer. A pair of sentences is read by the one BiLSTM twice (the paper's siamese form)
and the two pooled vectors combined as [h1, h2, h1 * h2, |h1 - h2|] before the ReLU layer.

It reads the rows a fine-tuned BERT reads (input_ids, segment_ids, input_mask from the teacher's tokenizer, so its
vocabulary is the teacher's) and returns the logits a classification or regression head returns, so that the
fine-tuning run, its step and bertjax.load take it where they take a head (bertjax/runs/finetuning_compression.py).
Its record (`record`, kept in the checkpoint's `distill` section) is what tells a reader it is no BERT.

Shape legend: B batch, S sequence length, R rows the BiLSTM reads (B; 2B for pairs: every first sentence, then
every second), E embedding width, H LSTM units each way, F the pooled features (2H; 8H for pairs), M the ReLU
layer's width, K logits (the classes; 1 for regression).
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bertjax.models.layers import Dropout

STUDENT = "bilstm"  # distill.student's value, and the record's name
TASK_KINDS = ("classification", "regression")  # the kinds whose logits it makes


@dataclasses.dataclass(frozen=True)
class BiLSTMConfig:
    """The student's shape. pairs: the siamese form (the task has sentence pairs), read from the training data."""

    vocab_size: int  # the teacher's embedding rows: the same input ids
    num_labels: int  # K
    embedding_size: int = 300  # E (the paper's word2vec width)
    hidden_size: int = 150  # H, each way
    mlp_size: int = 200  # M
    pairs: bool = False
    dropout_rate: float = 0.0  # on the pooled features, in training

    def __post_init__(self):
        for name in ("embedding_size", "hidden_size", "mlp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"distill.bilstm_{name}={value!r}: a positive whole number")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"distill.bilstm_dropout_rate={self.dropout_rate!r}: a rate in [0, 1)")


def describe(config: BiLSTMConfig | None) -> str:
    """The student in words, for the lines a run says ("a BERT" where it is none)."""
    if config is None:
        return "a BERT"
    return (f"a BiLSTM (embeddings {config.embedding_size}, {config.hidden_size} units each way, MLP "
            f"{config.mlp_size}{', sentence pairs' if config.pairs else ''})")


def record(config: BiLSTMConfig, teacher: str) -> dict:
    """The checkpoint's `distill` section of a BiLSTM student: its kind, shape and teacher."""
    return {"student": STUDENT, "teacher": teacher, STUDENT: dataclasses.asdict(config)}


def from_record(distill: dict | None) -> BiLSTMConfig | None:
    """The BiLSTMConfig a checkpoint's `distill` section records, or None for any other model."""
    if not distill or distill.get("student") != STUDENT:
        return None
    return BiLSTMConfig(**distill[STUDENT])


def sentences(input_ids, segment_ids, input_mask, pairs: bool):
    """The rows the BiLSTM reads, each left-aligned, and their lengths: ids [R, S] int, lengths [R] int.

    One sentence: each row's real tokens, as they are. Pairs: the first sentence is the row's real tokens of
    segment 0 (a prefix of the row), the second those of the other segment, which follow it: shifted to the
    row's start. The template's tokens stay in each ([CLS] A [SEP] and B [SEP]): they are vocabulary tokens
    like any other. A pair's segments must differ (BERT's template; RoBERTa's puts both in segment 0, which the
    run refuses)."""
    real = input_mask > 0  # [B, S]
    if not pairs:
        return input_ids, jnp.sum(real, axis=-1)
    first = jnp.sum(real & (segment_ids == 0), axis=-1)  # [B]
    second = jnp.sum(real & (segment_ids != 0), axis=-1)  # [B]
    seq_len = input_ids.shape[-1]
    shifted = jnp.minimum(first[:, None] + jnp.arange(seq_len), seq_len - 1)  # [B, S]: where B's tokens are
    second_ids = jnp.take_along_axis(input_ids, shifted, axis=-1)  # [B, S], B left-aligned (past it: anything)
    return jnp.concatenate([input_ids, second_ids]), jnp.concatenate([first, second])


def max_pool(states, lengths):
    """The max over each row's first `lengths` positions: states [R, S, D], lengths [R] -> [R, D]; 0 for an
    empty row (a pair model given one sentence: its second is empty)."""
    valid = jnp.arange(states.shape[1])[None, :] < lengths[:, None]  # [R, S]
    pooled = jnp.max(jnp.where(valid[..., None], states, -jnp.inf), axis=1)  # [R, D]
    return jnp.where(lengths[:, None] > 0, pooled, 0.0)


class BiLSTMClassifier(nn.Module):
    """Rows -> logits [B, K], as heads.BertForSequenceClassification's (regression: K=1, the value)."""

    config: BiLSTMConfig

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        # input_ids, segment_ids, input_mask: [B, S] int. Returns float32 logits [B, K].
        cfg = self.config
        ids, lengths = sentences(input_ids, segment_ids, input_mask, cfg.pairs)  # [R, S], [R]
        # The table is the student's largest part (V x E): its rows named as the teacher's word embeddings' are
        # (the rest is small, replicated). flax's Embed initialisation (std 1 / sqrt(E)): no word vectors here.
        init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
        table = nn.Embed(cfg.vocab_size, cfg.embedding_size, name="embedding",
                         embedding_init=nn.with_logical_partitioning(init, ("vocab", None)))
        x = table(ids)  # [R, S, E]
        # seq_lengths: the backward direction starts at each row's last real token, so padding reaches neither
        # direction's states at the real tokens (the forward's after them are never pooled).
        # The cells' params: lstm_forward and lstm_backward, each {ii, if, ig, io} (input kernels [E, H]) and
        # {hi, hf, hg, ho} (recurrent kernels [H, H] and the biases): the input, forget, cell and output gates.
        lstm = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(cfg.hidden_size, name="lstm_forward")),
                                nn.RNN(nn.OptimizedLSTMCell(cfg.hidden_size, name="lstm_backward")))
        states = lstm(x, seq_lengths=lengths)  # [R, S, 2H]: forward then backward units
        pooled = max_pool(states, lengths)  # [R, 2H]
        if cfg.pairs:
            h1, h2 = jnp.split(pooled, 2)  # [B, 2H] each
            pooled = jnp.concatenate([h1, h2, h1 * h2, jnp.abs(h1 - h2)], axis=-1)  # [B, 8H]
        pooled = Dropout(cfg.dropout_rate)(pooled, deterministic)  # [B, F]
        hidden = nn.relu(nn.Dense(cfg.mlp_size, name="mlp")(pooled))  # [B, M]
        logits = nn.Dense(cfg.num_labels, name="classifier")(hidden).astype(jnp.float32)  # [B, K]
        return nn.with_logical_constraint(logits, ("batch", None))
