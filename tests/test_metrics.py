"""bertjax.tasks.metrics against independent references: scikit-learn and scipy (GLUE), hand-worked cases and the
official v1.1 and v2.0 scripts' scoring and threshold search written out (SQuAD), seqeval (entity-level F1)."""

import collections
import re
import string
import warnings

import numpy as np
import pytest
import scipy.stats
from sklearn import metrics as sk

from bertjax.tasks import metrics
from bertjax.tasks import registry


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
    for name in ("squad", "squad_v2", "conll2003"):  # their metrics need answers or sentences, not [N] arrays
        with pytest.raises(ValueError, match="score it with squad_scores or entity_scores"):
            metrics.task_metrics(registry.TASKS[name], [0, 1], [0, 1])


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
        # Half the seeds draw from 5 values: ties, where the walk's order (the probs' own) decides.
        probs[qid] = float(rng.integers(0, 5) / 4) if seed % 2 else float(rng.normal())
    order = rng.permutation(list(probs))
    probs = {str(q): probs[str(q)] for q in order}  # not the questions' order
    probs.update({f"extra{n}": float(rng.normal()) for n in range(5)})  # in the na_prob file, not the data
    scores = metrics.squad_scores(predictions, golds, probs, version="v2.0")
    has = {q: bool(g) for q, g in golds.items()}
    for name, raw in (("exact_match", metrics.answer_exact), ("f1", metrics.answer_f1)):
        per_question = {q: raw(predictions[q], golds[q]) for q in golds}
        best, threshold = _official_find_best_thresh(predictions, per_question, probs, has)
        assert scores[f"best_{name}"] == pytest.approx(best)
        assert scores[f"best_{name}_threshold"] == threshold


def test_v2_best_threshold_by_hand_with_a_tie_and_an_answer_that_normalises_to_nothing():
    golds = {"h1": ["Blue sky"], "n1": []}
    predictions = {"h1": "sky", "n1": "the"}  # "the" normalises to "": raw EM and F1 of n1 are 1
    scores = metrics.squad_scores(predictions, golds, {"h1": -1.0, "n1": 2.0}, version="v2.0")
    # Raw: h1 EM 0, F1 of [sky] vs [blue, sky] = 2 * 1 * 1/2 / (3/2) = 2/3; n1 1 and 1.
    assert scores["exact_match"] == 0.5 and scores["f1"] == pytest.approx(5 / 6)
    # F1 walk: start 1 (n1 unanswered) -> h1 (-1.0) +2/3 = 5/3, the best -> n1 (2.0): the script's
    # gain is -1 for any non-empty prediction, "the" too -> 2/3. Best 5/3 of 2 at -1.0.
    assert scores["best_f1"] == pytest.approx(5 / 6) and scores["best_f1_threshold"] == -1.0
    # EM walk: 1 -> h1 +0 = 1 (not above) -> n1 -1 = 0: answering nothing, 1 of 2, threshold 0.0.
    assert scores["best_exact_match"] == 0.5 and scores["best_exact_match_threshold"] == 0.0
    # Equal probs: the walk takes them in no_answer_probs' order (the script's stable sort).
    golds, predictions = {"h1": ["red"], "n1": []}, {"h1": "red", "n1": "blue"}
    # n1 first: 1 -> 0 -> 1, never above the start: 1/2 at 0.0.
    scores = metrics.squad_scores(predictions, golds, {"n1": 0.5, "h1": 0.5}, version="v2.0")
    assert (scores["best_f1"], scores["best_f1_threshold"]) == (0.5, 0.0)
    # h1 first: 1 -> 2 (at 0.5) -> 1: 2/2 at 0.5 (the script's figure, though no threshold reaches it).
    scores = metrics.squad_scores(predictions, golds, {"h1": 0.5, "n1": 0.5}, version="v2.0")
    assert (scores["best_f1"], scores["best_f1_threshold"]) == (1.0, 0.5)


def test_v1_and_v2_differ_where_the_scripts_do():
    # v1.1 keeps gold answers that normalise to nothing: "a" equals "the" there; v2.0 drops "the".
    assert metrics.answer_exact("a", ["the", "The Band"], version="v1.1") == 1.0
    assert metrics.answer_exact("a", ["the", "The Band"], version="v2.0") == 0.0
    # v1.1's F1 of two empty token lists is 0 (no common token); v2.0's is 1 (gold "" = no answer).
    assert metrics.answer_f1("", ["the"], version="v1.1") == 0.0
    assert metrics.answer_f1("", ["the"], version="v2.0") == 1.0
    assert metrics.answer_f1("", [""]) == metrics.answer_f1("an", []) == 1.0  # [""] and [] alike
    with pytest.raises(ValueError, match="v1.1: a question without gold answers"):
        metrics.answer_f1("x", [], version="v1.1")
    with pytest.raises(ValueError, match="choose v1.1 or v2.0"):
        metrics.answer_exact("x", ["x"], version="v3")


def test_v1_scores_by_hand():
    golds = {"a": ["the big cat sat"], "b": ["Denver Broncos", "Broncos"]}
    predictions = {"a": "a cat sat down", "b": "The Broncos!"}
    # a: EM 0, F1 2/3 ([cat, sat, down] vs [big, cat, sat]); b: "broncos" == "broncos", 1 and 1.
    scores = metrics.squad_scores(predictions, golds)
    assert scores == {"exact_match": 0.5, "f1": pytest.approx((2 / 3 + 1) / 2)}


def test_v2_keys_missing_predictions_and_errors():
    golds = {"h": ["x"], "n": [""]}  # [""]: no answer, as []
    scores = metrics.squad_scores({}, golds, version="v2.0")  # both read as ""
    assert scores == {"exact_match": 0.5, "f1": 0.5, "has_ans_exact_match": 0.0, "has_ans_f1": 0.0,
                      "no_ans_exact_match": 1.0, "no_ans_f1": 1.0}
    only_unanswerable = metrics.squad_scores({"n": "y"}, {"n": []}, version="v2.0")
    assert set(only_unanswerable) == {"exact_match", "f1", "no_ans_exact_match", "no_ans_f1"}
    with pytest.raises(ValueError, match="no_answer_probs lacks 1 of the 2 questions"):
        metrics.squad_scores({}, golds, {"h": 0.0}, version="v2.0")
    with pytest.raises(ValueError, match="no questions to score"):
        metrics.squad_scores({}, {})


# The official scripts' scoring, written out as they are (evaluate-v1.1.py, evaluate-v2.0.py), as fractions.
def _script_normalize(s):
    def remove_articles(text):
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _script_v1(golds, predictions):
    def f1_score(prediction, ground_truth):
        prediction_tokens = _script_normalize(prediction).split()
        ground_truth_tokens = _script_normalize(ground_truth).split()
        common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
        num_same = sum(common.values())
        if num_same == 0:
            return 0
        precision = 1.0 * num_same / len(prediction_tokens)
        recall = 1.0 * num_same / len(ground_truth_tokens)
        return (2 * precision * recall) / (precision + recall)

    def exact_match_score(prediction, ground_truth):
        return _script_normalize(prediction) == _script_normalize(ground_truth)

    f1 = exact_match = total = 0
    for qid, ground_truths in golds.items():
        total += 1
        if qid not in predictions:
            continue
        exact_match += max(exact_match_score(predictions[qid], g) for g in ground_truths)
        f1 += max(f1_score(predictions[qid], g) for g in ground_truths)
    return {"exact_match": exact_match / total, "f1": f1 / total}


def _script_v2(golds, preds):
    def get_tokens(s):
        if not s:
            return []
        return _script_normalize(s).split()

    def compute_exact(a_gold, a_pred):
        return int(_script_normalize(a_gold) == _script_normalize(a_pred))

    def compute_f1(a_gold, a_pred):
        gold_toks = get_tokens(a_gold)
        pred_toks = get_tokens(a_pred)
        common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
        num_same = sum(common.values())
        if len(gold_toks) == 0 or len(pred_toks) == 0:
            return int(gold_toks == pred_toks)
        if num_same == 0:
            return 0
        precision = 1.0 * num_same / len(pred_toks)
        recall = 1.0 * num_same / len(gold_toks)
        return (2 * precision * recall) / (precision + recall)

    exact_scores, f1_scores = {}, {}
    for qid, answers in golds.items():
        gold_answers = [a for a in answers if _script_normalize(a)]
        if not gold_answers:
            gold_answers = [""]
        exact_scores[qid] = max(compute_exact(a, preds[qid]) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, preds[qid]) for a in gold_answers)
    out = {"exact_match": sum(exact_scores.values()) / len(exact_scores),
           "f1": sum(f1_scores.values()) / len(f1_scores)}
    has_ans_qids = [k for k, v in golds.items() if v]
    no_ans_qids = [k for k, v in golds.items() if not v]
    for prefix, qids in (("has_ans", has_ans_qids), ("no_ans", no_ans_qids)):
        if qids:
            out[f"{prefix}_exact_match"] = sum(exact_scores[k] for k in qids) / len(qids)
            out[f"{prefix}_f1"] = sum(f1_scores[k] for k in qids) / len(qids)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_squad_scores_equal_the_official_scripts_on_random_answers(seed):
    rng = np.random.default_rng(seed)
    # Case, punctuation inside and around words, articles alone and inside words, odd whitespace.
    words = ["The", "the", "a", "An", "cat", "Cat.", "sat,", "theatre", "U.S.", "us", "(big)", "big", "“big”",
             "an-", "!", "dog", "dog", "\t", " \n", "another"]

    def text(low, high):
        return " ".join(rng.choice(words, rng.integers(low, high)))

    golds_v1 = {f"q{n}": [text(1, 4) for _ in range(rng.integers(1, 4))] for n in range(80)}
    predictions = {q: text(0, 5) for q in golds_v1 if rng.random() < 0.9}  # some left unanswered
    expected = _script_v1(golds_v1, predictions)
    scores = metrics.squad_scores(predictions, golds_v1, version="v1.1")
    assert scores == {k: pytest.approx(v) for k, v in expected.items()}

    golds_v2 = {q: ([] if rng.random() < 0.3 else g) for q, g in golds_v1.items()}
    predictions = {q: text(0, 5) if rng.random() < 0.8 else "" for q in golds_v2}
    expected = _script_v2(golds_v2, predictions)
    scores = metrics.squad_scores(predictions, golds_v2, version="v2.0")
    assert scores == {k: pytest.approx(v) for k, v in expected.items()}


# ----------------------------------------------------------------------------------------------------
# Entity-level F1 (CoNLL)
# ----------------------------------------------------------------------------------------------------


def test_entities_are_read_as_conlleval_reads_them():
    assert metrics.tag_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert metrics.tag_entities(["I-PER", "I-PER", "I-LOC", "O", "I-ORG"]) == [("PER", 0, 1), ("LOC", 2, 2),
                                                                              ("ORG", 4, 4)]  # IOB1 / invalid I-
    assert metrics.tag_entities(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
    assert metrics.tag_entities(["O", "O"]) == []


def test_entities_of_invalid_and_iobes_sequences_by_hand():
    assert metrics.tag_entities(["O", "I-PER", "I-PER"]) == [("PER", 1, 2)]  # I- after O starts one
    assert metrics.tag_entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]  # type change
    assert metrics.tag_entities(["I-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    # IOBES: S- is one word; E- ends; an E- or I- after E- starts anew (conlleval).
    assert metrics.tag_entities(["S-PER", "B-LOC", "E-LOC", "E-LOC", "I-LOC", "S-LOC"]) == [
        ("PER", 0, 0), ("LOC", 1, 2), ("LOC", 3, 3), ("LOC", 4, 4), ("LOC", 5, 5)]
    assert metrics.tag_entities([]) == []


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "O", "O", "B-LOC"], ["O", "I-MISC"]]
    # Gold: PER 0-1, LOC 3-3, ORG 0-0. Predicted: PER 0-0 (wrong span), LOC 3-3, MISC 1-1. Right: LOC.
    scores = metrics.entity_scores(gold, predicted)
    assert scores == {"precision": pytest.approx(1 / 3), "recall": pytest.approx(1 / 3), "f1": pytest.approx(1 / 3),
                      "f1_LOC": 1.0, "f1_MISC": 0.0, "f1_ORG": 0.0, "f1_PER": 0.0}
    # Nothing found and nothing wanted: 0 everywhere, no per-type key.
    assert metrics.entity_scores([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def _random_tagging(rng, tags, sentences=40):
    gold, predicted = [], []
    for _ in range(sentences):
        n = int(rng.integers(1, 15))
        g = [str(t) for t in rng.choice(tags, n)]
        p = [t if rng.random() < 0.7 else str(rng.choice(tags)) for t in g]
        gold.append(g)
        predicted.append(p)
    return gold, predicted


def _assert_equal_to_seqeval(gold, predicted):
    from seqeval import metrics as seqeval
    from seqeval.metrics.sequence_labeling import get_entities

    ours = metrics.entity_scores(gold, predicted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns where a score is undefined (it sets 0 there)
        assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, predicted))
        assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, predicted))
        assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, predicted))
        report = seqeval.classification_report(gold, predicted, output_dict=True, zero_division=0)
    kinds = {k for k in report if not k.endswith(" avg")}
    assert {k for k in ours if k.startswith("f1_")} == {f"f1_{kind}" for kind in kinds}
    for kind in kinds:
        assert ours[f"f1_{kind}"] == pytest.approx(report[kind]["f1-score"])
    for sentence in gold + predicted:
        assert metrics.tag_entities(sentence) == get_entities(sentence)


@pytest.mark.parametrize("seed", range(6))
def test_entity_scores_equal_seqeval(seed):
    rng = np.random.default_rng(seed)
    # I-ORG has no B-ORG; I-LOC follows B-PER and I-PER follows O often enough: invalid BIO on purpose.
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-MISC"]
    _assert_equal_to_seqeval(*_random_tagging(rng, tags))


@pytest.mark.parametrize("seed", range(4))
def test_iobes_entity_scores_equal_seqeval(seed):
    rng = np.random.default_rng(100 + seed)
    tags = ["O", "O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "E-LOC", "S-LOC", "I-ORG", "E-ORG"]
    _assert_equal_to_seqeval(*_random_tagging(rng, tags))


def test_entity_scores_refuse_sentences_of_different_lengths():
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        metrics.entity_scores([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="2 gold sentences but 1 predicted"):
        metrics.entity_scores([["O"], ["O"]], [["O"]])
