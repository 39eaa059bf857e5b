"""python -m bertjax.finetune: a pretrained encoder fine-tuned on one task with one extra output layer.

    python -m bertjax.finetune --config=configs/finetune/sst2.py --config.train.init_from=/tmp/bertjax-tiny \
        --workdir=/tmp/ft-sst2
    python -m bertjax.finetune --config=configs/finetune/mrpc.py --config.train.init_from=/models/bert-base-uncased \
        --config.sweep=True --workdir=/tmp/ft-mrpc

init_from is a bertjax pretraining (or fine-tuning) workdir or checkpoint, a params export, or a Hugging
Face directory of any family; the user's own data as JSON lines through --config.data.train=FILE
--config.data.validation=FILE. SIGTERM saves and exits 0, Ctrl-C saves and exits 130, and re-running the
same command resumes. The run's story is bertjax/runs/finetuning.py.
"""

from absl import flags
from ml_collections import config_flags

from bertjax.runs import config_checks, console, finetuning


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/finetune/<task>.py file.", lock_config=True),
        workdir=flags.DEFINE_string("workdir", None,
                                    "Checkpoints, metrics.jsonl, predictions and the summary go here."),
        **console.define_dry_run_flag(),
        **console.define_distributed_flags(),
    )


def check(config):
    """The config as the run checks it; a BiLSTM student's is completed first (its train.init_from is the
    teacher), as the run does."""
    return config_checks.check_finetuning(finetuning.student_config(config))


def main(argv, args):
    console.no_arguments(argv)
    if args.dry_run:
        console.finish(config_checks.dry_run, check, args.config)
        return
    console.finish(finetuning.finetune_or_sweep, args.config, args.workdir, console.distributed(args))


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
