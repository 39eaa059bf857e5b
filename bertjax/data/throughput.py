"""python -m bertjax.data.throughput: examples per second of the input pipeline, per CPU core, and how
much of each row is real tokens, unpacked and packed.

    python -m bertjax.data.throughput                       # the demo corpus, a vocabulary learned once
    python -m bertjax.data.throughput --input_pattern='/data/wiki/*.txt' --vocab_path=vocab.txt

For seq 128 and 512 it measures, on one tf.data thread (one core) and on all of them:
  prepared: from a prepared shard, mapped (plan, pair, mask, batch) -- the training path for large corpora;
  raw text: from documents of sentence strings, tokenization included -- the in-memory path;
  packed:   prepared shards with data.packing (several pairs per row; rows/s and examples/s differ).
"per cpu-s" is examples per second of the process's CPU time. Then the packing efficiency (share of
positions that are real tokens) of each stream's first batches. Figures are printed as tables;
docs/data.md records them.

    python -m bertjax.data.throughput --memory              # the memory-mapped prepared corpus
    python -m bertjax.data.throughput --masking             # masking strategies against token masking

--masking times the prepared stream at seq 128 on one tf.data thread with each data.masking strategy,
in rounds that visit every strategy once (token first), and prints each one's examples per CPU second
as a ratio to token masking's in the same round (the median over --masking_rounds rounds): ratios within
one run, so that a shared machine's load changes cancel. units matches a lexicon of the corpus's most frequent word
pairs and triples (--masking_lexicon_size).

--memory writes a prepared corpus of --memory_tokens (200M) tokens by repeating the demo corpus's
tokenized documents, and one of 1M (also as four shards), and measures, each in a fresh process: the
peak resident memory of building a stream on it and drawing --memory_batches batches, and its
examples/s; and the same for the 1M corpus loaded into RAM (the in-memory path). It prints
RSS(200M) - RSS(1M) and mapped against in-memory examples/s (--objective: nsp, sop or none).
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

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


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        input=flags.DEFINE_string("input_pattern", None, "Text files (sentence per line); the demo corpus if unset."),
        vocab=flags.DEFINE_string("vocab_path", None, "A WordPiece vocab.txt; learned from the corpus if unset."),
        num_examples=flags.DEFINE_integer("num_examples", 20_000, "Examples (packed: rows) to time per measurement."),
        batch=flags.DEFINE_integer("batch_size", 256, "Examples (packed: rows) per batch."),
        efficiency_batches=flags.DEFINE_integer("efficiency_batches", 100, "Batches the real-token share is "
                                                "taken over (at most one epoch)."),
        memory=flags.DEFINE_bool("memory", False, "Measure the memory of mapped prepared corpora instead."),
        memory_tokens=flags.DEFINE_integer("memory_tokens", 200_000_000, "Tokens of the large mapped corpus."),
        memory_batches=flags.DEFINE_integer("memory_batches", 100, "Batches each memory run draws."),
        objective=flags.DEFINE_enum("objective", "nsp", ["nsp", "sop", "none"], "The memory runs' objective."),
        masking=flags.DEFINE_bool("masking", False, "Measure the masking strategies against token masking instead."),
        masking_rounds=flags.DEFINE_integer("masking_rounds", 5, "Rounds of the masking comparison."),
        masking_lexicon_size=flags.DEFINE_integer("masking_lexicon_size", 2000, "Units in the lexicon of units."),
    )


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


def masking_table(documents, tokenizer, directory: str, args) -> None:
    """Examples/s of the prepared stream at seq 128, one thread, per masking strategy, against token's."""
    phrases = frequent_phrases(documents, args.masking_lexicon_size)
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
    for _ in range(args.masking_rounds):
        token_rate = None
        for name, stream in streams.items():
            _, _, rate = measure(stream, args.num_examples, args.batch, 1)  # per CPU second: load cancels
            token_rate = token_rate or rate
            ratios[name].append(rate / token_rate)
            rates[name].append(rate)
    print(f"masking strategies, seq 128, one thread, {args.masking_rounds} rounds of {args.num_examples:,} examples "
          f"({len(phrases):,} lexicon units, up to {unit_max_words} words):")
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


def memory_benchmark(corpus, vocab_path: str, vocab_size: int, args) -> None:
    """--memory: write the two corpora, measure each in a fresh process, print the comparison."""
    tmp = tempfile.mkdtemp(prefix="bertjax-memory-benchmark-")
    try:
        start = time.perf_counter()
        large = write_repeated(os.path.join(tmp, "large"), corpus, args.memory_tokens, vocab_path, vocab_size)
        small = write_repeated(os.path.join(tmp, "small"), corpus, 1_000_000, vocab_path, vocab_size)
        write_repeated(os.path.join(tmp, "sharded"), corpus, 1_000_000, vocab_path, vocab_size, num_shards=4)
        print(f"wrote prepared corpora of {large:,} and {small:,} tokens (the second also as 4 shards) in "
              f"{time.perf_counter() - start:.1f}s")
        results = {}
        for name, directory, in_memory in (("mapped, large", "large", False), ("mapped, 1M", "small", False),
                                           ("4 maps, 1M", "sharded", False), ("in memory, 1M", "small", True)):
            code = ("import json, sys; from bertjax.data import throughput; "
                    "print(json.dumps(throughput.memory_run(*json.loads(sys.argv[1]))))")
            argv = json.dumps([os.path.join(tmp, directory), in_memory, args.objective, args.batch,
                               args.memory_batches])
            done = subprocess.run([sys.executable, "-c", code, argv], capture_output=True, text=True)
            if done.returncode:
                console.fail(f"the {name} run failed: {done.stderr.strip().splitlines()[-1]}")
            results[name] = r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name:>14}: {r['tokens']:>11,} tokens, {r['sentences']:>10,} sentences: peak RSS "
                  f"{r['built_rss_mb']:>6,.0f} MB with the plan, {r['peak_rss_mb']:>6,.0f} MB after the batches, "
                  f"{r['examples_per_s']:>6,.0f} examples/s "
                  f"({r['examples_per_cpu_s']:,.0f} per CPU-s), {r['setup_s']:.1f}s to the first batch")
        print(f"objective {args.objective}, {args.memory_batches} batches of {args.batch}, seq 128")
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


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if args.input:
        documents = list(text_files.read_text_documents(files.expand_pattern(args.input), "sentences"))
    else:
        documents = demo.demo_documents()
    tmp = tempfile.mkdtemp(prefix="bertjax-data-benchmark-")
    vocab_path = args.vocab
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
    if args.memory:
        memory_benchmark(corpus, vocab_path, tokenizer.vocab_size, args)
        return
    write_repeated(tmp, corpus, len(corpus.tokens), vocab_path, tokenizer.vocab_size)  # once, as prepare writes it
    if args.masking:
        masking_table(documents, tokenizer, tmp, args)
        return

    throughput_table(documents, tokenizer, tmp, args)
    efficiency_table(tokenizer, tmp, args)
    resume_timings(tokenizer, tmp, args.batch)


def throughput_table(documents, tokenizer, directory: str, args) -> None:
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
                rate, rows, per_cpu = measure(stream, args.num_examples, args.batch, threads)
                print(f"{seq:>4} {source:>9} {threads:>8} {rate:>11,.0f} {rate / threads:>9,.0f} {rows:>8,.0f} "
                      f"{per_cpu:>10,.0f}  "
                      f"{setup_s:.2f}s to examples ({stream.examples_per_epoch:,} examples, "
                      f"{stream.rows_per_epoch:,} rows/epoch)")


def efficiency_table(tokenizer, directory: str, args) -> None:
    """Packing efficiency: the share of positions that are real tokens, unpacked and packed, by objective."""
    print(f"\nreal tokens / positions over the first {args.efficiency_batches} batches of {args.batch} "
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
                shares.append(real_token_share(stream, args.batch, args.efficiency_batches))
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


def entry():
    """python -m bertjax.data.throughput."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
