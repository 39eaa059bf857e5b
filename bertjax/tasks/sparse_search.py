"""Sparse retrieval (SPLADE): an inverted index of the documents' term weights, exact top-k search over it,
and the index saved to a directory to be searched many times.

    index = build_index(chunks, model="runs/splade")   # chunks: document weights [B, V], in corpus order
    save_index(index, "runs/splade-index")
    index = load_index("runs/splade-index", model="runs/splade")
    scores, indices = search(index, query_weights, k=10)   # [Q, k] each, best first
    run = to_run(scores, indices, query_ids, corpus_ids)   # {query id: {corpus id: score}}

A text is a vector over the vocabulary: SPLADE's max-pooled log(1 + relu(logits)), never below 0, or the
inference-free side's learned weight per query token (models/sparse.py). Documents and queries are given as
the model gives them, dense rows of V weights; only the non-zeros are kept. The
documents come in chunks, so a corpus is never one [N, V] array. The index is CSR by term: term t's postings
are doc_ids[indptr[t]:indptr[t + 1]], ascending, with their weights: 8 bytes a non-zero plus 8 a term.

Search is exact. A query's score for a document is the sum over the query's non-zero terms t of
weight_q(t) * weight_d(t), added term by term (ascending ids) along t's postings into a float32 buffer of N
scores. Ranking is retrieval.search's: best first, equal scores to the document earlier in the corpus;
documents sharing no term with the query score 0 and are ranked as such (last, where weights are >= 0).

Shape legend: Q queries, N documents, V vocabulary, B documents per chunk, P postings (non-zeros kept), n a
chunk's non-zeros, k results per query.
"""

import collections
import dataclasses
import json
import os
import pathlib

import numpy as np

MANIFEST = "manifest.json"
POSTINGS = "postings.npz"
FORMAT = 1  # the layout of POSTINGS and MANIFEST; a reader refuses others


@dataclasses.dataclass(frozen=True, eq=False)
class SparseIndex:
    """Every term's postings (CSR by term) and what they were built from."""

    indptr: np.ndarray  # [V + 1] int64: term t's postings are [indptr[t], indptr[t + 1])
    doc_ids: np.ndarray  # [P] int32: corpus positions, ascending within a term
    weights: np.ndarray  # [P] float32, none 0
    num_documents: int
    model: str  # the model (a path or a name) whose weights these are
    terms: int | None = None  # the most terms kept per document; None: every non-zero

    @property
    def vocab_size(self) -> int:
        return len(self.indptr) - 1

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.doc_ids.nbytes + self.weights.nbytes


def _nonzeros(rows, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, term, weight) [n] of each non-zero of rows [R, V], by row then term; non-finite weights are one
    line. Only the non-zeros need checking: NaN and infinities are non-zero."""
    flat = np.flatnonzero(rows != 0)  # [n] ascending; np.nonzero(rows) is much slower on float rows
    values = rows.reshape(-1)[flat]
    rows_of, terms = np.divmod(flat, rows.shape[1])
    if not np.isfinite(values).all():
        raise ValueError(f"{what} hold NaN or infinite weights: the encoder is broken for some text")
    return rows_of, terms, values


def _top_terms(rows, terms, values, keep: int):
    """The entries of each row's `keep` largest weights, equal weights kept lower term id first; every entry
    where no row has more than `keep`."""
    counts = np.bincount(rows)
    if counts.max(initial=0) <= keep:
        return rows, terms, values
    order = np.lexsort((terms, -values, rows))  # by row, then weight (largest first), then term id
    first = np.cumsum(counts) - counts  # [rows] each row's first place in order
    rank = np.arange(len(order)) - first[rows[order]]  # rows are ascending, so rows[order] is too
    kept = np.sort(order[rank < keep])
    return rows[kept], terms[kept], values[kept]


def _chunk_postings(chunk, first_doc: int, vocab_size: int, keep: int | None, number: int):
    """(term ids, doc ids, weights) [n] of one chunk [B, V], by term then document: this chunk's part of
    every term's postings."""
    if chunk.ndim != 2 or chunk.shape[1] != vocab_size:
        raise ValueError(f"document chunk {number} has the shape {chunk.shape}: expected [documents, {vocab_size}] "
                         f"(the first chunk's vocabulary)")
    rows, terms, values = _nonzeros(chunk, f"document chunk {number}")
    if keep is not None:
        rows, terms, values = _top_terms(rows, terms, values, keep)
    order = np.argsort(terms, kind="stable")  # stable: documents stay ascending within a term
    return terms[order].astype(np.int32), (rows[order] + first_doc).astype(np.int32), values[order]


def _merge(parts: collections.deque, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunks' postings placed chunk after chunk in each term's range of (doc ids [P], weights [P]),
    which keeps every term's documents ascending; each chunk is dropped once placed."""
    vocab_size = len(indptr) - 1
    doc_ids = np.empty(indptr[-1], np.int32)
    weights = np.empty(indptr[-1], np.float32)
    filled = indptr[:-1].copy()  # [V] the next free place in each term's range
    while parts:
        terms, docs, values = parts.popleft()
        counts = np.bincount(terms, minlength=vocab_size)  # [V]
        first = np.cumsum(counts) - counts  # [V] each term's first place in this chunk
        places = filled[terms] + np.arange(len(terms)) - first[terms]  # [n]
        doc_ids[places] = docs
        weights[places] = values
        filled += counts
    return doc_ids, weights


def build_index(chunks, *, model: str, terms: int | None = None) -> SparseIndex:
    """The inverted index of the documents in chunks: an iterable of weight arrays [B, V] (numpy or JAX),
    in corpus order; a document's id is its position in the corpus. model: the model (path or name) that
    made the weights, kept so that a search with another model's queries is refused. terms: keep only each
    document's `terms` largest weights (equal ones by lower term id); None keeps every non-zero.
    Memory: 12 bytes a non-zero as the chunks are read (term, document, weight), then the index's 8 filled
    from them, so 20 at the peak."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model={model!r}: name the model (its path or name) the weights come from")
    if terms is not None and int(terms) < 1:
        raise ValueError(f"terms={terms}: keep at least one term per document, or None for every non-zero")
    keep = None if terms is None else int(terms)
    parts, counts, num_documents = collections.deque(), None, 0
    for number, chunk in enumerate(chunks):
        chunk = np.asarray(chunk, np.float32)
        if counts is None:  # the first chunk sets the vocabulary
            if chunk.ndim != 2 or not chunk.shape[1]:
                raise ValueError(f"document chunk 0 has the shape {chunk.shape}: expected [documents, vocabulary]")
            counts = np.zeros(chunk.shape[1], np.int64)  # [V] postings per term
        if num_documents + len(chunk) > np.iinfo(np.int32).max:
            raise ValueError(f"more than {np.iinfo(np.int32).max:,} documents: doc ids are int32; split the corpus")
        parts.append(_chunk_postings(chunk, num_documents, len(counts), keep, number))
        counts += np.bincount(parts[-1][0], minlength=len(counts))
        num_documents += len(chunk)
    if not num_documents:
        raise ValueError("no documents: chunks gave no rows of weights")
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    doc_ids, weights = _merge(parts, indptr)
    return SparseIndex(indptr, doc_ids, weights, num_documents, model, keep)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k best of scores [N]: best first, equal scores in index order. [k] int64."""
    if k < len(scores):
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]  # the k-th largest
        above = np.flatnonzero(scores > kth)
        chosen = np.concatenate([above, np.flatnonzero(scores == kth)[: k - len(above)]])  # equal ones: the earliest
    else:
        chosen = np.arange(len(scores))
    return chosen[np.lexsort((chosen, -scores[chosen]))]


def search(index: SparseIndex, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best documents of the index for each query of queries [Q, V] (weights as the documents'):
    (scores [Q, k] float32, corpus positions [Q, k] int64), best first, ties as retrieval.search breaks
    them; k above the corpus gives every document."""
    queries = np.asarray(queries, np.float32)
    if queries.ndim != 2 or queries.shape[1] != index.vocab_size:
        raise ValueError(f"queries have the shape {queries.shape}: expected [queries, {index.vocab_size}], the "
                         f"index's vocabulary")
    if int(k) < 1:
        raise ValueError(f"k={k}: at least one result per query")
    k = min(int(k), index.num_documents)
    rows, terms, values = _nonzeros(queries, "queries")
    bounds = np.searchsorted(rows, np.arange(len(queries) + 1))  # query q's terms: [bounds[q], bounds[q + 1])
    found = np.empty((len(queries), k), np.int64)
    scores = np.empty((len(queries), k), np.float32)
    buffer = np.empty(index.num_documents, np.float32)  # [N] one query's scores
    for q in range(len(queries)):
        buffer.fill(0)
        for term, weight in zip(terms[bounds[q]:bounds[q + 1]], values[bounds[q]:bounds[q + 1]]):
            start, stop = index.indptr[term], index.indptr[term + 1]
            # Doc ids are unique within a term, so `buffer[ids] += ...` would do; numpy's add.at is faster.
            np.add.at(buffer, index.doc_ids[start:stop], weight * index.weights[start:stop])
        found[q] = _top_k(buffer, k)
        scores[q] = buffer[found[q]]
    return scores, found


def to_run(scores, indices, query_ids, corpus_ids) -> dict[str, dict[str, float]]:
    """search's (scores, indices) as a run, query id -> {corpus id: score} in rank order: the form of
    retrieval.retrieve's run, which BEIR and pytrec_eval take."""
    if len(query_ids) != len(indices):
        raise ValueError(f"{len(query_ids)} query ids for {len(indices)} queries searched: one id a query")
    if len(corpus_ids) < int(np.max(indices, initial=-1)) + 1:
        raise ValueError(f"{len(corpus_ids)} corpus ids for an index of more documents: one id a document")
    return {query_id: {corpus_ids[i]: float(score) for i, score in zip(row, found)}
            for query_id, row, found in zip(query_ids, indices, scores)}


def save_index(index: SparseIndex, directory) -> pathlib.Path:
    """index written to directory (made if missing): POSTINGS, then MANIFEST, each replacing any earlier
    one whole, so a directory with a manifest holds a whole index. Returns the directory."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = dict(format=FORMAT, model=index.model, vocab_size=index.vocab_size,
                    num_documents=index.num_documents, postings=len(index.doc_ids), terms=index.terms)
    with open(directory / (POSTINGS + ".partial"), "wb") as f:
        np.savez(f, indptr=index.indptr, doc_ids=index.doc_ids, weights=index.weights)
    os.replace(directory / (POSTINGS + ".partial"), directory / POSTINGS)
    (directory / (MANIFEST + ".partial")).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(directory / (MANIFEST + ".partial"), directory / MANIFEST)
    return directory


def _same_model(a: str, b: str) -> bool:
    """Whether two model names or paths are the same, as written (no file system involved)."""
    return os.path.normpath(a) == os.path.normpath(b)


def load_index(directory, model: str | None = None) -> SparseIndex:
    """The index save_index wrote to directory. model (optional): the model whose queries will be searched;
    an index built from another model is refused (its weights live in another space)."""
    directory = pathlib.Path(directory)
    if not (directory / MANIFEST).is_file():
        raise ValueError(f"{directory} holds no sparse index: no {MANIFEST} (save_index writes one)")
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory} is a sparse index of format {manifest.get('format')!r}; this bertjax reads "
                         f"format {FORMAT}: build it again")
    if model is not None and not _same_model(manifest["model"], model):
        raise ValueError(f"{directory} indexes the weights of model {manifest['model']!r}, not {model!r}: build an "
                         f"index with {model!r}, or search this one with {manifest['model']!r}'s queries")
    with np.load(directory / POSTINGS) as arrays:
        indptr, doc_ids, weights = arrays["indptr"], arrays["doc_ids"], arrays["weights"]
    if (len(indptr) != manifest["vocab_size"] + 1 or len(doc_ids) != manifest["postings"]
            or len(weights) != len(doc_ids) or indptr[-1] != len(doc_ids)):
        raise ValueError(f"{directory}'s {POSTINGS} does not match its {MANIFEST}: the index is damaged, build it "
                         f"again")
    return SparseIndex(indptr, doc_ids, weights, manifest["num_documents"], manifest["model"], manifest["terms"])
