"""Exact multi-vector (ColBERT) search: each query's MaxSim against every document of a store, its top k;
and reranking a first stage's candidates (a dense run's, BM25's) by MaxSim.

    scores, ids = search(q, q_mask, docs, docs_mask, k=10)              # [Q, k] each, best first
    scores, ids = rerank(q, q_mask, docs, docs_mask, first_stage_ids)   # [Q, K], reordered by MaxSim

The store is the documents' token vectors as ColbertEncoder gives them, padded to one width with their
score masks. Search scans it in chunks of chunk_size documents keeping a running top k, a query batch at
a time: memory holds the store and one chunk's [B, C, Sq, Sd] similarities, never queries x documents x
tokens. Equal scores go to the document earlier in the store (the kept k come before each chunk, and
XLA's top_k puts the lower index first among equal values), as bertjax/tasks/retrieval.py's dense search.
Compression of the store (ColBERTv2's residuals, PLAID) is not here: this is the exact reference.

Shape legend: Q queries, N documents, Sq and Sd their tokens, D vector width, B queries per step, C
documents per chunk, k results, K first-stage candidates per query.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models.multivector import maxsim, maxsim_candidates

CHUNK_SIZE = 256  # documents a step: [B, C, Sq, Sd] float32 is 94 MB at B 16, Sq 32, Sd 180
QUERY_BATCH_SIZE = 16


def _check_vectors(vectors, mask, what: str) -> tuple[np.ndarray, np.ndarray]:
    vectors, mask = np.asarray(vectors), np.asarray(mask).astype(bool)
    if vectors.ndim != 3 or mask.shape != vectors.shape[:2] or not vectors.shape[0]:
        raise ValueError(f"{what} vectors {vectors.shape} and mask {mask.shape}: expected [count, tokens, width] "
                         "and [count, tokens], at least one")
    if not np.isfinite(vectors).all():
        raise ValueError(f"{what} vectors hold NaN or infinite values: the encoder is broken for some text")
    return vectors, mask


def _checked(queries, query_mask, docs, doc_mask):
    queries, query_mask = _check_vectors(queries, query_mask, "query")
    docs, doc_mask = _check_vectors(docs, doc_mask, "document")
    if queries.shape[2] != docs.shape[2]:
        raise ValueError(f"query vectors are {queries.shape[2]} wide and document vectors {docs.shape[2]}: one "
                         "encoder makes both")
    return queries, query_mask, docs, doc_mask


@functools.partial(jax.jit, static_argnames=("k", "num_docs"))
def _top_k(queries, query_mask, exclude, docs, doc_masks, *, k: int, num_docs: int):
    """The top k of the store for a query batch: queries [B, Sq, D], exclude [B] (a document index each may
    not retrieve, -1 for none), docs [N / C, C, Sd, D] and doc_masks [N / C, C, Sd] in chunks."""
    chunk = docs.shape[1]

    def step(best, xs):
        best_scores, best_indices = best  # [B, k] each, best first
        vectors, mask, start = xs
        scores = maxsim(queries, query_mask, vectors, mask, chunk_size=chunk)  # [B, C]
        index = start + jnp.arange(chunk)  # [C]
        dropped = (index[None, :] >= num_docs) | (index[None, :] == exclude[:, None])  # padding, own id
        scores = jnp.concatenate([best_scores, jnp.where(dropped, -jnp.inf, scores)], axis=1)  # [B, k + C]
        indices = jnp.concatenate([best_indices, jnp.broadcast_to(index, dropped.shape)], axis=1)
        top, at = jax.lax.top_k(scores, k)
        return (top, jnp.take_along_axis(indices, at, axis=1)), None

    size = (queries.shape[0], k)
    init = (jnp.full(size, -jnp.inf, jnp.float32), jnp.full(size, -1, jnp.int32))
    starts = chunk * jnp.arange(docs.shape[0])
    (top, indices), _ = jax.lax.scan(step, init, (docs, doc_masks, starts))
    return top, indices


def _batches(arrays: tuple, size: int, fill: tuple):
    """(start, count, the arrays' rows [start, start + size) padded to size rows with fill): one program."""
    total = len(arrays[0])
    for start in range(0, total, size):
        count = min(size, total - start)
        padded = []
        for array, value in zip(arrays, fill):
            block = np.full((size, *array.shape[1:]), value, array.dtype)
            block[:count] = array[start:start + count]
            padded.append(block)
        yield start, count, padded


def search(query_vectors, query_mask, doc_vectors, doc_mask, k: int, *, exclude=None, chunk_size: int = CHUNK_SIZE,
           query_batch_size: int = QUERY_BATCH_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """The k best documents of the store for each query by MaxSim: (scores [Q, k] float32, document indices
    [Q, k] int64), best first, equal scores in store order. query_vectors [Q, Sq, D], query_mask [Q, Sq];
    doc_vectors [N, Sd, D], doc_mask [N, Sd] (any float dtype: scored in float32). exclude [Q] (optional):
    a document index each query may not retrieve (its own id), -1 for none. A place left without a document
    (k above what is retrievable) has index -1 and score -inf."""
    queries, query_mask, docs, doc_mask = _checked(query_vectors, query_mask, doc_vectors, doc_mask)
    if int(k) < 1:
        raise ValueError(f"k={k}: at least one result per query")
    exclude = np.full(len(queries), -1, np.int32) if exclude is None else np.asarray(exclude, np.int32)
    if exclude.shape != (len(queries),):
        raise ValueError(f"exclude has the shape {exclude.shape}: one document index (or -1) per query, "
                         f"{len(queries)}")
    num_docs, doc_tokens, width = docs.shape
    k = min(int(k), num_docs)
    chunk = max(1, min(int(chunk_size), num_docs))
    chunks = -(-num_docs // chunk)
    stored = np.zeros((chunks * chunk, doc_tokens, width), docs.dtype)
    stored[:num_docs] = docs
    masks = np.zeros((chunks * chunk, doc_tokens), bool)
    masks[:num_docs] = doc_mask
    stored = jnp.asarray(stored.reshape(chunks, chunk, doc_tokens, width))  # on the device once for every batch
    masks = jnp.asarray(masks.reshape(chunks, chunk, doc_tokens))
    batch = max(1, min(int(query_batch_size), len(queries)))
    scores, indices = [], []
    for _, count, (q, m, own) in _batches((queries, query_mask, exclude), batch, (0, False, -1)):
        top, at = _top_k(q, m, own, stored, masks, k=k, num_docs=num_docs)
        scores.append(np.asarray(top)[:count])
        indices.append(np.asarray(at)[:count])
    scores, indices = np.concatenate(scores), np.concatenate(indices).astype(np.int64)
    return scores, np.where(np.isneginf(scores), -1, indices)


@jax.jit
def _candidate_scores(queries, query_mask, candidates, candidate_mask, present):
    scores = maxsim_candidates(queries, query_mask, candidates, candidate_mask)  # [B, K]
    return jnp.where(present, scores, -jnp.inf)


def rerank(query_vectors, query_mask, doc_vectors, doc_mask, candidates, *,
           query_batch_size: int = QUERY_BATCH_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """A first stage's candidates [Q, K] (document indices into the store, best first, -1 for none) scored
    by MaxSim and reordered: (scores [Q, K] float32, document indices [Q, K] int64), best first, equal scores
    in the first stage's order; a missing candidate stays last, index -1 and score -inf. The store as
    search takes it; only each batch's candidates go to the device."""
    queries, query_mask, docs, doc_mask = _checked(query_vectors, query_mask, doc_vectors, doc_mask)
    candidates = np.asarray(candidates, np.int64)
    if candidates.ndim != 2 or len(candidates) != len(queries):
        raise ValueError(f"candidates have the shape {candidates.shape}: [queries, K] = [{len(queries)}, K]")
    if ((candidates < -1) | (candidates >= len(docs))).any():
        raise ValueError(f"candidates hold indices outside the store of {len(docs)} documents (-1 marks none)")
    batch = max(1, min(int(query_batch_size), len(queries)))
    found = []
    for _, count, (q, m, ids) in _batches((queries, query_mask, candidates), batch, (0, False, -1)):
        present = ids >= 0
        chosen = np.maximum(ids, 0)  # [B, K]: a missing candidate reads document 0, then scores -inf
        found.append(np.asarray(_candidate_scores(q, m, docs[chosen], doc_mask[chosen], present))[:count])
    scores = np.concatenate(found)
    order = np.argsort(-scores, axis=1, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=1)
    return ranked, np.where(np.isneginf(ranked), -1, np.take_along_axis(candidates, order, axis=1))
