"""Hard negatives for (query, positive) pairs: the passages an embedder ranks close to a query that are not
its positives, chosen as sentence-transformers' `mine_hard_negatives` chooses them (version 6.3).

    negatives = mine_negatives(queries, corpus, positive_ids, relative_margin=0.05, num_negatives=5)

Each query's candidates are its exact top `range_max + most positives + 1` corpus rows by cosine
(retrieval.search: chunked, split over a mesh, never [queries, corpus] at once; the corpus goes to it a
block at a time and the blocks' best are merged; the queries go QUERY_CHUNK_SIZE at a time, and a store of
each chunk's results lets an interrupted mining resume). Its positives and its own row (`exclude`) are
dropped, then every candidate the filters reject: absolute_margin drops a score s with s + margin > p,
relative_margin one with s > p - |p| x margin, p being the query's lowest positive score (NV-Retriever's
TopK-PercPos 95% is relative_margin=0.05); max_score drops s > max_score, min_score s < min_score. The
survivors keep their order; ranks range_min to range_max - 1 of them are the candidates, and
sampling="top" takes the first num_negatives, "random" num_negatives of them at random (returned best
first). A query with fewer candidates gets fewer negatives.

Shape legend: Q queries, N corpus rows, D embedding width, K candidates retrieved per query.
"""

import numpy as np

from bertjax.tasks import retrieval

SAMPLINGS = ("top", "random")
# Queries searched at a time, whole batches of retrieval.search: the part an interrupted mining keeps
# (runs/mining.py); each chunk places every corpus block on the devices again, so not fewer.
QUERY_CHUNK_SIZE = 16 * retrieval.QUERY_BATCH_SIZE
# Corpus rows per device searched at a time (96 MiB at D 384): the devices hold one block, never the whole
# corpus, so mining's memory beyond the embeddings stays the same for any corpus size.
CORPUS_BLOCK_SIZE = 4 * retrieval.CHUNK_SIZE


def default_range_max(range_min: int, num_negatives: int, most_positives: int, filtered: bool) -> int:
    """sentence-transformers' range_max when none is given: room for the positives and num_negatives
    candidates after range_min, ten times as many candidates where a margin or max_score may drop some."""
    return range_min + num_negatives * (10 if filtered else 1) + most_positives


def search(queries, corpus, k: int, *, mesh=None, chunk_size: int = retrieval.CHUNK_SIZE,
           block_size: int = CORPUS_BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """retrieval.search(queries, corpus, k, similarity="cosine")'s (scores [Q, k], rows [Q, k]), the corpus
    searched block_size rows per device at a time and the blocks' best k merged. Equal scores keep corpus
    order as in one search: the blocks' results side by side in corpus order, sorted stably."""
    devices = 1 if mesh is None else mesh.devices.size
    firsts = range(0, len(corpus), block_size * devices)
    found = [retrieval.search(queries, corpus[first:first + block_size * devices], k, similarity="cosine", mesh=mesh,
                              chunk_size=chunk_size) for first in firsts]
    if len(found) == 1:
        return found[0]
    scores = np.concatenate([s for s, _ in found], axis=1)  # [Q, k x blocks]
    rows = np.concatenate([np.where(r < 0, -1, r + first) for (_, r), first in zip(found, firsts)], axis=1)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, best, axis=1), np.take_along_axis(rows, best, axis=1)


def check_settings(positive_ids, num_rows: int, *, range_min: int = 0, range_max: int | None = None,
                   num_negatives: int = 3, sampling: str = "top", filtered: bool = False) -> int:
    """range_max as mining uses it (default_range_max's where None), or a ValueError that says what to change.
    positive_ids: each query's positives' corpus rows; num_rows: the corpus's size; filtered: a margin or
    max_score is given."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling={sampling!r}: choose one of {', '.join(SAMPLINGS)}")
    if num_negatives < 1:
        raise ValueError(f"num_negatives={num_negatives}: at least 1")
    if range_min < 0:
        raise ValueError(f"range_min={range_min}: the number of best candidates to skip, 0 or more")
    if range_max is None:
        most_positives = max((len(set(ids)) for ids in positive_ids), default=0)
        range_max = default_range_max(range_min, num_negatives, most_positives, filtered)
    if range_max <= range_min:
        raise ValueError(f"range_max={range_max} must be above range_min={range_min}")
    if num_negatives > range_max - range_min:
        raise ValueError(f"num_negatives={num_negatives} does not fit in the {range_max - range_min} ranks from "
                         f"range_min={range_min} to range_max={range_max}: lower it or raise range_max")
    for q, ids in enumerate(positive_ids):
        if not len(ids):
            raise ValueError(f"query {q} has no positive: every query needs at least one corpus row")
        bad = [i for i in ids if not 0 <= int(i) < num_rows]
        if bad:
            raise ValueError(f"query {q}'s positive {bad[0]} is not a row of the corpus of {num_rows}")
    return range_max


def mine_negatives(query_embeddings, corpus_embeddings, positive_ids, *, range_min: int = 0,
                   range_max: int | None = None, max_score: float | None = None, min_score: float | None = None,
                   absolute_margin: float | None = None, relative_margin: float | None = None,
                   num_negatives: int = 3, sampling: str = "top", seed: int = 0, exclude=None,
                   chunk_size: int = retrieval.CHUNK_SIZE, query_chunk_size: int = QUERY_CHUNK_SIZE,
                   block_size: int = CORPUS_BLOCK_SIZE, searched=None, on_chunk=None, mesh=None) -> list[list[int]]:
    """Each query's hard negatives as corpus rows, best first (the module docstring says which).
    query_embeddings [Q, D], corpus_embeddings [N, D]; positive_ids: each query's positives' corpus rows
    (at least one); exclude [Q] (optional): a corpus row each query may not have as a negative besides its
    positives (its own text's), -1 for none. range_max: default_range_max's where None. seed: the random
    sampling's. mesh: the corpus split over its devices (retrieval.search's).
    The queries are searched query_chunk_size at a time, over the corpus block_size rows per device at a
    time (search). searched (optional, dict-like: `in`, `[]`, `[]=`) holds each chunk's candidates by its
    first query, (scores [q, K], rows [q, K]): a chunk it has is not searched again and every chunk
    searched is put in it, so a store kept on disk resumes an interrupted mining. on_chunk(done, Q) is
    called after each chunk searched here."""
    queries = np.asarray(query_embeddings, np.float32)
    corpus = np.asarray(corpus_embeddings, np.float32)
    positive_ids = [[int(i) for i in dict.fromkeys(ids)] for ids in positive_ids]
    if len(positive_ids) != len(queries):
        raise ValueError(f"positive_ids lists {len(positive_ids)} queries' positives for {len(queries)} queries")
    filtered = absolute_margin is not None or relative_margin is not None or max_score is not None
    range_max = check_settings(positive_ids, len(corpus), range_min=range_min, range_max=range_max,
                               num_negatives=num_negatives, sampling=sampling, filtered=filtered)
    own = np.full(len(queries), -1, np.int64) if exclude is None else np.asarray(exclude, np.int64)
    if own.shape != (len(queries),):
        raise ValueError(f"exclude has the shape {own.shape}: one corpus row (or -1) per query, {len(queries)}")
    if query_chunk_size < 1 or block_size < 1:
        raise ValueError(f"query_chunk_size={query_chunk_size}, block_size={block_size}: each at least 1")

    # The positives and the own row are dropped after the search, among range_max + most_positives + 1
    # candidates, as sentence-transformers drops them: the search's exclude would bring one more candidate.
    k = range_max + max(map(len, positive_ids), default=0) + 1
    scores, rows = _searched_candidates(queries, corpus, k, query_chunk_size=query_chunk_size, searched=searched,
                                        on_chunk=on_chunk, mesh=mesh, chunk_size=chunk_size, block_size=block_size)
    _drop_rejected(scores, rows, queries, corpus, positive_ids, own, max_score=max_score, min_score=min_score,
                   absolute_margin=absolute_margin, relative_margin=relative_margin)
    return _choose(scores, rows, range_min=range_min, range_max=range_max, num_negatives=num_negatives,
                   sampling=sampling, seed=seed)


def _searched_candidates(queries: np.ndarray, corpus: np.ndarray, k: int, *, query_chunk_size: int, searched=None,
                         on_chunk=None, mesh=None, chunk_size: int = retrieval.CHUNK_SIZE,
                         block_size: int = CORPUS_BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k best corpus rows by cosine, (scores [Q, K], rows [Q, K]), fresh arrays: the chunks of
    query_chunk_size queries that `searched` holds taken from it, the others searched (search) and put in
    it, on_chunk(done, Q) called after each (mine_negatives says what `searched` is)."""
    searched = {} if searched is None else searched
    for start in range(0, len(queries), query_chunk_size):
        if start not in searched:
            searched[start] = search(queries[start:start + query_chunk_size], corpus, k, mesh=mesh,
                                     chunk_size=chunk_size, block_size=block_size)
            if on_chunk is not None:
                on_chunk(min(start + query_chunk_size, len(queries)), len(queries))
    chunks = [searched[start] for start in range(0, len(queries), query_chunk_size)]
    scores = np.concatenate([s for s, _ in chunks])  # [Q, K], a copy: the store's arrays stay as they are
    rows = np.concatenate([r for _, r in chunks])  # [Q, K]
    return scores, rows


def _drop_rejected(scores: np.ndarray, rows: np.ndarray, queries: np.ndarray, corpus: np.ndarray, positive_ids,
                   own: np.ndarray, *, max_score: float | None = None, min_score: float | None = None,
                   absolute_margin: float | None = None, relative_margin: float | None = None) -> None:
    """scores [Q, K] set to -inf, in place, at every candidate that may not be a negative: an empty place,
    one of the query's positives, its own row (own [Q], -1 for none), and what the filters reject (the
    module docstring says how)."""
    dropped = (rows < 0) | (rows == own[:, None])
    for q, ids in enumerate(positive_ids):
        dropped[q] |= np.isin(rows[q], ids)
    scores[dropped] = -np.inf
    if absolute_margin is not None or relative_margin is not None:
        unit_queries = retrieval.normalized(queries)
        # The lowest positive score of each query: the margin keeps clear of its hardest positive. Only the
        # positives' rows are normalised: a second corpus-sized array is what the chunked search avoids.
        lowest = np.array([min(float(np.dot(unit_queries[q], unit)) for unit in retrieval.normalized(corpus[ids]))
                           for q, ids in enumerate(positive_ids)], np.float32)[:, None]  # [Q, 1]
        if absolute_margin is not None:
            scores[scores + np.float32(absolute_margin) > lowest] = -np.inf
        if relative_margin is not None:
            scores[scores > lowest - np.abs(lowest) * np.float32(relative_margin)] = -np.inf
    if max_score is not None:
        scores[scores > np.float32(max_score)] = -np.inf
    if min_score is not None:
        scores[scores < np.float32(min_score)] = -np.inf


def _choose(scores: np.ndarray, rows: np.ndarray, *, range_min: int, range_max: int, num_negatives: int,
            sampling: str, seed: int) -> list[list[int]]:
    """Each query's negatives as corpus rows, best first: ranks range_min to range_max - 1 of the candidates
    that survive (finite scores, in the search's order), the first num_negatives of them or a random choice."""
    rng = np.random.default_rng(seed)
    negatives = []
    for q in range(len(scores)):
        kept = np.flatnonzero(np.isfinite(scores[q]))  # the survivors, best first (the search's order)
        candidates = kept[range_min:range_max]
        if sampling == "random" and len(candidates) > num_negatives:
            candidates = np.sort(rng.choice(candidates, num_negatives, replace=False))
        negatives.append([int(rows[q, c]) for c in candidates[:num_negatives]])
    return negatives
