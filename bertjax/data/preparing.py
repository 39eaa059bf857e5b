"""Tokenize and index a corpus once, into memory-mappable shards: what python -m bertjax.prepare does
(its run: bertjax/runs/corpus_preparation.py), a library that tests and notebooks call too.

Output shard k holds the documents of input files j with j % num_shards == k (or, with fewer files
than shards, of documents i with i % num_shards == k; each backend of bertjax/data/backends says how it
splits: Parquet by row groups where it can, TFDS by the k-th of num_shards even splits),
divided into train and eval by the same stable hash as the in-memory path. The shards are written by a
pool of worker processes (num_workers=0: in this process); on many hosts each host writes the shards k
with k % process_count == process_index, which are the shards it reads when training.

Progress (documents, tokens, MB of raw text, MB/s, ETA where the input's size is known) is logged every
progress_seconds. A rerun with the same settings skips the shards that are complete (their files are
written beside and renamed), so a run killed at any point and started again ends with the files an
uninterrupted run writes.
"""

import concurrent.futures
import multiprocessing
import os
import queue
import shutil
import time

import numpy as np
from absl import logging

from bertjax.data import backends, prepared, splits
from bertjax.data.backends.backend import BadRows
from bertjax.data.corpus import corpus_from_lengths
from bertjax.data.settings import DataSettings
from bertjax.text import files, sentences, tokenizers

# Sentences tokenized per TensorFlow call in a worker, and so per progress report.
BATCH_SENTENCES = 4096
# A worker's progress reports go here: the pool's queue in a worker, a local one in this process.
_progress = None


def _set_progress_queue(q) -> None:
    global _progress
    _progress = q


def _tokenize(documents: list[list[str]], tokenizer, shard: int):
    """corpus.tokenize_documents, reporting (shard, documents, tokens, bytes of text) after each batch.
    -> (flat token ids, sentence lengths, sentence -> document), or None without a non-empty sentence."""
    values, lengths, doc_of_sentence = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    first = 0
    while first < len(documents):
        last, batch = first, []
        while last < len(documents) and (not batch or len(batch) + len(documents[last]) <= BATCH_SENTENCES):
            batch.extend(documents[last])
            last += 1
        ragged = tokenizer.tokenize(batch)  # [n] strings -> ragged ids
        values.append(ragged.flat_values.numpy())
        lengths.append(np.diff(ragged.row_splits.numpy()))
        doc_of_sentence.append(np.repeat(np.arange(first, last), [len(d) for d in documents[first:last]]))
        num_bytes = sum(len(s.encode("utf-8")) + 1 for s in batch)  # + 1: the line break
        if _progress is not None:
            _progress.put((shard, last - first, len(values[-1]), num_bytes))
        first = last
    lengths = np.concatenate(lengths)
    if not lengths.sum():
        return None
    return np.concatenate(values), lengths, np.concatenate(doc_of_sentence)


def prepare_shard(settings: DataSettings, shard: int, num_shards: int, output_dir: str, dtype: str) -> dict:
    """Read, split, tokenize and write one output shard (both splits). Runs in a worker process.
    -> {split: (documents, sentences, tokens)}, "bytes": raw text read, "bad_rows": BadRows,
    "seconds": time taken."""
    start = time.perf_counter()
    tokenizer = tokenizers.load_tokenizer(settings.tokenizer, settings.vocab_path, lower_case=settings.lower_case)
    bad_rows = BadRows()  # table rows that are not text: skipped, counted, the first few named
    documents = backends.shard_documents(settings, shard, num_shards, bad_rows=bad_rows)
    held_out = [splits.is_eval_document(d, settings.eval_fraction) for d in documents]  # one hash per document
    result = {"bytes": sum(len(s.encode("utf-8")) + 1 for d in documents for s in d), "bad_rows": bad_rows}
    for split in prepared.SPLITS:
        docs = [d for d, e in zip(documents, held_out) if e == (split == "eval")]
        tokenized = _tokenize(docs, tokenizer, shard)
        corpus = corpus_from_lengths(*tokenized, tokenizer.vocab_size) if tokenized else None
        prepared.write_shard(output_dir, split, shard, num_shards, corpus, np.dtype(dtype))
        result[split] = prepared.shard_counts(output_dir, split, shard, num_shards)
    result["seconds"] = time.perf_counter() - start
    return result


def input_bytes(settings: DataSettings) -> int | None:
    """The size of the raw text to read, where the file sizes tell it (plain text files); else None."""
    if settings.source != "text":
        return None
    total = 0
    for path in files.expand_pattern(settings.input_pattern):
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":  # gzip: its size on disk says little about its text
                return None
        total += os.path.getsize(path)
    return total


class Progress:
    """Sums the workers' reports; a line every `every` seconds: documents, tokens, MB, MB/s, ETA."""

    def __init__(self, total_bytes: int | None, every: float):
        self.total_bytes, self.every = total_bytes, every
        self.documents = self.tokens = self.bytes = self.logged_bytes = 0
        self.start = self.last = time.perf_counter()

    def add(self, documents: int, tokens: int, num_bytes: int) -> None:
        self.documents += documents
        self.tokens += tokens
        self.bytes += num_bytes

    def maybe_log(self) -> None:
        """A line when `every` seconds have passed and text was read since the last one (or a minute
        has passed: the workers may be reading a large shard before tokenizing it)."""
        now = time.perf_counter()
        if now - self.last < self.every or (self.bytes == self.logged_bytes and now - self.last < 60):
            return
        self.last, self.logged_bytes = now, self.bytes
        rate = self.bytes / 1e6 / max(now - self.start, 1e-9)
        eta = ""
        if self.total_bytes and rate > 0:
            eta = (f", ETA {max(self.total_bytes - self.bytes, 0) / 1e6 / rate:,.0f}s"
                   f" of {self.total_bytes / 1e6:,.1f} MB")
        logging.info("prepare: %s documents, %s tokens, %.1f MB of raw text read, %.2f MB/s%s",
                     f"{self.documents:,}", f"{self.tokens:,}", self.bytes / 1e6, rate, eta)


def corpus_metadata(settings: DataSettings, vocab_name: str, num_shards: int, dtype: np.dtype) -> dict:
    """What the shards are a function of: a rerun into the same directory must have the same."""
    backend = backends.get(settings.source)
    source = {"source": settings.source, "sentence_splitter": settings.sentence_splitter}
    source.update({key: getattr(settings, key) for key in backend.keys
                   if key not in backend.cache_keys and getattr(settings, key) is not None})
    return dict(format_version=prepared.FORMAT_VERSION, tokenizer=settings.tokenizer, vocab=vocab_name,
                lower_case=settings.lower_case, num_shards=num_shards, eval_fraction=settings.eval_fraction,
                dtype=dtype.name, data=source)


def check_resumable(output_dir: str, meta: dict, vocab_path: str) -> None:
    """An output directory with shards of other settings is refused, not mixed into."""
    path = os.path.join(output_dir, prepared.METADATA)
    if not os.path.exists(path):
        return
    try:
        old = prepared.read_metadata(output_dir)
    except ValueError:
        raise ValueError(f"--output_dir={output_dir} holds a corpus of the older TFRecord format: use a fresh "
                         f"--output_dir") from None
    changed = [f"{k}={old.get(k)!r} (now {meta[k]!r})" for k in meta if old.get(k) != meta[k]]
    copy = os.path.join(output_dir, meta["vocab"])
    if not changed and os.path.exists(copy):
        with open(copy, "rb") as a, open(vocab_path, "rb") as b:
            if a.read() != b.read():
                changed.append(f"the vocabulary {meta['vocab']}")
    if changed:
        raise ValueError(f"--output_dir={output_dir} was prepared with other settings ({', '.join(changed)}): use a "
                         f"fresh --output_dir, or the same settings to finish it")


def run(settings: DataSettings, output_dir: str, *, num_shards: int, num_workers: int, process_index: int = 0,
        process_count: int = 1, progress_seconds: float = 5.0) -> dict:
    """Prepare this host's shards of the settings' source into output_dir, skipping the complete ones.

    Returns the totals {split: [documents, sentences, tokens]}, "bytes", "worker_seconds", "seconds",
    "shards", "skipped", "bad_rows" (a BadRows over the shards written now, in shard order).
    Raises ValueError (or FileNotFoundError) for input a user must change.
    """
    meta = _start(settings, output_dir, num_shards=num_shards, process_index=process_index,
                  process_count=process_count)
    shards = list(splits.share(range(num_shards), process_index, process_count))
    todo = [k for k in shards if not prepared.shard_complete(output_dir, k, num_shards)]
    if len(todo) < len(shards):
        logging.info("prepare: %d of %d shards are complete already; preparing the other %d",
                     len(shards) - len(todo), len(shards), len(todo))
    totals = {split: np.zeros(3, np.int64) for split in prepared.SPLITS}
    for k in set(shards) - set(todo):
        for split in prepared.SPLITS:
            totals[split] += prepared.shard_counts(output_dir, split, k, num_shards)
    start = time.perf_counter()
    progress = Progress(input_bytes(settings), progress_seconds)
    results = _write_shards(settings, output_dir, todo, num_shards, meta["dtype"], num_workers, progress)
    for result in results.values():
        for split in prepared.SPLITS:
            totals[split] += result[split]
    if not any(totals[split][0] for split in prepared.SPLITS):
        raise ValueError(f"the corpus ({settings.source} {settings.input_pattern or settings.tfds_name or ''}) "
                         f"holds no document with a token for host {process_index}'s shards: check the input")
    if all(prepared.shard_complete(output_dir, k, num_shards) for k in range(num_shards)):
        _write_counts(output_dir, num_shards, meta)
    merged = BadRows()
    for k in sorted(results):
        merged.count += results[k]["bad_rows"].count
        merged.first += results[k]["bad_rows"].first[:merged.keep - len(merged.first)]
    return dict({split: totals[split].tolist() for split in prepared.SPLITS}, shards=len(shards),
                skipped=len(shards) - len(todo), seconds=time.perf_counter() - start, bad_rows=merged,
                bytes=sum(r["bytes"] for r in results.values()),
                worker_seconds=sum(r["seconds"] for r in results.values()))


def _start(settings: DataSettings, output_dir: str, *, num_shards: int, process_index: int,
           process_count: int) -> dict:
    """The checks that need no worker, then the directory with its vocabulary and metadata.json (whose
    dict is returned); a directory of other settings is refused."""
    if not output_dir:
        raise ValueError("--output_dir is required")
    if not settings.vocab_path:
        raise ValueError("prepare needs --config.data.vocab_path: learn one first with "
                         "python -m bertjax.vocab train --input=... --vocab_size=... --out=...")
    if not os.path.exists(settings.vocab_path):
        raise FileNotFoundError(f"data.vocab_path={settings.vocab_path} does not exist")
    sentences.get_splitter(settings.sentence_splitter)  # here, not in a worker: a missing package is one line
    if num_shards < 1 or num_shards % process_count:
        raise ValueError(f"--num_shards={num_shards} must be a positive multiple of --process_count={process_count}")
    if not 0 <= process_index < process_count:
        raise ValueError(f"--process_index={process_index} must lie in [0, --process_count={process_count})")
    tokenizer = tokenizers.load_tokenizer(settings.tokenizer, settings.vocab_path, lower_case=settings.lower_case)
    vocab_name = os.path.basename(settings.vocab_path)
    meta = corpus_metadata(settings, vocab_name, num_shards, prepared.token_dtype(tokenizer.vocab_size))
    check_resumable(output_dir, meta, settings.vocab_path)
    os.makedirs(output_dir, exist_ok=True)
    if process_index == 0:
        shutil.copy(settings.vocab_path, os.path.join(output_dir, vocab_name))
        if not os.path.exists(os.path.join(output_dir, prepared.METADATA)):
            prepared.write_metadata(output_dir, meta)
    return meta


def _write_shards(settings: DataSettings, output_dir: str, todo: list[int], num_shards: int, dtype: str,
                  num_workers: int, progress: Progress) -> dict[int, dict]:
    """prepare_shard of each shard of `todo`, in a pool of worker processes (or this one: num_workers=0),
    with their progress logged. -> {shard: its result}."""
    results = {}

    def drain(reports):
        while True:
            try:
                _, documents, tokens, num_bytes = reports.get_nowait()
            except queue.Empty:
                return
            progress.add(documents, tokens, num_bytes)

    if num_workers == 0:
        reports = queue.SimpleQueue()
        _set_progress_queue(reports)
        try:
            for k in todo:
                results[k] = prepare_shard(settings, k, num_shards, output_dir, dtype)
                drain(reports)
                progress.maybe_log()
        finally:
            _set_progress_queue(None)
    elif todo:
        # Spawned, not forked: TensorFlow's runtime does not survive a fork.
        context = multiprocessing.get_context("spawn")
        reports = context.Queue()
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(num_workers, len(todo)), mp_context=context,
                                                    initializer=_set_progress_queue, initargs=(reports,)) as pool:
            shard_of = {pool.submit(prepare_shard, settings, k, num_shards, output_dir, dtype): k for k in todo}
            pending = set(shard_of)
            try:
                while pending:
                    complete, pending = concurrent.futures.wait(pending, timeout=min(max(progress.every, 0.1), 1))
                    drain(reports)
                    for future in complete:
                        results[shard_of[future]] = future.result()
                    progress.maybe_log()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    return results


def _write_counts(output_dir: str, num_shards: int, meta: dict) -> None:
    """The counts into metadata.json, once every host's shards are in: the same bytes however the run was
    cut up."""
    counts = {split: dict(documents=0, sentences=0, tokens=0) for split in prepared.SPLITS}
    for k in range(num_shards):
        for split in prepared.SPLITS:
            for key, n in zip(("documents", "sentences", "tokens"),
                              prepared.shard_counts(output_dir, split, k, num_shards)):
                counts[split][key] += n
    prepared.write_metadata(output_dir, {**meta, "counts": counts})

