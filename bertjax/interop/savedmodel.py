"""A loaded bertjax model as a TensorFlow SavedModel for TF Serving: signatures on raw strings.

The model is the JAX function itself, converted with jax2tf (StableHLO inside the SavedModel, the
weights as variables); the tokenizer is bertjax's own, which is TensorFlow ops already, so the text is
tokenized inside the served graph exactly as in training. Texts are cut and padded to a fixed length S
(--max_seq_length) in the graph; the batch size is free.

Signatures (B texts; S max_seq_length; H hidden size; P masks per text, at most max_masks; k top_k):
  encode(texts)                  sequence_output float32 [B, S, H], pooled_output float32 [B, H],
                                 input_ids int32 [B, S], input_mask int32 [B, S]
  fill_mask(texts)               pretraining checkpoints. "[MASK]" written in a text is the mask token,
                                 as bertjax.load(...).fill_mask reads it: mask_positions int32 [B, P]
                                 (-1 past a text's masks), top_ids int32 [B, P, k], top_scores float32
                                 [B, P, k] (the softmax over the vocabulary, best first)
  predict(texts)                 classification / regression checkpoints: logits float32 [B, K],
  predict_pair(texts, text_pairs)  and for classification probabilities [B, K], label_index int32 [B],
                                 label string [B]; for regression score float32 [B]. Pairs are cut as
                                 bertjax/tasks/features.py cuts them (the longer segment first).
  predict_choices(contexts, choices)  multiple choice, choices string [B, C]: logits and probabilities
                                 [B, C], label_index int32 [B] (the chosen choice)
  tag(texts)                     tagging: words string [B, W] (the text split at whitespace, "" past its
                                 end), tags string [B, W] (each word's tag, read at its first piece; ""
                                 for words past the fixed length), logits float32 [B, S, K]

  answer(questions, contexts)    span QA: answer string [B] ("" where a v2.0 model, at the threshold
                                 tuned on its dev set, finds none), start and end int32 [B] (the
                                 answer's UTF-8 byte offsets in the context; -1 for none), score float32
                                 [B] (best start + end logit), null_score float32 [B] ([CLS]'s)

encode and fill_mask are built here; a fine-tuned model's own signatures by its kind's module
(bertjax/tasks/kinds/<kind>.py), from the `Graph` this module hands it (jax2tf, the tokenizer in the graph).

The served answer is one window (question, then the context cut to what fits in S) and whole words:
its span runs from the first to the last word (whitespace-separated) of the best tokens.
`bertjax.load(...).predict` does the full post-processing of run_squad.py in Python: overlapping
windows over a long context, the max-context rule, and the exact characters of each token.
"""

import dataclasses
from typing import Any

import jax
import numpy as np

from bertjax.models import bert as bert_model
from bertjax.tasks import kinds
from bertjax.text import tf_cpu

MAX_MASKS = 8
TOP_K = 5


def _device_free(tree):
    return jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), tree)


def _pad_rows(tf, rows, length: int, pad_id: int):
    """Ragged int32 [B, (n)] -> dense [B, S] right-padded with pad_id, and the input mask [B, S]."""
    ids = rows.to_tensor(default_value=pad_id, shape=[None, length])
    mask = tf.sequence_mask(tf.minimum(rows.row_lengths(), length), length, dtype=tf.int32)
    return tf.cast(ids, tf.int32), mask


def _single(tf, tokenizer, texts, length: int):
    """[CLS] text [SEP], cut to S: input_ids, segment_ids, input_mask, each int32 [B, S]."""
    ids = tokenizer.tokenize(texts)[:, : length - 2]
    batch = tf.shape(texts)[0]
    rows = tf.concat([tf.fill([batch, 1], tokenizer.cls_id), ids, tf.fill([batch, 1], tokenizer.sep_id)], axis=1)
    input_ids, mask = _pad_rows(tf, rows, length, tokenizer.pad_id)
    return input_ids, tf.zeros_like(input_ids), mask


def _truncated_lengths(tf, len_a, len_b, max_length: int):
    """features.truncated_lengths in TF ops: the longer segment is cut first, then both alternately."""
    shorter = tf.minimum(len_a, len_b)
    fits = len_a + len_b <= max_length
    only_longer = 2 * shorter <= max_length
    a_longer = len_a > len_b
    new_a = tf.where(only_longer, tf.where(a_longer, max_length - shorter, len_a), (max_length + 1) // 2)
    new_b = tf.where(only_longer, tf.where(a_longer, len_b, max_length - shorter), max_length // 2)
    return tf.where(fits, len_a, new_a), tf.where(fits, len_b, new_b)


def _pair(tf, tokenizer, texts, pairs, length: int):
    """[CLS] A [SEP] B [SEP], cut as in training: input_ids, segment_ids, input_mask int32 [B, S]."""
    a, b = tokenizer.tokenize(texts), tokenizer.tokenize(pairs)
    keep_a, keep_b = _truncated_lengths(tf, a.row_lengths(), b.row_lengths(), length - 3)
    a = tf.ragged.boolean_mask(a, tf.ragged.range(a.row_lengths()) < keep_a[:, None])
    b = tf.ragged.boolean_mask(b, tf.ragged.range(b.row_lengths()) < keep_b[:, None])
    batch = tf.shape(texts)[0]
    cls, sep = tf.fill([batch, 1], tokenizer.cls_id), tf.fill([batch, 1], tokenizer.sep_id)
    rows = tf.concat([cls, a, sep, b, sep], axis=1)
    first = tf.concat([tf.zeros_like(cls), tf.zeros_like(a), tf.zeros_like(sep)], axis=1)
    second = tf.concat([tf.ones_like(b), tf.ones_like(sep)], axis=1)
    input_ids, mask = _pad_rows(tf, rows, length, tokenizer.pad_id)
    segments, _ = _pad_rows(tf, tf.concat([first, second], axis=1), length, 0)
    return input_ids, segments, mask


def _with_masks(tf, tokenizer, texts, length: int):
    """Texts with "[MASK]" written in them: the pieces between the marks tokenized, the mask id between
    them, [CLS] ... [SEP], cut to S. Returns input_ids, segment_ids, input_mask [B, S] and the mask
    positions [B, P] (-1 past a text's masks)."""
    parts = tf.strings.split(texts, "[MASK]")  # [B, (pieces)]
    pieces = tokenizer.tokenize(parts.flat_values)  # [sum pieces, (T)]
    position = tf.range(tf.shape(parts.flat_values, out_type=tf.int64)[0])
    is_last = position == tf.gather(parts.row_splits[1:], parts.value_rowids()) - 1  # a text's last piece
    marks = tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(tf.cast(~is_last, tf.int32))], tokenizer.mask_id), tf.cast(~is_last, tf.int64))
    joined = tf.concat([pieces, marks], axis=1)  # each piece followed by a mask, but the last
    ids = tf.RaggedTensor.from_row_splits(joined, parts.row_splits).merge_dims(1, 2)[:, : length - 2]
    batch = tf.shape(texts)[0]
    rows = tf.concat([tf.fill([batch, 1], tokenizer.cls_id), ids, tf.fill([batch, 1], tokenizer.sep_id)], axis=1)
    input_ids, mask = _pad_rows(tf, rows, length, tokenizer.pad_id)
    is_mask = tf.equal(input_ids, tokenizer.mask_id) & (mask > 0)
    where = tf.RaggedTensor.from_row_lengths(tf.cast(tf.where(is_mask)[:, 1], tf.int32),
                                             tf.reduce_sum(tf.cast(is_mask, tf.int64), axis=1))
    positions = where[:, :MAX_MASKS].to_tensor(default_value=-1, shape=[None, MAX_MASKS])
    return input_ids, tf.zeros_like(input_ids), mask, positions


# Lowered for each: a SavedModel exported on a CPU machine serves on GPUs too.
PLATFORMS = ("cpu", "cuda")


def export_savedmodel(bert, directory: str, max_seq_length: int | None = None) -> list[str]:
    """Writes the SavedModel of `bert` (a bertjax.load result) to `directory`; returns its signature names.
    max_seq_length: S; by default a fine-tuned model's own (what bertjax.load(...).predict uses), else 128."""
    if bert.tokenizer.kind == "bpe":
        raise ValueError("--format=savedmodel: a byte-level BPE tokenizer runs in Python (the tokenizers library), "
                         "which a SavedModel's graph cannot hold; export with --format=hf or --format=params")
    tf = tf_cpu.import_tensorflow()  # here, not at the top: the export program's other formats run without TF
    length = _sequence_length(bert, max_seq_length)
    module = _weights_and_tokenizer(tf, bert)
    signatures = {"encode": _encode_signature(tf, module, bert, length)}
    if bert.task is not None:  # a fine-tuned model: its kind's signatures (bertjax/tasks/kinds/)
        signatures.update(kinds.get(bert.task.kind).signatures(Graph(tf, module, bert, length)))
    elif "mlm_head" in module.params:
        signatures["fill_mask"] = _fill_mask_signature(tf, module, bert, length)
    tf.saved_model.save(module, directory, signatures=signatures)
    return list(signatures)


def _sequence_length(bert, max_seq_length: int | None) -> int:
    """S: the one asked for, else a fine-tuned model's own, else 128; refused past the model's positions."""
    cfg = bert.config
    if max_seq_length is None:
        max_seq_length = int((bert.task.max_seq_length if bert.task else None) or 128)
    if not 3 <= max_seq_length <= cfg.max_position_embeddings:
        raise ValueError(f"--max_seq_length={max_seq_length}: between 3 and the model's max_position_embeddings="
                         f"{cfg.max_position_embeddings}")
    return max_seq_length


def _weights_and_tokenizer(tf, bert):
    """The tf.Module saved: the weights as variables (as graph constants they would meet protobuf's 2 GB
    limit), and the tokenizer's TF resources (its vocabulary or SentencePiece model), so it stands alone."""
    module = tf.Module()
    module.params = tf.nest.map_structure(lambda x: tf.Variable(x, trainable=False), _device_free(bert.params))
    module.tokenizer_parts = [v for v in vars(bert.tokenizer).values() if isinstance(v, tf.Module)]
    return module


def _to_tf(fn, *shapes: str):
    """`fn(params, *arrays)` as a TF function, the batch size free; shapes: each array's polymorphic shape."""
    from jax.experimental import jax2tf  # imports TensorFlow: only after tf_cpu (export_savedmodel), never at the top

    return jax2tf.convert(fn, polymorphic_shapes=[None, *shapes], with_gradient=False,
                          native_serialization_platforms=PLATFORMS)


def _head(net):
    """A task network's float32 output from (params, input_ids, segment_ids, input_mask)."""
    return lambda p, ids, segments, mask: net.apply({"params": p}, ids, segments, mask,
                                                    deterministic=True).astype(np.float32)


@dataclasses.dataclass
class Graph:
    """What a task kind's signatures (bertjax/tasks/kinds/) are built of: the saved module's weights, the
    jax2tf conversion, and the tokenizer in the graph at the fixed length S."""

    tf: Any  # the tensorflow module
    module: Any  # the tf.Module saved (_weights_and_tokenizer)
    bert: Any  # the bertjax.load result: config, tokenizer, task
    length: int  # S

    def convert(self, net, shape: str | None = None):
        """A task network as a TF function of (input_ids, segment_ids, input_mask) -> float32, the weights
        bound; shape: each input's polymorphic shape, (b, S) by default."""
        tf_net = _to_tf(_head(self.bert.network(net)), *[shape or f"(b, {self.length})"] * 3)
        return lambda ids, segments, mask: tf_net(self.module.params, ids, segments, mask)

    def text_spec(self, shape=(None,)):
        return _text_spec(self.tf, shape)

    def single(self, texts):
        """[CLS] text [SEP], cut to S: input_ids, segment_ids, input_mask int32 [B, S]."""
        return _single(self.tf, self.bert.tokenizer, texts, self.length)

    def pair(self, texts, pairs):
        """[CLS] A [SEP] B [SEP], cut as in training: input_ids, segment_ids, input_mask int32 [B, S]."""
        return _pair(self.tf, self.bert.tokenizer, texts, pairs, self.length)

    def pad_rows(self, rows, pad_id: int):
        """Ragged int32 [B, (n)] -> dense [B, S] right-padded with pad_id, and the input mask [B, S]."""
        return _pad_rows(self.tf, rows, self.length, pad_id)


def _text_spec(tf, shape=(None,)):
    return tf.TensorSpec(list(shape), tf.string)


def _encode_signature(tf, module, bert, length: int):
    """encode(texts): the encoder's sequence and pooled outputs, and the ids and mask it read."""
    encoder = bert.network(bert_model.BertModel(bert.config))  # int8 kernels where bert is quantised

    def encode_fn(p, ids, segments, mask):
        out = encoder.apply({"params": p["bert"]}, ids, segments, mask, deterministic=True)
        return out["sequence_output"].astype(np.float32), out["pooled_output"].astype(np.float32)

    tf_encode = _to_tf(encode_fn, *[f"(b, {length})"] * 3)

    @tf.function(input_signature=[_text_spec(tf)], autograph=False)
    def encode(texts):
        ids, segments, mask = _single(tf, bert.tokenizer, texts, length)
        sequence_output, pooled = tf_encode(module.params, ids, segments, mask)
        return {"sequence_output": sequence_output, "pooled_output": pooled, "input_ids": ids, "input_mask": mask}

    return encode


def _fill_mask_signature(tf, module, bert, length: int):
    """fill_mask(texts): the TOP_K guesses and their probabilities at each "[MASK]" of a text."""
    pretraining = bert.network(bert_model.BertForPreTraining(bert.config))

    def fill_fn(p, ids, segments, mask, positions):
        logits = pretraining.apply({"params": p}, ids, segments, mask, jax.numpy.maximum(positions, 0),
                                   deterministic=True)["mlm_logits"]  # [B, P, V]
        return jax.nn.softmax(logits.astype(np.float32), axis=-1)

    tf_fill = _to_tf(fill_fn, *[f"(b, {length})"] * 3, f"(b, {MAX_MASKS})")

    @tf.function(input_signature=[_text_spec(tf)], autograph=False)
    def fill_mask(texts):
        ids, segments, mask, positions = _with_masks(tf, bert.tokenizer, texts, length)
        # top-k in TF: jax's lowers to an op the StableHLO reader of this TF may not know yet.
        scores, top = tf.math.top_k(tf_fill(module.params, ids, segments, mask, positions), TOP_K)
        valid = positions[:, :, None] >= 0
        return {"mask_positions": positions, "top_ids": tf.where(valid, top, -1),
                "top_scores": tf.where(valid, scores, 0.0)}

    return fill_mask
