"""Fine-tuning metrics as each benchmark defines them, in numpy; names as metrics.jsonl writes them.

accuracy; f1 (binary, of the task's positive class: MRPC, QQP); matthews_corr (CoLA); pearson and
spearman (STS-B). A correlation that is undefined -- a constant prediction or label vector -- is
0.0, not nan: Matthews is 0 there by the usual convention (scikit-learn's too), Pearson and Spearman
follow it so that an evaluation line stays valid JSON (metrics.jsonl refuses nan) and "best
checkpoint" comparisons stay ordered. scipy would return nan there.
"""

import numpy as np


def accuracy(predictions, labels) -> float:
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float(np.mean(predictions == labels))


def f1(predictions, labels, positive: int = 1) -> float:
    """Binary F1 of the positive class: 2TP / (2TP + FP + FN); 0 when there is no positive anywhere."""
    predicted, actual = np.asarray(predictions) == positive, np.asarray(labels) == positive
    tp = np.sum(predicted & actual)
    denominator = 2 * tp + np.sum(predicted & ~actual) + np.sum(~predicted & actual)
    return float(2 * tp / denominator) if denominator else 0.0


def matthews_corr(predictions, labels) -> float:
    """Matthews correlation; for more than two classes its generalisation (Gorodkin's R_K) over the
    confusion matrix C: (n*tr(C) - t.p) / sqrt((n^2 - p.p)(n^2 - t.t)), t and p the true and
    predicted class counts."""
    predictions, labels = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    classes, coded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    k = len(classes)
    true_code, pred_code = coded[: len(labels)], coded[len(labels):]
    confusion = np.zeros((k, k), np.float64)
    np.add.at(confusion, (true_code, pred_code), 1)
    t, p, n = confusion.sum(1), confusion.sum(0), confusion.sum()
    covariance = n * np.trace(confusion) - t @ p
    scale = (n * n - p @ p) * (n * n - t @ t)
    return float(covariance / np.sqrt(scale)) if scale > 0 else 0.0


def pearson(predictions, labels) -> float:
    x = np.asarray(predictions, np.float64).reshape(-1)
    y = np.asarray(labels, np.float64).reshape(-1)
    x, y = x - x.mean(), y - y.mean()
    scale = np.sqrt(np.sum(x * x) * np.sum(y * y))
    if scale == 0:
        return 0.0
    return float(np.clip(np.sum(x * y) / scale, -1.0, 1.0))


def average_ranks(values) -> np.ndarray:
    """Ranks from 1; tied values share the mean of the ranks they span (scipy's rankdata 'average')."""
    values = np.asarray(values).reshape(-1)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Runs of equal values: each element gets the mean of the first and last rank of its run.
    new_run = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    run = np.cumsum(new_run) - 1
    run_starts = np.flatnonzero(new_run)
    run_ends = np.concatenate([run_starts[1:], [len(values)]])  # exclusive
    mean_rank = (run_starts + 1 + run_ends) / 2.0
    ranks = np.empty(len(values), np.float64)
    ranks[order] = mean_rank[run]
    return ranks


def spearman(predictions, labels) -> float:
    """Pearson correlation of the average ranks."""
    return pearson(average_ranks(predictions), average_ranks(labels))


_METRICS = {"accuracy": accuracy, "matthews_corr": matthews_corr, "pearson": pearson, "spearman": spearman}


def task_metrics(task, predictions, labels) -> dict[str, float]:
    """Every metric of `task` (a bertjax.data.tasks.registry.Task), by its metrics.jsonl name.

    predictions, labels: [N] class or choice indices, or scores for regression; padding rows
    (example_weight 0) must be left out first.
    """
    predictions, labels = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions but {len(labels)} labels")
    if not len(labels):
        raise ValueError(f"task {task.name}: no examples to score")
    out = {}
    for name in task.metrics:
        if name == "f1":
            out[name] = f1(predictions, labels, positive=task.positive_index)
        else:
            out[name] = _METRICS[name](predictions, labels)
    return out
