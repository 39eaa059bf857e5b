"""Task heads for fine-tuning: the BERT encoder (bert_model.BertModel) with one dense layer on top.

Every head keeps the parameter tree {"bert": <BertModel params, exactly as in BertForPreTraining>,
"classifier": {"kernel", "bias"}}, so a pretraining checkpoint's `bert` subtree is the encoder of any
head as it is (`with_pretrained_encoder`). As in Devlin et al. 2018 and Hugging Face:
  classification / regression   dropout on the pooled [CLS] output, dense H->K (K=1: regression, STS-B)
  multiple choice               each (context, choice) row scored like that with K=1, softmax over C
  span                          dense H->2 at every position (start and end logits), no dropout (SQuAD)
  tagging                       dropout on every token's output, dense H->K (NER and other tag sets)
  contrastive                   no classifier: the sentence embedder of bertjax/models/pooling.py, its
                                params {"bert", "dense" (where it projects)}, SPLADE's encoder
                                (bertjax/models/sparse.py: {"bert", "mlm_head"}) or ColBERT's
                                (bertjax/models/multivector.py: {"bert", "projection"}), its losses on
                                embeddings in bertjax/models/contrastive_losses.py (ColBERT's token vectors:
                                bertjax/models/multivector_losses.py)
The dropout is BERT's hidden dropout (Hugging Face's classifier_dropout falls back to it). With ModernBERT's
pooler (model.pooler="gelu_norm"), span and tagging read every token through the pooler's transform,
as transformers' ModernBERT task classes run their prediction head before the classifier.

`HEADS` is the model side of the task kinds: per kind the network, the loss and how logits become
predictions; everything else about a kind is its module in bertjax/tasks/kinds/.

Packed rows (data.packing; bertjax/tasks/batches.py): classification, regression and tagging also take
sequence_ids, position_ids [B, S] and cls_positions [B, Q] as BertModel does; each sequence of a row then
computes what it computes alone, and classification / regression read each sequence's own [CLS]:
logits [B, Q, K], labels and weights [B, Q]. The losses are means over the real entries whatever the
leading shape, so a packed batch's loss is the same examples' unpacked loss.

Shape legend (as in bertjax/models/bert.py):
  B batch   C choices   S sequence length   H hidden size   K labels (classes, tags; 2 for span)
  Q sequence slots of a packed row (data.max_sequences_per_row)
"""

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert as bert_model
from bertjax.models import contrastive_losses, multivector, pooling, rerank_losses, sparse
from bertjax.models.config import POOLERS, BertConfig
from bertjax.models.layers import Dropout, dense

# --------------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------------


def _classifier(cfg: BertConfig, num_labels: int) -> nn.Dense:
    # ("embed", None) like the NSP head: K is a handful of labels, not worth sharding. A bias whatever
    # model.use_bias says: every transformers task class has one (ModernBERT's too).
    return dense(cfg, num_labels, ("embed", None), "classifier", use_bias=True)


def _pooled_output(cfg: BertConfig, input_ids, segment_ids, input_mask, deterministic: bool):
    """BertModel's pooled [CLS] output [B, H]. The last block (unrolled) computes only at [CLS], which is
    all the pooler reads (output_rows: [CLS] asked for once more), instead of at all S positions."""
    cls_row = jnp.zeros((input_ids.shape[0], 1), jnp.int32)  # [B, 1]: position 0
    bert = bert_model.BertModel(cfg, name="bert")
    return bert(input_ids, segment_ids, input_mask, deterministic, output_rows=cls_row)["pooled_output"]


def _token_output(cfg: BertConfig, bert: bert_model.BertModel, encoded: dict):
    """What the per-token classifiers read [B, S, H]: the sequence output, or where POOLERS[model.pooler]
    says so (ModernBERT) the pooler's transform of every token. The one place that decides it."""
    x = encoded["sequence_output"]
    return bert.pool(x) if POOLERS[cfg.pooler] else x


class BertForSequenceClassification(nn.Module):
    """One sentence or a pair ([CLS] A [SEP] B [SEP]) -> K logits from the pooled [CLS] output.
    num_labels=1 is regression: the one logit is the predicted value."""

    config: BertConfig
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True, sequence_ids=None,
                 position_ids=None, cls_positions=None):
        # input_ids, segment_ids, input_mask: [B, S] int. Returns float32 logits [B, K].
        # Packed rows: sequence_ids, position_ids [B, S], cls_positions [B, Q]; logits [B, Q, K].
        cfg = self.config
        if sequence_ids is None:
            pooled = _pooled_output(cfg, input_ids, segment_ids, input_mask, deterministic)  # [B, H]
            axes = ("batch", None)
        else:  # the last block (unrolled) computes only the Q [CLS] rows (and one asked for again)
            bert = bert_model.BertModel(cfg, name="bert")
            pooled = bert(input_ids, segment_ids, input_mask, deterministic, output_rows=cls_positions[:, :1],
                          sequence_ids=sequence_ids, position_ids=position_ids,
                          cls_positions=cls_positions)["pooled_output"]  # [B, Q, H]
            axes = ("batch", None, None)
        pooled = Dropout(cfg.hidden_dropout_rate)(pooled, deterministic)
        logits = _classifier(cfg, self.num_labels)(pooled).astype(jnp.float32)  # [B, K] or [B, Q, K]
        return nn.with_logical_constraint(logits, axes)


class BertForReranking(nn.Module):
    """A cross-encoder: each (query, candidate) pair ([CLS] query [SEP] candidate [SEP]) -> one score from the
    pooled [CLS] output, the classifier a regression's (so transformers reads it as sequence classification
    with one label, sentence-transformers as a CrossEncoder). Inputs [..., S]: training's [B, C, S] (C
    candidates of a query), or one pair per row [B, S]; scores [...]."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True, sequence_ids=None,
                 position_ids=None, cls_positions=None):
        # Packed rows (sequence_ids, position_ids [R, S], cls_positions [R, Q]): scores [R, Q], one per slot.
        cfg = self.config
        if sequence_ids is None:
            lead, seq_len = input_ids.shape[:-1], input_ids.shape[-1]
            flat = lambda x: x.reshape(-1, seq_len)  # noqa: E731  [B*C, S]: one row per pair
            pooled = _pooled_output(cfg, flat(input_ids), flat(segment_ids), flat(input_mask), deterministic)
        else:
            bert = bert_model.BertModel(cfg, name="bert")
            lead = cls_positions.shape
            pooled = bert(input_ids, segment_ids, input_mask, deterministic, output_rows=cls_positions[:, :1],
                          sequence_ids=sequence_ids, position_ids=position_ids,
                          cls_positions=cls_positions)["pooled_output"]  # [R, Q, H]
        pooled = Dropout(cfg.hidden_dropout_rate)(pooled, deterministic)
        scores = _classifier(cfg, 1)(pooled).astype(jnp.float32)  # [B*C, 1] or [R, Q, 1]
        return scores.reshape(lead)


class BertForMultipleChoice(nn.Module):
    """C (context, choice) pairs per example, each row scored by the pooled output and one dense unit;
    the C scores are the logits of a C-way softmax (SWAG)."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        # input_ids, segment_ids, input_mask: [B, C, S] int. Returns float32 logits [B, C].
        cfg = self.config
        batch, choices, seq_len = input_ids.shape
        flat = lambda x: x.reshape(batch * choices, seq_len)  # noqa: E731  [B*C, S]: one row per pair
        pooled = _pooled_output(cfg, flat(input_ids), flat(segment_ids), flat(input_mask), deterministic)
        pooled = Dropout(cfg.hidden_dropout_rate)(pooled, deterministic)  # [B*C, H]
        scores = _classifier(cfg, 1)(pooled).astype(jnp.float32)  # [B*C, 1]
        return nn.with_logical_constraint(scores.reshape(batch, choices), ("batch", None))


class BertForQuestionAnswering(nn.Module):
    """Span extraction (SQuAD): a start and an end logit at every position, from the sequence output.
    No dropout before the dense layer, as in the original run_squad.py and Hugging Face."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        # input_ids, segment_ids, input_mask: [B, S] int. Returns float32 logits [B, S, 2]: start, end.
        cfg = self.config
        # The pooled [CLS] is computed and unused: kept so that the `bert` subtree is BertModel's own.
        bert = bert_model.BertModel(cfg, name="bert")
        encoded = bert(input_ids, segment_ids, input_mask, deterministic)
        logits = _classifier(cfg, 2)(_token_output(cfg, bert, encoded)).astype(jnp.float32)  # [B, S, 2]
        return nn.with_logical_constraint(logits, ("batch", "length", None))


class BertForTokenClassification(nn.Module):
    """Tagging (NER, POS): K logits at every position from the dropped-out sequence output."""

    config: BertConfig
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True, sequence_ids=None,
                 position_ids=None, cls_positions=None):
        # input_ids, segment_ids, input_mask: [B, S] int. Returns float32 logits [B, S, K].
        # Packed rows: sequence_ids, position_ids [B, S], cls_positions [B, Q]; logits still [B, S, K].
        cfg = self.config
        bert = bert_model.BertModel(cfg, name="bert")
        packed = {} if sequence_ids is None else dict(sequence_ids=sequence_ids, position_ids=position_ids,
                                                      cls_positions=cls_positions)
        encoded = bert(input_ids, segment_ids, input_mask, deterministic, **packed)
        x = Dropout(cfg.hidden_dropout_rate)(_token_output(cfg, bert, encoded), deterministic)  # [B, S, H]
        logits = _classifier(cfg, self.num_labels)(x).astype(jnp.float32)  # [B, S, K]
        return nn.with_logical_constraint(logits, ("batch", "length", None))


class BertFeatureTagger(nn.Module):
    """The paper's feature-based NER (Devlin et al. 2018, section 5.3): the encoder frozen, the token
    features of some of its layers (the last four) concatenated, a randomly initialised BiLSTM
    (two layers of 768 units each way) and a dense layer H'->K on top. The encoder's params sit in
    `bert` as for every head; no gradient reaches them, and fine-tuning's optimizer leaves them be."""

    config: BertConfig
    num_labels: int
    layers: tuple[int, ...] = (-1, -2, -3, -4)
    lstm_size: int = 768
    lstm_layers: int = 2

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True):
        # input_ids, segment_ids, input_mask: [B, S] int. Returns float32 logits [B, S, K].
        cfg = self.config
        encoded = bert_model.BertModel(cfg, name="bert")(input_ids, segment_ids, input_mask, True,
                                                         output_hidden_states=True)
        hidden = encoded["hidden_states"]  # L+1 x [B, S, H], embeddings first
        x = jnp.concatenate([hidden[layer] for layer in self.layers], axis=-1).astype(jnp.float32)  # [B, S, H*n]
        x = jax.lax.stop_gradient(x)
        lengths = jnp.sum(input_mask, axis=-1).astype(jnp.int32)  # [B]: the LSTM reads only the real tokens
        for n in range(self.lstm_layers):
            forward = nn.RNN(nn.OptimizedLSTMCell(self.lstm_size, name=f"lstm_{n}_forward"))
            backward = nn.RNN(nn.OptimizedLSTMCell(self.lstm_size, name=f"lstm_{n}_backward"))
            x = nn.Bidirectional(forward, backward)(x, seq_lengths=lengths)  # [B, S, 2 * lstm_size]
            x = Dropout(cfg.hidden_dropout_rate)(x, deterministic)
        logits = nn.Dense(self.num_labels, name="classifier")(x)  # [B, S, K]
        return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", None))


def feature_tagger(layers=(-1, -2, -3, -4), lstm_size: int = 768, lstm_layers: int = 2) -> Callable:
    """A `network` for the tagging kind that builds BertFeatureTagger with these settings."""
    def build(cfg: BertConfig, num_labels: int) -> nn.Module:
        return BertFeatureTagger(cfg, num_labels, tuple(layers), lstm_size, lstm_layers)
    return build


def encoder_mask(params: dict) -> dict:
    """True for every param of the `bert` subtree, False elsewhere: the mask that freezes the encoder
    (optax.masked(optax.set_to_zero(), encoder_mask) after the optimizer: its updates, weight decay
    included, become zero)."""
    return {name: jax.tree_util.tree_map(lambda _, name=name: name == "bert", tree) for name, tree in params.items()}


# --------------------------------------------------------------------------------------------------
# Losses and predictions: pure, top level. Each returns (loss, sums); the sums add across
# microbatches and steps (a metric is a sum over its count), as bert_model.pretraining_loss's do.
# --------------------------------------------------------------------------------------------------


def _weighted_mean(values, weights):
    """sum(w * v) / sum(w): the mean over the real (weight 1) entries; 0 where there are none."""
    count = jnp.sum(weights)
    return jnp.sum(weights * values) / jnp.maximum(count, 1e-12), count


def _softmax_nll(logits, labels):
    """-log softmax(logits)[label] over the last axis. logits [..., K] float; labels [...] int."""
    logits = logits.astype(jnp.float32)
    # The label's logit by a one-hot select (as bert_model.pretraining_loss): its gradient is one fused pass.
    label_logit = jnp.sum(jnp.where(jnp.arange(logits.shape[-1]) == labels[..., None], logits, 0.0), axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - label_logit


def classification_loss(logits, labels, weights):
    """Softmax cross-entropy, the mean over the real examples (classification and multiple choice).

    input    shape / dtype     meaning
    logits   [B, K] float      the classifier's logits ([B, C]: multiple choice; packed rows [B, Q, K])
    labels   [B] int           the class index, in [0, K) (packed: [B, Q])
    weights  [B] float         1 for a real example, 0 for the padding that fills a final partial batch
                               (packed: [B, Q], 0 at empty slots)
    Returns (loss: a float32 scalar, {nll_sum, correct, count}: sums over the real examples).
    Example: loss, sums = classification_loss(logits, batch["label"], batch["example_weight"])
    """
    weights = weights.astype(jnp.float32)
    nll = _softmax_nll(logits, labels)  # [B]
    loss, count = _weighted_mean(nll, weights)
    correct = jnp.sum(weights * (jnp.argmax(logits, axis=-1) == labels))
    return loss, {"nll_sum": jnp.sum(weights * nll), "correct": correct, "count": count}


def regression_loss(logits, labels, weights):
    """Mean squared error over the real examples (STS-B).

    input    shape / dtype     meaning
    logits   [B, 1] float      the predicted value (packed rows: [B, Q, 1])
    labels   [B] float         the gold value (packed: [B, Q])
    weights  [B] float         1 for a real example, 0 for padding (packed: [B, Q], 0 at empty slots)
    Returns (loss: a float32 scalar, {squared_error_sum, count}: sums over the real examples).
    Example: loss, sums = regression_loss(logits, batch["label"], batch["example_weight"])
    """
    weights = weights.astype(jnp.float32)
    squared_error = jnp.square(logits[..., 0].astype(jnp.float32) - labels.astype(jnp.float32))  # [B]
    loss, count = _weighted_mean(squared_error, weights)
    return loss, {"squared_error_sum": jnp.sum(weights * squared_error), "count": count}


def span_loss(logits, labels, weights):
    """The mean of the start and end positions' cross-entropies over the S positions, the mean over the
    real examples (SQuAD).

    input    shape / dtype     meaning
    logits   [B, S, 2] float   the start and end logit at every position
    labels   [B, 2] int        the answer's first and last token positions; (0, 0), [CLS], where the
                               window holds no answer
    weights  [B] float         1 for a real window, 0 for padding
    Returns (loss: a float32 scalar, {nll_sum, correct (both ends right), count}: sums over the real windows).
    Example: loss, sums = span_loss(logits, batch["label"], batch["example_weight"])
    """
    weights = weights.astype(jnp.float32)
    per_end = jnp.moveaxis(logits, -1, 1)  # [B, 2, S]
    nll = jnp.mean(_softmax_nll(per_end, labels), axis=-1)  # [B]
    loss, count = _weighted_mean(nll, weights)
    correct = jnp.sum(weights * jnp.all(jnp.argmax(per_end, axis=-1) == labels, axis=-1))
    return loss, {"nll_sum": jnp.sum(weights * nll), "correct": correct, "count": count}


def multiple_choice_loss(logits, labels, weights):
    """Softmax cross-entropy over the C choices' scores, the mean over the real examples: a C-way
    classification_loss.

    input    shape / dtype     meaning
    logits   [B, C] float      one score per (context, choice) pair
    labels   [B] int           the right choice's index, in [0, C)
    weights  [B] float         1 for a real example, 0 for padding
    Returns (loss: a float32 scalar, {nll_sum, correct, count}: sums over the real examples).
    Example: loss, sums = multiple_choice_loss(logits, batch["label"], batch["example_weight"])
    """
    return classification_loss(logits, labels, weights)


def tagging_loss(logits, labels, weights):
    """Softmax cross-entropy per token, the mean over the weighted tokens.

    input    shape / dtype     meaning
    logits   [B, S, K] float   the tag logits at every position
    labels   [B, S] int        the tag index at every position (read only where weights are 1)
    weights  [B, S] float      1 at the tokens that carry a tag (a word's first piece), 0 elsewhere (other
                               pieces, [CLS], [SEP], padding): label_weight (x example_weight)
    Returns (loss: a float32 scalar, {nll_sum, correct, count}: sums over the weighted tokens).
    Example: loss, sums = tagging_loss(logits, batch["label"], batch["label_weight"])
    """
    return classification_loss(logits, labels, weights)


def best_spans(logits):
    """[B, 2] int (start, end): the highest start + end logit with start <= end, over all positions.
    (Answer-length limits and context-only positions are the task's post-processing.)"""
    start, end = logits[..., 0], logits[..., 1]  # [B, S] each
    seq_len = start.shape[-1]
    scores = start[:, :, None] + end[:, None, :]  # [B, S, S]: rows start, columns end
    valid = jnp.arange(seq_len)[:, None] <= jnp.arange(seq_len)[None, :]
    best = jnp.argmax(jnp.where(valid, scores, -jnp.inf).reshape(-1, seq_len * seq_len), axis=-1)
    return jnp.stack([best // seq_len, best % seq_len], axis=-1).astype(jnp.int32)


def _argmax(logits):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _value(logits):
    return logits[..., 0]


def _value_of_scores(scores):
    return scores


def _embedder(cfg: BertConfig, num_labels: int = 0, representation: str = "dense", **embedding) -> nn.Module:
    """The contrastive kind's network: embedding = SentenceEmbedder's settings (modes, dense_features,
    normalize, ...); none gives mean pooling. representation="splade": sparse.SpladeEncoder with its
    settings (static_queries, chunk_rows); "colbert": multivector.ColbertEncoder (dim)."""
    if representation == "splade":
        return sparse.SpladeEncoder(cfg, **embedding)
    if representation == "colbert":
        return multivector.ColbertEncoder(cfg, **embedding)
    return pooling.SentenceEmbedder(cfg, **embedding)


# --------------------------------------------------------------------------------------------------
# The table of task kinds
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Head:
    """One kind of task: how to build its network, its loss, and its predictions from logits.

    HEADS at a glance (unpacked shapes; weights 1 for a real example or tagged token, 0 for padding):
    kind             logits      loss's labels  weights   predictions
    classification   [B, K]      [B] int        [B]       [B] int32, the class
    regression       [B, 1]      [B] float      [B]       [B] float32, the value
    multiple_choice  [B, C]      [B] int        [B]       [B] int32, the choice
    span             [B, S, 2]   [B, 2] int     [B]       [B, 2] int32, (start, end)
    tagging          [B, S, K]   [B, S] int     [B, S]    [B, S] int32, the tag
    rerank           [B, C]      [B, C] float   [B, C]    [B, C] float32, each candidate's score
    contrastive: embeddings, not logits; its loss is embedding_loss(embeddings, batch, loss=..., scale=...).
    rerank: its loss is rerank_losses.rerank_loss with the run's rerank.loss (name=...) and settings.
    Example: loss, sums = HEADS["classification"].loss(logits, batch["label"], batch["example_weight"])
    """

    network: Callable[[BertConfig, int], nn.Module]  # (config, num_labels) -> the flax module
    loss: Callable  # (logits, labels, weights) -> (loss, sums)
    predict: Callable  # logits -> predictions
    num_labels: int | None  # fixed by the kind, or None where the task's label set decides
    choices: bool = False  # inputs carry a choice axis: [B, C, S] instead of [B, S]
    # The network reads packed rows (several examples per row) for training; see docs/data.md.
    packable: bool = False


HEADS = {
    "classification": Head(BertForSequenceClassification, classification_loss, _argmax, None,
                           packable=True),  # [B]
    "regression": Head(BertForSequenceClassification, regression_loss, _value, 1, packable=True),  # [B] float
    "multiple_choice": Head(lambda cfg, _: BertForMultipleChoice(cfg), multiple_choice_loss, _argmax, 1,
                            choices=True),  # [B]: the chosen choice
    "span": Head(lambda cfg, _: BertForQuestionAnswering(cfg), span_loss, best_spans, 2),  # [B, 2]
    "tagging": Head(BertForTokenClassification, tagging_loss, _argmax, None, packable=True),  # [B, S]
    # Embeddings [B, D] are its outputs; its loss takes the embeddings of a batch's texts (embedding_loss).
    "contrastive": Head(_embedder, contrastive_losses.embedding_loss, lambda embeddings: embeddings, 0,
                        packable=True),  # its texts packed: bertjax/tasks/contrastive_batches.py
    # A query's C candidates scored; its loss over them (bertjax/models/rerank_losses.py). Packed rows score
    # every pair of the step's queries; the step gathers them back to [B, C] (bertjax/tasks/rerank_batches.py).
    "rerank": Head(lambda cfg, _: BertForReranking(cfg), rerank_losses.rerank_loss, _value_of_scores, 1,
                   choices=True, packable=True),  # [B, C] float
}


def head(kind: str) -> Head:
    """HEADS[kind], or one line listing the kinds."""
    if kind not in HEADS:
        raise ValueError(f"task kind {kind!r} is unknown: choose one of {list(HEADS)}")
    return HEADS[kind]


def resolve_num_labels(kind: str, num_labels: int | None) -> int:
    """The classifier width of `kind`: fixed by the kind, or the task's num_labels (then required)."""
    fixed = head(kind).num_labels
    if fixed is not None:
        if num_labels not in (None, fixed):
            raise ValueError(f"a {kind!r} head has num_labels={fixed}, not {num_labels}: leave num_labels unset")
        return fixed
    if num_labels is None or num_labels < 2:
        raise ValueError(f"a {kind!r} head needs num_labels >= 2 (the task's label count), got {num_labels}")
    return num_labels


def network(kind: str, config: BertConfig, num_labels: int | None = None, feature_based: dict | None = None,
            embedding: dict | None = None) -> nn.Module:
    """The flax module for a task kind (num_labels: the label count, for classification and tagging).
    feature_based (tagging only): {"layers", "lstm_size", "lstm_layers"}: the frozen-feature tagger.
    embedding (contrastive only): pooling.SentenceEmbedder's settings."""
    if embedding:
        return head(kind).network(config, resolve_num_labels(kind, num_labels), **embedding)
    if feature_based:
        if kind != "tagging":
            raise ValueError(f"the feature-based variant is a tagger: task kind {kind!r} fine-tunes the encoder")
        return feature_tagger(**feature_based)(config, resolve_num_labels(kind, num_labels))
    return head(kind).network(config, resolve_num_labels(kind, num_labels))


def predictions(logits, kind: str):
    """Logits -> predictions: the class (classification, tagging), the value (regression), the choice
    (multiple choice), the (start, end) span (span)."""
    return head(kind).predict(logits)


def dummy_inputs(kind: str, batch_size: int = 1, seq_len: int = 1, num_choices: int = 1) -> dict:
    """Zero inputs of the kind's shapes, for init and jax.eval_shape."""
    shape = (batch_size, num_choices, seq_len) if head(kind).choices else (batch_size, seq_len)
    ids = jnp.zeros(shape, jnp.int32)
    return {"input_ids": ids, "segment_ids": ids, "input_mask": jnp.ones_like(ids)}


def with_pretrained_encoder(params: dict, pretrained: dict) -> dict:
    """Head params with their encoder (`bert` subtree) replaced by `pretrained`'s: BertForPreTraining
    params (a pretraining checkpoint) or another head's. The classifier stays as given (fresh).

    `params` may be boxed (nn.Partitioned, as init returns them; the boxes and so the logical names are
    kept); `pretrained` plain or boxed. Layouts must agree (both scanned or both unrolled).
    """
    pretrained = nn.meta.unbox(pretrained)
    if set(pretrained) == {"params"}:  # a whole variables dict
        pretrained = pretrained["params"]
    if "bert" not in pretrained:
        raise ValueError(f"the pretrained params have no 'bert' encoder subtree, only {sorted(pretrained)}")
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
    target = jax.tree_util.tree_flatten_with_path(params["bert"], is_leaf=is_box)[0]
    source = dict(jax.tree_util.tree_flatten_with_path(pretrained["bert"])[0])
    differ = sorted({jax.tree_util.keystr(p) for p, _ in target} ^ {jax.tree_util.keystr(p) for p in source})
    if differ:
        raise ValueError(f"the pretrained encoder and the head's have different params (e.g. bert{differ[0]}): "
                         "the same model config, scan_layers included?")
    leaves = []
    for path, leaf in target:
        value = source[path]
        shape = (leaf.unbox() if is_box(leaf) else leaf).shape
        if value.shape != shape:
            raise ValueError(f"pretrained bert{jax.tree_util.keystr(path)} has shape {value.shape}, the head's "
                             f"encoder {shape}: same model config?")
        leaves.append(leaf.replace_boxed(value) if is_box(leaf) else value)
    treedef = jax.tree_util.tree_structure(params["bert"], is_leaf=is_box)
    return {**params, "bert": jax.tree_util.tree_unflatten(treedef, leaves)}
