"""Prediction files: one TSV per split, `index<TAB>prediction`, the form gluebenchmark.com reads (a GLUE
test split gets the file name the leaderboard expects; any other split `<split>.tsv`)."""

import numpy as np

from bertjax.tasks import registry


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
        elif task.submission_labels:
            value = task.submission_labels[int(predictions[i])]
        elif task.labels:  # the user's classes, by name
            value = task.labels[int(predictions[i])]
        else:  # multiple choice: the chosen choice's index
            value = str(int(predictions[i]))
        lines.append(f"{int(indices[i])}\t{value}")
    return lines


def file_name(task: registry.Task, split: str) -> str:
    return task.submission_file(split) if split in dict(task.submission_files) else f"{split}.tsv"
