"""GLUE submission files: one TSV per test split, `index<TAB>prediction`, as gluebenchmark.com reads them."""

import os

import numpy as np

from bertjax.data.tasks import registry


def submission_lines(task: registry.Task, indices, predictions) -> list[str]:
    """The file's lines (header first), rows sorted by index.

    predictions: class indices, or scores for regression (written with 3 decimals, as the GLUE
    baselines write STS-B).
    """
    indices = np.asarray(indices).reshape(-1)
    predictions = np.asarray(predictions).reshape(-1)
    if len(indices) != len(predictions):
        raise ValueError(f"{len(indices)} indices but {len(predictions)} predictions")
    if len(np.unique(indices)) != len(indices):
        raise ValueError("submission indices repeat: drop the padding rows (example_weight 0) first")
    lines = ["index\tprediction"]
    for i in np.argsort(indices, kind="stable"):
        if task.kind == registry.REGRESSION:
            value = f"{float(predictions[i]):.3f}"
        else:
            value = task.submission_labels[int(predictions[i])]
        lines.append(f"{int(indices[i])}\t{value}")
    return lines


def write_submission(directory: str, task: registry.Task, split: str, indices, predictions) -> str:
    """Writes the task's submission file for `split` into `directory`; returns its path."""
    path = os.path.join(directory, task.submission_file(split))
    lines = submission_lines(task, indices, predictions)
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
