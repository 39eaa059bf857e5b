"""bertjax.metrics against independent references: scikit-learn and scipy (GLUE), hand-worked cases and the
official v2.0 script's threshold search written out (SQuAD), seqeval (entity-level F1)."""

import warnings

import numpy as np
import pytest
import scipy.stats
from sklearn import metrics as sk

from bertjax import metrics
from bertjax.data.tasks import registry


def _random_classes(seed, n=200, k=2):
    rng = np.random.default_rng(seed)
    return rng.integers(0, k, n), rng.integers(0, k, n)


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    predictions, labels = _random_classes(seed)
    assert metrics.accuracy(predictions, labels) == pytest.approx(sk.accuracy_score(labels, predictions))
    assert metrics.f1(predictions, labels, positive=1) == pytest.approx(sk.f1_score(labels, predictions))
    assert metrics.f1(predictions, labels, positive=0) == pytest.approx(
        sk.f1_score(labels, predictions, pos_label=0))
    assert metrics.matthews_corr(predictions, labels) == pytest.approx(sk.matthews_corrcoef(labels, predictions))


@pytest.mark.parametrize("seed", range(3))
def test_multiclass_matthews_matches_sklearn(seed):
    predictions, labels = _random_classes(seed, k=3)
    assert metrics.matthews_corr(predictions, labels) == pytest.approx(sk.matthews_corrcoef(labels, predictions))


@pytest.mark.parametrize(
    "predictions, labels",
    [
        ([1, 1, 1, 1], [0, 1, 0, 1]),  # constant prediction
        ([0, 1, 0, 1], [1, 1, 1, 1]),  # constant labels
        ([0, 0, 0], [0, 0, 0]),  # no positive anywhere: F1 0 (sklearn's zero_division default)
        ([1, 0, 1, 0], [1, 0, 1, 0]),  # perfect
        ([0, 1, 0, 1], [1, 0, 1, 0]),  # perfectly wrong
    ],
)
def test_classification_edge_cases_match_sklearn(predictions, labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on the undefined cases it sets to 0
        expected_f1 = sk.f1_score(labels, predictions, zero_division=0)
        expected_mcc = sk.matthews_corrcoef(labels, predictions)
    assert metrics.f1(predictions, labels) == pytest.approx(expected_f1)
    assert metrics.matthews_corr(predictions, labels) == pytest.approx(expected_mcc)
    assert metrics.accuracy(predictions, labels) == pytest.approx(sk.accuracy_score(labels, predictions))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    labels = rng.uniform(0, 5, 100)
    predictions = labels + rng.normal(0, 1.5, 100)
    assert metrics.pearson(predictions, labels) == pytest.approx(scipy.stats.pearsonr(predictions, labels)[0])
    assert metrics.spearman(predictions, labels) == pytest.approx(
        scipy.stats.spearmanr(predictions, labels).correlation)


def test_spearman_with_ties_uses_average_ranks_like_scipy():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, 80).astype(float)  # STS-B gold scores repeat often
    predictions = np.round(labels + rng.normal(0, 1, 80))
    np.testing.assert_allclose(metrics.average_ranks(labels), scipy.stats.rankdata(labels))
    assert metrics.spearman(predictions, labels) == pytest.approx(
        scipy.stats.spearmanr(predictions, labels).correlation)


def test_correlation_of_a_constant_vector_is_zero_not_nan():
    # scipy returns nan here; metrics.jsonl refuses nan, so the documented choice is 0.
    assert metrics.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0
    assert metrics.spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0
    assert metrics.matthews_corr([1, 1, 1], [0, 1, 0]) == 0.0


def test_task_metrics_names_per_task():
    predictions, labels = _random_classes(7)
    mrpc = metrics.task_metrics(registry.TASKS["mrpc"], predictions, labels)
    assert set(mrpc) == {"accuracy", "f1"}
    assert mrpc["f1"] == pytest.approx(sk.f1_score(labels, predictions))  # "equivalent" is class 1
    assert set(metrics.task_metrics(registry.TASKS["cola"], predictions, labels)) == {"matthews_corr"}
    assert set(metrics.task_metrics(registry.TASKS["rte"], predictions, labels)) == {"accuracy"}
    scores = metrics.task_metrics(registry.TASKS["stsb"], labels + 0.5, labels * 2.0)
    assert scores == {"pearson": pytest.approx(1.0), "spearman": pytest.approx(1.0)}
    for task in registry.TASKS.values():
        assert task.main_metric in task.metrics
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        metrics.task_metrics(registry.TASKS["rte"], [0, 1, 0], [0, 1])


# ----------------------------------------------------------------------------------------------------
# SQuAD
# ----------------------------------------------------------------------------------------------------


def test_answers_are_normalised_as_the_official_scripts_do():
    assert metrics.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert metrics.normalize_answer("an apple a day") == "apple day"
    assert metrics.normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert metrics.normalize_answer("“Curly” quotes") == "“curly” quotes"  # string.punctuation is ASCII


def test_exact_match_and_f1_by_hand():
    assert metrics.answer_exact("the Eiffel Tower.", ["Eiffel tower", "the tower"]) == 1.0
    assert metrics.answer_exact("Eiffel", ["Eiffel tower"]) == 0.0
    # pred [big, cat, sat], gold [cat, sat, down]: 2 in common, P = R = 2/3.
    assert metrics.answer_f1("the big cat sat", ["a cat sat down"]) == pytest.approx(2 / 3)
    # The best over the golds: [cat] vs [cat] -> 1.
    assert metrics.answer_f1("a cat", ["the dog", "cat"]) == 1.0
    # Repeated tokens count as often as both have them: [cat, cat, dog] vs [cat, dog, dog] share 2.
    assert metrics.answer_f1("cat cat dog", ["cat dog dog"]) == pytest.approx(2 / 3)
    assert metrics.answer_f1("x", ["y"]) == 0.0
    # No answer: right only when the prediction is empty too (v2.0).
    assert metrics.answer_exact("", []) == metrics.answer_f1("", []) == 1.0
    assert metrics.answer_f1("something", []) == 0.0


def test_squad_scores_average_over_every_question():
    golds = {"a": ["Denver Broncos"], "b": ["1990", "in 1990"], "c": ["Paris"]}
    predictions = {"a": "the Denver Broncos", "b": "1990s"}  # c unanswered: 0 in v1.1
    scores = metrics.squad_scores(predictions, golds)
    assert scores == {"exact_match": pytest.approx(1 / 3), "f1": pytest.approx(1 / 3)}


def _official_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    """evaluate-v2.0.py's find_best_thresh, line by line (as a fraction, not a percentage)."""
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return best_score / len(scores), best_thresh


def test_v2_scores_and_the_best_threshold_by_hand():
    golds = {"h1": ["red"], "h2": ["blue sky"], "n1": [], "n2": []}
    predictions = {"h1": "red", "h2": "sky", "n1": "green", "n2": ""}
    probs = {"h1": -2.0, "h2": 1.0, "n1": 0.5, "n2": 3.0}
    scores = metrics.squad_scores(predictions, golds, probs, version="v2.0")
    # Raw: h1 1/1, h2 0/(F1 2/3), n1 0/0, n2 1/1.
    assert scores["exact_match"] == pytest.approx(2 / 4) and scores["f1"] == pytest.approx((2 + 2 / 3) / 4)
    assert scores["has_ans_f1"] == pytest.approx((1 + 2 / 3) / 2) and scores["no_ans_exact_match"] == 0.5
    # Walk by prob: start 2 (n1, n2 unanswered) -> h1 +1 = 3 (at -2) -> n1 -1 = 2 -> h2 +2/3 = 2.67 -> n2 +0.
    assert scores["best_f1"] == pytest.approx(3 / 4) and scores["best_f1_threshold"] == -2.0
    assert scores["best_exact_match"] == pytest.approx(3 / 4)


@pytest.mark.parametrize("seed", range(4))
def test_v2_threshold_search_equals_the_official_loop(seed):
    rng = np.random.default_rng(seed)
    words = ["red", "blue", "sky", "the", "cat", "sat"]
    golds, predictions, probs = {}, {}, {}
    for n in range(60):
        qid = f"q{n}"
        golds[qid] = [] if rng.random() < 0.4 else [" ".join(rng.choice(words, rng.integers(1, 4)))]
        predictions[qid] = "" if rng.random() < 0.2 else " ".join(rng.choice(words, rng.integers(1, 4)))
        probs[qid] = float(rng.normal())
    scores = metrics.squad_scores(predictions, golds, probs, version="v2.0")
    has = {q: bool(g) for q, g in golds.items()}
    for name, raw in (("exact_match", metrics.answer_exact), ("f1", metrics.answer_f1)):
        per_question = {q: raw(predictions[q], golds[q]) for q in golds}
        best, threshold = _official_find_best_thresh(predictions, per_question, probs, has)
        assert scores[f"best_{name}"] == pytest.approx(best)
        assert scores[f"best_{name}_threshold"] == threshold


# ----------------------------------------------------------------------------------------------------
# Entity-level F1 (CoNLL)
# ----------------------------------------------------------------------------------------------------


def test_entities_are_read_as_conlleval_reads_them():
    assert metrics.tag_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert metrics.tag_entities(["I-PER", "I-PER", "I-LOC", "O", "I-ORG"]) == [("PER", 0, 1), ("LOC", 2, 2),
                                                                              ("ORG", 4, 4)]  # IOB1 / invalid I-
    assert metrics.tag_entities(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
    assert metrics.tag_entities(["O", "O"]) == []


@pytest.mark.parametrize("seed", range(6))
def test_entity_scores_equal_seqeval(seed):
    from seqeval import metrics as seqeval

    rng = np.random.default_rng(seed)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-MISC"]
    gold, predicted = [], []
    for _ in range(40):
        n = int(rng.integers(1, 15))
        g = list(rng.choice(tags, n))
        p = [t if rng.random() < 0.7 else str(rng.choice(tags)) for t in g]
        gold.append(g)
        predicted.append(p)
    ours = metrics.entity_scores(gold, predicted)
    assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, predicted))
    assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, predicted))
    assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, predicted))
    report = seqeval.classification_report(gold, predicted, output_dict=True)
    for kind in ("PER", "LOC", "ORG", "MISC"):
        if kind in report:
            assert ours[f"f1_{kind}"] == pytest.approx(report[kind]["f1-score"])


def test_entity_scores_refuse_sentences_of_different_lengths():
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        metrics.entity_scores([["O", "O"]], [["O"]])
