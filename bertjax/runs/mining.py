"""Hard negatives added to a pairs file: python -m bertjax.mine's run.

The pairs are read and checked, the corpus is read (the pairs' own positives where none is given), every
distinct query and corpus text is embedded by the model (its query and document prompts), each query's
negatives are mined (tasks/mining.py: sentence-transformers' mine_hard_negatives), and the pairs are
written again with `negatives` added (or as a reranker's labeled lists), in one piece: a failure leaves no
output file.

Lines with the same query are one query whose positives are all of theirs, as sentence-transformers
reads them; a positive is always in the corpus; a negative is never one of the query's positives nor
the query's own text.

Resuming: the finished work is kept in `<out>.partial/` as it is done (the query and corpus embeddings
in parts of shard_size texts, the search's candidates in chunks of query_chunk_size queries), each part a
file written whole. SIGTERM and Ctrl-C stop the run after the part in progress; a kill or a crash loses
that part only. The same command again takes the kept parts and does the rest, to the same output, byte
for byte, as a run never interrupted; the directory is removed once the output is written. Its manifest
records what the parts depend on (the model's files, the pairs and corpus files' sizes and times,
batch_size, shard_size, query_chunk_size, range_max): a run whose inputs or settings differ stops with a
line naming them, rather than throw away work that may have taken hours. The selection's own settings
(margins, score bounds, sampling, seed) may change where range_max stays. Each stage says how far it is
at each tenth, or every PROGRESS_SECONDS.
"""

import dataclasses
import hashlib
import io
import json
import os
import time

import numpy as np

from bertjax import inference
from bertjax.runs import console, start
from bertjax.tasks import mining, readers, retrieval
from bertjax.tasks.kinds import contrastive
from bertjax.text import files
from bertjax.training import sharding
from bertjax.training.preemption import Preemption

# What the output holds: the pairs with `negatives` added, or a reranker's rows (tasks/kinds/rerank.py), as
# sentence-transformers' mine_hard_negatives writes them with output_format="labeled-list".
OUTPUT_FORMATS = ("pairs", "labeled-list")
SHARD_SIZE = 8192  # texts embedded per kept part, rounded down to whole batches
PROGRESS_SECONDS = 30.0  # a progress line at least this often, besides one at each tenth of a stage


def read_corpus(path: str) -> list[str]:
    """A corpus file's texts: JSON lines with `text`, or BEIR's {"_id", "title", "text"} (title, a space,
    text)."""
    texts = []
    for number, obj in readers.json_lines(path):
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{number}: expected a non-empty string field 'text' (lines of {{\"text\": ...}} "
                             f"or BEIR's {{\"_id\", \"title\", \"text\"}})")
        title = obj.get("title")
        texts.append(f"{title} {text}".strip() if isinstance(title, str) and title.strip() else text)
    return texts


def _embedder(model, batch_size: int):
    def embed(texts, kind):  # kind "query" | "document": sentence-transformers' encode_query, encode_document
        return model.embed(texts, task=kind, batch_size=batch_size)
    return embed


class Progress:
    """Lines on how far a stage is: at each further tenth of it, or after PROGRESS_SECONDS when that comes
    first, and at its end. The rate counts this run's work only (a resumed stage starts part way)."""

    def __init__(self, what: str, total: int, done: int = 0):
        self.what, self.total, self.done, self.first = what, total, done, done
        self.began = self.last = time.monotonic()
        self.shown = done
        if done:
            console.say(f"mining: {what} {done:,}/{total:,} kept from the interrupted run")

    def advance_to(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if done >= self.total or done - self.shown >= self.total / 10 or now - self.last >= PROGRESS_SECONDS:
            rate = (done - self.first) / max(now - self.began, 1e-9)
            console.say(f"mining: {self.what} {done:,}/{self.total:,} ({done / self.total:.0%}), {rate:,.0f}/s")
            self.shown, self.last = done, now


def _stamp(path: str) -> list:
    """What tells that a file or a directory changed, cheaply: its absolute path and each file's size and
    modification time (a directory's hashed into one string); a URL's path alone."""
    if files.is_remote(path):
        return [path]
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(path):
        status = os.stat(path)
        return [path, status.st_size, status.st_mtime_ns]
    digest = hashlib.sha256()
    for root, directories, names in os.walk(path):
        directories.sort()
        for name in sorted(names):
            status = os.stat(os.path.join(root, name))
            digest.update(f"{os.path.relpath(os.path.join(root, name), path)}\t{status.st_size}\t"
                          f"{status.st_mtime_ns}\n".encode())
    return [path, digest.hexdigest()[:16]]


class Partial:
    """The finished parts of a mining run in a directory (the module docstring says what and why): a
    manifest, and each part as a .npz file of named arrays, written whole."""

    def __init__(self, directory: str, manifest: dict):
        """Checks a kept manifest against this one; the directory is made when the first part is put, so
        that a run stopped by bad input before any work writes nothing."""
        self.directory = directory
        self.manifest = json.loads(json.dumps(manifest))  # as it reads back: lists for tuples
        path = files.path(directory, "manifest.json")
        self.started = path.exists()
        if self.started:
            kept = json.loads(path.read_text())
            changed = [key for key in self.manifest if kept.get(key) != self.manifest[key]]
            if changed:
                raise ValueError(f"{directory} keeps an interrupted run's work, done with another "
                                 f"{', '.join(changed)} (a changed file counts): delete it to start over, or give "
                                 f"the inputs and settings it was done with")
            console.say(f"mining: continuing the interrupted run kept in {directory}")

    def has(self, name: str) -> bool:
        return files.path(self.directory, f"{name}.npz").exists()

    def get(self, name: str) -> dict | None:
        if not self.has(name):
            return None
        with np.load(io.BytesIO(files.path(self.directory, f"{name}.npz").read_bytes())) as stored:
            return {key: stored[key] for key in stored.files}

    def put(self, name: str, **arrays) -> None:
        if not self.started:
            files.path(self.directory).mkdir(parents=True, exist_ok=True)
            files.write_bytes(files.join(self.directory, "manifest.json"), json.dumps(self.manifest).encode())
            self.started = True
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        files.write_bytes(files.join(self.directory, f"{name}.npz"), buffer.getvalue())

    def remove(self) -> None:
        if files.path(self.directory).exists():
            files.path(self.directory).rmtree()


class SearchParts:
    """The searched chunks of queries kept in a Partial, by their first query: mine_negatives' `searched`."""

    def __init__(self, partial: Partial):
        self.partial = partial

    def __contains__(self, first: int) -> bool:
        return self.partial.has(f"search-{first:09d}")

    def __getitem__(self, first: int) -> tuple:
        part = self.partial.get(f"search-{first:09d}")
        return part["scores"], part["rows"]

    def __setitem__(self, first: int, found: tuple) -> None:
        scores, rows = found
        self.partial.put(f"search-{first:09d}", scores=scores, rows=rows)

    def done(self, total: int, chunk: int) -> int:
        """How many of the total queries the kept chunks hold."""
        return sum(min(chunk, total - first) for first in range(0, total, chunk) if first in self)


def embed_in_parts(embed, texts: list[str], kind: str, batch_size: int, shard_size: int, partial: Partial,
                   stage: str, kept) -> np.ndarray:
    """retrieval.embed_texts(embed, texts, kind, batch_size) made shard_size texts at a time in its order
    (shortest first, so that the batches are its batches), each part kept in partial as it is made, and
    taken from it where it is there: [N, D] float32. kept(stage, done, total) after each part made."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    firsts = range(0, len(texts), shard_size)
    names = [f"{stage}-{number:06d}" for number in range(len(firsts))]
    progress = Progress(f"{stage} texts embedded", len(texts),
                        sum(len(order[first:first + shard_size]) for first, name in zip(firsts, names)
                            if partial.has(name)))

    def counted(batch, batch_kind):
        found = embed(batch, batch_kind)
        progress.advance_to(progress.done + len(batch))
        return found

    out = None
    for first, name in zip(firsts, names):
        chosen = order[first:first + shard_size]
        part = partial.get(name)
        if part is None:
            part = {"embeddings": retrieval.embed_texts(counted, [texts[i] for i in chosen], kind, batch_size)}
            partial.put(name, **part)
            kept(stage, first + len(chosen), len(texts))
        if out is None:
            out = np.empty((len(texts), part["embeddings"].shape[1]), np.float32)
        out[chosen] = part["embeddings"]
    return out


@dataclasses.dataclass(frozen=True)
class Inputs:
    """A pairs file and its corpus, read for mining (the module docstring says how queries and positives
    are gathered)."""

    lines: list[dict]  # the pairs file's objects, as written
    pairs: list  # contrastive.Pair per line
    corpus: list[str]  # the corpus file's texts, then the positives, each once
    queries: list[str]  # the distinct queries, in the order they first come
    positive_ids: list[list[int]]  # each query's positives' corpus rows

    def own_rows(self) -> list[int]:
        """Each query's own text's corpus row (never its negative), -1 where the corpus does not hold it."""
        row = {text: i for i, text in enumerate(self.corpus)}
        return [row.get(query, -1) for query in self.queries]


def read_inputs(pairs_path: str, corpus_path: str | None) -> Inputs:
    """The pairs and the corpus (the pairs' positives where corpus_path is None); one line for bad input."""
    pairs = contrastive.read_pairs(pairs_path, "mnrl")
    lines = [obj for _, obj in readers.json_lines(pairs_path)]
    corpus = read_corpus(corpus_path) if corpus_path else []
    if corpus_path and not corpus:
        raise ValueError(f"--corpus={corpus_path}: no texts to mine negatives from")
    corpus = list(dict.fromkeys(corpus + [p.positive for p in pairs]))  # the positives always in it, once
    if len(corpus) < 2:
        raise ValueError(f"{pairs_path}: the corpus holds {len(corpus)} text: negatives need more than the "
                         f"positives (give --corpus=FILE)")
    row = {text: i for i, text in enumerate(corpus)}
    queries = list(dict.fromkeys(p.query for p in pairs))
    query_index = {text: i for i, text in enumerate(queries)}
    positive_ids = [[] for _ in queries]
    for p in pairs:
        positive_ids[query_index[p.query]].append(row[p.positive])
    return Inputs(lines, pairs, corpus, queries, positive_ids)


def mine(model_path: str, pairs_path: str, out_path: str, *, corpus_path: str | None = None, num_negatives: int = 3,
         range_min: int = 0, range_max: int | None = None, absolute_margin: float | None = None,
         relative_margin: float | None = None, max_score: float | None = None, min_score: float | None = None,
         sampling: str = "top", seed: int = 0, batch_size: int = 64, shard_size: int = SHARD_SIZE,
         query_chunk_size: int = mining.QUERY_CHUNK_SIZE, output_format: str = "pairs", on_part=None) -> dict:
    """Write out_path: the pairs of pairs_path, each with its query's mined negatives after any it had, or
    (output_format="labeled-list") those pairs as a reranker's rows (labeled_lists). Returns {"pairs",
    "queries", "corpus", "negatives", "short"} (short: queries given fewer than num_negatives). shard_size:
    texts embedded per kept part (whole batches); query_chunk_size: queries searched per kept part.
    on_part(stage, done, total): called after each part is kept, stage being "query", "corpus" or "search"."""
    # ---- the pairs, the corpus and the settings ------------------------------------------------------
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"--output_format={output_format}: choose one of {', '.join(OUTPUT_FORMATS)}")
    inputs = read_inputs(pairs_path, corpus_path)
    queries, corpus = inputs.queries, inputs.corpus
    filtered = absolute_margin is not None or relative_margin is not None or max_score is not None
    range_max = mining.check_settings(inputs.positive_ids, len(corpus), range_min=range_min, range_max=range_max,
                                      num_negatives=num_negatives, sampling=sampling, filtered=filtered)
    if batch_size < 1 or shard_size < 1 or query_chunk_size < 1:
        raise ValueError(f"batch_size={batch_size}, shard_size={shard_size}, query_chunk_size={query_chunk_size}: "
                         f"each at least 1")
    shard_size = max(batch_size, shard_size // batch_size * batch_size)  # whole batches: the same as unsharded
    console.say(f"mining: {len(inputs.pairs)} pairs, {len(queries)} distinct queries, a corpus of {len(corpus)} "
                f"texts")

    # ---- the work kept from an interrupted run, and the model -------------------------------------------
    partial = Partial(f"{out_path}.partial", dict(
        model=_stamp(model_path), pairs=_stamp(pairs_path), corpus=_stamp(corpus_path) if corpus_path else None,
        batch_size=batch_size, shard_size=shard_size, query_chunk_size=query_chunk_size, range_max=range_max))
    model = inference.load(model_path)
    with Preemption() as preemption:
        kept = _keeper(preemption, partial, on_part)

        # ---- embeddings -------------------------------------------------------------------------------
        embed = _embedder(model, batch_size)
        query_embeddings = embed_in_parts(embed, queries, "query", batch_size, shard_size, partial, "query", kept)
        corpus_embeddings = embed_in_parts(embed, corpus, "document", batch_size, shard_size, partial, "corpus",
                                           kept)

        # ---- mining -----------------------------------------------------------------------------------
        searched = SearchParts(partial)
        negatives = mining.mine_negatives(
            query_embeddings, corpus_embeddings, inputs.positive_ids, range_min=range_min, range_max=range_max,
            max_score=max_score, min_score=min_score, absolute_margin=absolute_margin,
            relative_margin=relative_margin, num_negatives=num_negatives, sampling=sampling, seed=seed,
            exclude=inputs.own_rows(), query_chunk_size=query_chunk_size, searched=searched,
            on_chunk=_search_progress(searched, len(queries), query_chunk_size, kept),
            mesh=sharding.make_mesh({"data": -1}))

    # ---- the output, in one piece ------------------------------------------------------------------------
    rows = pair_rows(inputs, negatives)
    if output_format == "labeled-list":
        rows = labeled_lists(inputs.pairs, rows)
    files.write_bytes(out_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
    partial.remove()
    short = sum(len(n) < num_negatives for n in negatives)
    advice = f"; {short} got fewer than {num_negatives} (raise range_max or loosen the margins)" if short else ""
    console.say(f"wrote {out_path}: {sum(map(len, negatives))} negatives for {len(queries)} queries{advice}")
    return {"pairs": len(inputs.pairs), "queries": len(queries), "corpus": len(corpus),
            "negatives": sum(map(len, negatives)), "short": short}


def _keeper(preemption: Preemption, partial: Partial, on_part):
    """kept(stage, done, total), called after each part is kept: on_part's call, then the run stopped
    (start.Stopped) where SIGTERM or Ctrl-C asked for it, its work left in partial for the same command."""

    def kept(stage: str, done: int, total: int) -> None:
        if on_part is not None:
            on_part(stage, done, total)
        if preemption.should_stop(0):
            console.say(f"mining: {preemption.name}: stopped; the finished work is kept in {partial.directory}: "
                        f"the same command continues from it")
            raise start.Stopped(done, preemption.exit_code)
    return kept


def _search_progress(searched: SearchParts, total: int, chunk: int, kept):
    """mine_negatives' on_chunk: a progress line where one is due (the kept chunks counted as done), then kept."""
    progress = Progress("queries searched", total, searched.done(total, chunk))

    def chunk_done(done: int, total: int) -> None:
        progress.advance_to(done)
        kept("search", done, total)
    return chunk_done


def pair_rows(inputs: Inputs, negatives: list[list[int]]) -> list[dict]:
    """The pairs file's objects as written, each with `negatives`: those it gave (a `negative` of its own
    folded in), then its query's mined ones (negatives: corpus rows per query) it did not give."""
    query_index = {text: i for i, text in enumerate(inputs.queries)}
    rows = []
    for obj, p in zip(inputs.lines, inputs.pairs):
        given = list(p.negatives)
        mined = [inputs.corpus[i] for i in negatives[query_index[p.query]] if inputs.corpus[i] not in given]
        rows.append({**{key: value for key, value in obj.items() if key != "negative"}, "negatives": given + mined})
    return rows


def labeled_lists(pairs: list, rows: list[dict]) -> list[dict]:
    """pair_rows' rows (of these pairs) as a reranker's, one per query in the order the queries first come:
    {"query", "passages": its positives then its negatives, "labels": 1 for each positive, 0 for each
    negative}, each text once. A query with no negative is left out (its list would rank nothing), as
    sentence-transformers' labeled-list leaves it out; a query of several lines is one row, not one per
    positive as there, since the reranker's data takes one row a query."""
    lists: dict[str, tuple[dict, dict]] = {}
    for p, row in zip(pairs, rows):
        positives, negatives = lists.setdefault(p.query, ({}, {}))
        positives[p.positive] = None
        negatives.update(dict.fromkeys(row["negatives"]))
    out = []
    for query, (positives, negatives) in lists.items():
        negatives = [text for text in negatives if text not in positives]
        if negatives:
            out.append({"query": query, "passages": [*positives, *negatives],
                        "labels": [1] * len(positives) + [0] * len(negatives)})
    if not out:  # never a silent empty file: the kept work stays for a rerun with looser settings
        raise ValueError("no query kept a negative, so the labeled lists would be empty: loosen --relative_margin, "
                         "--absolute_margin or the score bounds, or raise --range_max")
    return out
