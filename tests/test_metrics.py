"""bertjax.metrics against independent references: scikit-learn and scipy."""

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
