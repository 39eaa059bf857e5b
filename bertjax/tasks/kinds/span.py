"""Span QA (SQuAD v1.1 and v2.0): a start and an end logit per position over a question's windows.

The windows, the token characters and the answer decoding of run_squad.py are bertjax/tasks/squad.py;
this module is what the rest of bertjax asks of the kind. Prediction files are the JSON files the
official SQuAD scripts read: <split>_predictions.json (id -> answer), <split>_nbest_predictions.json
and, v2.0, <split>_null_odds.json (their na_prob file).

Data: the TFDS squad splits, or SQuAD-format JSON files of yours (data.train, data.validation, data.test),
{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}, as squad.read_squad_json reads them:
  field          required?            meaning
  context        yes                  the paragraph (a string) its questions are asked of
  id, question   yes                  each question's id (unique in the file) and its text
  answers        labelled sets: yes   [{"text", "answer_start"}], the text found at that character offset
                                      of the context; the first is the training label, EM/F1 take all
  is_impossible  no (v2.0 only)       true: the context holds no answer (answers may then be empty)
Example, a file of one question and the run that fine-tunes on such files:
  {"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [{"id": "q1", "question":
  "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
  python -m bertjax.finetune --config=configs/finetune/span.py --config.train.init_from=PATH \
      --config.data.train=train.json --config.data.validation=dev.json [--config.data.squad_version=v2.0] \
      --workdir=DIR
"""

import json

import numpy as np

from bertjax.models import heads
from bertjax.tasks import metrics, readers, squad
from bertjax.tasks.kinds.base import Kind, Scored, Split
from bertjax.text import tf_cpu


def settings_from_config(config):
    """The windowing and decoding settings of a span config (configs/finetune/squad.py); None without them."""
    if "answers" not in config:
        return None
    return squad.Settings(max_seq_length=config.data.max_seq_length, max_query_length=config.data.max_query_length,
                          doc_stride=config.data.doc_stride, n_best=config.answers.n_best,
                          max_answer_length=config.answers.max_answer_length)


def read(task, split: str, path: str | None = None, data_dir: str | None = None, labeled: bool = True) -> list:
    """SQuAD-format JSON, or the TFDS squad split of the task's version."""
    if path:
        return squad.read_squad_json(path, task.squad_version, labeled=labeled)
    readers.check_tfds_split(task, split)
    return squad.read_tfds_squad(task.squad_version, split, data_dir=data_dir)


def featurize(task, examples: list, tokenizer, max_seq_length: int, settings=None) -> dict:
    """SquadExamples -> one row per window (settings.max_seq_length, not max_seq_length, is the width)."""
    return squad.featurize_squad(examples, tokenizer, settings)


def score(task, split_name: str, split: Split, logits: np.ndarray, settings=None, null_threshold: float = 0.0):
    """Answers decoded over each question's windows; EM/F1 (and v2.0's threshold search); the JSON files."""
    version = task.squad_version
    answers = squad.decode_answers(split.examples, split.features, logits[..., 0], logits[..., 1],
                                   settings or squad.Settings(), version, null_threshold)
    found = {}
    chosen = answers.text
    if split.labeled:
        golds = {e.id: list(e.answers) if not e.is_impossible else [] for e in split.examples}
        if version == squad.V2:
            found = metrics.squad_scores(answers.text, golds, version=version)  # at the threshold given
            # The threshold search of the official v2.0 script, over every question's best span (not
            # the answers already thresholded, which could only lose spans, never regain them).
            tuned = metrics.squad_scores(answers.best_span, golds, answers.null_odds, version=version)
            found.update({k: v for k, v in tuned.items() if k.startswith("best_")})
            # The prediction file answers at the threshold the dev set chose (its best F1).
            chosen = squad.with_threshold(answers, found["best_f1_threshold"])
        else:
            found = metrics.squad_scores(answers.text, golds, version=version)
    files = {f"{split_name}_predictions.json": json.dumps(chosen, indent=1, ensure_ascii=False),
             f"{split_name}_nbest_predictions.json": json.dumps(answers.nbest, indent=1, ensure_ascii=False)}
    if version == squad.V2:
        files[f"{split_name}_null_odds.json"] = json.dumps(answers.null_odds, indent=1)
    return Scored(found, files)


def predict(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    """questions=[...], contexts=[...] -> {"answer", "start", "end" (its characters in the context), "score"
    (its probability among the n-best)}; "" where a v2.0 model finds no answer (at its tuned threshold)."""
    if questions is None or contexts is None:
        raise ValueError("predict for span QA needs questions=[...] and contexts=[...], one context per question")
    questions = [questions] if isinstance(questions, str) else list(questions)
    contexts = [contexts] if isinstance(contexts, str) else list(contexts)
    if len(questions) != len(contexts) or not questions:
        raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts: give one context per question")
    task = model.task
    settings = squad.Settings(**task.squad_settings)
    examples = [squad.SquadExample(str(n), q, c, (), ()) for n, (q, c) in enumerate(zip(questions, contexts))]
    features = squad.featurize_squad(examples, model.tokenizer, settings)
    logits = model.task_logits(features)
    answers = squad.decode_answers(examples, features, logits[..., 0], logits[..., 1], settings,
                                   task.squad_version, task.null_threshold)
    out = []
    for e in examples:
        text = answers.text[e.id]
        best = next(entry for entry in answers.nbest[e.id] if entry["text"] == text)
        out.append({"answer": text, "start": best["start"], "end": best["end"], "score": best["probability"]})
    return out


# --------------------------------------------------------------------------------------------------
# The SavedModel's answer signature: one window, whole words (bertjax/interop/savedmodel.py's docstring)
# --------------------------------------------------------------------------------------------------


def signatures(graph) -> dict:
    """answer(questions, contexts): the span QA signature described in savedmodel.py's docstring."""
    tf, tokenizer, task, length = graph.tf, graph.bert.tokenizer, graph.bert.task, graph.length
    settings = task.squad_settings or {}
    max_query, max_answer = int(settings.get("max_query_length", 64)), int(settings.get("max_answer_length", 30))
    threshold = float(task.null_threshold or 0.0) if task.squad_version == "v2.0" else None
    tf_span = graph.convert(heads.network("span", graph.bert.config))
    # Called here, not at the top: the kinds are imported without TensorFlow (bertjax.load, the model).
    words_of = tf_cpu.import_tensorflow_text().WhitespaceTokenizer()

    @tf.function(input_signature=[graph.text_spec(), graph.text_spec()], autograph=False)
    def answer(questions, contexts):
        question = tokenizer.tokenize(questions)[:, :max_query]  # [B, (Q)]
        words, word_starts, word_ends = words_of.tokenize_with_offsets(contexts)  # [B, (W)], byte offsets
        context, context_word = _context_pieces(tf, tokenizer, words, length - 3 - question.row_lengths())
        ids, segments, mask = _window(graph, question, context)
        logits = tf_span(ids, segments, mask)  # [B, S, 2]
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

    return {"answer": answer}


def _context_pieces(tf, tokenizer, words, room):
    """The context's pieces [B, (T)] and each piece's word [B, (T)], cut to `room` [B] pieces."""
    pieces = tokenizer.tokenize(words.flat_values)  # [sum W, (P)]
    word_index = tf.ragged.range(words.row_lengths()).flat_values  # each word's place in its context
    piece_word = tf.RaggedTensor.from_row_lengths(tf.repeat(word_index, pieces.row_lengths()), pieces.row_lengths())
    context = tf.RaggedTensor.from_row_splits(pieces, words.row_splits).merge_dims(1, 2)  # [B, (T)]
    context_word = tf.RaggedTensor.from_row_splits(piece_word, words.row_splits).merge_dims(1, 2)
    fits = tf.ragged.range(context.row_lengths()) < room[:, None]
    return tf.ragged.boolean_mask(context, fits), tf.ragged.boolean_mask(context_word, fits)


def _window(graph, question, context):
    """[CLS] question [SEP] context [SEP]: input_ids, segment_ids (1 from the context on), input_mask [B, S]."""
    tf, tokenizer = graph.tf, graph.bert.tokenizer
    batch = tf.shape(question.row_lengths())[0]
    cls, sep = tf.fill([batch, 1], tokenizer.cls_id), tf.fill([batch, 1], tokenizer.sep_id)
    rows = tf.concat([cls, question, sep, context, sep], axis=1)
    ids, mask = graph.pad_rows(rows, tokenizer.pad_id)
    second = tf.concat([tf.zeros_like(cls), tf.zeros_like(question), tf.zeros_like(sep), tf.ones_like(context),
                        tf.ones_like(sep)], axis=1)
    segments, _ = graph.pad_rows(second, 0)
    return ids, segments, mask


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


SPAN = Kind("span", class_labels=False, read=read, featurize=featurize, score=score, predict=predict,
            signatures=signatures, settings_from_config=settings_from_config,
            hf_class=dict(architecture="BertForQuestionAnswering", prefix="qa_outputs", pooler=False, labels=False,
                          problem_type=None, auto_class="AutoModelForQuestionAnswering"))
