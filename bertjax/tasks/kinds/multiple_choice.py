"""Multiple choice (SWAG, HellaSwag): a context paired with each of C choices, [C, S] per example,
one score per pair and a softmax over the C. Features and scoring are classification's.

Data: HellaSwag's TFDS splits, or JSON lines of yours (data.train, data.validation, data.test), one
object per line, as bertjax/tasks/readers.py reads them:
  data field  required?  meaning
  context     yes        the context, segment A of each of its C pairs
  choices     yes        a list of exactly C strings (data.num_choices; HellaSwag: 4), each a segment B
  label       yes        the right choice's index, 0 .. C - 1. A test set (data.test) may leave it out
Example, a line of train.jsonl and the run that fine-tunes on it:
  {"context": "She opened the jar", "choices": ["and ate the jam.", "and it sang."], "label": 0}
  python -m bertjax.finetune --config=configs/finetune/multiple_choice.py --config.train.init_from=PATH \
      --config.data.train=train.jsonl --config.data.validation=dev.jsonl --config.data.num_choices=2 \
      --workdir=DIR
"""

import numpy as np

from bertjax.models import heads
from bertjax.tasks import features
import bertjax.tasks.kinds.classification as classification
from bertjax.tasks.kinds.base import Kind, refuse_questions


def predict(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    """texts are the contexts, choices one list per context -> {"label" (the choice's index), "scores"}."""
    refuse_questions(model.task.kind, questions, contexts)
    texts = [texts] if isinstance(texts, str) else list(texts)
    tok, seq = model.tokenizer, int(model.task.max_seq_length)
    special = dict(template=tok.template, pad_id=tok.pad_id)
    ids_a = tok.encode(texts)
    if choices is None or len(choices) != len(texts):
        raise ValueError("predict for multiple choice needs choices=[[choice, ...] per context]")
    encoded = [[features.encode_pair(np.asarray(a), np.asarray(c), seq, **special) for c in tok.encode(list(cs))]
               for a, cs in zip(ids_a, choices)]
    batch = {k: np.stack([np.stack([e[k] for e in row]) for row in encoded])
             for k in classification.INPUT_KEYS}  # [B, C, S]
    probs = np.asarray(classification._softmax(model.task_logits(batch, batch_size=len(texts))))
    return [{"label": int(np.argmax(p)), "scores": [float(x) for x in p]} for p in probs]


def signatures(graph) -> dict:
    """predict_choices(contexts, choices): each (context, choice) a pair, as in training."""
    tf = graph.tf
    num_choices, length = int(graph.bert.task.num_choices), graph.length
    tf_choices = graph.convert(heads.network("multiple_choice", graph.bert.config),
                               shape=f"(b, {num_choices}, {length})")

    @tf.function(input_signature=[graph.text_spec(), graph.text_spec((None, num_choices))], autograph=False)
    def predict_choices(contexts, choices):
        # [B * C, S] pairs, then [B, C, S].
        flat_contexts = tf.reshape(tf.repeat(contexts, num_choices), [-1])
        ids, segments, mask = graph.pair(flat_contexts, tf.reshape(choices, [-1]))
        shape = [-1, num_choices, length]
        logits = tf_choices(tf.reshape(ids, shape), tf.reshape(segments, shape), tf.reshape(mask, shape))
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
                "label_index": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    return {"predict_choices": predict_choices}


MULTIPLE_CHOICE = Kind(
    "multiple_choice", class_labels=False, read=classification.read, featurize=classification.featurize,
    score=classification.score, predict=predict, signatures=signatures,
    hf_class=dict(architecture="BertForMultipleChoice", prefix="classifier", pooler=True, labels=False,
                  problem_type=None, auto_class="AutoModelForMultipleChoice"))
