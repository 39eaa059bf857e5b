"""Retrieve-then-rerank: `python -m bertjax.evaluate --suite=retrieval --rerank_with=MODEL`. retrieval.rerank
against pytrec_eval on the run it returns; the suite's reranked table against pytrec_eval on a run built
independently (numpy's cosines of the same embedder's first stage, its top passages scored by
sentence-transformers' CrossEncoder of the reranker's export); bad input in one line, nothing written."""

import json

import numpy as np
import pytest
import pytrec_eval
from conftest import WORDS, run_program
from sentence_transformers import CrossEncoder
from test_embeddings import task_workdir  # a fine-tuned-looking checkpoint: a random head, logits far apart
from test_retrieval import mean_pooled, write_beir

import bertjax
from bertjax.runs import exporting, suite_evaluation
from bertjax.tasks import retrieval, retrieval_metrics

def trec_means(qrels, run) -> dict:
    """pytrec_eval's nDCG@10, Recall@100 and MRR@10 (its reciprocal rank of the run cut at 10, in
    trec_eval's order: score, then id, highest first), averaged over the judged queries."""
    found = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    top10 = {q: dict(sorted(s.items(), key=lambda item: (item[1], item[0]), reverse=True)[:10]) for q, s in run.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    return {"ndcg_cut_10": float(np.mean([r["ndcg_cut_10"] for r in found.values()])),
            "recall_100": float(np.mean([r["recall_100"] for r in found.values()])),
            "recip_rank": float(np.mean([r["recip_rank"] for r in reciprocal.values()]))}


def test_rerank_rescores_each_querys_top_k_and_drops_the_rest():
    rng = np.random.default_rng(0)
    corpus = {f"d{i}": " ".join(rng.choice(WORDS, 5)) for i in range(30)}
    queries = {f"q{i}": " ".join(rng.choice(WORDS, 3)) for i in range(7)}
    first = {q: list(rng.permutation(list(corpus))[: int(rng.integers(2, 12))]) for q in queries}
    calls = []

    def overlap(query_texts, passage_texts):  # a cross-encoder's stand-in: words shared, whole numbers (ties)
        calls.append(len(query_texts))
        return [len(set(q.split()) & set(p.split())) for q, p in zip(query_texts, passage_texts)]

    run = retrieval.rerank(overlap, queries, corpus, first, top_k=5, chunk_size=4)
    assert max(calls) <= 4 and sum(calls) == sum(min(5, len(r)) for r in first.values())
    for q, ranked in first.items():
        assert list(run[q]) == ranked[:5]  # the first five, rescored; the rest dropped
        assert all(run[q][d] == len(set(queries[q].split()) & set(corpus[d].split())) for d in run[q])
    assert retrieval.rerank(overlap, queries, corpus, first, top_k=5, chunk_size=1000) == run
    # Ranked as trec_eval ranks the run (ties by id), its metrics are pytrec_eval's.
    qrels = {q: {d: int(rng.integers(0, 3)) for d in rng.choice(list(corpus), 6, replace=False)} for q in queries}
    ours = retrieval_metrics.retrieval_scores(qrels, {q: retrieval_metrics.trec_ranking(s) for q, s in run.items()},
                                              (10, 100))
    reference = trec_means(qrels, run)
    assert ours["ndcg@10"] == pytest.approx(reference["ndcg_cut_10"], abs=1e-9)
    assert ours["recall@100"] == pytest.approx(reference["recall_100"], abs=1e-9)
    assert ours["mrr@10"] == pytest.approx(reference["recip_rank"], abs=1e-9)
    with pytest.raises(ValueError, match="top_k=0: rerank at least one passage"):
        retrieval.rerank(overlap, queries, corpus, first, top_k=0)


def short_retrieval_set(num_passages=24):
    """Passages of 6-9 words (a title on every third), a query of 4 of its passage's words, judged 2 for
    its passage and 1 for the next: every pair fits the reranker's 48 tokens, untruncated."""
    rng = np.random.default_rng(5)
    corpus, queries, qrels = [], [], []
    for i in range(num_passages):
        words = list(rng.choice(WORDS, int(rng.integers(6, 10))))
        corpus.append({"_id": f"p{i}", "title": "" if i % 3 else words[0], "text": " ".join(words[1:])})
        queries.append({"_id": f"q{i}", "text": " ".join(rng.choice(words, 4))})
        qrels += [(f"q{i}", f"p{i}", 2)] + ([(f"q{i}", f"p{i + 1}", 1)] if i % 2 and i + 1 < num_passages else [])
    return dict(corpus=corpus, queries=queries, qrels=qrels)


@pytest.fixture(scope="module")
def reranker(pretrained, tmp_path_factory):
    """A regression of pairs on `pretrained`'s encoder (a random head) and its CrossEncoder export."""
    root = tmp_path_factory.mktemp("reranker")
    workdir = task_workdir(root / "run", bertjax.load(pretrained["workdir"]), "regression", "relevance")
    exported = exporting.export(str(workdir), str(root / "ce"), "sentence-transformers")
    return dict(workdir=str(workdir), exported=exported)


def test_the_reranked_table_equals_pytrec_eval_on_cross_encoder_scores(pretrained, reranker, tmp_path):
    data = short_retrieval_set()
    directory = write_beir(tmp_path / "short", **data)
    out = suite_evaluation.retrieval_suite(pretrained["workdir"], [str(directory)], str(tmp_path / "eval"),
                                           rerank_with=reranker["workdir"], rerank_top=5)
    # The first stage built again: numpy's cosines of the mean-pooled embeddings (tests/test_retrieval.py).
    model = bertjax.load(pretrained["workdir"])
    passages = [(p["title"] + " " + p["text"]).strip() for p in data["corpus"]]
    q, p = mean_pooled(model, [x["text"] for x in data["queries"]]), mean_pooled(model, passages)
    cosine = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (p / np.linalg.norm(p, axis=1, keepdims=True)).T
    qrels = {}
    for query_id, corpus_id, grade in data["qrels"]:
        qrels.setdefault(query_id, {})[corpus_id] = grade
    first = {x["_id"]: {c["_id"]: float(cosine[i, j]) for j, c in enumerate(data["corpus"])}
             for i, x in enumerate(data["queries"])}
    # Its top 5 per query scored by sentence-transformers' CrossEncoder of the reranker's export.
    top = {x["_id"]: np.argsort(-cosine[i], kind="stable")[:5] for i, x in enumerate(data["queries"])}
    texts = {x["_id"]: x["text"] for x in data["queries"]}
    pairs = [(query_id, j) for query_id, chosen in top.items() for j in chosen]
    scores = CrossEncoder(reranker["exported"], device="cpu").predict([(texts[i], passages[j]) for i, j in pairs])
    reranked = {query_id: {} for query_id in top}
    for (query_id, j), score in zip(pairs, scores):
        reranked[query_id][data["corpus"][j]["_id"]] = float(score)
    assert out["rerank_score"] == "the regression head's logit"
    for stage, run in (("scores", first), ("reranked", reranked)):
        ours, reference = out[stage]["short"], trec_means(qrels, run)
        assert ours["ndcg@10"] == pytest.approx(reference["ndcg_cut_10"], abs=1e-6), stage
        assert ours["recall@100"] == pytest.approx(reference["recall_100"], abs=1e-6), stage
        assert ours["mrr@10"] == pytest.approx(reference["recip_rank"], abs=1e-6), stage
    # Only the top 5 were kept: relevant passages the first stage ranked lower are gone.
    assert out["scores"]["short"]["recall@100"] == 1.0 and out["reranked"]["short"]["recall@100"] < 1.0
    assert out["reranked"]["short"]["ndcg@10"] != pytest.approx(out["scores"]["short"]["ndcg@10"])
    heading, rule, first_row, reranked_row, first_average, reranked_average = out["table"]
    assert heading == "| Data set | Stage | nDCG@10 | MRR@10 | Recall@100 |"
    assert first_row.startswith("| short | first stage |") and reranked_row.startswith("| short | reranked (top 5) |")
    assert first_average.replace("Average", "short") == first_row and reranked_average.startswith("| Average |")
    assert (tmp_path / "eval" / "retrieval.md").read_text().splitlines() == out["table"]
    saved = json.loads((tmp_path / "eval" / "retrieval.json").read_text())
    assert saved["reranked"] == out["reranked"] and saved["rerank_top"] == 5
    assert "ndcg@1000" in saved["reranked"]["short"] and "map@100" in saved["scores"]["short"]


def test_a_two_class_pair_classifier_reranks_by_its_log_odds(pretrained, tmp_path):
    bert = bertjax.load(pretrained["workdir"])
    pairs = [("the old bridge", "The river runs under the old bridge."), ("music school", "A tower by the road.")]
    for labels, relevant in ((("no", "yes"), 1), (("entailment", "not_entailment"), 0)):
        workdir = task_workdir(tmp_path / labels[0], bert, "classification", "pairs", labels)
        score_pairs, what = suite_evaluation.pair_scorer(bertjax.load(workdir), str(workdir), 8)
        exported = exporting.export(str(workdir), str(tmp_path / f"{labels[0]}-ce"), "sentence-transformers")
        logits = CrossEncoder(exported, device="cpu").predict(pairs)  # [pairs, 2]
        np.testing.assert_allclose(score_pairs(*zip(*pairs)), logits[:, relevant] - logits[:, 1 - relevant],
                                   atol=1e-4)
        assert what == f"logit[{labels[relevant]}] - logit[{labels[1 - relevant]}]"


def test_bad_reranking_input_is_one_line_and_nothing_is_written(pretrained, tmp_path):
    directory = str(write_beir(tmp_path / "short", **short_retrieval_set(4)))
    workdir = tmp_path / "eval"
    result = run_program("bertjax.evaluate", "--suite=sts", f"--init_from={pretrained['workdir']}",
                         f"--workdir={workdir}", f"--rerank_with={pretrained['workdir']}")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--rerank_with: reranking is --suite=retrieval's" in lines[0]
    cases = [(dict(rerank_with=pretrained["workdir"], rerank_top=0), "--rerank_top=0: rerank at least the first"),
             (dict(rerank_top=10), "--rerank_top=10: how many passages --rerank_with's model rescores"),
             (dict(rerank_with=pretrained["workdir"]), "is no fine-tuned model: rerank with a model fine-tuned on"),
             # The keyword classifier scores single texts, but so would it pairs: two classes are taken; three are not.
             (dict(rerank_with=str(task_workdir(tmp_path / "three", bertjax.load(pretrained["workdir"]),
                                                "classification", "three", ("a", "b", "c")))),
              "is a fine-tuned classification model of 3 classes")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
            suite_evaluation.retrieval_suite(pretrained["workdir"], [directory], str(workdir), **kwargs)
        assert "\n" not in str(error.value)
    assert not workdir.exists()
