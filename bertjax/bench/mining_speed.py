"""The mining benchmark: hard negatives mined from synthetic embeddings at several corpus sizes; what
`python -m bertjax.benchmark --mining=100000,1000000` runs.

Timed: tasks/mining.mine_negatives as python -m bertjax.mine calls it (its query chunks over retrieval's
exact chunked search, the corpus split over every local device; then the selection, here 5 negatives
inside relative_margin=0.05, NV-Retriever's setting), on random unit-length float32 embeddings: the part
of mining that grows with corpus x queries. Embedding the texts is not timed: it grows with the texts
alone and is the model's speed (--embeddings measures that). The width is 384, all-MiniLM-L6-v2's (the
model of bench/embedding_speed.py); each query is its positive passage plus noise, at a cosine of about
0.7 to it.

Each corpus size runs in a fresh Python process, so that its peak resident memory is its own. Printed per
size: seconds (the search's compilation included), queries/s, the corpus matrix's size, the process's
resident memory before mining (the embeddings, JAX) and its peak while mining, and their difference: the
memory mining needs beyond its inputs.
"""

import json
import os
import resource
import subprocess
import sys
import time

import jax
import numpy as np

from bertjax.bench.timing import load_average, mib, print_table, resident_bytes
from bertjax.tasks import mining
from bertjax.training import sharding

PASSAGES = (100_000, 1_000_000)
QUERIES = 10_000
DIM = 384
SETTINGS = dict(num_negatives=5, relative_margin=0.05)
BLOCK = 65_536  # corpus rows drawn at a time: no second corpus-sized array while it is made


def synthetic(num_passages: int, num_queries: int, dim: int, seed: int = 0):
    """(queries [Q, D], corpus [N, D], each query's positive row [Q]), every row of unit length; a query is
    its positive plus noise of the same expected length (a cosine of about 0.71 to it)."""
    rng = np.random.default_rng(seed)
    corpus = np.empty((num_passages, dim), np.float32)
    for first in range(0, num_passages, BLOCK):
        block = rng.standard_normal((min(BLOCK, num_passages - first), dim), dtype=np.float32)
        corpus[first:first + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    positives = rng.choice(num_passages, num_queries, replace=num_queries > num_passages)
    queries = corpus[positives] + rng.standard_normal((num_queries, dim), dtype=np.float32) / np.sqrt(dim)
    return queries / np.linalg.norm(queries, axis=1, keepdims=True), corpus, positives


def measurement(num_passages: int, num_queries: int, dim: int) -> dict:
    """One size mined in this process: seconds, queries/s and memory (bytes); run it in a fresh process for
    a peak of its own."""
    queries, corpus, positives = synthetic(num_passages, num_queries, dim)
    before = resident_bytes()
    began = time.perf_counter()
    negatives = mining.mine_negatives(queries, corpus, [[int(p)] for p in positives],
                                      mesh=sharding.make_mesh({"data": -1}), **SETTINGS)
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return dict(passages=num_passages, queries=num_queries, dim=dim, seconds=seconds,
                queries_per_second=num_queries / seconds, corpus_bytes=corpus.nbytes, rss_before=before,
                peak_rss=peak, working=None if before is None else peak - before,
                negatives=sum(map(len, negatives)))


def benchmark(passages=PASSAGES, num_queries: int = QUERIES, dim: int = DIM) -> list[dict]:
    """measurement of each corpus size in passages, each in a fresh Python process; printed as each comes
    and as a table. A size whose process fails is a row saying how."""
    if not passages or min(passages) < 2 or num_queries < 1 or dim < 1:
        raise ValueError(f"mining benchmark: corpus sizes {list(passages)}, {num_queries} queries, width {dim}: "
                         f"give corpus sizes of 2 or more, at least one query and a width of at least 1")
    device = jax.devices()[0]
    print(f"mining hard negatives: backend {jax.default_backend()} ({device.device_kind}, {jax.local_device_count()} "
          f"devices), {os.cpu_count()} CPUs, load {load_average()}; {num_queries:,} queries of width {dim}, "
          f"{SETTINGS['num_negatives']} negatives each, relative_margin={SETTINGS['relative_margin']}", flush=True)
    code = ("import json, sys; from bertjax.bench import mining_speed as b; "
            "print('RESULT', json.dumps(b.measurement(**json.loads(sys.argv[1]))))")
    rows = []
    for num_passages in passages:
        args = dict(num_passages=int(num_passages), num_queries=num_queries, dim=dim)
        done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True)
        results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if results:
            row = json.loads(results[-1][len("RESULT "):])
            print(f"    {row['passages']:,} passages: {row['seconds']:,.1f} s, {row['queries_per_second']:,.0f} "
                  f"queries/s, peak RSS {mib(row['peak_rss'])} ({mib(row['working'])} above the inputs)", flush=True)
        else:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            row = dict(args, failed=f"exit status {done.returncode}: {last[-160:]}")
            print(f"    {num_passages:,} passages: {row['failed']}", flush=True)
        rows.append(row)
    print()
    print_table(["passages", "queries", "seconds", "queries/s", "corpus matrix", "RSS before", "peak RSS",
                 "peak - before"],
                [[f"{r['passages']:,}", f"{r['queries']:,}", r.get("failed", "")] + ["-"] * 5 if "failed" in r else
                 [f"{r['passages']:,}", f"{r['queries']:,}", f"{r['seconds']:,.1f}", f"{r['queries_per_second']:,.0f}",
                  mib(r["corpus_bytes"]), mib(r["rss_before"]), mib(r["peak_rss"]), mib(r["working"])]
                 for r in rows])
    print("seconds: mine_negatives whole (search and selection, compilation included); RSS before: the process "
          "with its embeddings made; peak - before: what mining needs beyond them", flush=True)
    return rows
