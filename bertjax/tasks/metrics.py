"""Fine-tuning metrics as each benchmark defines them, in numpy; names as metrics.jsonl writes them.

accuracy; f1 (binary, of the task's positive class: MRPC, QQP); matthews_corr (CoLA); pearson and
spearman (STS-B). A correlation that is undefined -- a constant prediction or label vector -- is
0.0, not nan: Matthews is 0 there by the usual convention (scikit-learn's too), Pearson and Spearman
follow it so that an evaluation line stays valid JSON (metrics.jsonl refuses nan) and "best
checkpoint" comparisons stay ordered. scipy would return nan there.

SQuAD's exact match and F1 follow the official evaluation scripts (v1.1 and v2.0, with v2.0's
best-threshold search); tagging's entity-level precision, recall and F1 follow conlleval. All are
fractions of 1, like the rest (the scripts print percentages).
"""

import collections
import re
import string

import numpy as np

from bertjax.tasks import registry


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
    """Every metric of `task` (a bertjax.tasks.registry.Task), by its metrics.jsonl name.

    predictions, labels: [N] class or choice indices, or scores for regression; padding rows
    (example_weight 0) must be left out first. Span and tagging tasks score whole answers and
    sentences instead: squad_scores and entity_scores (bertjax.tasks.scoring calls them).
    """
    if task.kind in (registry.SPAN, registry.TAGGING):
        raise ValueError(f"task {task.name} ({task.kind}): score it with squad_scores or entity_scores, "
                         "not task_metrics")
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


# ----------------------------------------------------------------------------------------------------
# SQuAD: the official evaluation scripts' algorithm (evaluate-v1.1.py, evaluate-v2.0.py), as fractions
# ----------------------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower-cased; punctuation, the articles a/an/the and extra whitespace removed."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_PUNCTUATION = frozenset(string.punctuation)


def _answer_f1(prediction: str, gold: str, version: str = "v2.0") -> float:
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == "v2.0" and (not predicted or not wanted):  # v2.0: "" is right only against ""
        return float(predicted == wanted)
    common = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if common == 0:  # v1.1 ends here for empty answers too: 0, even for two empty ones
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def _golds(golds, version: str) -> list[str]:
    if version not in _SQUAD_VERSIONS:
        raise ValueError(f"SQuAD version {version!r}: choose v1.1 or v2.0")
    golds = list(golds)
    if version == "v1.1":  # every gold answer as given; v1.1 has no question without one
        if not golds:
            raise ValueError("SQuAD v1.1: a question without gold answers (only v2.0 has those)")
        return golds
    # The v2.0 script's reading: gold answers that normalise to nothing are dropped; none left means
    # the only right answer is "".
    return [g for g in golds if normalize_answer(g)] or [""]


_SQUAD_VERSIONS = ("v1.1", "v2.0")


def answer_exact(prediction: str, golds, version: str = "v2.0") -> float:
    """1.0 if the normalised prediction equals a normalised gold answer, else 0.0 (the official scripts'
    exact match, the max over the golds). v2.0: golds [] or [""] mean "no answer", right only for a
    prediction that normalises to ""."""
    return max(float(normalize_answer(prediction) == normalize_answer(g)) for g in _golds(golds, version))


def answer_f1(prediction: str, golds, version: str = "v2.0") -> float:
    """The best F1 against the gold answers of the normalised whitespace tokens, counted with
    multiplicity (the official scripts'). v2.0: golds [] or [""] mean "no answer"; an empty answer
    scores 1.0 against an empty one and 0.0 against any other. v1.1: no common token, 0.0."""
    return max(_answer_f1(prediction, g, version) for g in _golds(golds, version))


def best_null_threshold(per_question: dict, no_answer_probs: dict, has_answer: dict, answered_empty: dict):
    """evaluate-v2.0.py's find_best_thresh: the no-answer threshold that maximises the mean score when
    every question whose no-answer prob exceeds it is answered "". Returns (best mean, threshold).

    Walks the questions by rising no-answer prob (ties in no_answer_probs' own order, as the script's
    stable sort of its na_prob file) from "answer nothing anywhere" (the count of unanswerable
    questions), adding each question's gain from being answered: its score if it has an answer, else
    -1 if its prediction is a non-empty string (even one that normalises to "") and 0 if it is "".
    Questions not in per_question are passed over; the mean is over per_question."""
    score = best = float(sum(not has for has in has_answer.values()))
    threshold = 0.0
    for qid in sorted(no_answer_probs, key=lambda q: no_answer_probs[q]):
        if qid not in per_question:
            continue
        if has_answer[qid]:
            gain = per_question[qid]
        elif answered_empty[qid]:
            gain = 0.0
        else:
            gain = -1.0
        score += gain
        if score > best:
            best, threshold = score, no_answer_probs[qid]
    return best / len(per_question), threshold


def squad_scores(predictions: dict, gold_answers: dict, no_answer_probs: dict | None = None,
                 version: str = "v1.1") -> dict[str, float]:
    """Exact match and F1 over every question of gold_answers (id -> answer texts; v2.0: [] or [""] for a
    question without answer), fractions of 1, by the official scripts' rules (see answer_exact,
    answer_f1). A question missing from predictions scores 0 (v1.1) or counts as answered "" (v2.0's
    script needs every question; here the empty answer is its natural reading).

    v2.0 adds has_ans_* and no_ans_* (where such questions exist) and, given no_answer_probs (id -> the
    no-answer score, the script's na_prob file; it must cover every question), best_exact_match,
    best_f1 and their thresholds (best_null_threshold). exact_match and f1 always score the predictions
    as given: the script, given an na_prob file, would first blank those whose prob exceeds its
    --na-prob-thresh (1.0), which changes nothing for probabilities but would for logit odds.
    """
    if not gold_answers:
        raise ValueError("no questions to score")
    if version not in _SQUAD_VERSIONS:
        raise ValueError(f"SQuAD version {version!r}: choose v1.1 or v2.0")
    exact, f1_scores = {}, {}
    for qid, golds in gold_answers.items():
        if qid not in predictions and version == "v1.1":
            exact[qid] = f1_scores[qid] = 0.0
            continue
        prediction = predictions.get(qid, "")
        exact[qid] = answer_exact(prediction, golds, version)
        f1_scores[qid] = answer_f1(prediction, golds, version)
    mean = lambda scores, ids: sum(scores[q] for q in ids) / len(ids)  # noqa: E731
    out = {"exact_match": mean(exact, exact), "f1": mean(f1_scores, f1_scores)}
    if version == "v1.1":
        return out
    # The script's has-answer test is a non-empty answer list; [""] is this module's other "no answer".
    has = {qid: any(golds) for qid, golds in gold_answers.items()}
    for prefix, ids in (("has_ans", [q for q in has if has[q]]), ("no_ans", [q for q in has if not has[q]])):
        if ids:
            out[f"{prefix}_exact_match"], out[f"{prefix}_f1"] = mean(exact, ids), mean(f1_scores, ids)
    if no_answer_probs is not None:
        missing = [qid for qid in gold_answers if qid not in no_answer_probs]
        if missing:
            raise ValueError(f"no_answer_probs lacks {len(missing)} of the {len(gold_answers)} questions "
                             f"(first: {missing[0]!r})")
        empty = {qid: not predictions.get(qid, "") for qid in gold_answers}
        out["best_exact_match"], out["best_exact_match_threshold"] = best_null_threshold(
            exact, no_answer_probs, has, empty)
        out["best_f1"], out["best_f1_threshold"] = best_null_threshold(f1_scores, no_answer_probs, has, empty)
    return out


# ----------------------------------------------------------------------------------------------------
# Tagging: entity-level precision, recall and F1, conlleval's definition (seqeval's default mode)
# ----------------------------------------------------------------------------------------------------


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O" or "-" not in tag:
        return "O", ""
    prefix, kind = tag.split("-", 1)
    return prefix, kind


def _chunk_ends(prev_prefix, prev_kind, prefix, kind) -> bool:
    """conlleval's endOfChunk: the chunk of the previous tag ends before this tag."""
    if prev_prefix in ("E", "S"):
        return True
    if prev_prefix in ("B", "I"):
        return prefix in ("B", "S", "O") or kind != prev_kind
    return False


def _chunk_starts(prev_prefix, prev_kind, prefix, kind) -> bool:
    """conlleval's startOfChunk: this tag starts a chunk."""
    if prefix in ("B", "S"):
        return True
    if prefix in ("I", "E"):
        return prev_prefix in ("E", "S", "O") or kind != prev_kind
    return False


def tag_entities(tags) -> list[tuple[str, int, int]]:
    """The (type, first, last) entities of a tag sequence (BIO, IOB1 or IOBES), as conlleval reads them:
    an I- after O or after another type starts an entity."""
    entities, start = [], None
    prev_prefix, prev_kind = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, kind = _split_tag(tag)
        if start is not None and _chunk_ends(prev_prefix, prev_kind, prefix, kind):
            entities.append((prev_kind, start, i - 1))
            start = None
        if _chunk_starts(prev_prefix, prev_kind, prefix, kind):
            start = i
        prev_prefix, prev_kind = prefix, kind
    return entities


def entity_scores(gold, predicted) -> dict[str, float]:
    """Micro precision, recall and F1 over entities (right only with the exact span and type), and
    f1_<TYPE> per gold or predicted type; 0 where undefined. gold, predicted: lists of tag sequences."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    found, wanted = set(), set()
    for n, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(g)} gold tags but {len(p)} predicted")
        wanted |= {(n, *e) for e in tag_entities(g)}
        found |= {(n, *e) for e in tag_entities(p)}

    def prf(found, wanted):
        right = len(found & wanted)
        precision = right / len(found) if found else 0.0
        recall = right / len(wanted) if wanted else 0.0
        return precision, recall, 2 * precision * recall / (precision + recall) if right else 0.0

    precision, recall, f1_value = prf(found, wanted)
    out = {"precision": precision, "recall": recall, "f1": f1_value}
    for kind in sorted({e[1] for e in found | wanted}):
        out[f"f1_{kind}"] = prf({e for e in found if e[1] == kind}, {e for e in wanted if e[1] == kind})[2]
    return out
