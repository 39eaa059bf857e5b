"""Classification and regression: one text or a pair -> a class (K logits) or a value (one).

The two kinds share everything but the loss, the output and transformers' problem_type: features
(bertjax/tasks/features.py), one prediction per example scored by the task's metrics and written as a
GLUE submission TSV, and the SavedModel's predict / predict_pair signatures.

Data: a benchmark task's TFDS splits, or JSON lines of yours (data.train, data.validation, data.test),
one object per line, as bertjax/tasks/readers.py reads them:
  data field  required?  meaning
  text        yes        the text (segment A)
  text_pair   per task   the second text (segment B): required by GLUE's pair tasks, refused by CoLA and
                         SST-2, optional for the generic classification and regression tasks
  label       yes        classification: a class of the task (data.labels) by name or by index (0, 1, ...);
                         regression: a number. A test set (data.test) may leave it out
Example, a line of train.jsonl and the run that fine-tunes on it:
  {"text": "A fine film.", "text_pair": "I would see it again.", "label": "positive"}
  python -m bertjax.finetune --config=configs/finetune/classification.py --config.train.init_from=PATH \
      --config.data.train=train.jsonl --config.data.validation=dev.jsonl \
      --config.data.labels="('negative', 'positive')" --workdir=DIR
Regression: configs/finetune/regression.py, a number as each label and no data.labels.
"""

import functools

import jax
import numpy as np

from bertjax.models import heads
from bertjax.tasks import features, metrics, readers, submission
from bertjax.tasks.kinds.base import Kind, Scored, Split, refuse_questions

INPUT_KEYS = ("input_ids", "segment_ids", "input_mask")


def read(task, split: str, path: str | None = None, data_dir: str | None = None, labeled: bool = True) -> list:
    """JSON lines ({"text", "text_pair", "label"}; multiple choice {"context", "choices", "label"}), or TFDS."""
    return readers.read_split(task, split, path=path, data_dir=data_dir, labeled=labeled)


def featurize(task, examples: list, tokenizer, max_seq_length: int, settings=None) -> dict:
    """Examples (or ChoiceExamples) -> [CLS] A [SEP] B [SEP] features (bertjax/tasks/features.py)."""
    return features.featurize(examples, task, tokenizer, max_seq_length)


def score(task, split_name: str, split: Split, logits: np.ndarray, settings=None, null_threshold: float = 0.0):
    """One prediction per example: the task's metrics (labeled splits) and its GLUE submission TSV."""
    predictions = np.asarray(heads.predictions(logits, task.kind))
    found = metrics.task_metrics(task, predictions, split.features["label"]) if split.labeled else {}
    lines = submission.submission_lines(task, split.features["idx"], predictions)
    return Scored(found, {submission.file_name(task, split_name): "\n".join(lines) + "\n"})


def encode_texts(model, texts, text_pairs=None) -> dict:
    """Texts (and pairs) cut and padded as in training: input_ids, segment_ids, input_mask [B, S]."""
    tok, seq = model.tokenizer, int(model.task.max_seq_length)
    special = dict(template=tok.template, pad_id=tok.pad_id)
    if text_pairs is not None and len(text_pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
    ids_b = tok.encode(list(text_pairs)) if text_pairs is not None else [None] * len(texts)
    encoded = [features.encode_pair(np.asarray(a), None if b is None else np.asarray(b), seq, **special)
               for a, b in zip(tok.encode(texts), ids_b)]
    return {k: np.stack([e[k] for e in encoded]) for k in INPUT_KEYS}


def _logits(model, texts, text_pairs):
    texts = [texts] if isinstance(texts, str) else list(texts)
    return model.task_logits(encode_texts(model, texts, text_pairs), batch_size=len(texts))


def predict_class(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    """{"label", "score", "scores" {label: probability}} per text (or pair)."""
    refuse_questions(model.task.kind, questions, contexts)
    probs = np.asarray(_softmax(_logits(model, texts, text_pairs)))
    labels = model.task.labels
    return [{"label": labels[int(np.argmax(p))], "score": float(np.max(p)),
             "scores": {name: float(x) for name, x in zip(labels, p)}} for p in probs]


def predict_value(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    """{"score"} per text (or pair): the regression's value."""
    refuse_questions(model.task.kind, questions, contexts)
    return [{"score": float(v)} for v in _logits(model, texts, text_pairs)[:, 0]]


def _softmax(logits):
    return jax.nn.softmax(logits, axis=-1)


def signatures(graph, *, regression: bool = False) -> dict:
    """predict(texts) and predict_pair(texts, text_pairs): a classifier's label or a regression's score."""
    tf, task = graph.tf, graph.bert.task
    labels = list(task.labels or [])
    net = heads.network(task.kind, graph.bert.config, None if regression else len(labels))
    tf_logits = graph.convert(net)

    def outputs(ids, segments, mask):
        logits = tf_logits(ids, segments, mask)
        if regression:
            return {"logits": logits, "score": logits[:, 0]}
        index = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1), "label_index": index,
                "label": tf.gather(tf.constant(labels), index)}

    @tf.function(input_signature=[graph.text_spec()], autograph=False)
    def predict(texts):
        return outputs(*graph.single(texts))

    @tf.function(input_signature=[graph.text_spec(), graph.text_spec()], autograph=False)
    def predict_pair(texts, text_pairs):
        return outputs(*graph.pair(texts, text_pairs))

    return {"predict": predict, "predict_pair": predict_pair}


CLASSIFICATION = Kind(
    "classification", class_labels=True, read=read, featurize=featurize, score=score, predict=predict_class,
    signatures=signatures, hf_class=dict(architecture="BertForSequenceClassification", prefix="classifier",
                                         pooler=True, labels=True, problem_type="single_label_classification",
                                         auto_class="AutoModelForSequenceClassification"))
REGRESSION = Kind(
    "regression", class_labels=False, read=read, featurize=featurize, score=score, predict=predict_value,
    signatures=functools.partial(signatures, regression=True),
    hf_class=dict(architecture="BertForSequenceClassification", prefix="classifier", pooler=True, labels=True,
                  problem_type="regression", auto_class="AutoModelForSequenceClassification"))
