"""Task examples from TFDS or from the user's JSON-lines files.

JSON lines, one object per line (blank lines are skipped):
  classification, regression:  {"text": "...", "text_pair": "..." (optional), "label": ...}
  scored pairs (STS):          {"text": "...", "text_pair": "...", "score": ...} (read_scored_pairs)
      label: a class name of the task, or its index (0, 1, ...); for regression a number
      text_pair: required by GLUE's pair tasks, refused by its single-sentence ones (CoLA, SST-2),
      optional for the generic kinds
  multiple choice:             {"context": "...", "choices": ["...", ...], "label": 1}
      label: the index of the right choice; choices: exactly the task's number of choices
A set read with labeled=False (a test set) may leave out "label"; where it is there it is checked all
the same. Every problem is one ValueError line naming the file and line.
"""

import json
import math
import os

from bertjax.tasks import registry
from bertjax.tasks.examples import ChoiceExample, Example
from bertjax.text import files, tf_cpu


def read_split(task: registry.Task, split: str, *, path: str | None = None, data_dir: str | None = None,
               labeled: bool = True) -> list:
    """One split's examples of a classification, regression or multiple-choice task: from the JSON-lines
    file `path` when given, else from the task's TFDS split. (Each kind reads through its Kind.read,
    bertjax/tasks/kinds/; span QA and tagging have their own formats.)"""
    if path:
        return read_jsonl(path, task, labeled=labeled)
    if task.tfds_name is None:
        raise ValueError(f"task {task.name} reads the user's JSON-lines files: set data.{split} to a file")
    return read_tfds(task, split, data_dir=data_dir)


# ----------------------------------------------------------------------------------------------------
# TFDS
# ----------------------------------------------------------------------------------------------------


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _tfds_label(task: registry.Task, value):
    # GLUE's and HellaSwag's test splits carry -1 where the label is withheld.
    if task.kind == registry.REGRESSION:
        value = float(value)
        return None if value == -1.0 else value
    value = int(value)
    return None if value < 0 else value


def check_tfds_split(task: registry.Task, split: str) -> None:
    if task.tfds_name is None:
        raise ValueError(f"task {task.name} reads the user's files: set data.{split} to a file")
    known = tuple(s for s in (task.train_split, *task.eval_splits, *task.test_splits) if s)
    if split not in known:
        raise ValueError(f"task {task.name} has no split {split!r}: its TFDS splits are {', '.join(known)}")


def read_tfds(task: registry.Task, split: str, data_dir: str | None = None) -> list:
    """The examples of a TFDS split, in the dataset's `idx` order where it has one (GLUE)."""
    tfds = tf_cpu.import_tensorflow_datasets()  # here: the task kinds import this module without TensorFlow

    check_tfds_split(task, split)
    ds = tfds.load(task.tfds_name, split=split, data_dir=data_dir, shuffle_files=False)
    rows = list(tfds.as_numpy(ds))
    if not rows:
        raise ValueError(f"TFDS {task.tfds_name} split {split} is empty")
    if "idx" in rows[0]:
        rows.sort(key=lambda r: int(r["idx"]))  # TFDS's shard order is not the file order
    examples = []
    for n, row in enumerate(rows):
        idx = int(row["idx"]) if "idx" in row else n
        label = _tfds_label(task, row["label"])
        if task.kind == registry.MULTIPLE_CHOICE:
            context_key, choices_key = task.text_features
            choices = tuple(_text(c) for c in row[choices_key])
            if len(choices) != task.num_choices:
                raise ValueError(f"TFDS {task.tfds_name} split {split} example {n}: {len(choices)} choices,"
                                 f" task {task.name} expects {task.num_choices}")
            examples.append(ChoiceExample(idx, _text(row[context_key]), choices, label))
        else:
            pair = _text(row[task.text_features[1]]) if len(task.text_features) > 1 else None
            examples.append(Example(idx, _text(row[task.text_features[0]]), pair, label))
    return examples


# ----------------------------------------------------------------------------------------------------
# JSON lines
# ----------------------------------------------------------------------------------------------------


def json_lines(path: str):
    """(line number from 1, decoded object) for every non-blank line of a JSON-lines file; errors name
    path:line."""
    text = files.read_text(path, "a JSON-lines file")
    found = False
    # Lines end at "\n" only: str.splitlines() would also end one at U+2028 inside a string.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        found = True
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        yield number, obj
    if not found:
        raise ValueError(f"{path}: empty file: expected one JSON object per line")


def _string_field(obj, key, where, required=True):
    if key not in obj or obj[key] is None:
        if required:
            raise ValueError(f"{where}: missing field {key!r}")
        return None
    if not isinstance(obj[key], str):
        raise ValueError(f"{where}: field {key!r} must be a string, got {json.dumps(obj[key])[:60]}")
    return obj[key]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _class_index(task: registry.Task, value, where) -> int:
    """A class name of the task or its index -> the index."""
    if isinstance(value, str) and value in task.labels:
        return task.labels.index(value)
    if _is_number(value) and float(value).is_integer() and 0 <= value < len(task.labels):
        return int(value)
    raise ValueError(f"{where}: label {json.dumps(value)[:60]} is not a class of task {task.name}: expected one"
                     f" of {', '.join(task.labels)} (or its index 0-{len(task.labels) - 1})")


def _label(task: registry.Task, obj, where, labeled: bool):
    if "label" not in obj or obj["label"] is None:
        if labeled:
            raise ValueError(f"{where}: missing field 'label'")
        return None
    value = obj["label"]
    if task.kind == registry.CLASSIFICATION:
        return _class_index(task, value, where)
    if task.kind == registry.REGRESSION:
        if not _is_number(value) or not math.isfinite(value):
            raise ValueError(f"{where}: label {json.dumps(value)[:60]} is not a number: task {task.name}"
                             " is a regression")
        return float(value)
    if not _is_number(value) or not float(value).is_integer() or not 0 <= value < task.num_choices:
        raise ValueError(f"{where}: label {json.dumps(value)[:60]} is not a choice index: expected 0-"
                         f"{task.num_choices - 1}")
    return int(value)


def read_jsonl(path: str, task: registry.Task, labeled: bool = True) -> list:
    """A JSON-lines file of the task's kind -> Examples (or ChoiceExamples), in file order."""
    path = os.fspath(path)
    if task.kind not in registry.JSONL_KINDS:
        raise ValueError(f"task {task.name} ({task.kind}) has no JSON-lines reader")
    examples = []
    for number, obj in json_lines(path):
        where = f"{path}:{number}"
        label = _label(task, obj, where, labeled)
        if task.kind == registry.MULTIPLE_CHOICE:
            context = _string_field(obj, "context", where)
            choices = obj.get("choices")
            if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
                raise ValueError(f"{where}: field 'choices' must be a list of strings")
            if len(choices) != task.num_choices:
                raise ValueError(f"{where}: {len(choices)} choices, task {task.name} expects {task.num_choices}")
            examples.append(ChoiceExample(len(examples), context, tuple(choices), label))
        else:
            text = _string_field(obj, "text", where)
            # Benchmark tasks fix single sentence or pair; the generic kinds take either.
            pair = _string_field(obj, "text_pair", where, required=len(task.text_features) == 2)
            if pair is not None and len(task.text_features) == 1:
                raise ValueError(f"{where}: task {task.name} takes single sentences: remove 'text_pair'")
            examples.append(Example(len(examples), text, pair, label))
    return examples


def read_scored_pairs(path: str) -> list:
    """A JSON-lines file of scored pairs {"text", "text_pair", "score"} (an STS set of yours) -> Examples
    whose label is the score, in file order."""
    path = os.fspath(path)
    examples = []
    for number, obj in json_lines(path):
        where = f"{path}:{number}"
        text, pair = _string_field(obj, "text", where), _string_field(obj, "text_pair", where)
        if obj.get("score") is None:
            raise ValueError(f"{where}: missing field 'score' (each line is {{\"text\", \"text_pair\", \"score\"}})")
        if not _is_number(obj["score"]) or not math.isfinite(obj["score"]):
            raise ValueError(f"{where}: score {json.dumps(obj['score'])[:60]} is not a number")
        examples.append(Example(len(examples), text, pair, float(obj["score"])))
    return examples
