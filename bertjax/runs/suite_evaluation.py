"""Benchmark suites and the compression report: what `python -m bertjax.evaluate` runs.

    evaluate(init_from, "glue", workdir)   # each task of the suite that TFDS has prepared, fine-tuned with its
                                           # configs/finetune/<task>.py in WORKDIR/<task>; one table
    retrieval_suite(init_from, [dir, ...], workdir)  # retrieval data sets searched with the model's
                                                     # embeddings, no fine-tuning; one table
    sts_suite(init_from, ["stsb", file, ...], workdir)  # zero-shot STS: pairs' similarities against gold
                                                        # scores (Spearman, Pearson); one table
    compress(task, teacher, variants)      # runs/compression_report.py's table of a teacher and its variants

The suite tables have the layout of the BERT paper's (Devlin et al. 2018: GLUE table 1, SQuAD tables 2 and
3, CoNLL-2003 table 7), printed and written to WORKDIR/<suite>.md and <suite>.json; retrieval's has a row
per data set and BEIR's columns, written to WORKDIR/retrieval.md and retrieval.json; STS's a row per set,
written to WORKDIR/sts.md and sts.json.
"""

import dataclasses
import json
import os

from bertjax import inference
from bertjax.compression import quantize
from bertjax.runs import compression_report, finetuning
from bertjax.tasks import readers, registry, retrieval, retrieval_data, retrieval_metrics
from bertjax.text import files, tf_cpu
from bertjax.training import sharding
from configs.finetune import cola, conll2003, mnli, mrpc, qnli, qqp, rte, squad, squad_v2, sst2, stsb


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
# --suite=retrieval's columns (heading, metric), as BEIR's papers report them; every k's figures go to the JSON.
RETRIEVAL = "retrieval"
RETRIEVAL_COLUMNS = (("nDCG@10", "ndcg@10"), ("Recall@100", "recall@100"), ("MRR@10", "mrr@10"), ("MAP@100", "map@100"))
# --suite=sts: zero-shot similarity of embeddings; "stsb" among its --tasks is GLUE's STS-B.
STS, STS_B = "sts", "stsb"


def available(task_name: str, data_dir: str | None) -> str | None:
    """None when TFDS has the task's data prepared, else why not (what to run)."""
    tfds = tf_cpu.import_tensorflow_datasets()  # here: TFDS is slow to load, and only this question needs it

    name = registry.TASKS[task_name].tfds_name
    if tfds.builder(name, data_dir=data_dir).is_prepared():
        return None
    return (f"{name} is not prepared in {data_dir or 'the default TFDS directory'}: `tfds build {name}` (downloads) "
            "to include it")


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
    if suite == "all":
        return _evaluate_all(init_from, workdir, tasks=tasks, data_dir=data_dir, sweep=sweep, **overrides)
    if suite == RETRIEVAL:
        raise ValueError("--suite=retrieval reads data sets of yours: give their directories as --tasks=DIR,...")
    if suite not in SUITES:
        raise ValueError(f"--suite={suite}: choose one of {', '.join(SUITES)}, all, {RETRIEVAL} or {STS}")
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
        raise ValueError(f"no task of suite {suite} has its data prepared in "
                         f"{data_dir or 'the default TFDS directory'}: "
                         f"prepare some with `tfds build <dataset>` ({', '.join(skipped)}), or pass --tfds_data_dir")
    files.make(workdir)
    scores = {}
    for task in chosen:
        print(f"--- {task}", flush=True)
        config = task_config(task, init_from, data_dir, **overrides)
        run_dir = files.join(workdir, task)
        summary = (finetuning.sweep if sweep else finetuning.finetune)(config, run_dir)
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


# ----------------------------------------------------------------------------------------------------
# Retrieval: the model's embeddings searched, no fine-tuning
# ----------------------------------------------------------------------------------------------------


def retrieval_table(scores: dict[str, dict]) -> tuple[list[str], dict[str, float]]:
    """The markdown table (a row per data set, then their average) and the averages; scores: data set ->
    evaluate_retrieval's metrics."""
    lines = ["| Data set | " + " | ".join(h for h, _ in RETRIEVAL_COLUMNS) + " |",
             "|" + "---|" * (len(RETRIEVAL_COLUMNS) + 1)]
    for name, metrics in scores.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * metrics[m]:.1f}" for _, m in RETRIEVAL_COLUMNS) + " |")
    average = {m: sum(s[m] for s in scores.values()) / len(scores) for _, m in RETRIEVAL_COLUMNS}
    lines.append("| Average | " + " | ".join(f"{100 * average[m]:.1f}" for _, m in RETRIEVAL_COLUMNS) + " |")
    return lines, average


def retrieval_suite(init_from: str, directories: list[str], workdir: str, *, split: str = "test",
                       similarity: str | None = None, batch_size: int | None = None, ignore_identical_ids: bool = False,
                       k_values=retrieval_metrics.K_VALUES) -> dict:
    """Each data set's split (a BEIR directory or save_to_disk datasets: tasks/retrieval_data.py) searched
    with the model's query and passage embeddings over all devices; one table, printed and written to
    WORKDIR/retrieval.md and retrieval.json. Every data set is read and checked before the model loads."""
    if not directories:
        raise ValueError("--suite=retrieval needs --tasks=DIR,...: BEIR directories (corpus.jsonl, queries.jsonl, "
                         "qrels/) or save_to_disk ones (corpus/, queries/, qrels/)")
    if similarity is not None and similarity not in retrieval.SIMILARITIES:
        raise ValueError(f"--similarity={similarity}: choose one of {', '.join(retrieval.SIMILARITIES)}")
    batch_size = batch_size or 32
    data_sets = [retrieval_data.read_retrieval(d, split) for d in directories]
    names = [d.name for d in data_sets]
    if len(set(names)) != len(names):
        raise ValueError(f"--tasks: two data sets in directories of the same name ({', '.join(names)}): "
                         f"their rows in the table would be confused")
    model = inference.load(init_from)
    prompts = model.embedding.prompts if model.embedding else {}
    # The model's own similarity unless asked for another; cosine for a model without an embedding record.
    similarity = similarity or (model.embedding.similarity if model.embedding else "cosine")

    def embed(texts, kind):  # kind: "query" | "passage": the model's prompt of that name, where it has one
        if kind == "query":  # and the query length it was trained with (sentence-transformers' encode_query)
            return model.embed(texts, task="query", batch_size=batch_size)
        return model.embed(texts, prompt_name=kind if kind in prompts else None, batch_size=batch_size)

    mesh = sharding.make_mesh({"data": -1})  # the corpus split over every device
    files.make(workdir)
    scores = {}
    for data in data_sets:
        print(f"--- {data.name}: {len(data.queries)} queries, {len(data.passages)} passages ({split})", flush=True)
        scores[data.name] = retrieval.evaluate_retrieval(embed, data, k_values, similarity, batch_size, mesh=mesh,
                                                         ignore_identical_ids=ignore_identical_ids)
    lines, average = retrieval_table(scores)
    print("\n".join(lines), flush=True)
    out = {"suite": RETRIEVAL, "init_from": init_from, "split": split, "similarity": similarity,
           "ignore_identical_ids": ignore_identical_ids, "directories": list(map(str, directories)), "scores": scores,
           "average": average, "table": lines}
    files.write_bytes(files.join(workdir, f"{RETRIEVAL}.json"), json.dumps(out, indent=1).encode())
    files.write_bytes(files.join(workdir, f"{RETRIEVAL}.md"), ("\n".join(lines) + "\n").encode())
    return out


# ----------------------------------------------------------------------------------------------------
# STS: each pair's similarity of the model's embeddings against its gold score, no fine-tuning
# ----------------------------------------------------------------------------------------------------


def read_sts_sets(tasks: list[str] | None, data_dir: str | None) -> dict[str, list]:
    """--tasks of --suite=sts -> name -> examples: "stsb" is GLUE's STS-B (its TFDS validation split: the
    test split's scores are withheld), anything else a JSON-lines file of {"text", "text_pair", "score"}
    named by its file name."""
    sets = {}
    for task in tasks or [STS_B]:
        if task == STS_B:
            name, examples = STS_B, readers.read_split(registry.get_task(STS_B), "validation", data_dir=data_dir)
        else:
            name, examples = os.path.splitext(os.path.basename(task))[0], readers.read_scored_pairs(task)
        if name in sets:
            raise ValueError(f"--tasks: two STS sets named {name}: their rows in the table would be confused")
        retrieval.sts_pairs(examples)  # every pair scored: said before the model loads
        sets[name] = examples
    return sets


def sts_table(scores: dict[str, dict]) -> list[str]:
    """The markdown table: a row per set (Spearman and Pearson times 100, and its pairs), then the average."""
    lines = ["| Data set | Spearman | Pearson | Pairs |", "|---|---|---|---|"]
    for name, found in scores.items():
        lines.append(f"| {name} | {100 * found['spearman']:.1f} | {100 * found['pearson']:.1f} | {found['pairs']} |")
    average = {m: sum(found[m] for found in scores.values()) / len(scores) for m in ("spearman", "pearson")}
    lines.append(f"| Average | {100 * average['spearman']:.1f} | {100 * average['pearson']:.1f} | "
                 f"{sum(found['pairs'] for found in scores.values())} |")
    return lines


def sts_suite(init_from: str, tasks: list[str] | None, workdir: str, *, similarity: str | None = None,
              batch_size: int | None = None, data_dir: str | None = None) -> dict:
    """Zero-shot STS: each set's pairs embedded by the model (its default prompt, as sentence-transformers'
    encode), their similarities' Spearman and Pearson correlations with the gold scores; one table, printed
    and written to WORKDIR/sts.md and sts.json. Every set is read and checked before the model loads."""
    if similarity is not None and similarity not in retrieval.SIMILARITIES:
        raise ValueError(f"--similarity={similarity}: choose one of {', '.join(retrieval.SIMILARITIES)}")
    sets = read_sts_sets(tasks, data_dir)
    model = inference.load(init_from)
    similarity = similarity or (model.embedding.similarity if model.embedding else "cosine")
    batch_size = batch_size or 32
    files.make(workdir)
    scores = {}
    for name, examples in sets.items():
        print(f"--- {name}: {len(examples)} pairs", flush=True)
        scores[name] = retrieval.evaluate_sts(lambda texts, kind: model.embed(texts, batch_size=batch_size), examples,
                                              batch_size, similarity)
    lines = sts_table(scores)
    print("\n".join(lines), flush=True)
    out = {"suite": STS, "init_from": init_from, "similarity": similarity, "tasks": list(tasks or [STS_B]),
           "scores": scores, "table": lines}
    files.write_bytes(files.join(workdir, f"{STS}.json"), json.dumps(out, indent=1).encode())
    files.write_bytes(files.join(workdir, f"{STS}.md"), ("\n".join(lines) + "\n").encode())
    return out


def parse_variant(spec: str):
    """--variant=NAME=DIR or NAME=DIR+MODE (int8, int4-g128, ...) -> report.Model; one line for anything else."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--variant={spec}: write NAME=DIR, or NAME=DIR+int8 to quantise it on load")
    head, plus, suffix = path.rpartition("+")
    if plus and head and suffix.startswith("int"):
        quantize.resolve(suffix)  # one line for a mode that does not exist
        return compression_report.Model(name, head, suffix)
    return compression_report.Model(name, path, None)


def dev_set(task: str) -> tuple[str | None, str | None]:
    """--task -> (dev file, TFDS data dir): a JSON-lines file as it is; a benchmark task's fine-tuning
    config (configs/finetune/<task>.py): its data.validation (None: the task's TFDS dev split) and
    data.tfds_data_dir."""
    if task in TASK_CONFIGS:
        config = TASK_CONFIGS[task].get_config()
        return config.data.get("validation") or None, config.data.get("tfds_data_dir")
    if not os.path.isfile(task):
        raise ValueError(f"--task={task}: no such file; give the dev set's JSON lines, or a benchmark task "
                         f"({', '.join(sorted(TASK_CONFIGS))}) for its TFDS dev split")
    return task, None


def compress(task: str, teacher: str, variant: list[str], *, workdir: str | None = None,
             tfds_data_dir: str | None = None, max_seq_length: int | None = None, repeats: int = 10) -> dict:
    """The compression report of a teacher and its variants (NAME=DIR[+int8]) on a task's dev set; prints its
    table, writes it under workdir when given."""
    if not task or not teacher or not variant:
        raise ValueError("compress needs --task (dev set), --teacher and at least one --variant=NAME=DIR")
    teacher_model = parse_variant(teacher if "=" in teacher else f"teacher={teacher}")
    variants = [parse_variant(v) for v in variant]
    dev_path, data_dir = dev_set(task)
    out = compression_report.compression_report(teacher_model, variants, dev_path=dev_path,
                                                data_dir=tfds_data_dir or data_dir, max_seq_length=max_seq_length,
                                                repeats=repeats)
    print(f"{out['task']}: {out['examples']} dev examples ({out['split']}), sequence length {out['max_seq_length']}; "
          f"latency: median of {repeats} runs on this machine")
    print("\n".join(out["table"]), flush=True)
    if workdir:
        files.make(workdir)
        saved = {**out, "rows": [dataclasses.asdict(r) for r in out["rows"]]}
        files.write_bytes(files.join(workdir, "compression.json"), json.dumps(saved, indent=1).encode())
        files.write_bytes(files.join(workdir, "compression.md"), ("\n".join(out["table"]) + "\n").encode())
    return out
