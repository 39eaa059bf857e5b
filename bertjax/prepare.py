"""python -m bertjax.prepare: tokenize and index a corpus once, into memory-mappable shards.

    python -m bertjax.prepare --config=configs/base.py \\
        --config.data.source=text --config.data.input_pattern='/data/wiki/*.txt' \\
        --config.data.vocab_path=/data/vocab.txt --output_dir=/data/wiki-prepared --num_shards=64

Then train with --config.data.source=prepared --config.data.prepared_dir=/data/wiki-prepared. How the
documents are dealt to shards, hosts and worker processes, and how a killed run resumes:
bertjax/data/preparing.py; the run is bertjax/runs/corpus_preparation.py.
"""

import os

from absl import flags
from ml_collections import config_flags

from bertjax.runs import console, corpus_preparation


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file (its data section is used)."),
        output_dir=flags.DEFINE_string("output_dir", None, "Where the shards and metadata.json go."),
        num_shards=flags.DEFINE_integer("num_shards", 16, "Output shards per split; a multiple of the training hosts."),
        num_workers=flags.DEFINE_integer("num_workers", os.cpu_count() or 1,
                                         "Worker processes on this host; 0 prepares in this process."),
        process_index=flags.DEFINE_integer("process_index", 0, "This host's index, when several hosts prepare."),
        process_count=flags.DEFINE_integer("process_count", 1, "How many hosts prepare (and will train)."),
        progress_seconds=flags.DEFINE_float("progress_seconds", 5.0, "Seconds between progress lines."),
    )


def main(argv, args):
    console.no_arguments(argv)
    console.finish(corpus_preparation.prepare, args.config, args.output_dir, num_shards=args.num_shards,
                   num_workers=args.num_workers, process_index=args.process_index,
                   process_count=args.process_count, progress_seconds=args.progress_seconds)


def entry():
    """The console program `bertjax-prepare`, as `python -m bertjax.prepare`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
