"""Sparse search (bertjax/tasks/sparse_search.py): scores against numpy's dense dot products, rankings against
a full stable sort, the per-document terms cut against Python's sorted, the saved index, and the benchmark at a
tiny size."""

import json

import numpy as np
import pytest

from bertjax.bench import sparse_search_speed
from bertjax.tasks import sparse_search

VOCAB = 40


def sparse_rows(rng, count, vocab=VOCAB, density=0.15, whole=False):
    """[count, vocab] float32, about density non-zero: whole numbers 1-3 (exact sums, many ties) or floats."""
    weights = rng.integers(1, 4, (count, vocab)) if whole else rng.uniform(0.01, 3.0, (count, vocab))
    return np.where(rng.random((count, vocab)) < density, weights, 0).astype(np.float32)


def chunked(rows, sizes):
    """rows in consecutive chunks of the given sizes (an empty chunk among them), the rest as one."""
    bounds = np.cumsum([0, *sizes, len(rows) - sum(sizes)])
    return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def dense_ranking(queries, documents, k):
    """(scores, indices) of each query's top k by a full stable sort of float64 dot products: best first,
    equal scores by corpus index."""
    scores = queries.astype(np.float64) @ documents.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def index_as_dense(index):
    """The index's postings written back as [N, V] (an independent reading of the CSR layout)."""
    out = np.zeros((index.num_documents, index.vocab_size), np.float32)
    terms = np.repeat(np.arange(index.vocab_size), np.diff(index.indptr))
    out[index.doc_ids, terms] = index.weights
    return out


def test_scores_equal_dense_dot_products_for_every_pair():
    rng = np.random.default_rng(0)
    documents, queries = sparse_rows(rng, 150), sparse_rows(rng, 25)
    documents[7] = 0  # a document with no terms, and queries sharing no term with many documents
    queries[3] = 0  # a query with no terms: every document scores 0
    index = sparse_search.build_index(chunked(documents, [13, 0, 40]), model="m")
    assert index.doc_ids.dtype == np.int32 and index.weights.dtype == np.float32 and index.indptr.shape == (VOCAB + 1,)
    assert len(index.doc_ids) == np.count_nonzero(documents)  # memory follows the non-zeros
    np.testing.assert_array_equal(index_as_dense(index), documents)
    for term in range(VOCAB):  # each term's documents ascending
        assert (np.diff(index.doc_ids[index.indptr[term]:index.indptr[term + 1]]) > 0).all()
    whole = sparse_search.build_index([documents], model="m")  # chunking changes nothing
    np.testing.assert_array_equal(whole.doc_ids, index.doc_ids)
    np.testing.assert_array_equal(whole.weights, index.weights)
    scores, indices = sparse_search.search(index, queries, k=len(documents) + 10)  # every document
    assert scores.shape == indices.shape == (25, 150) and scores.dtype == np.float32
    assert (np.sort(indices, axis=1) == np.arange(150)).all()
    full = np.empty((25, 150))
    np.put_along_axis(full, indices, scores, axis=1)
    np.testing.assert_allclose(full, queries.astype(np.float64) @ documents.astype(np.float64).T, rtol=1e-6,
                               atol=1e-6)
    assert (scores[3] == 0).all() and (indices[3] == np.arange(150)).all()


@pytest.mark.parametrize("signed", [False, True], ids=["SPLADE weights", "negative query weights too"])
@pytest.mark.parametrize("k", [1, 5, 60, 200])
def test_top_k_equals_the_dense_ranking_ties_included(k, signed):
    rng = np.random.default_rng(1)
    documents, queries = sparse_rows(rng, 120, whole=True), sparse_rows(rng, 30, density=0.08, whole=True)
    documents[20:30] = documents[4]  # repeated documents: equal scores wherever they match
    if signed:  # a learned query weight may fall below 0: documents sharing no term then rank above some
        queries[:, ::3] *= -1
    index = sparse_search.build_index(chunked(documents, [17, 33]), model="m")
    scores, indices = sparse_search.search(index, queries, k)
    expected_scores, expected = dense_ranking(queries, documents, k)
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(scores, expected_scores)  # whole numbers: exact in float32
    ranked, _ = dense_ranking(queries, documents, len(documents))
    if k < len(documents):  # equal scores on both sides of the cut: which ones are kept is the tie rule's
        assert (ranked[:, k - 1] == ranked[:, k]).any()
    else:  # and documents sharing no term with a query, ranked by their score of 0 in corpus order
        assert (np.diff(ranked, axis=1) == 0).any() and (ranked == 0).any()
        assert not signed or (ranked < 0).any()


def test_terms_cut_keeps_each_documents_largest_weights():
    rng = np.random.default_rng(2)
    documents = sparse_rows(rng, 80, density=0.3)
    documents[:10] = sparse_rows(rng, 10, density=0.3, whole=True)  # equal weights across the cut
    documents[10, :] = 0
    documents[10, [5, 9]] = 1.0  # fewer than the cut: kept whole
    index = sparse_search.build_index(chunked(documents, [9, 30]), model="m", terms=4)
    expected = np.zeros_like(documents)
    for d, row in enumerate(documents):
        kept = sorted(np.flatnonzero(row), key=lambda t: (-row[t], t))[:4]  # largest, then lower term id
        expected[d, kept] = row[kept]
    np.testing.assert_array_equal(index_as_dense(index), expected)
    assert (np.count_nonzero(documents, axis=1) > 4).sum() > 60 and index.terms == 4
    queries = sparse_rows(rng, 12)
    scores, indices = sparse_search.search(index, queries, 80)
    full = np.empty((12, 80))
    np.put_along_axis(full, indices, scores, axis=1)
    np.testing.assert_allclose(full, queries.astype(np.float64) @ expected.T, rtol=1e-6, atol=1e-6)


def test_saved_index_searches_alike_and_names_its_model(tmp_path):
    rng = np.random.default_rng(3)
    documents, queries = sparse_rows(rng, 60), sparse_rows(rng, 9)
    index = sparse_search.build_index([documents[:25], documents[25:]], model="runs/splade", terms=5)
    directory = sparse_search.save_index(index, tmp_path / "index")
    sparse_search.save_index(index, directory)  # saving again replaces it whole
    manifest = json.loads((directory / sparse_search.MANIFEST).read_text())
    assert manifest == dict(format=sparse_search.FORMAT, model="runs/splade", vocab_size=VOCAB, num_documents=60,
                            postings=len(index.doc_ids), terms=5)
    assert sorted(p.name for p in directory.iterdir()) == [sparse_search.MANIFEST, sparse_search.POSTINGS]
    loaded = sparse_search.load_index(directory, model="runs/splade/")  # the same path, written otherwise
    for name in ("indptr", "doc_ids", "weights"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(index, name))
        assert getattr(loaded, name).dtype == getattr(index, name).dtype
    assert (loaded.num_documents, loaded.model, loaded.terms) == (60, "runs/splade", 5)
    for got, want in zip(sparse_search.search(loaded, queries, 7), sparse_search.search(index, queries, 7)):
        np.testing.assert_array_equal(got, want)
    scores, indices = sparse_search.search(loaded, queries, 3)
    run = sparse_search.to_run(scores, indices, [f"q{i}" for i in range(9)], [f"d{i}" for i in range(60)])
    assert list(run["q4"].items()) == [(f"d{d}", float(s)) for d, s in zip(indices[4], scores[4])]  # rank order
    with pytest.raises(ValueError, match=r"indexes the weights of model 'runs/splade', not 'naver/splade-v3'"):
        sparse_search.load_index(directory, model="naver/splade-v3")


def refused(tmp_path, case):
    """The call of each bad-input case."""
    documents = np.eye(4, dtype=np.float32)
    index = sparse_search.build_index([documents], model="m")
    calls = {
        "infinite": lambda: sparse_search.build_index([np.where(documents > 0, np.inf, 0)], model="m"),
        "NaN": lambda: sparse_search.search(index, np.full((1, 4), np.nan, np.float32), 1),
        "another width": lambda: sparse_search.build_index([documents, np.eye(5, dtype=np.float32)], model="m"),
        "no documents": lambda: sparse_search.build_index([], model="m"),
        "a 1-D chunk": lambda: sparse_search.build_index([documents[0]], model="m"),
        "terms 0": lambda: sparse_search.build_index([documents], model="m", terms=0),
        "no model": lambda: sparse_search.build_index([documents], model=""),
        "query width": lambda: sparse_search.search(index, np.ones((2, 3), np.float32), 1),
        "k 0": lambda: sparse_search.search(index, documents, 0),
        "no index": lambda: sparse_search.load_index(tmp_path / "missing"),
        "run ids": lambda: sparse_search.to_run(*sparse_search.search(index, documents, 2), ["q"], list("abcd")),
    }
    return calls[case]


@pytest.mark.parametrize("case", ["infinite", "NaN", "another width", "no documents", "a 1-D chunk",
                                  "terms 0", "no model", "query width", "k 0", "no index",
                                  "run ids"])
def test_bad_input_is_one_line(tmp_path, case):
    with pytest.raises(ValueError) as error:
        refused(tmp_path, case)()
    assert "\n" not in str(error.value) and len(str(error.value)) > 20


def test_the_benchmark_at_a_tiny_size(capsys):
    result = sparse_search_speed.benchmark(3000, 40, vocab_size=2000, document_terms=50, query_terms=12,
                                           chunk_size=700)
    assert result["documents"] == 3000 and result["queries"] == 40
    assert abs(result["document_terms"] - 50) < 5 and abs(result["query_terms"] - 12) < 2  # the draws hit the mean
    assert result["index_bytes"] == 8 * round(3000 * result["document_terms"]) + 8 * 2001  # 8 bytes a non-zero
    assert result["queries_per_second"] == pytest.approx(40 / result["search_seconds"])
    # Zipf's law: a common term is in most documents, so a query meets more postings than uniform terms would.
    assert result["postings_per_query"] > 3 * 12 * 50 * 3000 / 2000
    printed = capsys.readouterr().out
    assert "3,000 documents" in printed and "queries/s" in printed and "peak" in printed
