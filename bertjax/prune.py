"""python -m bertjax.prune: a fine-tuned model made smaller, attention heads by importance and weights by
magnitude, then fine-tuned again to recover.

    python -m bertjax.prune --config=configs/finetune/sst2.py --config.train.init_from=/tmp/ft-sst2 \\
        --config.prune.heads=72 --config.prune.recovery_epochs=1 --workdir=/tmp/ft-sst2-pruned

train.init_from is a model fine-tuned on the config's task (a bertjax fine-tuning workdir, or a Hugging Face
directory of the task's class). WORKDIR then reads as any fine-tuned workdir; pruning.json says what was
done. The run's story is bertjax/runs/prune_and_recover.py.
"""

from absl import flags
from ml_collections import config_flags

from bertjax.runs import config_checks, console, prune_and_recover


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/finetune/<task>.py file.", lock_config=True),
        workdir=flags.DEFINE_string("workdir", None, "The pruned model, its recovery fine-tuning and pruning.json."),
        **console.define_dry_run_flag(),
        **console.define_distributed_flags(),
    )


def main(argv, args):
    console.no_arguments(argv)
    if args.dry_run:
        console.finish(config_checks.dry_run, config_checks.check_finetuning, args.config)
        return
    console.finish(prune_and_recover.prune, args.config, args.workdir, console.distributed(args))


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
