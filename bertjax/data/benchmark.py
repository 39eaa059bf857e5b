"""python -m bertjax.data.benchmark: examples per second of the input pipeline, per CPU core.

    python -m bertjax.data.benchmark                       # the demo corpus, a vocabulary learned once
    python -m bertjax.data.benchmark --input_pattern='/data/wiki/*.txt' --vocab_path=vocab.txt

For seq 128 and 512 it measures, on one tf.data thread (one core) and on all of them:
  prepared: from prepared shards (load, plan, pair, mask, batch) -- the training path for large corpora;
  raw text: from documents of sentence strings, tokenization included -- the in-memory path.
Figures are printed as a table; docs/data.md records them.
"""

import os
import tempfile
import time

from absl import app, flags

from bertjax import console


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        input=flags.DEFINE_string("input_pattern", None, "Text files (sentence per line); the demo corpus if unset."),
        vocab=flags.DEFINE_string("vocab_path", None, "A WordPiece vocab.txt; learned from the corpus if unset."),
        num_examples=flags.DEFINE_integer("num_examples", 20_000, "Examples to time per measurement."),
        batch=flags.DEFINE_integer("batch_size", 256, "Examples per batch."),
    )


def measure(stream, num_examples: int, batch_size: int, threads: int | None) -> float:
    """Examples per second once the pipeline is warm."""
    batches = iter(stream.dataset(batch_size, threads=threads).as_numpy_iterator())
    next(batches)  # first batch: plan and tracing, not throughput
    steps = max(1, num_examples // batch_size)
    start = time.perf_counter()
    for _ in range(steps):
        next(batches)
    return steps * batch_size / (time.perf_counter() - start)


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

    print(f"{'seq':>4} {'source':>9} {'threads':>8} {'examples/s':>11} {'per core':>9}  plan build")
    for seq, predictions in ((128, 20), (512, 80)):
        spec = pt.MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=predictions)
        for source in ("prepared", "raw text"):
            start = time.perf_counter()
            if source == "prepared":
                source_corpus = prepared.load_corpus(tmp, "train", 0, 1)
            else:
                source_corpus = pt.tokenize_documents(documents, tokenizer)
            stream = pt.PretrainingStream(source_corpus, spec, seed=0, max_seq_length=seq)
            setup_s = time.perf_counter() - start
            for threads in (1, os.cpu_count()):
                rate = measure(stream, args.num_examples, args.batch, threads)
                print(f"{seq:>4} {source:>9} {threads:>8} {rate:>11,.0f} {rate / threads:>9,.0f}  "
                      f"{setup_s:.1f}s to examples ({stream.examples_per_epoch:,} pairs/epoch)")

    # Resuming: the first batch at step 1,000,000 against the first batch at step 0, each on a fresh
    # stream (one epoch plan built either way).
    spec = pt.MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=20)
    for step in (0, 1_000_000):
        start = time.perf_counter()
        stream = pt.PretrainingStream(prepared.load_corpus(tmp, "train", 0, 1), spec, seed=0, max_seq_length=128)
        next(stream.dataset(args.batch, start_step=step).as_numpy_iterator())
        epoch, _ = stream.locate(step * args.batch)
        print(f"first batch at step {step:>9,} (epoch {epoch:,}): {time.perf_counter() - start:.2f}s")


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
