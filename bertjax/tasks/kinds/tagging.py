"""Tagging (NER, POS): a tag per word, read at its first piece; scored at the entity level.

The CoNLL columns, BIO and the rows split at word boundaries are bertjax/tasks/tag_sequences.py; this module
is what the rest of bertjax asks of the kind. Its prediction file is <split>_predictions.txt in
conlleval's input form (word, gold tag, predicted tag; a blank line between sentences).

Data: TFDS conll2003, or CoNLL column files of yours (data.train, data.validation, data.test), one word
per line, a blank line between sentences, -DOCSTART- lines skipped, as tag_sequences.read_conll reads them:
  column          required?  meaning
  word (first)    yes        the word, as the sentence spells it
  middle columns  no         read past (CoNLL-2003's POS and chunk tags); every line has the first's count
  tag (last)      yes        a tag of data.labels ("O" among them) once read as BIO: BIO or IOB1 files.
                             A test set (data.test) may be the words alone
Example, a sentence of train.txt and the run that fine-tunes on it:
  "Alice B-PER", "visited O", "Paris B-LOC", ". O": one line each, then a blank line
  python -m bertjax.finetune --config=configs/finetune/tagging.py --config.train.init_from=PATH \
      --config.data.train=train.txt --config.data.validation=dev.txt \
      --config.data.labels="('O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC')" --workdir=DIR
"""

import numpy as np

from bertjax.models import heads
from bertjax.tasks import metrics, readers, tag_sequences
from bertjax.tasks.kinds.base import Kind, Scored, Split, refuse_questions


def read(task, split: str, path: str | None = None, data_dir: str | None = None, labeled: bool = True) -> list:
    """CoNLL columns, or TFDS conll2003."""
    if path:
        return tag_sequences.read_conll(path, task.labels, labeled=labeled)
    readers.check_tfds_split(task, split)
    return tag_sequences.read_tfds_conll(split, data_dir=data_dir)


def featurize(task, examples: list, tokenizer, max_seq_length: int, settings=None) -> dict:
    """TagExamples -> rows of whole words, labels at each word's first piece (label_weight 1 there)."""
    return tag_sequences.featurize_tagging(examples, task.labels, tokenizer, max_seq_length)


def score(task, split_name: str, split: Split, logits: np.ndarray, settings=None, null_threshold: float = 0.0):
    """Entity-level precision, recall and F1 (labeled splits) and the conlleval columns."""
    predicted = tag_sequences.tags_from_predictions(split.features, np.argmax(logits, axis=-1), task.labels,
                                              split.examples)
    found = {}
    if split.labeled:
        gold = [list(e.tags) for e in split.examples]
        found = metrics.entity_scores(gold, [predicted[e.idx] for e in split.examples])
    lines = []
    for e in split.examples:
        for n, word in enumerate(e.words):
            gold_tag = e.tags[n] if e.tags is not None else "O"
            lines.append(f"{word} {gold_tag} {predicted[e.idx][n]}")
        lines.append("")
    return Scored(found, {f"{split_name}_predictions.txt": "\n".join(lines)})


def predict(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    """texts: sentences, each a list of words or a string split at whitespace -> {"tags" [(word, tag)],
    "entities" [{"type", "start", "end", "text"}]}, entity words [start, end)."""
    refuse_questions(model.task.kind, questions, contexts)
    if texts is None:
        raise ValueError("predict for tagging needs texts: sentences, each a list of words or a string")
    if isinstance(texts, str):
        texts = [texts]
    sentences = [tuple(t.split()) if isinstance(t, str) else tuple(t) for t in texts]
    examples = [tag_sequences.TagExample(n, words, None) for n, words in enumerate(sentences)]
    labels = tuple(model.task.labels)
    features = tag_sequences.featurize_tagging(examples, labels, model.tokenizer, int(model.task.max_seq_length))
    predicted = tag_sequences.tags_from_predictions(features, np.argmax(model.task_logits(features), axis=-1), labels,
                                              examples)
    out = []
    for e in examples:
        tags = predicted[e.idx]
        entities = [{"type": kind, "start": first, "end": last + 1, "text": " ".join(e.words[first:last + 1])}
                    for kind, first, last in metrics.tag_entities(list(tags))]
        out.append({"tags": list(zip(e.words, tags)), "entities": entities})
    return out


def signatures(graph) -> dict:
    """tag(texts): each whitespace-separated word's tag, read at its first piece."""
    tf, tokenizer, length = graph.tf, graph.bert.tokenizer, graph.length
    labels = list(graph.bert.task.labels)
    net = heads.network("tagging", graph.bert.config, len(labels), feature_based=graph.bert.task.feature_based)
    tf_tags = graph.convert(net)

    @tf.function(input_signature=[graph.text_spec()], autograph=False)
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
        ids, mask = graph.pad_rows(rows, tokenizer.pad_id)
        logits = tf_tags(ids, tf.zeros_like(ids), mask)  # [B, S, K]
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, S]
        at = tf.ragged.boolean_mask(tf.ragged.range(first.row_lengths()) + 1, first)  # first pieces, after [CLS]
        word_tags = tf.gather(tf.constant(labels), tf.gather(predicted, tf.cast(at, tf.int32), batch_dims=1))
        words_out = words.to_tensor(default_value="")  # [B, W]
        tags_out = word_tags.to_tensor(default_value="")  # [B, <= W]: words past S have no tag
        missing = tf.shape(words_out)[1] - tf.shape(tags_out)[1]
        tags_out = tf.pad(tags_out, [[0, 0], [0, missing]], constant_values="")
        return {"words": words_out, "tags": tags_out, "logits": logits}

    return {"tag": tag}


TAGGING = Kind("tagging", class_labels=True, read=read, featurize=featurize, score=score, predict=predict,
               signatures=signatures, feature_based=True,
               hf_class=dict(architecture="BertForTokenClassification", prefix="classifier", pooler=False, labels=True,
                             problem_type=None, auto_class="AutoModelForTokenClassification"))
