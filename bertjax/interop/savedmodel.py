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
                                 bertjax/data/tasks/features.py cuts them (the longer segment first).
  predict_choices(contexts, choices)  multiple choice, choices string [B, C]: logits and probabilities
                                 [B, C], label_index int32 [B] (the chosen choice)
  tag(texts)                     tagging: words string [B, W] (the text split at whitespace, "" past its
                                 end), tags string [B, W] (each word's tag, read at its first piece; ""
                                 for words past the fixed length), logits float32 [B, S, K]

  answer(questions, contexts)    span QA: answer string [B] ("" where a v2.0 model, at the threshold
                                 tuned on its dev set, finds none), start and end int32 [B] (the
                                 answer's UTF-8 byte offsets in the context; -1 for none), score float32
                                 [B] (best start + end logit), null_score float32 [B] ([CLS]'s)

The served answer is one window (question, then the context cut to what fits in S) and whole words:
its span runs from the first to the last word (whitespace-separated) of the best tokens.
`bertjax.load(...).predict` does the full post-processing of run_squad.py in Python: overlapping
windows over a long context, the max-context rule, and the exact characters of each token.
"""

import jax
import numpy as np

from bertjax.models import heads
from bertjax.models import bert as bert_model

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
    from bertjax.text import tf_cpu

    tf = tf_cpu.import_tensorflow()
    length = _sequence_length(bert, max_seq_length)
    module = _weights_and_tokenizer(tf, bert)
    signatures = {"encode": _encode_signature(tf, module, bert, length)}
    kind = bert.task["kind"] if bert.task is not None else None
    if kind is None and "mlm_head" in module.params:
        signatures["fill_mask"] = _fill_mask_signature(tf, module, bert, length)
    if kind == "multiple_choice":
        signatures["predict_choices"] = _choices_signature(tf, module, bert, length)
    if kind == "tagging":
        signatures["tag"] = _tag_signature(tf, module, bert, length)
    if kind == "span":
        signatures["answer"] = _answer_signature(tf, module, bert, length)
    if kind in ("classification", "regression"):
        signatures.update(_predict_signatures(tf, module, bert, length))
    tf.saved_model.save(module, directory, signatures=signatures)
    return list(signatures)


def _sequence_length(bert, max_seq_length: int | None) -> int:
    """S: the one asked for, else a fine-tuned model's own, else 128; refused past the model's positions."""
    cfg = bert.config
    if max_seq_length is None:
        max_seq_length = int((bert.task or {}).get("max_seq_length") or 128)
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
    from jax.experimental import jax2tf

    return jax2tf.convert(fn, polymorphic_shapes=[None, *shapes], with_gradient=False,
                          native_serialization_platforms=PLATFORMS)


def _head(net):
    """A task network's float32 output from (params, input_ids, segment_ids, input_mask)."""
    return lambda p, ids, segments, mask: net.apply({"params": p}, ids, segments, mask,
                                                    deterministic=True).astype(np.float32)


def _text_spec(tf, shape=(None,)):
    return tf.TensorSpec(list(shape), tf.string)


def _encode_signature(tf, module, bert, length: int):
    """encode(texts): the encoder's sequence and pooled outputs, and the ids and mask it read."""
    encoder = bert_model.BertModel(bert.config)

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
    pretraining = bert_model.BertForPreTraining(bert.config)

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


def _choices_signature(tf, module, bert, length: int):
    """predict_choices(contexts, choices): each (context, choice) a pair, as in training."""
    num_choices = int(bert.task["num_choices"])
    tf_choices = _to_tf(_head(heads.network("multiple_choice", bert.config)),
                        *[f"(b, {num_choices}, {length})"] * 3)

    @tf.function(input_signature=[_text_spec(tf), _text_spec(tf, (None, num_choices))], autograph=False)
    def predict_choices(contexts, choices):
        # [B * C, S] pairs, then [B, C, S].
        flat_contexts = tf.reshape(tf.repeat(contexts, num_choices), [-1])
        ids, segments, mask = _pair(tf, bert.tokenizer, flat_contexts, tf.reshape(choices, [-1]), length)
        shape = [-1, num_choices, length]
        logits = tf_choices(module.params, tf.reshape(ids, shape), tf.reshape(segments, shape),
                            tf.reshape(mask, shape))
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
                "label_index": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    return predict_choices


def _tag_signature(tf, module, bert, length: int):
    """tag(texts): each whitespace-separated word's tag, read at its first piece."""
    tokenizer, labels = bert.tokenizer, list(bert.task["labels"])
    net = heads.network("tagging", bert.config, len(labels), feature_based=bert.task.get("feature_based"))
    tf_tags = _to_tf(_head(net), *[f"(b, {length})"] * 3)

    @tf.function(input_signature=[_text_spec(tf)], autograph=False)
    def tag(texts):
        words = tf.strings.split(texts)  # [B, (W)]
        pieces = tokenizer.tokenize(words.flat_values)  # [sum W, (P)]
        empty = tf.cast(pieces.row_lengths() == 0, tf.int64)  # a word of dropped characters: [UNK]
        unk = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(empty)], tokenizer.unk_id), empty)
        pieces = tf.concat([pieces, unk], axis=1)
        first = tf.ragged.range(pieces.row_lengths()) == 0
        tokens = tf.RaggedTensor.from_row_splits(pieces, words.row_splits).merge_dims(1, 2)[:, : length - 2]
        first = tf.RaggedTensor.from_row_splits(first, words.row_splits).merge_dims(1, 2)[:, : length - 2]
        batch = tf.shape(texts)[0]
        rows = tf.concat([tf.fill([batch, 1], tokenizer.cls_id), tokens, tf.fill([batch, 1], tokenizer.sep_id)],
                         axis=1)
        ids, mask = _pad_rows(tf, rows, length, tokenizer.pad_id)
        logits = tf_tags(module.params, ids, tf.zeros_like(ids), mask)  # [B, S, K]
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, S]
        at = tf.ragged.boolean_mask(tf.ragged.range(first.row_lengths()) + 1, first)  # first pieces, after [CLS]
        word_tags = tf.gather(tf.constant(labels), tf.gather(predicted, tf.cast(at, tf.int32), batch_dims=1))
        words_out = words.to_tensor(default_value="")  # [B, W]
        tags_out = word_tags.to_tensor(default_value="")  # [B, <= W]: words past S have no tag
        missing = tf.shape(words_out)[1] - tf.shape(tags_out)[1]
        tags_out = tf.pad(tags_out, [[0, 0], [0, missing]], constant_values="")
        return {"words": words_out, "tags": tags_out, "logits": logits}

    return tag


def _predict_signatures(tf, module, bert, length: int) -> dict:
    """predict(texts) and predict_pair(texts, text_pairs): a classifier's label or a regression's score."""
    tokenizer, kind = bert.tokenizer, bert.task["kind"]
    labels = list(bert.task.get("labels") or [])
    net = heads.network(kind, bert.config, len(labels) if kind == "classification" else None)
    tf_logits = _to_tf(_head(net), *[f"(b, {length})"] * 3)

    def outputs(ids, segments, mask):
        logits = tf_logits(module.params, ids, segments, mask)
        if kind == "regression":
            return {"logits": logits, "score": logits[:, 0]}
        index = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1), "label_index": index,
                "label": tf.gather(tf.constant(labels), index)}

    @tf.function(input_signature=[_text_spec(tf)], autograph=False)
    def predict(texts):
        return outputs(*_single(tf, tokenizer, texts, length))

    @tf.function(input_signature=[_text_spec(tf), _text_spec(tf)], autograph=False)
    def predict_pair(texts, text_pairs):
        return outputs(*_pair(tf, tokenizer, texts, text_pairs, length))

    return {"predict": predict, "predict_pair": predict_pair}


def _answer_signature(tf, module, bert, length: int):
    """answer(questions, contexts): the span QA signature described in the module docstring."""
    import tensorflow_text as tf_text

    tokenizer, task = bert.tokenizer, bert.task
    settings = task.get("squad_settings") or {}
    max_query, max_answer = int(settings.get("max_query_length", 64)), int(settings.get("max_answer_length", 30))
    threshold = float(task.get("null_threshold") or 0.0) if task.get("squad_version") == "v2.0" else None
    tf_span = _to_tf(_head(heads.network("span", bert.config)), *[f"(b, {length})"] * 3)
    words_of = tf_text.WhitespaceTokenizer()

    @tf.function(input_signature=[_text_spec(tf), _text_spec(tf)], autograph=False)
    def answer(questions, contexts):
        batch = tf.shape(questions)[0]
        question = tokenizer.tokenize(questions)[:, :max_query]  # [B, (Q)]
        words, word_starts, word_ends = words_of.tokenize_with_offsets(contexts)  # [B, (W)], byte offsets
        pieces = tokenizer.tokenize(words.flat_values)  # [sum W, (P)]
        word_index = tf.ragged.range(words.row_lengths()).flat_values  # each word's place in its context
        piece_word = tf.RaggedTensor.from_row_lengths(tf.repeat(word_index, pieces.row_lengths()),
                                                      pieces.row_lengths())
        context = tf.RaggedTensor.from_row_splits(pieces, words.row_splits).merge_dims(1, 2)  # [B, (T)]
        context_word = tf.RaggedTensor.from_row_splits(piece_word, words.row_splits).merge_dims(1, 2)
        room = length - 3 - question.row_lengths()  # [B]: what the window leaves for the context
        fits = tf.ragged.range(context.row_lengths()) < room[:, None]
        context, context_word = tf.ragged.boolean_mask(context, fits), tf.ragged.boolean_mask(context_word, fits)
        cls, sep = tf.fill([batch, 1], tokenizer.cls_id), tf.fill([batch, 1], tokenizer.sep_id)
        rows = tf.concat([cls, question, sep, context, sep], axis=1)
        ids, mask = _pad_rows(tf, rows, length, tokenizer.pad_id)
        second = tf.concat([tf.zeros_like(cls), tf.zeros_like(question), tf.zeros_like(sep), tf.ones_like(context),
                            tf.ones_like(sep)], axis=1)
        segments, _ = _pad_rows(tf, second, length, 0)
        logits = tf_span(module.params, ids, segments, mask)  # [B, S, 2]
        start_logits, end_logits = logits[..., 0], logits[..., 1]
        offset = tf.cast(question.row_lengths() + 2, tf.int32)[:, None]  # [B, 1]: the context's first position
        first, last, score = _best_span(tf, start_logits, end_logits, offset,
                                        tf.cast(context.row_lengths(), tf.int32)[:, None], length, max_answer)
        words_dense = context_word.to_tensor(default_value=0)  # [B, T']
        first_word = tf.gather(words_dense, tf.maximum(first - offset[:, 0], 0), batch_dims=1)
        last_word = tf.gather(words_dense, tf.maximum(last - offset[:, 0], 0), batch_dims=1)
        begin = tf.gather(word_starts.to_tensor(), first_word, batch_dims=1)
        end = tf.gather(word_ends.to_tensor(), last_word, batch_dims=1)
        null_score = start_logits[:, 0] + end_logits[:, 0]
        found = tf.math.is_finite(score)
        if threshold is not None:
            found &= null_score - score <= threshold
        text = tf.strings.substr(contexts, begin, end - begin)
        return {"answer": tf.where(found, text, ""), "start": tf.where(found, tf.cast(begin, tf.int32), -1),
                "end": tf.where(found, tf.cast(end, tf.int32), -1), "score": score, "null_score": null_score}

    return answer


def _best_span(tf, start_logits, end_logits, offset, context_length, length: int, max_answer: int):
    """The best span inside the context, at most max_answer long: its first and last positions [B] and its
    score [B] (start + end logit; -inf where none fits). Logits [B, S]; offset, context_length [B, 1]."""
    position = tf.range(length)[None, :]
    in_context = (position >= offset) & (position < offset + context_length)
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # [B, S, S]: rows start, columns end
    span = position[0][None, :] - position[0][:, None]  # end - start
    valid = (in_context[:, :, None] & in_context[:, None, :] & (span >= 0)[None] & (span < max_answer)[None])
    flat = tf.reshape(tf.where(valid, scores, -np.inf), [-1, length * length])
    best = tf.argmax(flat, axis=-1, output_type=tf.int32)
    return best // length, best % length, tf.reduce_max(flat, axis=-1)
