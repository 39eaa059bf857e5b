"""Ranking metrics as trec_eval computes them (what BEIR reports, through pytrec_eval), from ranked lists.

For a query with judgements rel(d) (a whole number; relevant means rel >= 1, trec_eval's default level)
and a ranking d_1, d_2, ... (unjudged passages count as rel 0), at a cut-off k:
  ndcg@k    DCG / ideal DCG, DCG = sum over i <= k of rel(d_i) / log2(i + 1) (trec_eval's ndcg_cut: the gain
            is the grade itself, not 2^rel - 1; the ideal ranking is the judgements sorted by grade);
            0 when no passage is relevant
  recall@k  relevant passages in the top k / all relevant ones (0 when there are none)
  map@k     (trec_eval's map_cut) the sum of precision@i at each relevant d_i, i <= k, / all relevant
  mrr@k     1 / the rank of the first relevant passage within the top k, else 0 (trec_eval's
            recip_rank on the ranking cut at k)
Each is averaged over the queries that have judgements (BEIR's mean), as a fraction of 1; a query the
run does not rank counts as an empty ranking.
"""

import numpy as np

METRICS = ("ndcg", "recall", "map", "mrr")
K_VALUES = (1, 3, 5, 10, 100, 1000)


def trec_ranking(scores: dict[str, float]) -> list[str]:
    """Passage ids ranked as trec_eval ranks a run's scores: by score, highest first; equal scores by
    id, the greater (by code point) first."""
    return [d for d, _ in sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def query_metrics(relevance: dict[str, int], ranking: list[str], k_values=K_VALUES) -> dict[str, float]:
    """Every metric at every k for one query: its judgements (passage id -> grade) and its ranking."""
    deepest = max(k_values)
    grades = np.array([relevance.get(d, 0) for d in ranking[:deepest]], np.float64)  # [R]
    grades = np.pad(grades, (0, deepest - len(grades)))  # [K]: a short ranking ends in unjudged places
    relevant = grades >= 1
    discount = 1.0 / np.log2(np.arange(2, deepest + 2))  # [K]: 1 / log2(rank + 1)
    dcg = np.cumsum(np.where(grades > 0, grades, 0.0) * discount)  # [K]: DCG at each cut-off
    ideal_grades = np.sort([g for g in relevance.values() if g > 0])[::-1][:deepest]
    ideal = np.cumsum(np.pad(ideal_grades.astype(np.float64), (0, deepest - len(ideal_grades))) * discount)
    num_relevant = sum(1 for g in relevance.values() if g >= 1)
    found = np.cumsum(relevant)  # [K]: relevant passages in the top i
    precision_sum = np.cumsum(np.where(relevant, found / np.arange(1, deepest + 1), 0.0))
    first = int(np.argmax(relevant)) if relevant.any() else None
    out = {}
    for k in k_values:
        out[f"ndcg@{k}"] = float(dcg[k - 1] / ideal[k - 1]) if ideal[k - 1] > 0 else 0.0
        out[f"recall@{k}"] = float(found[k - 1] / num_relevant) if num_relevant else 0.0
        out[f"map@{k}"] = float(precision_sum[k - 1] / num_relevant) if num_relevant else 0.0
        out[f"mrr@{k}"] = 1.0 / (first + 1) if first is not None and first < k else 0.0
    return out


def retrieval_scores(qrels: dict[str, dict[str, int]], run: dict[str, list[str]],
                     k_values=K_VALUES) -> dict[str, float]:
    """The metrics (module docstring) averaged over the queries of qrels: {"ndcg@10": ..., ...}."""
    k_values = tuple(sorted(set(int(k) for k in k_values)))
    if not k_values or k_values[0] < 1:
        raise ValueError(f"k values {k_values}: each cut-off must be a whole number >= 1")
    if not qrels:
        raise ValueError("no query has judgements: nothing to average")
    per_query = [query_metrics(relevance, run.get(query_id, []), k_values) for query_id, relevance in qrels.items()]
    names = [f"{metric}@{k}" for metric in METRICS for k in k_values]
    return {name: float(np.mean([q[name] for q in per_query])) for name in names}
