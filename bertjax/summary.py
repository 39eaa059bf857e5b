"""python -m bertjax.summary --config=configs/base.py: the model a config builds, without building it.

Prints every parameter with its shape, logical axis names and the mesh axes the config's rules give it,
then the parameter count, beside the count of the Hugging Face class the model converts to where the two
differ (RoBERTa's and ModernBERT's masked-LM classes have no pooler and no NSP head, which bertjax keeps).
Shapes come from jax.eval_shape, so even configs/large.py costs no memory.
"""

from ml_collections import config_flags

from bertjax.runs import console, model_summary


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file.", lock_config=True),
    )


def main(argv, args):
    console.no_arguments(argv)
    console.finish(model_summary.print_summary, args.config)


def entry():
    """`python -m bertjax.summary` as a console program."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
