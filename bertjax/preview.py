"""python -m bertjax.preview: see exactly what the model will be fed.

    python -m bertjax.preview --config=configs/tiny.py --num_examples=3
    python -m bertjax.preview --config=configs/tiny.py --num_examples=100 --format=jsonl > examples.jsonl

The text form opens with a legend of its marks, says for each training batch what its rows hold, and
shows each example (with data.packing, each packed row and its sequences); the jsonl form writes one
example (or packed row) per line with every model input and the decoded tokens. --start_step shows the
examples of a later training step, as a resumed run would see them. Units masked together (data.masking)
show as one mark, and a last line gives the masked share and the mean unit length. The run is
bertjax/runs/data_preview.py.
"""

from absl import flags
from ml_collections import config_flags

from bertjax.runs import console, data_preview


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file."),
        num_examples=flags.DEFINE_integer("num_examples", 5, "How many examples (packed: rows) to show."),
        format=flags.DEFINE_enum("format", "text", ["text", "jsonl"], "text for people, jsonl for tools."),
        split=flags.DEFINE_enum("split", "train", ["train", "eval"], "The training stream or the held-out one."),
        start_step=flags.DEFINE_integer("start_step", 0, "Show the examples of this training step on (those of a "
                                        "one-host run: from example start_step x train.batch_size)."),
        workdir=flags.DEFINE_string("workdir", None, "A training workdir, whose vocabulary is read (or learned into "
                                    "it, as training would); unset, a learned vocabulary is kept in bertjax's cache "
                                    "directory ($BERTJAX_CACHE_DIR, else ~/.cache/bertjax)."),
    )


def main(argv, args):
    console.no_arguments(argv)
    console.finish(data_preview.preview, args.config, num_examples=args.num_examples, output_format=args.format,
                   split=args.split, start_step=args.start_step, workdir=args.workdir)


def entry():
    """The console program `bertjax-preview`, as `python -m bertjax.preview`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
