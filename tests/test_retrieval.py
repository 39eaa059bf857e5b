"""Retrieval and similarity evaluation: trec_eval's metrics (against pytrec_eval), exact top-k search (against
numpy, one device and eight), BEIR and save_to_disk readers, STS correlations (against scipy), and
`python -m bertjax.evaluate --suite=retrieval` on the `pretrained` model."""

import json
import pathlib
import zlib

import datasets
import jax
import numpy as np
import pytest
import pytrec_eval
import scipy.stats

from bertjax import inference
from bertjax.data import demo
from bertjax.runs import suite_evaluation
from bertjax.tasks import readers, registry, retrieval, retrieval_data, retrieval_metrics
from bertjax.training import sharding
from conftest import run_program

K_VALUES = retrieval_metrics.K_VALUES


# ----------------------------------------------------------------------------------------------------
# Metrics: pytrec_eval (trec_eval) on the same rankings
# ----------------------------------------------------------------------------------------------------


def random_judgements(seed: int, num_queries=60, num_docs=80):
    """Graded qrels (0-3, some queries with no relevant passage) and runs whose scores tie often (whole
    numbers 0-4), some empty, some longer than a cut-off."""
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(num_docs)]
    qrels, run = {}, {}
    for q in range(num_queries):
        judged = rng.choice(docs, size=rng.integers(1, 15), replace=False)
        qrels[f"q{q}"] = {d: int(rng.integers(0, 4)) for d in judged}
        retrieved = rng.choice(docs, size=rng.integers(0, num_docs), replace=False)
        run[f"q{q}"] = {d: float(rng.integers(0, 5)) for d in retrieved}
    return qrels, run


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_equal_trec_eval(seed):
    qrels, run = random_judgements(seed)
    cut = ",".join(map(str, K_VALUES))
    measures = {f"ndcg_cut.{cut}", f"recall.{cut}", f"map_cut.{cut}"}
    reference = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    assert set(reference) == set(qrels)  # every judged query is averaged, as BEIR averages
    rankings = {q: retrieval_metrics.trec_ranking(scores) for q, scores in run.items()}
    assert any(len(set(s.values())) < len(s) for s in run.values())  # ties, broken as trec_eval breaks them
    ours = {q: retrieval_metrics.query_metrics(qrels[q], rankings[q], K_VALUES) for q in qrels}
    names = {"ndcg": "ndcg_cut", "recall": "recall", "map": "map_cut"}
    for k in K_VALUES:
        for q in qrels:
            for name, trec_name in names.items():
                assert ours[q][f"{name}@{k}"] == pytest.approx(reference[q][f"{trec_name}_{k}"], abs=1e-9), (q, name, k)
        # MRR@k: trec_eval's recip_rank of the run cut at k, in trec_eval's own order.
        truncated = {q: {d: run[q][d] for d in rankings[q][:k]} for q in run}
        reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(truncated)
        for q in qrels:
            assert ours[q][f"mrr@{k}"] == pytest.approx(reciprocal[q]["recip_rank"], abs=1e-9), (q, k)
    means = retrieval_metrics.retrieval_scores(qrels, rankings, K_VALUES)
    for k in (10, 100):
        assert means[f"ndcg@{k}"] == pytest.approx(np.mean([r[f"ndcg_cut_{k}"] for r in reference.values()]), abs=1e-9)
        assert means[f"map@{k}"] == pytest.approx(np.mean([r[f"map_cut_{k}"] for r in reference.values()]), abs=1e-9)
    assert 0 < means["ndcg@10"] < 1 and 0 < means["recall@1000"] < 1


# ----------------------------------------------------------------------------------------------------
# Search: numpy's full sort on the same embeddings
# ----------------------------------------------------------------------------------------------------


def brute_force(queries, corpus, k, similarity, exclude=None):
    """(scores, indices) of each query's top k by a full stable sort: best first, ties by corpus index."""
    if similarity == "cosine":
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        corpus = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    scores = queries.astype(np.float64) @ corpus.astype(np.float64).T
    if exclude is not None:
        scores[np.arange(len(queries))[exclude >= 0], exclude[exclude >= 0]] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def embeddings(similarity: str, num_queries=37, num_passages=203, width=16):
    rng = np.random.default_rng(3)
    if similarity == "cosine":
        return rng.normal(size=(num_queries, width)), rng.normal(size=(num_passages, width))
    # Small whole numbers: dot products exact in float32, and many equal, with repeated passages too.
    queries, corpus = rng.integers(-2, 3, (num_queries, width)), rng.integers(-2, 3, (num_passages, width))
    corpus[10:20] = corpus[5]
    return queries.astype(np.float32), corpus.astype(np.float32)


MESHES = {"one device": ({"data": 1}, 1), "8 devices": ({"data": -1}, 8),
          "2 x 2 x 2": ({"data": 2, "fsdp": 2, "tensor": 2}, 8)}  # the corpus split over all three axes


@pytest.mark.mesh
@pytest.mark.parametrize("similarity", ["cosine", "dot"])
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("chunk_size", [7, 100_000])
def test_search_equals_a_full_sort(similarity, mesh, chunk_size):
    queries, corpus = embeddings(similarity)
    axes, devices = MESHES[mesh]
    mesh = sharding.make_mesh(axes, jax.devices()[:devices])
    scores, indices = retrieval.search(queries, corpus, 10, similarity=similarity, mesh=mesh, chunk_size=chunk_size,
                                       query_batch_size=16)
    expected_scores, expected = brute_force(queries, corpus, 10, similarity)
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    if similarity == "dot":
        assert (np.diff(expected_scores, axis=1) == 0).any()  # ties were there to break


def test_search_leaves_out_each_querys_own_passage():
    queries, corpus = embeddings("dot", num_queries=21, num_passages=30)
    exclude = np.arange(21) % 31 - 1  # -1 (nothing), then passages 0, 1, ...
    mesh = sharding.make_mesh({"data": -1})
    scores, indices = retrieval.search(queries, corpus, 30, similarity="dot", mesh=mesh, exclude=exclude, chunk_size=2)
    expected_scores, expected = brute_force(queries, corpus, 30, "dot", exclude)
    expected[np.isneginf(expected_scores)] = -1  # the one place left without a passage
    np.testing.assert_array_equal(indices, expected)
    assert ((indices == -1).sum(axis=1) == (exclude >= 0)).all()
    assert not (indices == exclude[:, None]).any(axis=1)[exclude >= 0].any()


def test_retrieve_is_the_search_as_a_run():
    """The first stage (evaluate_retrieval's and the reranking suite's): each query's top k as {corpus id:
    score}, in numpy's full-sort order (ties by corpus position, not by id), its own id left out when asked;
    "query" and "passage" texts each embedded as their kind."""
    queries, corpus = embeddings("dot", num_queries=9, num_passages=40)
    ids = [f"p{i}" for i in np.random.default_rng(7).permutation(40)]
    data = retrieval_data.RetrievalSet("ties", ids, [f"passage {i}" for i in range(40)], ids[:9],
                                       [f"query {i}" for i in range(9)], {})
    table = {"query": queries, "passage": corpus}
    embed = lambda texts, kind: table[kind][[int(t.split()[1]) for t in texts if t.startswith(kind)]]
    found_itself = []
    for ignore in (False, True):
        run = retrieval.retrieve(embed, data, 12, "dot", 5, ignore_identical_ids=ignore)
        scores, order = brute_force(queries, corpus, 12, "dot", np.arange(9) if ignore else None)
        assert list(run) == data.query_ids
        for q, query_id in enumerate(data.query_ids):
            assert list(run[query_id]) == [ids[i] for i in order[q]]
            assert list(run[query_id].values()) == pytest.approx(list(scores[q]))
        found_itself.append(sum(query_id in run[query_id] for query_id in data.query_ids))
        assert (np.diff(scores, axis=1) == 0).any()  # ties were there to keep in order
    assert found_itself[0] > 0 and found_itself[1] == 0


def test_ignore_identical_ids_keeps_a_query_from_finding_itself():
    """Quora's shape: the queries are passages too; judged relevant are their duplicates, not themselves."""
    words = "the river city north old museum bridge water school road tower".split()
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(words, 6)) for _ in range(20)]
    ids = [f"t{i}" for i in range(20)]
    data = retrieval_data.RetrievalSet("quora-like", ids, texts, ids[:10], texts[:10],
                                       {f"t{i}": {f"t{i + 10}": 1} for i in range(10)})
    run, scores = {}, retrieval_metrics.retrieval_scores

    def spy(qrels, ranking, k_values):  # the rankings the metrics get
        run.update(ranking)
        return scores(qrels, ranking, k_values)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retrieval.retrieval_metrics, "retrieval_scores", spy)
        kept = retrieval.evaluate_retrieval(hashed_embed, data, (1, 10))
        assert all(run[q][0] == q for q in ids[:10])  # itself, at rank 1
        ignored = retrieval.evaluate_retrieval(hashed_embed, data, (1, 10), ignore_identical_ids=True)
        assert all(q not in run[q] and len(run[q]) == 10 for q in ids[:10])
    assert kept["mrr@1"] == 0 and ignored["recall@10"] > kept["recall@10"] - 1e-9


# ----------------------------------------------------------------------------------------------------
# Readers: BEIR's files and save_to_disk datasets
# ----------------------------------------------------------------------------------------------------

CORPUS = [{"_id": "p1", "title": "Rivers", "text": "The river runs north."},
          {"_id": "p2", "title": "", "text": "An old bridge."},
          {"_id": "p3", "title": "Towers", "text": "  The tower is tall. "}]
QUERIES = [{"_id": "q1", "text": "where does the river run"}, {"_id": "q2", "text": "no judgements"},
           {"_id": "q3", "text": "tall towers"}]
QRELS = [("q1", "p1", 2), ("q1", "p2", 0), ("q3", "p3", 1), ("q3", "p1", 1)]


def write_beir(root: pathlib.Path, corpus=CORPUS, queries=QUERIES, qrels=QRELS, split="test") -> pathlib.Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries), encoding="utf-8")
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in qrels]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_hf(root: pathlib.Path, corpus=CORPUS, queries=QUERIES, qrels=QRELS, split="test") -> pathlib.Path:
    """The Hub's layout as a user saves it: corpus and queries DatasetDicts of one split, qrels by split."""

    def table(rows, columns):  # a missing value is None, as the Hub's Parquet files give it
        return datasets.Dataset.from_dict({c: [r.get(c) for r in rows] for c in columns})

    datasets.DatasetDict({"corpus": table(corpus, ("_id", "title", "text"))}).save_to_disk(str(root / "corpus"))
    datasets.DatasetDict({"queries": table(queries, ("_id", "text"))}).save_to_disk(str(root / "queries"))
    rows = [{"query-id": q, "corpus-id": d, "score": s} for q, d, s in qrels]
    qrels_table = table(rows, retrieval_data.QRELS_HEADER)
    datasets.DatasetDict({split: qrels_table}).save_to_disk(str(root / "qrels"))
    return root


def test_beir_and_datasets_directories_read_alike(tmp_path):
    beir = retrieval_data.read_retrieval(write_beir(tmp_path / "beir" / "demo"))
    hf = retrieval_data.read_retrieval(write_hf(tmp_path / "hf" / "demo"))
    assert beir == hf
    assert beir.name == "demo" and beir.corpus_ids == ["p1", "p2", "p3"]
    assert beir.passages == ["Rivers The river runs north.", "An old bridge.", "Towers   The tower is tall."]
    assert beir.query_ids == ["q1", "q3"] and beir.queries == ["where does the river run", "tall towers"]
    assert beir.qrels == {"q1": {"p1": 2, "p2": 0}, "q3": {"p3": 1, "p1": 1}}


BAD = {
    "empty corpus": (dict(corpus=[]), "the corpus is empty"),
    "missing text": (dict(corpus=[*CORPUS[:2], {"_id": "p3", "title": "x"}]), "missing field 'text'"),
    "missing query id": (dict(queries=[QUERIES[0], {"text": "q"}, QUERIES[2]]), "missing field '_id'"),
    "unknown query": (dict(qrels=[*QRELS, ("q9", "p1", 1)]), "query-id 'q9' is not in"),
    "unknown passage": (dict(qrels=[*QRELS, ("q1", "p9", 1)]), "corpus-id 'p9' is not in"),
    "no such split": (dict(split="dev"), "no qrels/test"),
}


# datasets' save_to_disk cannot write a dataset of no rows, so an empty corpus is BEIR's files' case alone.
@pytest.mark.parametrize("layout,case", [(layout, case) for case in BAD for layout in ("beir", "hf")
                                         if (layout, case) != ("hf", "empty corpus")])
def test_bad_data_is_one_line(tmp_path, layout, case):
    changes, message = BAD[case]
    root = (write_beir if layout == "beir" else write_hf)(tmp_path / "set", **changes)
    with pytest.raises(ValueError) as error:
        retrieval_data.read_retrieval(root, "test")
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_qrels_file_without_its_header_is_refused(tmp_path):
    root = write_beir(tmp_path / "set")
    (root / "qrels" / "test.tsv").write_text("q1\tp1\t1\n")
    with pytest.raises(ValueError, match="expected the header line query-id <tab> corpus-id <tab> score"):
        retrieval_data.read_retrieval(root)


# ----------------------------------------------------------------------------------------------------
# STS: scipy's correlations of the same cosines
# ----------------------------------------------------------------------------------------------------


def hashed_embed(texts, kind):
    """A fixed random embedding per word, summed: texts sharing words come out similar."""
    out = []
    for text in texts:
        vectors = [np.random.default_rng(zlib.crc32(w.encode())).normal(size=24) for w in text.lower().split()]
        out.append(np.sum(vectors, axis=0))
    return np.array(out, np.float32)


def test_sts_correlations_equal_scipy(tmp_path):
    rng = np.random.default_rng(0)
    words = "the river city north old museum bridge water school road tower".split()
    rows = []
    for _ in range(50):
        a = list(rng.choice(words, 5))
        shared = int(rng.integers(0, 6))
        b = a[:shared] + list(rng.choice(words, 3))
        rows.append({"text": " ".join(a), "text_pair": " ".join(b), "label": float(shared)})  # many ties
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = readers.read_jsonl(str(tmp_path / "dev.jsonl"), registry.get_task("stsb"))  # STS-B's reader
    out = retrieval.evaluate_sts(hashed_embed, examples, batch_size=7)
    first = hashed_embed([r["text"] for r in rows], "query")
    second = hashed_embed([r["text_pair"] for r in rows], "query")
    cosine = np.sum(first * second, 1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    gold = [r["label"] for r in rows]
    assert out["spearman"] == pytest.approx(scipy.stats.spearmanr(cosine, gold).statistic, abs=1e-6)
    assert out["pearson"] == pytest.approx(scipy.stats.pearsonr(cosine, gold).statistic, abs=1e-6)
    assert out["spearman"] > 0.3 and out["pairs"] == 50


# ----------------------------------------------------------------------------------------------------
# The program: python -m bertjax.evaluate --suite=retrieval
# ----------------------------------------------------------------------------------------------------


def demo_retrieval_set(num_passages=36):
    """Passages from the demo corpus's documents (a title on every other one), a query per passage made from
    its words, judged 2 for its passage and 1 for the next."""
    documents = [d for d in demo.demo_documents(200) if len(d) >= 2][:num_passages]
    corpus = [{"_id": f"doc{i}", "title": d[0][:40] if i % 2 else "", "text": " ".join(d[1:3])}
              for i, d in enumerate(documents)]
    queries = [{"_id": f"query{i}", "text": " ".join(d[1].split()[:8])} for i, d in enumerate(documents)]
    qrels = [(f"query{i}", f"doc{i}", 2) for i in range(num_passages)]
    qrels += [(f"query{i}", f"doc{i + 1}", 1) for i in range(0, num_passages - 1, 3)]
    return dict(corpus=corpus, queries=queries, qrels=qrels)


def mean_pooled(model, texts):
    """What LoadedBert.embed gives a model without an embedding record, from its encoder's outputs: the
    mean of the last layer over each text's tokens."""
    out = model.encode(list(texts))
    mask = out["input_mask"][..., None]
    return (out["sequence_output"] * mask).sum(1) / mask.sum(1)


def test_the_retrieval_table(pretrained, tmp_path, capsys):
    data = demo_retrieval_set()
    directories = [write_beir(tmp_path / "demo-beir", **data), write_hf(tmp_path / "demo-hf", **data)]
    out = suite_evaluation.retrieval_suite(pretrained["workdir"], [str(d) for d in directories], str(tmp_path / "eval"))
    printed = capsys.readouterr().out
    assert out["similarity"] == "cosine"  # a model without an embedding record
    heading, rule, beir, hf, average = out["table"]
    assert heading == "| Data set | nDCG@10 | Recall@100 | MRR@10 | MAP@100 | Index MiB | ms/query |"
    cells = lambda row: row.strip("| ").split(" | ")[1:]  # 4 metrics, the index's MiB, the milliseconds
    assert beir.startswith("| demo-beir |") and cells(hf)[:5] == cells(beir)[:5]  # one data set, two layouts
    assert cells(average)[:5] == cells(beir)[:5]
    costs = [out["scores"][name]["query_ms"] for name in ("demo-beir", "demo-hf")]
    assert cells(beir)[5] == f"{costs[0]:,.2f}" and cells(average)[5] == f"{np.mean(costs):,.2f}" and min(costs) > 0
    assert out["scores"]["demo-beir"]["index_bytes"] == 36 * 64 * 4  # the passages' float32 embeddings
    assert "\n".join(out["table"]) in printed
    assert (tmp_path / "eval" / "retrieval.md").read_text().splitlines() == out["table"]
    assert json.loads((tmp_path / "eval" / "retrieval.json").read_text())["scores"] == out["scores"]
    # The same numbers from numpy's cosines and pytrec_eval.
    model = inference.load(pretrained["workdir"])
    queries = mean_pooled(model, [q["text"] for q in data["queries"]])
    passages = mean_pooled(model, [(p["title"] + " " + p["text"]).strip() for p in data["corpus"]])
    cosine = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (
        passages / np.linalg.norm(passages, axis=1, keepdims=True)).T
    run = {q["_id"]: {p["_id"]: float(cosine[i, j]) for j, p in enumerate(data["corpus"])}
           for i, q in enumerate(data["queries"])}
    qrels = {}
    for q, d, s in data["qrels"]:
        qrels.setdefault(q, {})[d] = s
    reference = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map_cut.100"}).evaluate(run)
    scores = out["scores"]["demo-beir"]
    assert scores["ndcg@10"] == pytest.approx(np.mean([r["ndcg_cut_10"] for r in reference.values()]), abs=1e-6)
    assert scores["recall@100"] == pytest.approx(1.0) and scores["queries"] == 36 and scores["passages"] == 36
    assert scores["map@100"] == pytest.approx(np.mean([r["map_cut_100"] for r in reference.values()]), abs=1e-6)
    assert scores["ndcg@10"] > 0.2  # a random encoder's mean-pooled words still find their passage often


def test_a_bad_directory_is_one_line_and_exit_2(pretrained, tmp_path):
    data = demo_retrieval_set(6)
    bad = write_beir(tmp_path / "bad", **{**data, "qrels": data["qrels"] + [("query1", "doc99", 1)]})
    workdir = tmp_path / "eval"
    result = run_program("bertjax.evaluate", "--suite=retrieval", f"--init_from={pretrained['workdir']}",
                         f"--workdir={workdir}", f"--tasks={bad}")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "qrels/test.tsv:" in lines[0] and "corpus-id 'doc99' is not in" in lines[0], lines[0]
    assert not workdir.exists()
