"""From a split's logits to its predictions, metrics and prediction files, per task kind.

Fine-tuning evaluates every dev split with `score` and writes the best checkpoint's predictions of
every split with `write_predictions`; each kind reads its logits its own way:
  classification, regression, multiple choice  one prediction per example; a GLUE submission TSV
  span       answers decoded over each question's windows (bertjax/data/tasks/squad.py); the JSON
             files the official SQuAD scripts read: <split>_predictions.json (id -> answer),
             <split>_nbest_predictions.json and, v2.0, <split>_null_odds.json (their na_prob file)
  tagging    each word's tag read at its first piece; <split>_predictions.txt in conlleval's input
             form (word, gold tag, predicted tag; a blank line between sentences)
"""

import dataclasses
import json

import numpy as np

from bertjax.models import heads
from bertjax.tasks import metrics
from bertjax.tasks import registry, squad, submission


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


def _labeled_metrics(task, split: Split, compute) -> dict:
    return compute() if split.labeled else {}


def score(task: registry.Task, split_name: str, split: Split, logits: np.ndarray, *,
          squad_settings: squad.Settings | None = None, null_threshold: float = 0.0) -> Scored:
    """The metrics and prediction files of one split from its logits (the rows of split.features)."""
    if task.kind == registry.SPAN:
        return _score_span(task, split_name, split, logits, squad_settings or squad.Settings(), null_threshold)
    if task.kind == registry.TAGGING:
        return _score_tagging(task, split_name, split, logits)
    predictions = np.asarray(heads.predictions(logits, task.kind))
    found = _labeled_metrics(task, split, lambda: metrics.task_metrics(task, predictions, split.features["label"]))
    lines = submission.submission_lines(task, split.features["idx"], predictions)
    return Scored(found, {submission.file_name(task, split_name): "\n".join(lines) + "\n"})


def _score_span(task, split_name, split: Split, logits, settings, null_threshold) -> Scored:
    version = task.squad_version
    answers = squad.decode_answers(split.examples, split.features, logits[..., 0], logits[..., 1], settings,
                                   version, null_threshold)
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


def _score_tagging(task, split_name, split: Split, logits) -> Scored:
    from bertjax.tasks import tagging

    predicted = tagging.tags_from_predictions(split.features, np.argmax(logits, axis=-1), task.labels,
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


def write_predictions(directory: str, scored: Scored) -> list[str]:
    """Writes a scored split's prediction files into `directory` (local or remote); returns their paths."""
    from bertjax.text import files

    files.path(directory).mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in scored.files.items():
        path = files.join(directory, name)
        files.write_bytes(path, text.encode("utf-8"))
        written.append(path)
    return written
