"""Retrieval evaluation of SPLADE and ColBERT models: the sparse and multi-vector first stages against numpy's
dot products and MaxSim (a full stable sort), the suite's table against pytrec_eval on runs built from the
same vectors (tiny SPLADE and ColBERT models; a stand-in ColBERT model, reranked too), bad input in one line, and
`python -m bertjax.benchmark --sparse_search`."""

import json
import types
import zlib

import flax.linen as nn
import jax
import numpy as np
import pytest
import pytrec_eval
from conftest import run_program, untrained_contrastive_workdir
from test_colbert import brute_maxsim
from test_retrieval import brute_force, demo_retrieval_set, write_beir

import bertjax
from bertjax.models import heads, multivector
from bertjax.runs import suite_evaluation
from bertjax.tasks import retrieval, retrieval_data
from bertjax.tasks.kinds import contrastive as contrastive_kind

# ----------------------------------------------------------------------------------------------------
# The first stages on plain arrays: numpy's full sort
# ----------------------------------------------------------------------------------------------------


def table_set(num_queries: int, num_passages: int) -> retrieval_data.RetrievalSet:
    """Texts "query i" and "passage j" (a lookup table's keys), the passages' ids shuffled and the first
    queries sharing their ids with passages (for ignore_identical_ids)."""
    ids = [f"p{i}" for i in np.random.default_rng(7).permutation(num_passages)]
    return retrieval_data.RetrievalSet("table", ids, [f"passage {i}" for i in range(num_passages)], ids[:num_queries],
                                       [f"query {i}" for i in range(num_queries)], {})


def rows_of(texts, kind) -> list[int]:
    return [int(t.split()[1]) for t in texts if t.startswith(kind)]


def assert_run_is(run, data, scores, order):
    for q, query_id in enumerate(data.query_ids):
        assert list(run[query_id]) == [data.corpus_ids[i] for i in order[q]], query_id
        assert list(run[query_id].values()) == pytest.approx(list(scores[q]), abs=1e-5)


def test_the_sparse_stage_equals_numpy_dot_products_in_chunks():
    """Whole-number weights, most zero (exact sums, many ties, many passages sharing no term with a query):
    the inverted index's run is numpy's stable ranking of the dot products, its own passage left out when
    asked; no embed call holds more than chunk_size passages; the index is 8 bytes a non-zero and a term."""
    rng = np.random.default_rng(0)
    table = {kind: np.where(rng.random((n, 40)) < 0.15, rng.integers(1, 4, (n, 40)), 0).astype(np.float32)
             for kind, n in (("query", 9), ("passage", 40))}
    calls = []

    def embed(texts, kind):
        calls.append((kind, len(texts)))
        return table[kind][rows_of(texts, kind)]

    data = table_set(9, 40)
    for ignore in (False, True):
        stage = retrieval.sparse_first_stage(embed, data, 30, 5, model="table", ignore_identical_ids=ignore,
                                             chunk_size=7)
        scores, order = brute_force(table["query"], table["passage"], 30, "dot", np.arange(9) if ignore else None)
        assert_run_is(stage.run, data, scores, order)
        assert (np.diff(scores, axis=1) == 0).any() and (scores == 0).any()  # ties, and passages scoring 0
        assert stage.index_bytes == 8 * np.count_nonzero(table["passage"]) + 8 * 41 and stage.query_seconds > 0
    assert max(n for kind, n in calls if kind == "passage") <= 5  # chunks of 7 in batches of 5, never all 40
    assert sum(n for kind, n in calls if kind == "passage") == 2 * 40


def token_table(rng, count, tokens=5, width=4):
    """Whole-number token vectors (exact MaxSim, ties) of 1 to `tokens` scored tokens each, zero after."""
    mask = np.arange(tokens)[None] < rng.integers(1, tokens + 1, count)[:, None]
    return np.where(mask[..., None], rng.integers(-2, 3, (count, tokens, width)), 0).astype(np.float32), mask


def test_the_multivector_stage_equals_numpy_maxsim_across_chunks():
    """Passages embedded 5 at a time, each call's vectors as wide as its longest text, every chunk's top k
    merged: numpy's stable ranking of MaxSim over the whole corpus, ties in corpus order, its own passage
    left out when asked; the index is the scored tokens' float32 vectors."""
    rng = np.random.default_rng(1)
    table = {"query": token_table(rng, 9), "passage": token_table(rng, 40)}
    widths = []

    def embed_tokens(texts, kind):
        vectors, mask = (array[rows_of(texts, kind)] for array in table[kind])
        width = int(mask.sum(axis=1).max())
        widths.append((kind, len(texts), width))
        return vectors[:, :width], mask[:, :width]

    data = table_set(9, 40)
    scores_all = brute_maxsim(*table["query"], *table["passage"])
    for ignore in (False, True):
        stage = retrieval.multivector_first_stage(embed_tokens, data, 12, ignore_identical_ids=ignore, chunk_size=5)
        scores = scores_all.copy()
        if ignore:
            scores[np.arange(9), np.arange(9)] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :12]
        assert_run_is(stage.run, data, np.take_along_axis(scores, order, axis=1), order)
        assert (np.diff(np.take_along_axis(scores, order, axis=1), axis=1) == 0).any()  # ties to keep in order
        assert stage.index_bytes == table["passage"][1].sum() * 4 * 4 and stage.query_seconds > 0
    passages = [(n, width) for kind, n, width in widths if kind == "passage"]
    assert max(n for n, _ in passages) == 5 and len({width for _, width in passages}) > 1


# ----------------------------------------------------------------------------------------------------
# The suite: pytrec_eval on runs built from the same vectors
# ----------------------------------------------------------------------------------------------------


def trec_figures(qrels, run) -> dict:
    """pytrec_eval's nDCG@10, Recall@100, MAP@100 and MRR@10 (recip_rank of the run cut at 10 in trec_eval's
    order), averaged over the judged queries."""
    found = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map_cut.100"}).evaluate(run)
    top10 = {q: dict(sorted(s.items(), key=lambda item: (item[1], item[0]), reverse=True)[:10]) for q, s in run.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    mean = lambda name, results: float(np.mean([r[name] for r in results.values()]))
    return {"ndcg@10": mean("ndcg_cut_10", found), "recall@100": mean("recall_100", found),
            "map@100": mean("map_cut_100", found), "mrr@10": mean("recip_rank", reciprocal)}


def judged(data) -> dict:
    qrels = {}
    for query_id, corpus_id, grade in data["qrels"]:
        qrels.setdefault(query_id, {})[corpus_id] = grade
    return qrels


def full_run(data, scores) -> dict:
    return {q["_id"]: {p["_id"]: float(scores[i, j]) for j, p in enumerate(data["corpus"])}
            for i, q in enumerate(data["queries"])}


def assert_figures(ours: dict, reference: dict):
    for name, value in reference.items():
        assert ours[name] == pytest.approx(value, abs=1e-6), name


def passage_texts(data) -> list[str]:
    return [(p["title"] + " " + p["text"]).strip() for p in data["corpus"]]


@pytest.fixture
def splade_workdir(pretrained, tmp_path):
    """`pretrained`'s encoder and masked-LM head as a SPLADE model."""
    settings = contrastive_kind.Settings(representation="splade", max_seq_length=48)
    return untrained_contrastive_workdir(pretrained, tmp_path / "splade", settings,
                                         {k: pretrained["params"][k] for k in ("bert", "mlm_head")})


def test_the_table_of_a_splade_model_equals_pytrec_eval_on_numpy_dot_products(splade_workdir, tmp_path):
    data = demo_retrieval_set()
    directory = write_beir(tmp_path / "demo", **data)
    out = suite_evaluation.retrieval_suite(splade_workdir, [str(directory)], str(tmp_path / "eval"))
    model = bertjax.load(splade_workdir)
    queries = model.embed([q["text"] for q in data["queries"]], task="query")
    passages = model.embed(passage_texts(data), task="document")
    assert passages.shape == (36, model.config.vocab_size) and 0 < np.count_nonzero(passages) < passages.size
    ours = out["scores"]["demo"]
    assert_figures(ours, trec_figures(judged(data), full_run(data, queries.astype(np.float64) @ passages.T)))
    assert out["similarity"] == "dot" and ours["ndcg@10"] > 0.1
    assert ours["index_bytes"] == 8 * np.count_nonzero(passages) + 8 * (model.config.vocab_size + 1)
    heading, rule, row, average = out["table"]
    assert heading == "| Data set | nDCG@10 | Recall@100 | MRR@10 | MAP@100 | Index MiB | ms/query |"
    assert row.split(" | ")[1:5] == [f"{100 * ours[m]:.1f}" for m in ("ndcg@10", "recall@100", "mrr@10", "map@100")]
    assert row.split(" | ")[5:] == [f"{ours['index_bytes'] / 2**20:,.2f}", f"{ours['query_ms']:,.2f} |"]
    assert average.replace("Average", "demo") == row and ours["query_ms"] > 0
    assert (tmp_path / "eval" / "retrieval.md").read_text().splitlines() == out["table"]
    assert json.loads((tmp_path / "eval" / "retrieval.json").read_text())["scores"] == out["scores"]


class StandInColbert:
    """A ColBERT model's stand-in: a text's tokens are its words, each a fixed random unit vector of 8 plus
    noise of its own text and place (so no two passages tie); queries and documents alike."""

    embedding = types.SimpleNamespace(representation="colbert", similarity="maxsim")

    @staticmethod
    def vectors(text: str) -> np.ndarray:
        words = text.lower().split()
        noise = np.random.default_rng(zlib.crc32(text.encode())).normal(size=(len(words), 8))
        vectors = np.array([np.random.default_rng(zlib.crc32(w.encode())).normal(size=8) for w in words]) + 0.3 * noise
        return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)

    def embed_tokens(self, texts, task, batch_size=32):
        assert task in ("query", "document") and batch_size == 32
        found = [self.vectors(t) for t in texts]
        width = max(len(v) for v in found)
        vectors, mask = np.zeros((len(texts), width, 8), np.float32), np.zeros((len(texts), width), bool)
        for i, v in enumerate(found):
            vectors[i, :len(v)], mask[i, :len(v)] = v, True
        return vectors, mask


def test_the_table_of_a_colbert_model_and_its_reranking(tmp_path, monkeypatch):
    """The stand-in's MaxSim by numpy over each text's own vectors: its table is pytrec_eval's, and its
    top 5 reranked (by words shared, a cross-encoder's stand-in) too."""
    data = demo_retrieval_set()
    directory = str(write_beir(tmp_path / "demo", **data))
    monkeypatch.setattr(suite_evaluation.inference, "load", lambda path, *args, **kwargs: StandInColbert())
    overlap = lambda queries, passages: [len(set(q.split()) & set(p.split())) for q, p in zip(queries, passages)]
    monkeypatch.setattr(suite_evaluation, "pair_scorer", lambda model, source, batch_size: (overlap, "words shared"))
    out = suite_evaluation.retrieval_suite("colbert", [directory], str(tmp_path / "eval"))
    query_texts, passages = [q["text"] for q in data["queries"]], passage_texts(data)
    maxsim = np.array([[(StandInColbert.vectors(q).astype(np.float64) @ StandInColbert.vectors(p).T).max(axis=1).sum()
                        for p in passages] for q in query_texts])
    ours, qrels = out["scores"]["demo"], judged(data)
    assert_figures(ours, trec_figures(qrels, full_run(data, maxsim)))
    assert out["similarity"] == "maxsim" and ours["ndcg@10"] > 0.3
    assert ours["index_bytes"] == sum(len(p.split()) for p in passages) * 8 * 4
    assert out["table"][0].endswith("| Index MiB | ms/query |") and len(out["table"]) == 4
    reranked = suite_evaluation.retrieval_suite("colbert", [directory], str(tmp_path / "rerank"), rerank_with="r",
                                                rerank_top=5)
    assert reranked["scores"] == {"demo": {**ours, "query_ms": reranked["scores"]["demo"]["query_ms"]}}
    top = np.argsort(-maxsim, axis=1, kind="stable")[:, :5]
    run = {q["_id"]: {data["corpus"][j]["_id"]: float(overlap([q["text"]], [passages[j]])[0]) for j in top[i]}
           for i, q in enumerate(data["queries"])}
    assert_figures(reranked["reranked"]["demo"], trec_figures(qrels, run))
    assert reranked["reranked"]["demo"]["recall@100"] < 1.0 and reranked["rerank_score"] == "words shared"


def test_the_table_of_a_colbert_model_equals_pytrec_eval_on_numpy_maxsim(pretrained, tmp_path):
    """A ColBERT model on `pretrained`'s encoder (a fresh projection to 16), untrained, through bertjax.load:
    its table is pytrec_eval's on numpy's MaxSim of embed_tokens' own vectors."""
    settings = contrastive_kind.Settings(representation="colbert", colbert_dim=16, colbert_query_length=12,
                                         colbert_document_length=40)
    ids = np.zeros((1, 8), np.int32)
    params = multivector.ColbertEncoder(pretrained["cfg"], dim=16).init(jax.random.key(3), ids, ids, ids + 1)
    encoder = heads.with_pretrained_encoder(nn.unbox(params["params"]), pretrained["params"])
    workdir = untrained_contrastive_workdir(pretrained, tmp_path / "colbert", settings, encoder)
    data = demo_retrieval_set()
    out = suite_evaluation.retrieval_suite(workdir, [str(write_beir(tmp_path / "demo", **data))],
                                           str(tmp_path / "eval"))
    model = bertjax.load(workdir)
    queries = model.embed_tokens([q["text"] for q in data["queries"]], task="query")
    passages = model.embed_tokens(passage_texts(data), task="document")
    ours = out["scores"]["demo"]
    assert_figures(ours, trec_figures(judged(data), full_run(data, brute_maxsim(*queries, *passages))))
    assert ours["index_bytes"] == passages[1].sum() * 16 * 4 and out["similarity"] == "maxsim"


# ----------------------------------------------------------------------------------------------------
# Bad input, and the sparse search benchmark's program
# ----------------------------------------------------------------------------------------------------


def test_what_a_representation_cannot_do_is_one_line(splade_workdir, tmp_path, monkeypatch):
    directory = [str(write_beir(tmp_path / "demo", **demo_retrieval_set(6)))]
    workdir = tmp_path / "eval"
    with pytest.raises(ValueError, match=r"--similarity=cosine: .*splade is a splade model, scored by dot; "
                                         r"leave --similarity unset") as error:
        suite_evaluation.retrieval_suite(splade_workdir, directory, str(workdir), similarity="cosine")
    assert "\n" not in str(error.value) and not workdir.exists()
    stand_in = StandInColbert()
    monkeypatch.setattr(suite_evaluation.inference, "load", lambda path, *args, **kwargs: stand_in)
    with pytest.raises(ValueError, match="--similarity=dot: colbert is a colbert model, scored by maxsim"):
        suite_evaluation.retrieval_suite("colbert", directory, str(workdir), similarity="dot")
    stand_in.embedding = types.SimpleNamespace(representation="bag_of_words")
    with pytest.raises(ValueError, match="colbert makes bag_of_words embeddings: --suite=retrieval searches dense, "
                                         "splade, colbert ones"):
        suite_evaluation.retrieval_suite("colbert", directory, str(workdir))
    assert not workdir.exists()
    broken = lambda texts, kind: (np.zeros((len(texts), 3, 8)), np.ones((len(texts), 4), bool))
    with pytest.raises(ValueError, match=r"embed_tokens returned vectors \(2, 3, 8\) and a mask \(2, 4\) for 2 "
                                         r"query texts: expected \[2, tokens, width\] and \[2, tokens\]"):
        retrieval.multivector_first_stage(broken, table_set(2, 4), 3)


def test_the_sparse_search_benchmark_program():
    result = run_program("bertjax.benchmark", "--sparse_search=1500,2500", "--sparse_queries=20")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1,500 documents" in result.stdout and "2,500 documents" in result.stdout
    assert result.stdout.count("queries/s") == 2 and result.stdout.count("peak") == 2
    result = run_program("bertjax.benchmark", "--sparse_search=many")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "--sparse_search=many: give corpus sizes" in lines[0]
