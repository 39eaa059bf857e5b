"""python -m bertjax.train: BERT pretraining, from one CPU to a pod.

    python -m bertjax.train --config=configs/tiny.py --workdir=/tmp/bertjax-tiny
    python -m bertjax.train --config=configs/large.py:lamb_phase1 --workdir=gs://bucket/large-p1

Re-running the same command resumes from the workdir's latest checkpoint; SIGTERM (preemption) saves
and exits cleanly, Ctrl-C saves and exits 130. The run's story is bertjax/runs/pretraining.py.
"""

from absl import flags
from ml_collections import config_flags

from bertjax.runs import config_checks, console, pretraining


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file.", lock_config=True),
        workdir=flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events go here."),
        **console.define_dry_run_flag(),
        **console.define_distributed_flags(),
    )


def main(argv, args):
    console.no_arguments(argv)
    if args.dry_run:
        console.finish(config_checks.dry_run, config_checks.check_pretraining, args.config)
        return
    console.finish(pretraining.pretrain, args.config, args.workdir, console.distributed(args))


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
