"""python -m bertjax.summary --config=configs/base.py: the model a config builds, without building it.

Prints every parameter with its shape, logical axis names and the mesh axes the config's rules give it,
then the parameter count, beside the count of the Hugging Face class the model converts to where the two
differ (RoBERTa's and ModernBERT's masked-LM classes have no pooler and no NSP head, which bertjax keeps).
Shapes come from jax.eval_shape, so even configs/large.py costs no memory. --memory also compiles the
train step for one device of this machine at the config's batch and sequence length, and prints what
that device holds (parameters, optimizer state, batch, activations and temporaries):

    python -m bertjax.summary --config=configs/base.py --memory --config.train.batch_size=32
"""

from absl import flags
from ml_collections import config_flags

from bertjax.bench import model_summary
from bertjax.runs import console


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file.", lock_config=True),
        memory=flags.DEFINE_bool("memory", False, "Also compile the train step (never run it) for one device of "
                                 "this machine at train.batch_size x data.max_seq_length and print the memory it "
                                 "holds."),
    )


def main(argv, args):
    console.no_arguments(argv)
    console.finish(model_summary.print_summary, args.config, memory=args.memory)


def entry():
    """`python -m bertjax.summary` as a console program."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
