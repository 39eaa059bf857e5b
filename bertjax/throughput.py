"""python -m bertjax.throughput: examples per second of the input pipeline, per CPU core, and how
much of each row is real tokens, unpacked and packed.

    python -m bertjax.throughput                       # the demo corpus, a vocabulary learned once
    python -m bertjax.throughput --input_pattern='/data/wiki/*.txt' --vocab_path=vocab.txt

For seq 128 and 512 it measures, on one tf.data thread (one core) and on all of them:
  prepared: from a prepared shard, mapped (plan, pair, mask, batch) -- the training path for large corpora;
  raw text: from documents of sentence strings, tokenization included -- the in-memory path;
  packed:   prepared shards with data.packing (several pairs per row; rows/s and examples/s differ).
"per cpu-s" is examples per second of the process's CPU time. Then the packing efficiency (share of
positions that are real tokens) of each stream's first batches. Figures are printed as tables;
docs/data.md records them.

    python -m bertjax.throughput --memory              # the memory-mapped prepared corpus
    python -m bertjax.throughput --masking             # masking strategies against token masking

--masking times the prepared stream at seq 128 on one tf.data thread with each data.masking strategy,
in rounds that visit every strategy once (token first), and prints each one's examples per CPU second
as a ratio to token masking's in the same round (the median over --masking_rounds rounds): ratios within
one run, so that a shared machine's load changes cancel. units matches a lexicon of the corpus's most frequent word
pairs and triples (--masking_lexicon_size).

--memory writes a prepared corpus of --memory_tokens (200M) tokens by repeating the demo corpus's
tokenized documents, and one of 1M (also as four shards), and measures, each in a fresh process: the
peak resident memory of building a stream on it and drawing --memory_batches batches, and its
examples/s; and the same for the 1M corpus loaded into RAM (the in-memory path). It prints
RSS(200M) - RSS(1M) and mapped against in-memory examples/s (--objective: nsp, sop or none). The run is
bertjax/bench/input_speed.py.
"""

from absl import flags

from bertjax.bench import input_speed
from bertjax.runs import console


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        input_pattern=flags.DEFINE_string("input_pattern", None, "Text files (sentence per line); the demo corpus "
                                          "if unset."),
        vocab_path=flags.DEFINE_string("vocab_path", None, "A WordPiece vocab.txt; learned from the corpus if unset."),
        num_examples=flags.DEFINE_integer("num_examples", 20_000, "Examples (packed: rows) to time per measurement."),
        batch_size=flags.DEFINE_integer("batch_size", 256, "Examples (packed: rows) per batch."),
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


def main(argv, args):
    console.no_arguments(argv)
    options = input_speed.Options(
        num_examples=args.num_examples, batch_size=args.batch_size, efficiency_batches=args.efficiency_batches,
        memory_tokens=args.memory_tokens, memory_batches=args.memory_batches, objective=args.objective,
        masking_rounds=args.masking_rounds, masking_lexicon_size=args.masking_lexicon_size)
    console.finish(input_speed.throughput, args.input_pattern, args.vocab_path, options, memory=args.memory,
                   masking=args.masking)


def entry():
    """The console program `bertjax-throughput`, as `python -m bertjax.throughput`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
