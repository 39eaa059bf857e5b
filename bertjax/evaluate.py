"""python -m bertjax.evaluate: fine-tune and score every task of a benchmark suite, one table.

    python -m bertjax.evaluate --init_from=path/to/bert-base-uncased --suite=glue --workdir=runs/glue
    python -m bertjax.evaluate --init_from=runs/base --suite=glue --tasks=sst2,mrpc --sweep --workdir=runs/glue
    python -m bertjax.evaluate --init_from=runs/base --suite=all --workdir=runs/eval   # glue, squad, conll

Each task of the suite whose data TFDS has prepared (`tfds build glue/<task>`, `squad/v1.1`,
`conll2003`; nothing is downloaded here) is fine-tuned with its configs/finetune/<task>.py in
WORKDIR/<task>; the dev scores go into one table in the layout of the BERT paper's tables (Devlin et
al. 2018: GLUE table 1, SQuAD tables 2 and 3, CoNLL-2003 table 7), printed and written to
WORKDIR/<suite>.md and <suite>.json.
"""

import dataclasses
import json

from absl import app, flags

from bertjax import console
from configs.finetune import cola, conll2003, mnli, mrpc, qnli, qqp, rte, squad, squad_v2, sst2, stsb
from bertjax.text import files


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        init_from=flags.DEFINE_string("init_from", None, "A bertjax workdir or checkpoint, or a Hugging Face BERT "
                                      "directory."),
        suite=flags.DEFINE_string("suite", "glue", "The benchmark suite: glue, squad, conll, or all of them."),
        workdir=flags.DEFINE_string("workdir", None, "Each task's fine-tuning workdir goes under it, and the table."),
        tasks=flags.DEFINE_list("tasks", None, "Only these tasks of the suite (default: all it has data for)."),
        tfds_data_dir=flags.DEFINE_string("tfds_data_dir", None, "Where TFDS keeps the prepared data sets."),
        sweep=flags.DEFINE_bool("sweep", False, "The paper's learning-rate grid per task, the best dev score kept."),
        epochs=flags.DEFINE_float("epochs", None, "Override the recipe's epochs (e.g. for a quick look)."),
        batch_size=flags.DEFINE_integer("batch_size", None, "Override the recipe's batch size."),
        max_seq_length=flags.DEFINE_integer("max_seq_length", None, "Override the recipe's sequence length."),
    )


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a suite's table: its heading, the task, and which dev metrics it shows."""

    heading: str
    task: str
    metrics: tuple[tuple[str, str], ...]  # (dev split, metric), shown joined by "/"


# The paper's GLUE table: F1 for QQP and MRPC, Spearman for STS-B, Matthews for CoLA, accuracy for the
# rest; WNLI left out, as the paper did. The average is over the columns' first figures.
SUITES = {
    "glue": (
        Column("MNLI-(m/mm)", "mnli", (("validation_matched", "accuracy"), ("validation_mismatched", "accuracy"))),
        Column("QQP", "qqp", (("validation", "f1"),)),
        Column("QNLI", "qnli", (("validation", "accuracy"),)),
        Column("SST-2", "sst2", (("validation", "accuracy"),)),
        Column("CoLA", "cola", (("validation", "matthews_corr"),)),
        Column("STS-B", "stsb", (("validation", "spearman"),)),
        Column("MRPC", "mrpc", (("validation", "f1"),)),
        Column("RTE", "rte", (("validation", "accuracy"),)),
    ),
    # The paper's SQuAD tables (2 and 3): dev EM/F1; v2.0 at the no-answer threshold tuned on dev.
    "squad": (
        Column("SQuAD 1.1 (EM/F1)", "squad", (("validation", "exact_match"), ("validation", "f1"))),
        Column("SQuAD 2.0 (EM/F1)", "squad_v2", (("validation", "best_exact_match"), ("validation", "best_f1"))),
    ),
    # The paper's CoNLL-2003 table (7): entity-level F1 on dev, and on test.
    "conll": (
        Column("CoNLL-2003 NER (dev/test F1)", "conll2003", (("dev", "f1"), ("test", "f1"))),
    ),
}
# Each task's configs/finetune/<task>.py.
TASK_CONFIGS = {"cola": cola, "conll2003": conll2003, "mnli": mnli, "mrpc": mrpc, "qnli": qnli, "qqp": qqp, "rte": rte,
                "squad": squad, "squad_v2": squad_v2, "sst2": sst2, "stsb": stsb}
assert {c.task for suite in SUITES.values() for c in suite} <= set(TASK_CONFIGS)
# Suites whose table ends in an average column, as the paper's GLUE table does.
AVERAGED = ("glue",)
# --suite=all: each suite in turn, one table each.
ALL = ("glue", "squad", "conll")


def available(task_name: str, data_dir: str | None) -> str | None:
    """None when TFDS has the task's data prepared, else why not (what to run)."""
    import tensorflow_datasets as tfds

    from bertjax.tasks import registry

    name = registry.TASKS[task_name].tfds_name
    if tfds.builder(name, data_dir=data_dir).is_prepared():
        return None
    return f"{name} is not prepared in {data_dir or 'the default TFDS directory'}: `tfds build {name}` (downloads) to include it"


def task_config(task_name: str, init_from: str, data_dir: str | None, *, epochs=None, batch_size=None,
                max_seq_length=None):
    config = TASK_CONFIGS[task_name].get_config()
    config.train.init_from = init_from
    config.data.tfds_data_dir = data_dir
    if epochs is not None:
        config.train.epochs = epochs
    if batch_size is not None:
        config.train.batch_size = batch_size
    if max_seq_length is not None:
        config.data.max_seq_length = max_seq_length
    return config


def table(columns, scores: dict, average_column: bool = True) -> tuple[list[str], float | None]:
    """The markdown table (heading, rule, values) and the average of the columns that ran.
    scores: task -> {split: {metric: value}}."""
    cells, firsts = [], []
    for column in columns:
        if column.task not in scores:
            cells.append("-")
            continue
        values = [100 * scores[column.task][split][metric] for split, metric in column.metrics]
        firsts.append(values[0])
        cells.append("/".join(f"{v:.1f}" for v in values))
    average = sum(firsts) / len(firsts) if firsts else None
    headings = [c.heading for c in columns]
    if average_column:
        headings.append("Average")
        cells.append("-" if average is None else f"{average:.1f}")
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings), "| " + " | ".join(cells) + " |"]
    return lines, average


def evaluate(init_from: str, suite: str, workdir: str, *, tasks=None, data_dir=None, sweep=False, **overrides) -> dict:
    from bertjax import finetune

    if suite == "all":
        return _evaluate_all(init_from, workdir, tasks=tasks, data_dir=data_dir, sweep=sweep, **overrides)
    if suite not in SUITES:
        raise ValueError(f"--suite={suite}: choose one of {', '.join(SUITES)} or all")
    columns = SUITES[suite]
    known = [c.task for c in columns]
    if tasks:
        unknown = sorted(set(tasks) - set(known))
        if unknown:
            raise ValueError(f"--tasks: {', '.join(unknown)} not in suite {suite} ({', '.join(known)})")
    skipped = {}
    for task in tasks or known:
        reason = available(task, data_dir)
        if reason:
            skipped[task] = reason
            print(f"skipped {task}: {reason}", flush=True)
    chosen = [t for t in (tasks or known) if t not in skipped]
    if not chosen:
        raise ValueError(f"no task of suite {suite} has its data prepared in {data_dir or 'the default TFDS directory'}: "
                         f"prepare some with `tfds build <dataset>` ({', '.join(skipped)}), or pass --tfds_data_dir")
    files.make(workdir)
    scores = {}
    for task in chosen:
        print(f"--- {task}", flush=True)
        config = task_config(task, init_from, data_dir, **overrides)
        run_dir = files.join(workdir, task)
        summary = finetune.sweep(config, run_dir) if sweep else finetune.finetune(config, run_dir)
        scores[task] = summary["best"]["metrics"]
    lines, average = table(columns, scores, average_column=suite in AVERAGED)
    print("\n".join(lines), flush=True)
    out = {"suite": suite, "init_from": init_from, "scores": scores, "average": average, "skipped": skipped,
           "table": lines}
    files.write_bytes(files.join(workdir, f"{suite}.json"), json.dumps(out, indent=1).encode())
    files.write_bytes(files.join(workdir, f"{suite}.md"), ("\n".join(lines) + "\n").encode())
    return out


def _evaluate_all(init_from: str, workdir: str, *, tasks=None, **kwargs) -> dict:
    """Every suite it has data for, one table each; tasks (if given) picked from all suites."""
    results, lines = {}, []
    for suite in ALL:
        chosen = [t for t in tasks if t in {c.task for c in SUITES[suite]}] if tasks else None
        if tasks and not chosen:
            continue
        try:
            results[suite] = evaluate(init_from, suite, files.join(workdir, suite), tasks=chosen, **kwargs)
        except ValueError as e:
            if "has its data prepared" not in str(e):
                raise
            print(f"skipped suite {suite}: {e}", flush=True)
            continue
        lines += [f"{suite}:", ""] + results[suite]["table"] + [""]
    if not results:
        raise ValueError(f"no suite has data prepared in {kwargs.get('data_dir') or 'the default TFDS directory'}")
    print("\n".join(lines), flush=True)
    files.write_bytes(files.join(workdir, "all.json"), json.dumps(results, indent=1).encode())
    files.write_bytes(files.join(workdir, "all.md"), "\n".join(lines).encode())
    return {"suite": "all", "suites": results, "table": lines}


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    if not args.init_from or not args.workdir:
        console.fail("--init_from and --workdir are required")
    try:
        evaluate(args.init_from, args.suite, args.workdir, tasks=args.tasks, data_dir=args.tfds_data_dir,
                 sweep=args.sweep, epochs=args.epochs, batch_size=args.batch_size, max_seq_length=args.max_seq_length)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        console.fail(str(e))


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
