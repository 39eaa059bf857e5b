"""MTEB: bertjax/interop/mteb.py's Encoder run by mteb.evaluate itself on a local retrieval task (mteb's own
retrieval task class, its data read from a BEIR directory written here) scores what bertjax's retrieval
table and mteb's own wrapper of the sentence-transformers export score; its prompts are chosen as mteb
chooses them; `python -m bertjax.evaluate --suite=mteb` in one line where mteb or a task is missing. No
network: a connection attempt fails the test."""

import json
import pathlib
import socket
import sys
import types

import datasets
import mteb
import numpy as np
import pytest
import torch
from conftest import run_command
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.models.abs_encoder import get_prompt_name
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from test_retrieval import write_beir
from test_rerank_eval import short_retrieval_set

import bertjax
from bertjax import embeddings
from bertjax.interop import mteb as bertjax_mteb
from bertjax.interop import sentence_transformers as st_directories
from bertjax.runs import exporting, suite_evaluation
from bertjax.training.checkpoint_meta import EmbeddingRecord

# "document", sentence-transformers 6's name for encode_document's prompt (a model of its own with a "passage"
# prompt gets an empty "document" one beside it, which its encode_document takes: the export writes both).
PROMPTS = {"query": "query: ", "document": "passage: "}


class LocalRetrieval(AbsTaskRetrieval):
    """A retrieval task of mteb's own class, its test split read from a BEIR directory into memory."""

    metadata = mteb.TaskMetadata(
        name="LocalRetrieval", type="Retrieval", main_score="ndcg_at_10", description="A BEIR directory of the test.",
        reference="https://github.com/embeddings-benchmark/mteb", dataset={"path": "NA", "revision": "NA"},
        category="t2t", modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"],
        date=("2024-01-01", "2024-01-01"), domains=[], task_subtypes=[], license="cc-by-4.0",
        annotations_creators="derived", dialect=[], sample_creation="found", bibtex_citation="")

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def load_data(self, num_proc=None, **kwargs):
        read = lambda name: [json.loads(line) for line in (self.directory / name).read_text().splitlines()]
        corpus = [{"id": r["_id"], "title": r.get("title", ""), "text": r["text"]} for r in read("corpus.jsonl")]
        queries = [{"id": r["_id"], "text": r["text"]} for r in read("queries.jsonl")]
        qrels = {}
        for line in (self.directory / "qrels" / "test.tsv").read_text().splitlines()[1:]:
            query_id, corpus_id, grade = line.split("\t")
            qrels.setdefault(query_id, {})[corpus_id] = int(grade)
        split = RetrievalSplitData(corpus=datasets.Dataset.from_list(corpus),
                                   queries=datasets.Dataset.from_list(queries), relevant_docs=qrels, top_ranked=None)
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


@pytest.fixture(scope="module")
def prompted_embedder(bpe_directories, tmp_path_factory):
    """conftest's byte-level BPE RoBERTa, mean pooled and normalised, with query and passage prompts and dot
    product as its similarity, read by bertjax and exported again as a sentence-transformers directory."""
    from test_embeddings import save_workdir

    root = tmp_path_factory.mktemp("mteb")
    SentenceTransformer(modules=[Transformer(str(bpe_directories["roberta"]), max_seq_length=32),
                                 Pooling(32, pooling_mode="mean"), Normalize()], prompts=PROMPTS,
                        similarity_fn_name="dot", device="cpu").save(str(root / "st"))
    bert = bertjax.load(root / "st")
    workdir = save_workdir(root / "run", bert, bert.vocab_path, embedding=bert.embedding, kind="bpe")
    return exporting.export(str(workdir), str(root / "exported"), "sentence-transformers")


@pytest.fixture
def offline(monkeypatch):
    """No connection leaves the test (and the Hub's client is told it is offline)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(self, address, *args):
        raise AssertionError(f"a connection to {address} was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_mteb_on_the_bertjax_encoder_scores_what_bertjax_and_sentence_transformers_score(prompted_embedder, tmp_path,
                                                                                        offline):
    directory = write_beir(tmp_path / "tiny", **short_retrieval_set(16))
    out = suite_evaluation.mteb_suite(prompted_embedder, [LocalRetrieval(directory)], str(tmp_path / "mteb"))
    ours = suite_evaluation.retrieval_suite(prompted_embedder, [str(directory)], str(tmp_path / "retrieval"))
    reference = mteb.evaluate(SentenceTransformer(prompted_embedder, device="cpu"), [LocalRetrieval(directory)],
                              cache=None, show_progress_bar=False, encode_kwargs={"batch_size": 8})
    reference_scores = reference.task_results[0].scores["test"][0]
    found = out["tasks"]["LocalRetrieval"]
    assert found["main_score"] == "ndcg_at_10" and found["type"] == "Retrieval"
    # mteb rounds its figures to 5 decimals; bertjax's are trec_eval's unrounded: equal to 5e-6.
    assert found["value"] == pytest.approx(ours["scores"]["tiny"]["ndcg@10"], abs=1e-5)
    assert found["value"] == pytest.approx(reference_scores["ndcg_at_10"], abs=1e-5)
    assert found["scores"]["test"][0]["mrr_at_10"] == pytest.approx(reference_scores["mrr_at_10"], abs=1e-5)
    assert 0.1 < found["value"] < 1.0 and ours["similarity"] == "dot"
    assert out["table"][:3] == ["| Task | Type | Main score | Value |", "|---|---|---|---|",
                                f"| LocalRetrieval | Retrieval | ndcg_at_10 | {100 * found['value']:.2f} |"]
    assert (tmp_path / "mteb" / "mteb.md").read_text().splitlines() == out["table"]
    saved = json.loads((tmp_path / "mteb" / "mteb.json").read_text())["tasks"]["LocalRetrieval"]
    assert saved["value"] == found["value"] and saved["scores"]["test"][0]["ndcg_at_100"] == found["scores"]["test"][0][
        "ndcg_at_100"]
    results = list((tmp_path / "mteb" / "mteb_results").rglob("LocalRetrieval.json"))
    assert len(results) == 1 and "bertjax__exported" in str(results[0])  # mteb's own result file, named after the model


def test_the_encoder_embeds_and_scores_as_mteb_wraps_sentence_transformers(prompted_embedder, offline):
    encoder = bertjax_mteb.Encoder(bertjax.load(prompted_embedder))
    reference = mteb.SentenceTransformerEncoderWrapper(SentenceTransformer(prompted_embedder, device="cpu"))
    meta = encoder.mteb_model_meta
    assert (meta.name, meta.embed_dim, meta.max_tokens, meta.similarity_fn_name.value) == \
        ("bertjax/" + pathlib.Path(prompted_embedder).name, 32, 32, "dot")  # named after its directory
    assert meta.n_parameters == sum(p.numel() for p in reference.model.parameters())
    texts = ["the old bridge by the river", "Music", "a long road north of the city and its famous tower"]
    batches = torch.utils.data.DataLoader(datasets.Dataset.from_dict({"text": texts}), batch_size=2)  # as mteb's
    for prompt_type in (mteb.types.PromptType.query, mteb.types.PromptType.document, None):
        how = dict(task_metadata=LocalRetrieval.metadata, hf_split="test", hf_subset="default", prompt_type=prompt_type)
        ours, theirs = encoder.encode(batches, **how), reference.encode(batches, **how)
        np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=str(prompt_type))
        np.testing.assert_allclose(np.asarray(encoder.similarity(ours, ours)),
                                   np.asarray(reference.similarity(theirs, theirs)), atol=1e-5)
        np.testing.assert_allclose(np.asarray(encoder.similarity_pairwise(ours, ours[::-1].copy())),
                                   np.asarray(reference.similarity_pairwise(theirs, theirs[::-1].copy())), atol=1e-5)


def test_prompts_are_chosen_as_mteb_chooses_them():
    prompts = {"LocalRetrieval-query": "a", "LocalRetrieval": "b", "Retrieval-document": "c", "STS": "d",
               "query": "e", "passage": "f", "corpus": "g"}
    tasks = [types.SimpleNamespace(name=name, type=kind) for name, kind in
             (("LocalRetrieval", "Retrieval"), ("SciFact", "Retrieval"), ("STSBenchmark", "STS"), ("Banking", "Other"))]
    for task in tasks:
        for prompt_type in (mteb.types.PromptType.query, mteb.types.PromptType.document, None):
            ours = bertjax_mteb.prompt_name(prompts, task.name, task.type, getattr(prompt_type, "value", None))
            assert ours == get_prompt_name(prompts, task, prompt_type), (task, prompt_type)
    assert bertjax_mteb.prompt_name({}, "SciFact", "Retrieval", "query") is None
    # Where mteb picks none, a document's is embed(task="document")'s: sentence-transformers' encode_document
    # takes the first of document, passage, corpus, and an empty one hides no later one that is not.
    passage = lambda prompts: embeddings.resolve(EmbeddingRecord(prompts=prompts), 64, prompt_name=None, prompt=None,
                                                 task="document").prompt
    assert passage(prompts) == "f" and passage({"document": "", "passage": "passage: "}) == "passage: "
    assert st_directories.document_prompt_name({"corpus": "", "query": "q: "}) == "corpus"  # no prompt, over a default
    assert passage({"query": "q: "}) == "" and st_directories.document_prompt_name({"query": "q: "}) is None


def test_without_mteb_or_with_an_unknown_task_it_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"--tasks: the MTEB task 'SciFactt' not found. Did you mean: 'SciFact'\?"):
        suite_evaluation.mteb_suite(str(tmp_path / "no-model"), ["SciFactt"], str(tmp_path / "eval"))
    monkeypatch.setitem(sys.modules, "mteb", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"^MTEB evaluation needs the mteb package: pip install bertjax\[mteb\]$"):
        suite_evaluation.mteb_suite(str(tmp_path / "no-model"), ["SciFact"], str(tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_importing_bertjax_imports_no_mteb():
    code = ("import sys, bertjax, bertjax.evaluate, bertjax.interop.mteb\n"
            "assert 'mteb' not in sys.modules, 'mteb was imported'\n")
    result = run_command([sys.executable, "-c", code])  # in a fork of the program server, which imports bertjax
    assert result.returncode == 0, result.stderr[-2000:]
