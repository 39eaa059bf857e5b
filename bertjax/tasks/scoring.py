"""From a split's logits to its predictions, metrics and prediction files, per task kind.

Fine-tuning evaluates every dev split with `score` and writes the best checkpoint's predictions of
every split with `write_predictions`; each kind reads its logits its own way:
  classification, regression, multiple choice  one prediction per example; a GLUE submission TSV
  span       answers decoded over each question's windows; the official SQuAD scripts' JSON files
  tagging    each word's tag read at its first piece; conlleval's columns
Each kind's `score` is in its module, bertjax/tasks/kinds/<kind>.py.
"""

import numpy as np

from bertjax.tasks import kinds, registry
from bertjax.tasks.kinds.base import Scored, Split  # noqa: F401  (the records are the kinds'; named here too)
from bertjax.text import files


def score(task: registry.Task, split_name: str, split: Split, logits: np.ndarray, *, settings=None,
          null_threshold: float = 0.0) -> Scored:
    """The metrics and prediction files of one split from its logits (the rows of split.features), by the
    task's kind (settings: the kind's own, as Kind.settings_from_config gives them; span's windows)."""
    return kinds.get(task.kind).score(task, split_name, split, logits, settings=settings,
                                      null_threshold=null_threshold)


def write_predictions(directory: str, scored: Scored) -> list[str]:
    """Writes a scored split's prediction files into `directory` (local or remote); returns their paths."""
    files.path(directory).mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in scored.files.items():
        path = files.join(directory, name)
        files.write_bytes(path, text.encode("utf-8"))
        written.append(path)
    return written
