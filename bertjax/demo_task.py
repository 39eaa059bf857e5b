"""python -m bertjax.demo_task: a fine-tuning task made from the built-in demo corpus, as JSON lines, for
trying fine-tuning and compression end to end without a download.

    python -m bertjax.demo_task --task=word_order --out=/tmp/word_order
    python -m bertjax.demo_task --task=retrieval --out=/tmp/retrieval    # and the test set in BEIR's layout

What each task asks and where its splits come from: bertjax/tasks/demo_tasks.py; the run is
bertjax/runs/demo_task_files.py.
"""

from absl import flags

from bertjax.runs import console, demo_task_files
from bertjax.tasks import demo_tasks


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    defined = dict(
        task=flags.DEFINE_enum("task", None, list(demo_tasks.TASKS), "Which demo task to write."),
        out=flags.DEFINE_string("out", None, "Directory for train.jsonl and dev.jsonl (retrieval: and demo-test/)."),
        seed=flags.DEFINE_integer("seed", 0, "Which sentences, and how their words are shuffled."),
        length=flags.DEFINE_integer("length", demo_tasks.RECALL_LENGTH, "recall: words of filler in a dev document "
                                    "(more tokens than words)."),
        train_length=flags.DEFINE_integer("train_length", demo_tasks.RECALL_TRAIN_LENGTH, "recall: the most words "
                                          "of filler in a training document."),
    )
    flags.mark_flags_as_required(["task", "out"])
    return defined


def main(argv, args):
    console.no_arguments(argv)
    console.finish(demo_task_files.write, args.task, args.out, seed=args.seed, length=args.length,
                   train_length=args.train_length)


def entry():
    """The console program `bertjax-demo-task`, as `python -m bertjax.demo_task`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
