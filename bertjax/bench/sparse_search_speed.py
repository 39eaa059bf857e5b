"""The sparse search benchmark: an inverted index built from synthetic SPLADE-like vectors, then searched
exactly (bertjax/tasks/sparse_search.py).

    python -m bertjax.benchmark --sparse_search=100000,1000000 --sparse_queries=1000

The vectors: each document has about 120 non-zero terms and each query about 30, over BERT's vocabulary of
30,522, with weights uniform in [0.05, 2.5] (SPLADE's are positive and mostly below 3). Terms are drawn by
Zipf's law (probability 1 / rank, the ranks shuffled over the term ids), so common terms have long
postings: the commonest are in nearly every document. A trained SPLADE's FLOPS regulariser shortens those
lists, so this is the harder case. The documents reach build_index as dense [B, V] chunks, as a model gives
them; making them is not timed.

Printed: the build's seconds, the index's size, the search's seconds (k = 10) and queries/s, the postings
a query scores, and resident memory before building, after it and at its peak (the whole process's: run it
in a fresh process, as in_fresh_processes and `python -m bertjax.benchmark --sparse_search=N,...` do).
"""

import json
import resource
import subprocess
import sys
import time

import numpy as np

from bertjax.bench.timing import load_average, mib, resident_bytes
from bertjax.tasks import sparse_search

DOCUMENTS = 1_000_000
QUERIES = 1_000
VOCAB_SIZE = 30_522  # BERT's uncased WordPiece vocabulary, which SPLADE's models keep
DOCUMENT_TERMS = 120
QUERY_TERMS = 30
K = 10
CHUNK_SIZE = 1_024  # documents a chunk: [B, V] float32 is 119 MiB at this vocabulary


def zipf_probabilities(vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """[V] each term's chance in one draw: 1 / rank, normalised (Zipf's law), the ranks shuffled over ids."""
    p = 1.0 / np.arange(1, vocab_size + 1)
    return rng.permutation(p / p.sum())


def draws_for(probabilities: np.ndarray, distinct: int) -> int:
    """The draws (with replacement) that give `distinct` different terms on average: the least m with
    sum over t of 1 - (1 - p_t)^m at least `distinct`."""
    expected = lambda m: float(np.sum(-np.expm1(m * np.log1p(-probabilities))))
    low, high = distinct, distinct
    while expected(high) < distinct:
        low, high = high, 2 * high
    while low < high:  # the least m in [low, high] with expected(m) >= distinct
        middle = (low + high) // 2
        low, high = (middle + 1, high) if expected(middle) < distinct else (low, middle)
    return low


def synthetic(count: int, probabilities: np.ndarray, draws: int, rng: np.random.Generator,
              out: np.ndarray | None = None) -> np.ndarray:
    """[count, V] float32 weights: `draws` terms drawn per row by probabilities (a term drawn twice is set
    once), each weight uniform in [0.05, 2.5], every other weight 0. Written into out (all zeros) if given."""
    terms = rng.choice(len(probabilities), size=(count, draws), p=probabilities)  # [count, draws]
    out = np.zeros((count, len(probabilities)), np.float32) if out is None else out[:count]
    out[np.arange(count)[:, None], terms] = rng.uniform(0.05, 2.5, (count, draws)).astype(np.float32)
    return out


def synthetic_chunks(documents: int, chunk_size: int, probabilities: np.ndarray, draws: int,
                     rng: np.random.Generator, making: list):
    """synthetic's documents as chunks [B, V] of chunk_size, each chunk's making seconds appended to making.
    One buffer serves every chunk, zeroed again where the last one set it: a fresh array a chunk is slow to
    make (its pages faulted in anew). build_index keeps no reference to a chunk, so reusing one is safe there."""
    buffer = np.zeros((min(chunk_size, documents), len(probabilities)), np.float32)
    for first in range(0, documents, chunk_size):
        began = time.perf_counter()
        buffer[buffer != 0] = 0  # only the last chunk's non-zeros are set
        chunk = synthetic(min(chunk_size, documents - first), probabilities, draws, rng, buffer)
        making.append(time.perf_counter() - began)
        yield chunk


def _check(documents, queries, vocab_size, document_terms, query_terms, k, chunk_size) -> None:
    if min(documents, queries, k, chunk_size, document_terms, query_terms) < 1:
        raise ValueError(f"sparse search benchmark: {documents} documents, {queries} queries, k={k}, chunks of "
                         f"{chunk_size}, {document_terms} and {query_terms} terms: each must be at least 1")
    if 2 * max(document_terms, query_terms) > vocab_size:
        raise ValueError(f"{max(document_terms, query_terms)} terms a text over a vocabulary of {vocab_size}: give "
                         f"at most half the vocabulary")


def benchmark(documents: int = DOCUMENTS, queries: int = QUERIES, *, vocab_size: int = VOCAB_SIZE,
              document_terms: int = DOCUMENT_TERMS, query_terms: int = QUERY_TERMS, k: int = K,
              chunk_size: int = CHUNK_SIZE, seed: int = 0) -> dict:
    """One index built and searched (module docstring); its figures printed and returned (seconds, bytes)."""
    _check(documents, queries, vocab_size, document_terms, query_terms, k, chunk_size)
    rng = np.random.default_rng(seed)
    probabilities = zipf_probabilities(vocab_size, rng)
    document_draws, query_draws = draws_for(probabilities, document_terms), draws_for(probabilities, query_terms)
    print(f"sparse search: {documents:,} documents of ~{document_terms} terms ({document_draws} Zipf draws), "
          f"{queries:,} queries of ~{query_terms} ({query_draws} draws), vocabulary {vocab_size:,}, k={k}; load "
          f"{load_average()}", flush=True)
    making = []  # seconds spent making each chunk: not the build's
    rss_before = resident_bytes()
    began = time.perf_counter()
    index = sparse_search.build_index(synthetic_chunks(documents, chunk_size, probabilities, document_draws, rng,
                                                       making), model="synthetic-zipf")
    build_seconds = time.perf_counter() - began - sum(making)
    rss_built = resident_bytes()
    query_weights = synthetic(queries, probabilities, query_draws, rng)  # [Q, V]
    began = time.perf_counter()
    sparse_search.search(index, query_weights, k)
    search_seconds = time.perf_counter() - began
    query_terms_found = np.nonzero(query_weights)[1]
    postings = int((index.indptr[query_terms_found + 1] - index.indptr[query_terms_found]).sum())
    result = dict(documents=documents, queries=queries, vocab_size=vocab_size, k=k,
                  document_terms=len(index.doc_ids) / documents, query_terms=len(query_terms_found) / queries,
                  build_seconds=build_seconds, making_seconds=sum(making), index_bytes=index.nbytes,
                  search_seconds=search_seconds, queries_per_second=queries / search_seconds,
                  postings_per_query=postings / queries, rss_before=rss_before, rss_built=rss_built,
                  peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux
    _report(result)
    return result


def _report(r: dict) -> None:
    print(f"    terms a text: {r['document_terms']:.1f} per document, {r['query_terms']:.1f} per query", flush=True)
    print(f"    build: {r['build_seconds']:,.1f} s ({r['making_seconds']:,.1f} s more making the chunks, not "
          f"counted); index {mib(r['index_bytes'])}", flush=True)
    print(f"    search: {r['search_seconds']:,.1f} s, {r['queries_per_second']:,.1f} queries/s, "
          f"{r['postings_per_query']:,.0f} postings a query", flush=True)
    print(f"    resident memory: {mib(r['rss_before'])} before building, {mib(r['rss_built'])} built, peak "
          f"{mib(r['peak_rss'])}", flush=True)


def in_fresh_processes(sizes, queries: int = QUERIES) -> list[dict]:
    """benchmark at each corpus size of sizes, each in a fresh Python process (its resident memory its own),
    its lines printed when it ends. A size whose process fails is {"documents", "failed": how}."""
    if not sizes:
        raise ValueError("sparse search benchmark: give at least one corpus size")
    _check(min(sizes), queries, VOCAB_SIZE, DOCUMENT_TERMS, QUERY_TERMS, K, CHUNK_SIZE)
    code = ("import json, sys; from bertjax.bench import sparse_search_speed as b; "
            "print('RESULT', json.dumps(b.benchmark(**json.loads(sys.argv[1]))))")
    rows = []
    for documents in sizes:
        args = dict(documents=int(documents), queries=int(queries))
        done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True)
        lines = done.stdout.splitlines()
        print("\n".join(line for line in lines if not line.startswith("RESULT ")), flush=True)
        results = [line for line in lines if line.startswith("RESULT ")]
        if results:
            rows.append(json.loads(results[-1][len("RESULT "):]))
        else:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            rows.append(dict(args, failed=f"exit status {done.returncode}: {last[-160:]}"))
            print(f"    {int(documents):,} documents: {rows[-1]['failed']}", flush=True)
    return rows
