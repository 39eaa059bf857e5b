"""python -m bertjax.distill: a smaller BERT taught by a pretrained one (general distillation).

    python -m bertjax.distill --config=configs/distill/distilbert.py \
        --config.distill.teacher=/models/bert-base-uncased --workdir=/tmp/distilbert
    python -m bertjax.distill --config=configs/distill/tiny.py --config.distill.teacher=/tmp/teacher \
        --workdir=/tmp/student

DistilBERT's recipe (configs/distill/common.py): the student keeps the teacher's width and starts from
a subset of its layers (distill.student_layers) with its embeddings and heads; it learns the teacher's
masked-LM distribution at a temperature, the masked-LM labels and the direction of the teacher's last
hidden states, on the pretraining stream of the data section. With distill.student_layers=() the student
is config.model, fresh (any width, with distill.alpha_cos=0), or train.init_from's. The teacher may be any
encoder (a sentence-transformers BERT, a Hugging Face BertModel) where no loss reads its masked-LM head:
train.num_steps=0 (its layers copied), or distill.alpha_ce=0 (the soft targets are the loss that reads
it). WORKDIR reads as any pretraining workdir (bertjax.load, finetune's train.init_from, export). The
run's story is bertjax/runs/general_distillation.py.

MobileBERT's progressive knowledge transfer (distill.progressive=True) is the same program: one stage per
layer of the student, then pre-training distillation, from an IB-BERT teacher (compression/progressive.py):

    python -m bertjax.train --config=configs/ibbert_tiny.py --workdir=/tmp/ibbert-tiny
    python -m bertjax.distill --config=configs/distill/mobilebert_tiny.py \
        --config.distill.teacher=/tmp/ibbert-tiny --workdir=/tmp/mobilebert-tiny-pkt
"""

from absl import flags
from ml_collections import config_flags

from bertjax.runs import config_checks, console, general_distillation


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/distill/<recipe>.py file.",
                                               lock_config=True),
        workdir=flags.DEFINE_string("workdir", None, "The student's checkpoints and metrics go here."),
        **console.define_dry_run_flag(),
        **console.define_distributed_flags(),
    )


def main(argv, args):
    console.no_arguments(argv)
    if args.dry_run:
        console.finish(config_checks.dry_run, general_distillation.check, args.config)
        return
    console.finish(general_distillation.distill, args.config, args.workdir, console.distributed(args))


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
