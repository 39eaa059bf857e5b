"""Hard negatives added to a pairs file: python -m bertjax.mine's run.

The pairs are read and checked, the corpus is read (the pairs' own positives where none is given), every
distinct query and corpus text is embedded by the model (its query and document prompts), each query's
negatives are mined (tasks/mining.py: sentence-transformers' mine_hard_negatives), and the pairs are
written again with `negatives` added, in one piece: a failure leaves no output file.

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

DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # the prompt names sentence-transformers' encode_document tries
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
    prompts = model.embedding.prompts if model.embedding else {}
    document = next((name for name in DOCUMENT_PROMPTS if name in prompts), None)

    def embed(texts, kind):  # as sentence-transformers' encode_query and encode_document
        if kind == "query":
            return model.embed(texts, task="query", batch_size=batch_size)
        return model.embed(texts, prompt_name=document, batch_size=batch_size)
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


def mine(model_path: str, pairs_path: str, out_path: str, *, corpus_path: str | None = None, num_negatives: int = 3,
         range_min: int = 0, range_max: int | None = None, absolute_margin: float | None = None,
         relative_margin: float | None = None, max_score: float | None = None, min_score: float | None = None,
         sampling: str = "top", seed: int = 0, batch_size: int = 64, shard_size: int = SHARD_SIZE,
         query_chunk_size: int = mining.QUERY_CHUNK_SIZE, on_part=None) -> dict:
    """Write out_path: the pairs of pairs_path, each with its query's mined negatives after any it had.
    Returns {"pairs", "queries", "corpus", "negatives", "short"} (short: queries given fewer than
    num_negatives). shard_size: texts embedded per kept part (whole batches); query_chunk_size: queries
    searched per kept part. on_part(stage, done, total): called after each part is kept, stage being
    "query", "corpus" or "search"."""
    # ---- the pairs, the corpus and the settings ------------------------------------------------------
    pairs = contrastive.read_pairs(pairs_path, "mnrl")
    lines = [obj for _, obj in readers.json_lines(pairs_path)]
    corpus = read_corpus(corpus_path) if corpus_path else []
    if corpus_path and not corpus:
        raise ValueError(f"--corpus={corpus_path}: no texts to mine negatives from")
    corpus = list(dict.fromkeys(corpus + [p.positive for p in pairs]))  # the positives always in it, once
    row = {text: i for i, text in enumerate(corpus)}
    queries = list(dict.fromkeys(p.query for p in pairs))
    query_index = {text: i for i, text in enumerate(queries)}
    positive_ids = [[] for _ in queries]
    for p in pairs:
        positive_ids[query_index[p.query]].append(row[p.positive])
    if len(corpus) < 2:
        raise ValueError(f"{pairs_path}: the corpus holds {len(corpus)} text: negatives need more than the "
                         f"positives (give --corpus=FILE)")
    filtered = absolute_margin is not None or relative_margin is not None or max_score is not None
    range_max = mining.check_settings(positive_ids, len(corpus), range_min=range_min, range_max=range_max,
                                      num_negatives=num_negatives, sampling=sampling, filtered=filtered)
    if batch_size < 1 or shard_size < 1 or query_chunk_size < 1:
        raise ValueError(f"batch_size={batch_size}, shard_size={shard_size}, query_chunk_size={query_chunk_size}: "
                         f"each at least 1")
    shard_size = max(batch_size, shard_size // batch_size * batch_size)  # whole batches: the same as unsharded
    console.say(f"mining: {len(pairs)} pairs, {len(queries)} distinct queries, a corpus of {len(corpus)} texts")

    # ---- the work kept from an interrupted run, and the model -------------------------------------------
    partial = Partial(f"{out_path}.partial", dict(
        model=_stamp(model_path), pairs=_stamp(pairs_path), corpus=_stamp(corpus_path) if corpus_path else None,
        batch_size=batch_size, shard_size=shard_size, query_chunk_size=query_chunk_size, range_max=range_max))
    model = inference.load(model_path)
    with Preemption() as preemption:

        def kept(stage: str, done: int, total: int) -> None:
            if on_part is not None:
                on_part(stage, done, total)
            if preemption.should_stop(0):
                console.say(f"mining: {preemption.name}: stopped; the finished work is kept in {partial.directory}: "
                            f"the same command continues from it")
                raise start.Stopped(done, preemption.exit_code)

        # ---- embeddings -------------------------------------------------------------------------------
        embed = _embedder(model, batch_size)
        query_embeddings = embed_in_parts(embed, queries, "query", batch_size, shard_size, partial, "query", kept)
        corpus_embeddings = embed_in_parts(embed, corpus, "document", batch_size, shard_size, partial, "corpus",
                                           kept)

        # ---- mining -----------------------------------------------------------------------------------
        searched = SearchParts(partial)
        progress = Progress("queries searched", len(queries), searched.done(len(queries), query_chunk_size))

        def chunk_done(done: int, total: int) -> None:
            progress.advance_to(done)
            kept("search", done, total)

        negatives = mining.mine_negatives(
            query_embeddings, corpus_embeddings, positive_ids, range_min=range_min, range_max=range_max,
            max_score=max_score, min_score=min_score, absolute_margin=absolute_margin,
            relative_margin=relative_margin, num_negatives=num_negatives, sampling=sampling, seed=seed,
            exclude=[row.get(q, -1) for q in queries], query_chunk_size=query_chunk_size, searched=searched,
            on_chunk=chunk_done, mesh=sharding.make_mesh({"data": -1}))

    # ---- the pairs written with their negatives --------------------------------------------------------
    out = []
    for obj, p in zip(lines, pairs):
        given = list(p.negatives)
        mined = [corpus[i] for i in negatives[query_index[p.query]] if corpus[i] not in given]
        record = {key: value for key, value in obj.items() if key != "negative"}
        out.append(json.dumps({**record, "negatives": given + mined}, ensure_ascii=False) + "\n")
    files.write_bytes(out_path, "".join(out).encode("utf-8"))
    partial.remove()
    short = sum(len(n) < num_negatives for n in negatives)
    advice = f"; {short} got fewer than {num_negatives} (raise range_max or loosen the margins)" if short else ""
    console.say(f"wrote {out_path}: {sum(map(len, negatives))} negatives for {len(queries)} queries{advice}")
    return {"pairs": len(pairs), "queries": len(queries), "corpus": len(corpus),
            "negatives": sum(map(len, negatives)), "short": short}
