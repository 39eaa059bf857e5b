"""Retrieval and similarity evaluation of a sentence embedder: exact top-k search, BEIR's metrics, STS.

    embed = lambda texts, kind: model.embed(texts, task="query" if kind == "query" else "document")
    evaluate_retrieval(embed, read_retrieval("scifact"), k_values=(10, 100))  # {"ndcg@10": ..., ...}
    evaluate_sts(embed, readers.read_split(registry.get_task("stsb"), "validation"))  # pearson, spearman
    run = retrieve(embed, read_retrieval("scifact"), top_k=100)  # the first stage: {query id: {corpus id: score}}
    rerank(score_pairs, queries, corpus, run, top_k=100)  # BEIR's Rerank: {query id: {corpus id: score}}

`embed(texts, kind) -> [N, D]` is any callable, so the search and the metrics are tested with plain arrays.

The first stages of the evaluation suite (dense_first_stage, sparse_first_stage, multivector_first_stage)
also say what they cost: the bytes the corpus's index holds and the seconds the queries took (encoding and
search, after an untimed pass that compiles what the timed one runs).

Search is exact: every query is scored against every passage, by cosine (both sides normalised) or dot
product, in float32 at full matmul precision. The corpus is split over the devices of a mesh (each device
holds a contiguous slice), each device scans its slice in chunks of `chunk_size` passages keeping a running
top k, and the devices' top k are gathered and merged: memory holds [B, k + chunk] scores at a time, never
[queries, corpus]. Equal scores go to the passage earlier in the corpus, on any mesh: XLA's top_k puts the
lower index first among equal values, and every candidate list is kept in corpus order.

Shape legend: Q queries, N passages, D embedding width, B queries per search step, C passages per chunk,
n passages per device, k results per query.
"""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax.tasks import metrics, multivector_search, retrieval_metrics, sparse_search
from bertjax.tasks.retrieval_data import RetrievalSet
from bertjax.training import sharding

SIMILARITIES = ("cosine", "dot")  # the names of sentence-transformers' similarity_fn_name
CHUNK_SIZE = 16_384  # passages scored at a time per device: [B, C] float32 is 16 MB at B = 256
QUERY_BATCH_SIZE = 256
# Texts a sparse or multi-vector stage embeds at a time: [C, V] float32 is 119 MiB at BERT's vocabulary,
# [C, S, D] 90 MiB at ColBERT's 180 tokens of 128.
TEXT_CHUNK = 1024


def normalized(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero: torch's F.normalize's eps of 1e-12)."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _local_top_k(queries, corpus, exclude, *, k: int, chunk: int, num_passages: int, axes: tuple):
    """The top k of this device's slice, then of all devices'. queries [B, D] and exclude [B] (the corpus
    index a query may not retrieve, -1 for none) on every device; corpus [n, D] this device's slice."""
    n, d = corpus.shape
    offset = jax.lax.axis_index(axes) * n  # the slice's first corpus index
    chunks = corpus.reshape(n // chunk, chunk, d)  # [n / C, C, D]
    starts = offset + chunk * jnp.arange(n // chunk)

    def step(best, xs):
        best_scores, best_indices = best  # [B, k] each, in rank order
        passages, start = xs  # [C, D], the chunk's first corpus index
        scores = jnp.dot(queries, passages.T, precision=jax.lax.Precision.HIGHEST)  # [B, C]
        index = start + jnp.arange(chunk)  # [C]
        dropped = (index[None, :] >= num_passages) | (index[None, :] == exclude[:, None])  # padding, own id
        scores = jnp.where(dropped, -jnp.inf, scores)
        # The kept k come first, and hold only earlier passages: equal scores keep corpus order.
        scores = jnp.concatenate([best_scores, scores], axis=1)  # [B, k + C]
        indices = jnp.concatenate([best_indices, jnp.broadcast_to(index, scores[:, k:].shape)], axis=1)
        top, at = jax.lax.top_k(scores, k)
        return (top, jnp.take_along_axis(indices, at, axis=1)), None

    init = (jnp.full((queries.shape[0], k), -jnp.inf, jnp.float32), jnp.full((queries.shape[0], k), -1, jnp.int32))
    (top, indices), _ = jax.lax.scan(step, init, (chunks, starts))
    # Every device's k side by side in device order, which is corpus order: [B, devices * k].
    top = jax.lax.all_gather(top, axes, axis=1, tiled=True)
    indices = jax.lax.all_gather(indices, axes, axis=1, tiled=True)
    top, at = jax.lax.top_k(top, k)
    return top, jnp.take_along_axis(indices, at, axis=1)


@functools.partial(jax.jit, static_argnames=("k", "chunk", "num_passages", "mesh"))
def _top_k(queries, corpus, exclude, *, k, chunk, num_passages, mesh):
    axes = tuple(mesh.axis_names)
    local = functools.partial(_local_top_k, k=k, chunk=chunk, num_passages=num_passages, axes=axes)
    # check_vma off: the merged top k is the same on every device (it is made from all_gather's result), which
    # JAX 0.10's all_gather does not mark as such.
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axes), P()), out_specs=(P(), P()),
                         check_vma=False)(queries, corpus, exclude)


def _on_mesh(array: np.ndarray, mesh, spec) -> jax.Array:
    """A host array laid out on the mesh; each process gives its own devices' parts (all hold the array)."""
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def _corpus_on_mesh(corpus: np.ndarray, rows: int, mesh, normalize: bool) -> jax.Array:
    """corpus [N, D] as [rows, D] split over all the mesh's devices, zero rows after N, each row scaled to
    unit length when normalize. Each device's part is copied from the host as it is made, and scaled on the
    device: the host holds no second copy of a corpus that may be most of its memory."""
    sharding = NamedSharding(mesh, P(tuple(mesh.axis_names)))

    def part(index):
        start, stop, _ = index[0].indices(rows)
        out = np.zeros((stop - start, corpus.shape[1]), np.float32)
        out[: max(0, min(stop, len(corpus)) - start)] = corpus[start:stop]
        return out

    placed = jax.make_array_from_callback((rows, corpus.shape[1]), sharding, part)
    return _unit_rows(placed) if normalize else placed


@functools.partial(jax.jit, donate_argnums=0)
def _unit_rows(x):
    """Rows scaled to unit length on the device, in place of x (normalized's eps)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _check_embeddings(x, what: str) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.ndim != 2 or not x.shape[0] or not x.shape[1]:
        raise ValueError(f"{what} embeddings have the shape {x.shape}: expected [count, width], neither empty")
    if not np.isfinite(x).all():
        raise ValueError(f"{what} embeddings hold NaN or infinite values: the embedder is broken for some text")
    return x


def _check_search(queries, corpus, k, similarity, exclude):
    """The search's arguments as float32 and int32 arrays, or one line saying what is wrong."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity={similarity!r}: choose one of {', '.join(SIMILARITIES)}")
    if int(k) < 1:
        raise ValueError(f"k={k}: at least one result per query")
    queries, corpus = _check_embeddings(queries, "query"), _check_embeddings(corpus, "passage")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(f"queries are {queries.shape[1]} wide and passages {corpus.shape[1]}: one embedder makes both")
    exclude = np.full(len(queries), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
    if exclude.shape != (len(queries),):
        raise ValueError(f"exclude has the shape {exclude.shape}: one corpus index (or -1) per query, {len(queries)}")
    return queries, corpus, exclude


def search(queries, corpus, k: int, *, similarity: str = "cosine", mesh=None, exclude=None,
           chunk_size: int = CHUNK_SIZE, query_batch_size: int = QUERY_BATCH_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """The k best passages of corpus [N, D] for each query of queries [Q, D]: (scores [Q, k] float32,
    corpus indices [Q, k] int64), best first, equal scores in corpus order. exclude [Q] (optional): a
    corpus index each query may not retrieve (its own id), -1 for none; a place left without a passage
    (k above what is retrievable) has index -1 and score -inf. mesh: the corpus is split over all its
    devices, whatever its axes (training.sharding.make_mesh's; default: one device)."""
    queries, corpus, exclude = _check_search(queries, corpus, k, similarity, exclude)
    if similarity == "cosine":
        queries = normalized(queries)
    mesh = mesh if mesh is not None else sharding.make_mesh({"data": 1}, jax.devices()[:1])
    num_passages, devices = corpus.shape[0], mesh.devices.size
    k = min(int(k), num_passages)
    per_device = -(-num_passages // devices)
    chunk = max(1, min(chunk_size, per_device))
    padded = devices * chunk * -(-per_device // chunk)  # every device an equal whole number of chunks
    corpus = _corpus_on_mesh(corpus, padded, mesh, normalize=similarity == "cosine")
    batch = min(query_batch_size, len(queries))
    found = []
    for start in range(0, len(queries), batch):  # the last batch padded: one compiled program
        block = np.zeros((batch, queries.shape[1]), np.float32)
        block[: len(queries[start:start + batch])] = queries[start:start + batch]
        own = np.full(batch, -1, np.int32)
        own[: len(exclude[start:start + batch])] = exclude[start:start + batch]
        # Dispatched without waiting: the host prepares the next batch while the devices search this one.
        found.append(_top_k(_on_mesh(block, mesh, P()), corpus, _on_mesh(own, mesh, P()), k=k, chunk=chunk,
                            num_passages=num_passages, mesh=mesh))
    scores = np.concatenate([np.asarray(top.addressable_data(0)) for top, _ in found])[: len(queries)]
    indices = np.concatenate([np.asarray(at.addressable_data(0)) for _, at in found])[: len(queries)].astype(np.int64)
    return scores, np.where(np.isneginf(scores), -1, indices)


def embed_texts(embed, texts: list[str], kind: str, batch_size: int) -> np.ndarray:
    """embed(texts, kind) over texts in batches of batch_size, shortest first (a batch pads to its longest
    text, so like lengths together waste less), returned in the texts' order: [N, D] float32."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    parts = []
    for start in range(0, len(texts), batch_size):
        chosen = [texts[i] for i in order[start:start + batch_size]]
        part = np.asarray(embed(chosen, kind), np.float32)
        if part.ndim != 2 or part.shape[0] != len(chosen):
            raise ValueError(f"embed returned the shape {part.shape} for {len(chosen)} {kind} texts: expected "
                             f"[{len(chosen)}, width]")
        parts.append(part)
    out = np.empty((len(texts), parts[0].shape[1]), np.float32)
    out[order] = np.concatenate(parts)
    return out


def own_positions(dataset: RetrievalSet) -> np.ndarray:
    """[Q] int32: the corpus position of the passage with each query's id, -1 for none (what a query may
    not retrieve under BEIR's ignore_identical_ids)."""
    position = {corpus_id: i for i, corpus_id in enumerate(dataset.corpus_ids)}
    return np.array([position.get(query_id, -1) for query_id in dataset.query_ids], np.int32)


def as_run(dataset: RetrievalSet, scores, indices) -> dict[str, dict[str, float]]:
    """A search's (scores [Q, k], corpus positions [Q, k], -1 for an empty place) as a run, query id ->
    {corpus id: score} in the search's rank order."""
    return {query_id: {dataset.corpus_ids[i]: float(score) for i, score in zip(row, found) if i >= 0}
            for query_id, row, found in zip(dataset.query_ids, indices, scores)}


def retrieve(embed, dataset: RetrievalSet, top_k: int, similarity: str = "cosine", batch_size: int = 64, *,
             ignore_identical_ids: bool = False, mesh=None,
             chunk_size: int = CHUNK_SIZE) -> dict[str, dict[str, float]]:
    """The first stage: the data set's queries and passages embedded (embed(texts, "query" | "passage")) and
    each query's top_k passages found by the exact search. Returns the run, query id -> {corpus id: score},
    each query's passages in rank order (best first, equal scores in corpus order: the search's).
    ignore_identical_ids: a query never retrieves the passage with its own id (BEIR's option, for Quora and
    ArguAna)."""
    queries = embed_texts(embed, dataset.queries, "query", batch_size)
    passages = embed_texts(embed, dataset.passages, "passage", batch_size)
    exclude = own_positions(dataset) if ignore_identical_ids else None
    scores, indices = search(queries, passages, top_k, similarity=similarity, mesh=mesh, exclude=exclude,
                             chunk_size=chunk_size)
    return as_run(dataset, scores, indices)


def evaluate_retrieval(embed, dataset: RetrievalSet, k_values=retrieval_metrics.K_VALUES, similarity: str = "cosine",
                       batch_size: int = 64, *, ignore_identical_ids: bool = False, mesh=None,
                       chunk_size: int = CHUNK_SIZE) -> dict:
    """Each query's top max(k_values) passages (retrieve) and BEIR's metrics over the data set's judgements
    (retrieval_metrics), the passages ranked as the search ranked them: {"ndcg@10": ..., "recall@100": ...,
    ..., "queries": Q, "passages": N}."""
    k_values = tuple(sorted(set(int(k) for k in k_values)))
    run = retrieve(embed, dataset, max(k_values), similarity, batch_size, ignore_identical_ids=ignore_identical_ids,
                   mesh=mesh, chunk_size=chunk_size)
    scores = retrieval_metrics.retrieval_scores(dataset.qrels, rankings(run), k_values)
    return {**scores, "queries": len(dataset.queries), "passages": len(dataset.passages)}


def rankings(run: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    """retrieve's run as the metrics take it: query id -> corpus ids in the run's rank order."""
    return {query_id: list(found) for query_id, found in run.items()}


# ----------------------------------------------------------------------------------------------------
# First stages with their costs: dense, sparse (SPLADE) and multi-vector (ColBERT) embeddings
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FirstStage:
    """A first stage's run on one data set and what it cost."""

    run: dict[str, dict[str, float]]  # query id -> {corpus id: score}, in rank order
    index_bytes: int  # what the search holds for the corpus
    query_seconds: float  # every query encoded and searched, wall-clock (the timed pass)


def stage_scores(dataset: RetrievalSet, stage: FirstStage, k_values=retrieval_metrics.K_VALUES) -> dict:
    """BEIR's metrics of the stage's run, ranked as the stage ranked it, and its costs: {"ndcg@10": ...,
    "queries": Q, "passages": N, "index_bytes": ..., "query_ms": milliseconds a query}."""
    scores = retrieval_metrics.retrieval_scores(dataset.qrels, rankings(stage.run), k_values)
    return {**scores, "queries": len(dataset.queries), "passages": len(dataset.passages),
            "index_bytes": int(stage.index_bytes), "query_ms": 1000 * stage.query_seconds / len(dataset.queries)}


def _timed(step):
    """(step()'s result, the seconds of its second call): the first compiles the shapes it runs, which a
    query would not wait for in a served index."""
    step()
    began = time.perf_counter()
    out = step()
    return out, time.perf_counter() - began


def dense_first_stage(embed, dataset: RetrievalSet, top_k: int, similarity: str = "cosine", batch_size: int = 64, *,
                      ignore_identical_ids: bool = False, mesh=None, chunk_size: int = CHUNK_SIZE) -> FirstStage:
    """retrieve's run and its costs: the index is the passages' embeddings [N, D] float32; the queries'
    encoding and search are timed."""
    passages = embed_texts(embed, dataset.passages, "passage", batch_size)
    exclude = own_positions(dataset) if ignore_identical_ids else None

    def query_pass():
        queries = embed_texts(embed, dataset.queries, "query", batch_size)
        return search(queries, passages, top_k, similarity=similarity, mesh=mesh, exclude=exclude,
                      chunk_size=chunk_size)

    (scores, indices), seconds = _timed(query_pass)
    return FirstStage(as_run(dataset, scores, indices), passages.nbytes, seconds)


def without(scores, indices, exclude, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, indices) [Q, K] with each query's excluded corpus position (exclude [Q], -1 for none) taken
    out and the places after it moved up, cut to k places: [Q, min(k, K)]. A place left empty has index -1
    and score -inf, as search's."""
    kept = (indices != np.asarray(exclude)[:, None]) & (indices >= 0)  # [Q, K]
    place = np.cumsum(kept, axis=1) - 1  # each kept result's place after the taking out
    rows, columns = np.nonzero(kept & (place < k))
    width = min(int(k), indices.shape[1])
    out_scores = np.full((len(indices), width), -np.inf, np.float32)
    out_indices = np.full((len(indices), width), -1, np.int64)
    out_scores[rows, place[rows, columns]] = scores[rows, columns]
    out_indices[rows, place[rows, columns]] = indices[rows, columns]
    return out_scores, out_indices


def sparse_first_stage(embed, dataset: RetrievalSet, top_k: int, batch_size: int = 64, *, model: str,
                       ignore_identical_ids: bool = False, chunk_size: int = TEXT_CHUNK) -> FirstStage:
    """A SPLADE model's first stage through the inverted index (tasks/sparse_search.py), exact, by dot
    product: embed(texts, kind) gives non-negative [n, V] vectors. The passages reach build_index chunk_size
    at a time (never the corpus as one [N, V] array) and the queries are embedded and searched chunk_size at
    a time. model: the model's path or name, which the index records. The index's size is its nbytes."""
    if int(top_k) < 1:
        raise ValueError(f"k={top_k}: at least one result per query")
    chunks = (embed_texts(embed, dataset.passages[start:start + chunk_size], "passage", batch_size)
              for start in range(0, len(dataset.passages), chunk_size))
    index = sparse_search.build_index(chunks, model=model)
    exclude = own_positions(dataset) if ignore_identical_ids else np.full(len(dataset.queries), -1, np.int32)
    depth = int(top_k) + 1 if ignore_identical_ids else int(top_k)  # one more: its own passage is taken out

    def query_pass():
        found = [sparse_search.search(index, embed_texts(embed, dataset.queries[start:start + chunk_size], "query",
                                                         batch_size), depth)
                 for start in range(0, len(dataset.queries), chunk_size)]
        scores, indices = (np.concatenate(parts) for parts in zip(*found))
        return without(scores, indices, exclude, int(top_k))

    (scores, indices), seconds = _timed(query_pass)
    return FirstStage(as_run(dataset, scores, indices), index.nbytes, seconds)


def token_vectors(embed_tokens, texts: list[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """embed_tokens(texts, kind) as (vectors [n, S, D] float32, mask [n, S] bool: the tokens that count), or
    one line saying what it returned instead."""
    vectors, mask = embed_tokens(list(texts), kind)
    vectors, mask = np.asarray(vectors, np.float32), np.asarray(mask).astype(bool)
    if vectors.ndim != 3 or mask.shape != vectors.shape[:2] or len(vectors) != len(texts):
        raise ValueError(f"embed_tokens returned vectors {vectors.shape} and a mask {mask.shape} for {len(texts)} "
                         f"{kind} texts: expected [{len(texts)}, tokens, width] and [{len(texts)}, tokens]")
    return vectors, mask


def merge_top_k(best, found, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of two ranked candidate lists per query, (scores [Q, a], indices [Q, a]) each, best's from
    earlier corpus positions than found's: best first, equal scores to the earlier position (a stable sort
    of best, then found), empty places (-1, -inf) last."""
    scores = np.concatenate([best[0], found[0]], axis=1)
    indices = np.concatenate([best[1], found[1]], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)


def _maxsim_chunk(queries, query_mask, vectors, mask, start: int, exclude, best, k: int):
    """best merged with the top k of one chunk of passages (the corpus's from position start)."""
    inside = (exclude >= start) & (exclude < start + len(vectors))
    scores, indices = multivector_search.search(queries, query_mask, vectors, mask, k,
                                                exclude=np.where(inside, exclude - start, -1))
    return merge_top_k(best, (scores, np.where(indices >= 0, indices + start, -1)), k)


def multivector_first_stage(embed_tokens, dataset: RetrievalSet, top_k: int, *, ignore_identical_ids: bool = False,
                            chunk_size: int = TEXT_CHUNK) -> FirstStage:
    """A ColBERT model's first stage by exact MaxSim (tasks/multivector_search.py): embed_tokens(texts, kind)
    gives (vectors [n, S, D], mask [n, S]). The passages are embedded chunk_size at a time, each chunk
    searched for every query's top k and merged into the running top k: memory holds one chunk's vectors,
    never the corpus's. The index's size is its scored token vectors' bytes (a store without padding); the
    queries' encoding and every chunk's search are timed."""
    if int(top_k) < 1:
        raise ValueError(f"k={top_k}: at least one result per query")
    exclude = own_positions(dataset) if ignore_identical_ids else np.full(len(dataset.queries), -1, np.int32)
    (queries, query_mask), seconds = _timed(lambda: token_vectors(embed_tokens, dataset.queries, "query"))
    best = (np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64))
    index_bytes = 0
    for start in range(0, len(dataset.passages), chunk_size):
        vectors, mask = token_vectors(embed_tokens, dataset.passages[start:start + chunk_size], "passage")
        index_bytes += int(mask.sum()) * vectors.shape[2] * vectors.itemsize
        best, spent = _timed(functools.partial(_maxsim_chunk, queries, query_mask, vectors, mask, start, exclude,
                                               best, int(top_k)))
        seconds += spent
    return FirstStage(as_run(dataset, *best), index_bytes, seconds)


def sts_pairs(examples) -> list[tuple[str, str, float]]:
    """(text, text_pair, gold score) of scored pair examples: STS-B's (bertjax.tasks.readers, from TFDS or
    JSON lines), or the user's regression pairs."""
    pairs = [(e.text, e.text_pair, e.label) for e in examples]
    unscored = [e.idx for e in examples if e.text_pair is None or e.label is None]
    if unscored:
        raise ValueError(f"STS needs scored pairs: example {unscored[0]} has no second text or no score")
    if not pairs:
        raise ValueError("STS needs at least one scored pair")
    return pairs


def sts_similarities(embed, pairs, similarity: str = "cosine", batch_size: int = 64) -> np.ndarray:
    """Each pair's similarity (cosine, or dot product) of its two texts' embeddings: float32 [pairs].
    Both texts are embedded as kind "query": the task is symmetric (E5's models ask for "query: " on
    both sides of a symmetric task)."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity={similarity!r}: choose one of {', '.join(SIMILARITIES)}")
    first = embed_texts(embed, [a for a, _, _ in pairs], "query", batch_size)
    second = embed_texts(embed, [b for _, b, _ in pairs], "query", batch_size)
    if similarity == "cosine":
        first, second = normalized(first), normalized(second)
    return np.sum(first * second, axis=1)  # [pairs]


def evaluate_sts(embed, examples, batch_size: int = 64, similarity: str = "cosine") -> dict:
    """Pearson and Spearman correlations of the pairs' similarities (sts_similarities) with their gold
    scores, and the number of pairs."""
    pairs = sts_pairs(examples)
    scores = sts_similarities(embed, pairs, similarity, batch_size)
    gold = np.array([score for _, _, score in pairs], np.float64)
    return {"pearson": metrics.pearson(scores, gold), "spearman": metrics.spearman(scores, gold), "pairs": len(pairs)}


def rerank(score_pairs, queries: dict[str, str], corpus: dict[str, str], first_stage: dict, top_k: int,
           chunk_size: int = 1024) -> dict[str, dict[str, float]]:
    """BEIR's Rerank: each query's first top_k passages of first_stage (query id -> corpus ids best first,
    or retrieve's run) scored again by score_pairs(query texts, passage texts) -> [n] (a cross-encoder),
    chunk_size pairs a call; the passages beyond top_k are dropped. Returns query id -> {corpus id: score},
    the run as BEIR and pytrec_eval take it (retrieval_metrics.trec_ranking ranks it as they do)."""
    if int(top_k) < 1:
        raise ValueError(f"top_k={top_k}: rerank at least one passage per query")
    pairs = [(query_id, corpus_id) for query_id, ranked in first_stage.items()
             for corpus_id in list(ranked)[:int(top_k)]]
    scores = np.empty(len(pairs), np.float64)
    for start in range(0, len(pairs), chunk_size):
        chunk = pairs[start:start + chunk_size]
        found = np.asarray(score_pairs([queries[q] for q, _ in chunk], [corpus[d] for _, d in chunk]), np.float64)
        if found.shape != (len(chunk),):
            raise ValueError(f"score_pairs returned the shape {found.shape} for {len(chunk)} pairs: one score a pair")
        if not np.isfinite(found).all():
            raise ValueError("score_pairs gave NaN or infinite scores: the reranker is broken for some pair")
        scores[start:start + len(chunk)] = found
    run = {query_id: {} for query_id in first_stage}
    for (query_id, corpus_id), score in zip(pairs, scores):
        run[query_id][corpus_id] = float(score)
    return run
