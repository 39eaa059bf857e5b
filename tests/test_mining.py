"""Hard-negative mining: the same negatives as sentence-transformers' mine_hard_negatives for the same
embeddings and settings, the random sampling's guarantees, and python -m bertjax.mine's run."""

import json
import signal
import types

import numpy as np
import pytest

from bertjax.bench import mining_speed
from bertjax.runs import console, start
from bertjax.runs import mining as mining_run
from bertjax.tasks import mining, retrieval
from bertjax.tasks.kinds import contrastive, rerank
from bertjax.training import sharding

D = 16


class FixedEmbedder:
    """A stand-in for a SentenceTransformer whose embeddings are given: what mine_hard_negatives calls."""

    device = "cpu"

    def __init__(self, table: dict):
        self.table = table

    def _encode(self, texts, **_):
        return np.stack([self.table[t] for t in texts]).astype(np.float32)

    encode_query = encode_document = _encode

    def similarity(self, a, b):
        from sentence_transformers.util import cos_sim
        return cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from sentence_transformers.util import pairwise_cos_sim
        return pairwise_cos_sim(a, b)


@pytest.fixture(scope="module")
def data():
    """24 queries, two of them given twice (two positives each), one of them also a corpus text; a corpus of
    80 texts besides the positives. Each query is near its positive and near a few corpus texts."""
    rng = np.random.default_rng(0)
    corpus = [f"passage {i}" for i in range(80)]
    table = {t: rng.normal(size=D) for t in corpus}
    anchors, positives = [], []
    for q in range(24):
        query, positive = f"query {q}", f"answer {q}"
        base = rng.normal(size=D)
        table[query] = base
        table[positive] = base + rng.normal(scale=0.8, size=D)
        for i in rng.choice(80, 6, replace=False):  # hard candidates
            table[corpus[i]] = base + rng.normal(scale=1.0 + 0.2 * rng.random(), size=D)
        anchors.append(query)
        positives.append(positive)
    for q in (3, 7):  # a second positive
        anchors.append(f"query {q}")
        positives.append(f"answer {q} again")
        table[f"answer {q} again"] = table[f"query {q}"] + rng.normal(scale=0.9, size=D)
    corpus.append("query 5")  # a query's own text in the corpus is never its negative
    table = {t: (v / np.linalg.norm(v)).astype(np.float32) for t, v in table.items()}
    return dict(anchors=anchors, positives=positives, corpus=corpus, table=table)


def ours(data, **settings):
    """mine_negatives on the data's embeddings, laid out as sentence-transformers lays them out: the
    queries once each, the corpus with the positives after it, once each. (queries, corpus, positive
    rows, negative rows)."""
    corpus = list(dict.fromkeys(data["corpus"] + data["positives"]))
    row = {t: i for i, t in enumerate(corpus)}
    queries = list(dict.fromkeys(data["anchors"]))
    positive_ids = {q: [] for q in queries}
    for a, p in zip(data["anchors"], data["positives"]):
        positive_ids[a].append(row[p])
    table = data["table"]
    negatives = mining.mine_negatives(
        np.stack([table[q] for q in queries]), np.stack([table[t] for t in corpus]),
        [positive_ids[q] for q in queries], exclude=[row.get(q, -1) for q in queries], chunk_size=7,
        mesh=sharding.make_mesh({"data": -1}), **settings)
    return queries, corpus, [positive_ids[q] for q in queries], negatives


def theirs(data, output_format, **settings):
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    dataset = Dataset.from_dict({"anchor": data["anchors"], "positive": data["positives"]})
    return mine_hard_negatives(dataset, FixedEmbedder(data["table"]), corpus=data["corpus"],
                               output_format=output_format, verbose=False, **settings).to_list()


def expected_rows(data, output_format, num_negatives, **settings):
    """Our negatives in the rows sentence-transformers' output_format makes of them."""
    queries, corpus, positive_ids, negatives = ours(data, num_negatives=num_negatives, **settings)
    rows = []
    for query, positives, found in zip(queries, positive_ids, negatives):
        for p in positives:
            if output_format == "triplet":
                rows += [{"anchor": query, "positive": corpus[p], "negative": corpus[n]} for n in found]
            elif len(found) == num_negatives:  # n-tuple: a row only where all were found
                rows.append({"anchor": query, "positive": corpus[p],
                             **{f"negative_{i}": corpus[n] for i, n in enumerate(found, 1)}})
    return rows


CASES = [
    ("triplet", dict(num_negatives=1)),
    ("triplet", dict(num_negatives=3, range_min=2, range_max=12)),
    ("n-tuple", dict(num_negatives=3, range_min=1, range_max=8)),
    ("triplet", dict(num_negatives=2, absolute_margin=0.05)),
    ("n-tuple", dict(num_negatives=4, relative_margin=0.05)),  # NV-Retriever's TopK-PercPos (95%)
    ("triplet", dict(num_negatives=3, max_score=0.5, range_max=20)),
    ("n-tuple", dict(num_negatives=2, min_score=0.3, absolute_margin=0.0, range_min=1)),
]


@pytest.mark.parametrize("output_format,settings", CASES, ids=[str(s) for _, s in CASES])
def test_the_negatives_of_sentence_transformers(data, output_format, settings):
    want = theirs(data, output_format, sampling_strategy="top", **settings)
    got = expected_rows(data, output_format, **settings)
    assert want, "a case that mines nothing compares nothing"
    assert got == want


def test_filters_leave_some_queries_short(data):
    """A tight filter leaves queries with fewer negatives, which n-tuple drops and both count alike."""
    settings = dict(num_negatives=5, relative_margin=0.3, range_max=12)
    _, _, _, negatives = ours(data, **settings)
    assert any(len(n) < 5 for n in negatives) and any(len(n) == 5 for n in negatives)
    assert expected_rows(data, "n-tuple", **settings) == theirs(data, "n-tuple", **settings)


def test_labeled_lists_of_sentence_transformers(data):
    """The program's labeled-list rows from our negatives are sentence-transformers' labeled-list rows, but
    for one row a query: theirs has one per positive (queries 3 and 7 have two), each with the same negatives,
    and a query without negatives is left out of both."""
    settings = dict(num_negatives=3, min_score=0.6, range_max=10)
    queries, corpus, positive_ids, negatives = ours(data, **settings)
    assert any(not n for n in negatives) and any(0 < len(n) < 3 for n in negatives)  # none, and short lists
    pairs = [contrastive.Pair(i, a, p) for i, (a, p) in enumerate(zip(data["anchors"], data["positives"]))]
    inputs = mining_run.Inputs([{"query": p.query, "positive": p.positive} for p in pairs], pairs, corpus, queries,
                               positive_ids)
    got = mining_run.labeled_lists(pairs, mining_run.pair_rows(inputs, negatives))
    want = {}
    for row in theirs(data, "labeled-list", sampling_strategy="top", **settings):
        assert row["labels"] == [1] + [0] * (len(row["positive"]) - 1)
        positives, found = want.setdefault(row["anchor"], ([], row["positive"][1:]))
        assert row["positive"][1:] == found
        positives.append(row["positive"][0])
    assert [len(positives) for positives, _ in want.values()].count(2) == 2
    assert got == [{"query": query, "passages": positives + found, "labels": [1] * len(positives) + [0] * len(found)}
                   for query, (positives, found) in want.items()]
    with pytest.raises(ValueError, match="no query kept a negative, so the labeled lists would be empty: loosen"):
        mining_run.labeled_lists(pairs, mining_run.pair_rows(inputs, [[] for _ in negatives]))  # never an empty file


def test_random_sampling_draws_distinct_candidates_inside_the_filters(data):
    settings = dict(range_min=1, range_max=10, relative_margin=0.05)
    _, _, positive_ids, every = ours(data, num_negatives=9, **settings)  # the whole candidate window, in order
    seen = set()
    for seed in (0, 1):
        _, _, _, drawn = ours(data, num_negatives=3, sampling="random", seed=seed, **settings)
        for candidates, positives, found in zip(every, positive_ids, drawn):
            assert len(found) == min(3, len(candidates)) and len(set(found)) == len(found)
            assert set(found) <= set(candidates) and not set(found) & set(positives)
            assert found == sorted(found, key=candidates.index)  # best first
            seen |= {(q, n) for q, n in enumerate(found)}
        assert drawn != ours(data, num_negatives=3, sampling="random", seed=seed + 2, **settings)[3]
    assert len(seen) > 3 * len(every)  # not always the same three


@pytest.mark.parametrize("settings,message", [
    (dict(num_negatives=0), "num_negatives=0"),
    (dict(range_min=5, range_max=5), "range_max=5 must be above"),
    (dict(num_negatives=4, range_min=2, range_max=5), "does not fit"),
    (dict(sampling="best"), "sampling='best'"),
])
def test_bad_settings_are_one_line(data, settings, message):
    with pytest.raises(ValueError, match=message):
        ours(data, **settings)


def test_search_by_corpus_blocks_is_one_search():
    """Blocks of 4 rows, merged: the same scores and rows as one search, ties included (each passage is
    there twice, the copy a block later)."""
    rng = np.random.default_rng(1)
    queries, half = rng.normal(size=(6, D)).astype(np.float32), rng.normal(size=(9, D)).astype(np.float32)
    corpus = np.concatenate([half, half])
    want = retrieval.search(queries, corpus, 7, chunk_size=3)
    got = mining.search(queries, corpus, 7, chunk_size=3, block_size=4)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert (got[1][:, 1] == got[1][:, 0] + 9).all()  # the tie: the earlier copy first


def test_queries_searched_in_chunks_and_kept_in_a_store(data):
    settings = dict(num_negatives=3, range_min=1, relative_margin=0.05)
    whole = ours(data, **settings)[3]
    store, calls = {}, []
    chunked = ours(data, query_chunk_size=5, block_size=10, searched=store, on_chunk=lambda *done: calls.append(done),
                   **settings)[3]
    assert chunked == whole and sorted(store) == [0, 5, 10, 15, 20]
    assert calls == [(5, 24), (10, 24), (15, 24), (20, 24), (24, 24)]
    assert [len(scores) for scores, _ in store.values()] == [5, 5, 5, 5, 4]

    def searched_again(*_):
        raise AssertionError("a chunk in the store was searched again")
    assert ours(data, query_chunk_size=5, searched=store, on_chunk=searched_again, **settings)[3] == whole


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


# The program's settings in these tests: parts of 8 texts and chunks of 4 queries, so that an interrupted
# run keeps several parts of each stage.
PROGRAM = dict(num_negatives=2, batch_size=8, shard_size=8, query_chunk_size=4)


@pytest.fixture(scope="module")
def program_files(pretrained, tmp_path_factory):
    """A pairs file of 10 pairs (the first with a given negative), a BEIR corpus of 20 more texts, and the
    output of one uninterrupted run over them: {"pairs", "corpus", "texts", "out", "report"}."""
    root = tmp_path_factory.mktemp("program")
    texts = [json.loads(line)["text"] for line in open(pretrained["files"]["train"], encoding="utf-8")][:40]
    pairs = [{"query": texts[i], "positive": texts[i + 1], "id": i} for i in range(0, 20, 2)]
    pairs[0]["negatives"] = ["a given negative"]
    write_jsonl(root / "pairs.jsonl", pairs)
    write_jsonl(root / "corpus.jsonl", [{"_id": str(i), "title": "", "text": t} for i, t in enumerate(texts[20:])])
    report = mining_run.mine(pretrained["workdir"], str(root / "pairs.jsonl"), str(root / "mined.jsonl"),
                             corpus_path=str(root / "corpus.jsonl"), **PROGRAM)
    return dict(pairs=pairs, corpus=root / "corpus.jsonl", texts=texts, out=root / "mined.jsonl", report=report)


def test_the_program_adds_negatives_to_a_pairs_file(program_files):
    out, pairs, texts = program_files["out"], program_files["pairs"], program_files["texts"]
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert program_files["report"] == {"pairs": 10, "queries": 10, "corpus": 30, "negatives": 20, "short": 0}
    assert [w["id"] for w in written] == list(range(0, 20, 2))
    assert written[0]["negatives"][0] == "a given negative" and len(written[0]["negatives"]) == 3
    positives = {p["positive"] for p in pairs}
    for w in written:
        mined = w["negatives"][-2:]
        assert len(set(mined)) == 2 and w["positive"] not in mined and w["query"] not in mined
        assert set(mined) <= set(texts[20:]) | positives
    assert sorted(p.name for p in out.parent.iterdir()) == ["corpus.jsonl", "mined.jsonl", "pairs.jsonl"]


def test_the_labeled_list_is_the_pairs_output_rearranged(pretrained, program_files, tmp_path):
    """--output_format=labeled-list: each query's line of the pairs output as a reranker's row (its positive
    labelled 1, then its negatives 0), which the rerank kind reads as it is."""
    out = tmp_path / "lists.jsonl"
    report = mining_run.mine(pretrained["workdir"], str(program_files["out"].with_name("pairs.jsonl")), str(out),
                             corpus_path=str(program_files["corpus"]), output_format="labeled-list", **PROGRAM)
    assert report == program_files["report"]
    pairs = [json.loads(line) for line in program_files["out"].read_text(encoding="utf-8").splitlines()]
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert written == [{"query": p["query"], "passages": [p["positive"], *p["negatives"]],
                        "labels": [1] + [0] * len(p["negatives"])} for p in pairs]
    examples = rerank.read(types.SimpleNamespace(name="mined", rerank_loss="listnet"), "train", str(out))
    assert [(e.query, e.passages, e.targets) for e in examples] == [
        (w["query"], w["passages"], w["labels"]) for w in written]
    with pytest.raises(ValueError, match="--output_format=triplets: choose one of pairs, labeled-list"):
        mining_run.mine("no-model", str(program_files["out"].with_name("pairs.jsonl")), str(tmp_path / "no.jsonl"),
                        output_format="triplets")
    assert not (tmp_path / "no.jsonl").exists()


def test_an_interrupted_run_continues_to_the_same_output(pretrained, program_files, tmp_path, capsys):
    """A crash after two corpus parts, then SIGTERM after the first searched chunk, then a run to the end:
    each run takes up what the one before kept, and the output is the uninterrupted run's, byte for byte."""
    out, partial = tmp_path / "mined.jsonl", tmp_path / "mined.jsonl.partial"
    parts = []

    def run(stop_at=None, **changed):
        def on_part(stage, done, total):
            parts.append((stage, done))
            if (stage, done) == stop_at == ("corpus", 16):
                raise RuntimeError("a crash")
            if (stage, done) == stop_at:
                signal.raise_signal(signal.SIGTERM)
        return mining_run.mine(pretrained["workdir"], str(program_files["out"].with_name("pairs.jsonl")), str(out),
                               corpus_path=str(program_files["corpus"]), on_part=on_part, **{**PROGRAM, **changed})

    with pytest.raises(RuntimeError, match="a crash"):
        run(stop_at=("corpus", 16))
    assert parts == [("query", 8), ("query", 10), ("corpus", 8), ("corpus", 16)] and not out.exists()
    assert sorted(p.name for p in partial.iterdir()) == ["corpus-000000.npz", "corpus-000001.npz", "manifest.json",
                                                         "query-000000.npz", "query-000001.npz"]
    with pytest.raises(ValueError, match="done with another batch_size, shard_size"):
        run(batch_size=16)

    parts.clear()
    with pytest.raises(start.Stopped) as stopped:
        run(stop_at=("search", 4))
    assert stopped.value.exit_code == 0 and not out.exists()
    assert parts == [("corpus", 24), ("corpus", 30), ("search", 4)]  # the kept parts not made again
    said = capsys.readouterr().out
    assert "mining: corpus texts embedded 16/30 kept from the interrupted run" in said
    assert f"mining: SIGTERM: stopped; the finished work is kept in {partial}" in said

    parts.clear()
    assert run() == program_files["report"]
    assert parts == [("search", 8), ("search", 10)]
    assert out.read_bytes() == program_files["out"].read_bytes()
    assert not partial.exists()


def test_progress_is_a_line_a_tenth(capsys):
    progress = mining_run.Progress("texts embedded", 1000, done=100)
    for done in range(101, 1001):
        progress.advance_to(done)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mining: texts embedded 100/1,000 kept from the interrupted run"
    assert [line.split(" (")[0] for line in lines[1:]] == [f"mining: texts embedded {n:,}/1,000"
                                                           for n in range(200, 1001, 100)]


def test_bad_pairs_are_one_line_and_write_nothing(tmp_path, capsys):
    write_jsonl(tmp_path / "pairs.jsonl", [{"query": "a", "positive": "b"}, {"query": "c"}])
    out = tmp_path / "mined.jsonl"
    with pytest.raises(SystemExit) as stop:
        console.finish(mining_run.mine, "no-model", str(tmp_path / "pairs.jsonl"), str(out))
    assert stop.value.code == 2
    assert "pairs.jsonl:2: missing field 'positive'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no such file"):
        mining_run.mine("no-model", str(tmp_path / "missing.jsonl"), str(out))
    write_jsonl(tmp_path / "pairs.jsonl", [{"query": "a", "positive": "b"}])
    write_jsonl(tmp_path / "corpus.jsonl", [{"title": "no text"}])
    with pytest.raises(ValueError, match="corpus.jsonl:1: expected a non-empty string field 'text'"):
        mining_run.mine("no-model", str(tmp_path / "pairs.jsonl"), str(out), corpus_path=str(tmp_path / "corpus.jsonl"))
    with pytest.raises(ValueError, match="the corpus holds 1 text"):  # the one positive alone
        mining_run.mine("no-model", str(tmp_path / "pairs.jsonl"), str(out))
    assert not out.exists()


def test_the_mining_benchmark_at_a_tiny_size(capsys):
    queries, corpus, positives = mining_speed.synthetic(300, 20, 32)
    np.testing.assert_allclose(np.linalg.norm(np.concatenate([queries, corpus]), axis=1), 1, rtol=1e-5)
    assert 0.5 < np.mean(np.sum(queries * corpus[positives], axis=1)) < 0.9  # near their positives, not on them
    [row] = mining_speed.benchmark([300], num_queries=20, dim=32)
    assert row["passages"] == 300 and row["negatives"] == 20 * mining_speed.SETTINGS["num_negatives"]
    assert row["queries_per_second"] == pytest.approx(20 / row["seconds"])
    assert row["corpus_bytes"] == 300 * 32 * 4 and row["peak_rss"] >= row["rss_before"] > row["corpus_bytes"]
    assert "300 passages:" in capsys.readouterr().out
