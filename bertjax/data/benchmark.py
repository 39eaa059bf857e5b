"""python -m bertjax.data.benchmark: examples per second of the input pipeline, per CPU core, and how
much of each row is real tokens, unpacked and packed.

    python -m bertjax.data.benchmark                       # the demo corpus, a vocabulary learned once
    python -m bertjax.data.benchmark --input_pattern='/data/wiki/*.txt' --vocab_path=vocab.txt

For seq 128 and 512 it measures, on one tf.data thread (one core) and on all of them:
  prepared: from prepared shards (load, plan, pair, mask, batch) -- the training path for large corpora;
  raw text: from documents of sentence strings, tokenization included -- the in-memory path;
  packed:   prepared shards with data.packing (several pairs per row; rows/s and examples/s differ).
"per cpu-s" is examples per second of the process's CPU time. Then the packing efficiency (share of
positions that are real tokens) of each stream's first batches. Figures are printed as tables;
docs/data.md records them.
"""

import os
import tempfile
import time

from absl import app, flags

from bertjax import console

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
    )


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
    from bertjax.data import demo, prepared, sources
    from bertjax.data import pretraining as pt
    from bertjax.text import files, tf_cpu, tokenizers
    from bertjax.text import vocab as vocabularies

    tf_cpu.import_tensorflow()
    if args.input:
        documents = list(sources.read_text_documents(files.expand_pattern(args.input), "sentences"))
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
    corpus = pt.tokenize_documents(documents, tokenizer)
    tokenize_s = time.perf_counter() - start
    print(f"tokenization: {num_sentences / tokenize_s:,.0f} sentences/s ({len(corpus.tokens):,} tokens in "
          f"{tokenize_s:.1f}s, all cores)")
    prepared.write_shard(prepared.shard_path(tmp, "train", 0, 1), corpus)
    prepared.write_metadata(tmp, tokenizer="wordpiece", vocab_name="vocab.txt", lower_case=True, num_shards=1,
                            eval_fraction=0.0)

    print(f"{'seq':>4} {'source':>9} {'threads':>8} {'examples/s':>11} {'per core':>9} {'rows/s':>8} "
          f"{'per cpu-s':>10}  plan build")
    for seq, predictions, per_row in SHAPES:
        spec = pt.MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=predictions)
        for source in ("prepared", "raw text", "packed"):
            start = time.perf_counter()
            if source == "raw text":
                source_corpus = pt.tokenize_documents(documents, tokenizer)
            else:
                source_corpus = prepared.load_corpus(tmp, "train", 0, 1)
            stream = pt.PretrainingStream(source_corpus, spec, seed=0, max_seq_length=seq,
                                          packing=source == "packed", max_sequences_per_row=per_row)
            setup_s = time.perf_counter() - start
            for threads in (1, os.cpu_count()):
                rate, rows, per_cpu = measure(stream, args.num_examples, args.batch, threads)
                print(f"{seq:>4} {source:>9} {threads:>8} {rate:>11,.0f} {rate / threads:>9,.0f} {rows:>8,.0f} "
                      f"{per_cpu:>10,.0f}  "
                      f"{setup_s:.2f}s to examples ({stream.examples_per_epoch:,} examples, "
                      f"{stream.rows_per_epoch:,} rows/epoch)")

    # Packing efficiency: the share of positions that are real tokens, unpacked and packed, by objective.
    print(f"\nreal tokens / positions over the first {args.efficiency_batches} batches of {args.batch} "
          f"(or one epoch, if shorter):")
    print(f"{'seq':>4} {'objective':>9} {'unpacked':>9} {'packed':>7} {'rows':>7} {'examples':>9}")
    corpus = prepared.load_corpus(tmp, "train", 0, 1)
    for seq, predictions, per_row in SHAPES:
        spec = pt.MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=predictions)
        for objective in ("nsp", "sop", "none"):
            shares = []
            for packing in (False, True):
                stream = pt.PretrainingStream(corpus, spec, seed=0, max_seq_length=seq, objective=objective,
                                              packing=packing, max_sequences_per_row=per_row)
                shares.append(real_token_share(stream, args.batch, args.efficiency_batches))
            print(f"{seq:>4} {objective:>9} {shares[0]:>9.1%} {shares[1]:>7.1%} {stream.rows_per_epoch:>7,} "
                  f"{stream.examples_per_epoch:>9,}")

    # Resuming: the first batch at step 1,000,000 against the first batch at step 0, each on a fresh
    # stream (one epoch plan built either way).
    spec = pt.MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=20)
    for packing in (False, True):
        for step in (0, 1_000_000):
            start = time.perf_counter()
            stream = pt.PretrainingStream(prepared.load_corpus(tmp, "train", 0, 1), spec, seed=0,
                                          max_seq_length=128, packing=packing)
            next(stream.dataset(args.batch, start_step=step).as_numpy_iterator())
            epoch, _ = stream.locate(step * args.batch)
            print(f"first batch at step {step:>9,} (epoch {epoch:,}, packing={packing}): "
                  f"{time.perf_counter() - start:.2f}s")


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
