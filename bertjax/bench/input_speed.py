"""The input pipeline's examples per second, per CPU core, its real-token shares, a mapped corpus's memory
and the masking strategies' cost: python -m bertjax.throughput's run (the program's docstring says what
each measurement reads and prints; docs/data.md records the figures).
"""

import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from bertjax.data import demo, prepared, units
from bertjax.data.backends import text_files
from bertjax.data.corpus import TokenizedCorpus, tokenize_documents
from bertjax.data.masking import MaskingSpec
from bertjax.data.stream import PretrainingStream
from bertjax.runs import console
from bertjax.text import files, tokenizers
from bertjax.text import vocab_learning as vocabularies

# (max_seq_length, max_predictions_per_seq, max_sequences_per_row): BERT's two phases, with the
# packing defaults of configs/common.py (K 8 at 128, the seq-512 recipe's 16).
SHAPES = ((128, 20, 8), (512, 80, 16))


@dataclasses.dataclass(frozen=True)
class Options:
    """How much each measurement reads: the program's flags of the same names."""
    num_examples: int = 20_000  # examples (packed: rows) timed per measurement
    batch_size: int = 256
    efficiency_batches: int = 100  # batches the real-token share is taken over (at most one epoch)
    memory_tokens: int = 200_000_000  # tokens of the large mapped corpus
    memory_batches: int = 100  # batches each memory run draws
    objective: str = "nsp"  # the memory runs' objective
    masking_rounds: int = 5
    masking_lexicon_size: int = 2000  # units in the lexicon of units masking


def throughput(input_pattern: str | None = None, vocab_path: str | None = None, options: Options = Options(), *,
               memory: bool = False, masking: bool = False) -> None:
    """Print the tables of the text files' corpus (the demo corpus without input_pattern): the streams'
    throughput and real-token shares and the resume timings; or the memory comparison (memory); or the
    masking strategies against token masking (masking). Without vocab_path, a vocabulary is learned first."""
    if input_pattern:
        documents = list(text_files.read_text_documents(files.expand_pattern(input_pattern), "sentences"))
    else:
        documents = demo.demo_documents()
    tmp = tempfile.mkdtemp(prefix="bertjax-data-benchmark-")
    try:
        if not vocab_path:
            vocab_path = vocabularies.learn_wordpiece_vocab(
                (s for d in documents for s in d), 8192, True, os.path.join(tmp, "vocab.txt"))
        tokenizer = tokenizers.load_tokenizer("wordpiece", vocab_path)
        num_sentences = sum(len(d) for d in documents)
        print(f"corpus: {len(documents)} documents, {num_sentences} sentences; cores: {os.cpu_count()}")
        start = time.perf_counter()
        corpus = tokenize_documents(documents, tokenizer)
        tokenize_s = time.perf_counter() - start
        print(f"tokenization: {num_sentences / tokenize_s:,.0f} sentences/s ({len(corpus.tokens):,} tokens in "
              f"{tokenize_s:.1f}s, all cores)")
        if memory:
            memory_benchmark(corpus, vocab_path, tokenizer.vocab_size, options)
            return
        # Once, as python -m bertjax.prepare writes it: the prepared stream reads these shards.
        write_repeated(tmp, corpus, len(corpus.tokens), vocab_path, tokenizer.vocab_size)
        if masking:
            masking_table(documents, tokenizer, tmp, options)
            return
        throughput_table(documents, tokenizer, tmp, options)
        efficiency_table(tokenizer, tmp, options)
        resume_timings(tokenizer, tmp, options.batch_size)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------
# --masking: each masking strategy's examples/s as a ratio to token masking's
# ----------------------------------------------------------------------------------------------------


def frequent_phrases(documents, size: int) -> list[str]:
    """The corpus's `size` most frequent word pairs and triples: a lexicon for units masking."""
    counts = {}
    for document in documents:
        for sentence in document:
            words = sentence.lower().split()
            for n in (2, 3):
                for i in range(len(words) - n + 1):
                    phrase = " ".join(words[i:i + n])
                    counts[phrase] = counts.get(phrase, 0) + 1
    return [phrase for phrase, _ in sorted(counts.items(), key=lambda item: -item[1])[:size]]


def masking_table(documents, tokenizer, directory: str, options: Options) -> None:
    """Examples/s of the prepared stream at seq 128, one thread, per masking strategy, against token's."""
    phrases = frequent_phrases(documents, options.masking_lexicon_size)
    unit_hashes, unit_max_words = units.lexicon_units(tokenizer.encode_arrays(phrases),
                                                      np.asarray(tokenizer.word_start, bool), units.MAX_UNIT_WORDS)
    corpus = prepared.load_corpus(directory, "train", 0, 1)
    streams = {}
    for name in ("token", "whole_word", "span", "ngram", "units"):
        spec = MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=20, masking=name,
                                          unit_hashes=unit_hashes, unit_max_words=unit_max_words)
        streams[name] = PretrainingStream(corpus, spec, seed=0, max_seq_length=128)
    ratios = {name: [] for name in streams}
    rates = {name: [] for name in streams}
    for _ in range(options.masking_rounds):
        token_rate = None
        for name, stream in streams.items():
            _, _, rate = measure(stream, options.num_examples, options.batch_size, 1)  # per CPU second: load cancels
            token_rate = token_rate or rate
            ratios[name].append(rate / token_rate)
            rates[name].append(rate)
    print(f"masking strategies, seq 128, one thread, {options.masking_rounds} rounds of {options.num_examples:,} "
          f"examples ({len(phrases):,} lexicon units, up to {unit_max_words} words):")
    print(f"{'masking':>10} {'per cpu-s':>11} {'/ token (median)':>17} {'min':>6} {'max':>6}")
    for name in streams:
        print(f"{name:>10} {np.median(rates[name]):>11,.0f} {np.median(ratios[name]):>17.2f} "
              f"{min(ratios[name]):>6.2f} {max(ratios[name]):>6.2f}")


# ----------------------------------------------------------------------------------------------------
# --memory: a large prepared corpus, mapped, against a small one in RAM
# ----------------------------------------------------------------------------------------------------


def write_repeated(directory: str, corpus, num_tokens: int, vocab_path: str, vocab_size: int,
                   num_shards: int = 1) -> int:
    """A prepared corpus of the corpus's documents repeated until it holds at least num_tokens tokens,
    whole repeats dealt to num_shards shards, written array by array through np.lib.format.open_memmap
    (never whole in RAM); the held-out split is the corpus once, in shard 0. Returns its training tokens."""
    os.makedirs(directory, exist_ok=True)
    repeats = max(num_shards, -(-num_tokens // len(corpus.tokens)))
    dtype = prepared.token_dtype(vocab_size)
    arrays = {"tokens": (corpus.tokens.astype(dtype), len(corpus.tokens), dtype),
              "sentence_starts": (corpus.sentence_starts[:-1], corpus.sentence_starts[-1], np.int64),
              "doc_starts": (corpus.doc_starts[:-1], corpus.doc_starts[-1], np.int64)}
    for k in range(num_shards):
        count = len(range(k, repeats, num_shards))
        for name, (block, shift, array_dtype) in arrays.items():
            ends_with_total = name != "tokens"  # offsets: S + 1 (D + 1) entries, the last the total
            out = np.lib.format.open_memmap(prepared.array_path(directory, "train", k, num_shards, name), mode="w+",
                                            dtype=array_dtype, shape=(count * len(block) + ends_with_total,))
            for r in range(count):
                out[r * len(block):(r + 1) * len(block)] = block + (r * shift if ends_with_total else 0)
            if ends_with_total:
                out[-1] = count * shift
            out.flush()
            del out
        prepared.write_shard(directory, "eval", k, num_shards, corpus if k == 0 else None, dtype)
    if os.path.abspath(vocab_path) != os.path.abspath(os.path.join(directory, "vocab.txt")):
        shutil.copy(vocab_path, os.path.join(directory, "vocab.txt"))
    prepared.write_metadata(directory, dict(format_version=prepared.FORMAT_VERSION, tokenizer="wordpiece",
                                            vocab="vocab.txt", lower_case=True, num_shards=num_shards,
                                            eval_fraction=0.0, dtype=dtype.name))
    return repeats * len(corpus.tokens)


def memory_run(directory: str, in_memory: bool, objective: str, batch_size: int, num_batches: int) -> dict:
    """In this (fresh) process: the stream of the prepared corpus's training split, mapped or loaded
    into RAM; num_batches drawn. -> peak RSS (from the corpus on: with the plan built, and after the
    batches), examples/s (wall and per CPU second), setup seconds."""
    start = time.perf_counter()
    meta = prepared.read_metadata(directory)
    tokenizer = tokenizers.load_tokenizer(meta["tokenizer"], prepared.vocab_file(directory, meta))
    # The peak from here on: importing TensorFlow and loading the tokenizer peak higher than the data
    # work of a small corpus, and would hide it (Linux: "5" resets the high-water mark).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    corpus = prepared.load_corpus(directory, "train", 0, 1)
    if in_memory:  # today's in-memory path: the arrays read whole into RAM
        corpus = TokenizedCorpus(np.array(corpus.tokens), np.array(corpus.sentence_starts), np.array(corpus.doc_starts))
    spec = MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=20)
    stream = PretrainingStream(corpus, spec, seed=0, max_seq_length=128, objective=objective)
    built_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the plan built, no batch yet
    batches = stream.dataset(batch_size).as_numpy_iterator()
    next(batches)
    setup = time.perf_counter() - start
    begin, begin_cpu = time.perf_counter(), time.process_time()
    for _ in range(num_batches):
        next(batches)
    seconds, cpu = time.perf_counter() - begin, time.process_time() - begin_cpu
    return dict(peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, built_rss_mb=built_rss,
                setup_s=setup,
                examples_per_s=num_batches * batch_size / seconds, examples_per_cpu_s=num_batches * batch_size / cpu,
                tokens=len(corpus.tokens), sentences=corpus.num_sentences, in_memory=corpus.in_memory)


def memory_benchmark(corpus, vocab_path: str, vocab_size: int, options: Options) -> None:
    """--memory: write the two corpora, measure each in a fresh process, print the comparison."""
    tmp = tempfile.mkdtemp(prefix="bertjax-memory-benchmark-")
    try:
        start = time.perf_counter()
        large = write_repeated(os.path.join(tmp, "large"), corpus, options.memory_tokens, vocab_path, vocab_size)
        small = write_repeated(os.path.join(tmp, "small"), corpus, 1_000_000, vocab_path, vocab_size)
        write_repeated(os.path.join(tmp, "sharded"), corpus, 1_000_000, vocab_path, vocab_size, num_shards=4)
        print(f"wrote prepared corpora of {large:,} and {small:,} tokens (the second also as 4 shards) in "
              f"{time.perf_counter() - start:.1f}s")
        results = {}
        for name, directory, in_memory in (("mapped, large", "large", False), ("mapped, 1M", "small", False),
                                           ("4 maps, 1M", "sharded", False), ("in memory, 1M", "small", True)):
            code = ("import json, sys; from bertjax.bench import input_speed; "
                    "print(json.dumps(input_speed.memory_run(*json.loads(sys.argv[1]))))")
            argv = json.dumps([os.path.join(tmp, directory), in_memory, options.objective, options.batch_size,
                               options.memory_batches])
            done = subprocess.run([sys.executable, "-c", code, argv], capture_output=True, text=True)
            if done.returncode:
                console.fail(f"the {name} run failed: {done.stderr.strip().splitlines()[-1]}")
            results[name] = r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name:>14}: {r['tokens']:>11,} tokens, {r['sentences']:>10,} sentences: peak RSS "
                  f"{r['built_rss_mb']:>6,.0f} MB with the plan, {r['peak_rss_mb']:>6,.0f} MB after the batches, "
                  f"{r['examples_per_s']:>6,.0f} examples/s "
                  f"({r['examples_per_cpu_s']:,.0f} per CPU-s), {r['setup_s']:.1f}s to the first batch")
        print(f"objective {options.objective}, {options.memory_batches} batches of {options.batch_size}, seq 128")
        for key, when in (("built_rss_mb", "with the plan built"), ("peak_rss_mb", "after the batches")):
            grown = results["mapped, large"][key] - results["mapped, 1M"][key]
            print(f"RSS(large) - RSS(1M), mapped, peak {when}: {grown:,.0f} MB (target < 1,024 MB)")
        for key, unit in (("examples_per_s", "examples/s"), ("examples_per_cpu_s", "examples per CPU-s")):
            loaded = results["in memory, 1M"][key]
            for name in ("mapped, 1M", "4 maps, 1M"):
                print(f"{unit}, 1M corpus: {name.split(',')[0]} {results[name][key]:,.0f} / in memory "
                      f"{loaded:,.0f} = {results[name][key] / loaded:.2f}x (target >= 0.9x)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(stream, num_rows: int, batch_size: int, threads: int | None) -> tuple[float, float, float]:
    """(examples/s, rows/s, examples per CPU second) once the pipeline is warm. Rows and examples are
    the same unless the stream packs. CPU seconds are the process's, all threads: a figure that holds on
    a machine shared with other work, where wall-clock rates do not."""
    batches = iter(stream.dataset(batch_size, threads=threads).as_numpy_iterator())
    next(batches)  # first batch: plan and tracing, not throughput
    steps = max(1, num_rows // batch_size)
    examples = 0
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        batch = next(batches)
        examples += int(batch["sentence_weights"].sum()) if stream.packing else batch_size
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    return examples / seconds, steps * batch_size / seconds, examples / cpu_seconds


def real_token_share(stream, batch_size: int, num_batches: int) -> float:
    """The share of positions that are real tokens in the stream's first num_batches batches (at most
    one epoch's rows): input_mask.mean() over them, counted from the plans without building a batch."""
    return stream.real_token_share(min(num_batches * batch_size, stream.rows_per_epoch))


def throughput_table(documents, tokenizer, directory: str, options: Options) -> None:
    """Examples/s of the prepared, raw-text and packed streams at each shape, on one thread and on all."""
    print(f"{'seq':>4} {'source':>9} {'threads':>8} {'examples/s':>11} {'per core':>9} {'rows/s':>8} "
          f"{'per cpu-s':>10}  plan build")
    for seq, predictions, per_row in SHAPES:
        spec = MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=predictions)
        for source in ("prepared", "raw text", "packed"):
            start = time.perf_counter()
            if source == "raw text":
                source_corpus = tokenize_documents(documents, tokenizer)
            else:
                source_corpus = prepared.load_corpus(directory, "train", 0, 1)
            stream = PretrainingStream(source_corpus, spec, seed=0, max_seq_length=seq,
                                       packing=source == "packed", max_sequences_per_row=per_row)
            setup_s = time.perf_counter() - start
            for threads in (1, os.cpu_count()):
                rate, rows, per_cpu = measure(stream, options.num_examples, options.batch_size, threads)
                print(f"{seq:>4} {source:>9} {threads:>8} {rate:>11,.0f} {rate / threads:>9,.0f} {rows:>8,.0f} "
                      f"{per_cpu:>10,.0f}  "
                      f"{setup_s:.2f}s to examples ({stream.examples_per_epoch:,} examples, "
                      f"{stream.rows_per_epoch:,} rows/epoch)")


def efficiency_table(tokenizer, directory: str, options: Options) -> None:
    """Packing efficiency: the share of positions that are real tokens, unpacked and packed, by objective."""
    print(f"\nreal tokens / positions over the first {options.efficiency_batches} batches of {options.batch_size} "
          f"(or one epoch, if shorter):")
    print(f"{'seq':>4} {'objective':>9} {'unpacked':>9} {'packed':>7} {'rows':>7} {'examples':>9}")
    corpus = prepared.load_corpus(directory, "train", 0, 1)
    for seq, predictions, per_row in SHAPES:
        spec = MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=predictions)
        for objective in ("nsp", "sop", "none"):
            shares = []
            for packing in (False, True):
                stream = PretrainingStream(corpus, spec, seed=0, max_seq_length=seq, objective=objective,
                                           packing=packing, max_sequences_per_row=per_row)
                shares.append(real_token_share(stream, options.batch_size, options.efficiency_batches))
            print(f"{seq:>4} {objective:>9} {shares[0]:>9.1%} {shares[1]:>7.1%} {stream.rows_per_epoch:>7,} "
                  f"{stream.examples_per_epoch:>9,}")


def resume_timings(tokenizer, directory: str, batch_size: int) -> None:
    """The first batch at step 1,000,000 against the first batch at step 0, each on a fresh stream (one
    epoch plan built either way)."""
    spec = MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=20)
    for packing in (False, True):
        for step in (0, 1_000_000):
            start = time.perf_counter()
            stream = PretrainingStream(prepared.load_corpus(directory, "train", 0, 1), spec, seed=0,
                                       max_seq_length=128, packing=packing)
            next(stream.dataset(batch_size, start_step=step).as_numpy_iterator())
            epoch, _ = stream.locate(step * batch_size)
            print(f"first batch at step {step:>9,} (epoch {epoch:,}, packing={packing}): "
                  f"{time.perf_counter() - start:.2f}s")
