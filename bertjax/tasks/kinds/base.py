"""What every task kind provides (`Kind`), and the split records its scoring reads and returns.

The kinds' modules import this one, the registry (bertjax/tasks/kinds/__init__.py) imports them:
so the records live here, below both, and scoring.py re-exports Split and Scored.
"""

import dataclasses
from typing import Callable


@dataclasses.dataclass
class Split:
    """A split as fine-tuning holds it: the examples as read, their features, and whether they carry
    labels (dev sets) or not (test sets predicted for a submission)."""

    examples: list
    features: dict
    labeled: bool


@dataclasses.dataclass
class Scored:
    """A split scored: the metrics (empty for an unlabeled split) and the prediction files' contents."""

    metrics: dict
    files: dict  # file name -> text


def no_settings(config) -> None:
    """Settings of a kind that has none beyond data.max_seq_length."""
    return None


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of fine-tuning task: everything about it that is not model code. Its network and loss
    are bertjax.models.heads.HEADS[name]; the functions take plain arguments, TensorFlow only inside.

    read(task, split, path, data_dir, labeled) -> the split's examples: from the file `path` when given
        (the kind's own format), else from the task's TFDS split
    featurize(task, examples, tokenizer, max_seq_length, settings) -> fixed-shape features
    score(task, split_name, split, logits, settings, null_threshold) -> Scored (metrics, prediction files)
    predict(model, texts, text_pairs, choices, questions, contexts) -> one dict per input
        (model: a bertjax.load result fine-tuned for this kind; what LoadedBert.predict returns)
    signatures(graph) -> {name: tf.function}: the SavedModel's signatures of this kind
        (graph: bertjax.interop.savedmodel.Graph, the converter and the tokenizer in the graph)
    settings_from_config(config) -> the kind's own settings (span: windows and answers), or None;
        called by the fine-tuning program, kept in the checkpoint as a dict
    hf_class: the transformers class, as bertjax.interop.hf.HFHead's fields (architecture, prefix, auto_class,
        pooler, labels, problem_type); None where the kind has none (contrastive: an encoder and its pooling)
    batch_keys(train features) -> the keys a training batch sends to the devices; None: the classifier
        kinds' (bertjax/tasks/steps.py's TRAIN_KEYS, and label_weight where the features have it)
    eval_keys: the keys the kind's eval step reads; None: steps.INPUT_KEYS
    """

    name: str
    class_labels: bool  # the task's label (tag) names are the head's outputs: its width is their count
    read: Callable
    featurize: Callable
    score: Callable
    predict: Callable
    signatures: Callable
    hf_class: dict | None
    settings_from_config: Callable = no_settings
    feature_based: bool = False  # has a frozen-feature variant (config.feature_based)
    batch_keys: Callable | None = None
    eval_keys: tuple | None = None

    def num_labels(self, labels) -> int | None:
        """The head width to ask of heads.resolve_num_labels: the label count, or None (the kind fixes it)."""
        return len(labels) if self.class_labels else None


def refuse_questions(kind: str, questions, contexts) -> None:
    """predict's questions/contexts belong to span QA: one line for any other kind given them."""
    if questions is not None or contexts is not None:
        raise ValueError(f"questions and contexts are for span QA; this model is fine-tuned for {kind}")
