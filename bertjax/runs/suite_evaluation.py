"""Benchmark suites and the compression report: what `python -m bertjax.evaluate` runs.

    evaluate(init_from, "glue", workdir)   # each task of the suite that TFDS has prepared, fine-tuned with its
                                           # configs/finetune/<task>.py in WORKDIR/<task>; one table
    retrieval_suite(init_from, [dir, ...], workdir)  # retrieval data sets searched with the model's
                                                     # embeddings (dense, SPLADE or ColBERT), no
                                                     # fine-tuning; one table
    retrieval_suite(init_from, [dir], workdir, rerank_with=cross_encoder, rerank_top=100)  # then reranked
    mteb_suite(init_from, ["SciFact", ...], workdir)  # MTEB's tasks run by mteb itself; one table
    sts_suite(init_from, ["stsb", file, ...], workdir)  # zero-shot STS: pairs' similarities against gold
                                                        # scores (Spearman, Pearson); one table
    compress(task, teacher, variants)      # runs/compression_report.py's table of a teacher and its variants

The suite tables have the layout of the BERT paper's (Devlin et al. 2018: GLUE table 1, SQuAD tables 2 and
3, CoNLL-2003 table 7), printed and written to WORKDIR/<suite>.md and <suite>.json; retrieval's has a row
per data set, BEIR's columns and the first stage's index size and milliseconds a query, written to
WORKDIR/retrieval.md and retrieval.json (reranked: a row per data set and stage); STS's a row per set,
written to WORKDIR/sts.md and sts.json; MTEB's a row per task (its main score), written to WORKDIR/mteb.md
and mteb.json.
"""

import dataclasses
import json
import os

import jax
import numpy as np

from bertjax import inference
from bertjax.compression import quantize
from bertjax.interop import mteb as bertjax_mteb
from bertjax.runs import compression_report, finetuning
from bertjax.tasks import readers, registry, retrieval, retrieval_data, retrieval_metrics
from bertjax.tasks.kinds import classification
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
# And what the first stage cost: its index (MiB) and the queries' encoding and search (milliseconds a query).
COST_COLUMNS = ("Index MiB", "ms/query")
# The representations a model's embedding record names, each with the similarity it is scored by (None:
# --similarity chooses, cosine or dot).
REPRESENTATIONS = {"dense": None, "splade": "dot", "colbert": "maxsim"}
# --rerank_with: the reranked table's columns, each query's passages rescored by default, and the fine-tuned
# kinds whose head gives a (query, passage) pair one score (a two-class classifier is taken too: pair_scorer).
RERANK_COLUMNS = (("nDCG@10", "ndcg@10"), ("MRR@10", "mrr@10"), ("Recall@100", "recall@100"))
RERANK_TOP = 100
PAIR_SCORING_KINDS = ("rerank", "regression")
# --suite=sts: zero-shot similarity of embeddings; "stsb" among its --tasks is GLUE's STS-B.
STS, STS_B = "sts", "stsb"
# --suite=mteb: MTEB's tasks, run by mteb itself (interop/mteb.py); its result files go to WORKDIR/MTEB_RESULTS.
MTEB, MTEB_RESULTS = "mteb", "mteb_results"


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
        raise ValueError(f"--suite={suite}: choose one of {', '.join(SUITES)}, all, {RETRIEVAL}, {STS} or {MTEB}")
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
    retrieval.stage_scores' metrics and costs (the index in MiB, the milliseconds a query)."""
    costs = lambda found: [found["index_bytes"] / 2**20, found["query_ms"]]

    def row(name, metrics, cost):
        return (f"| {name} | " + " | ".join(f"{100 * metrics[m]:.1f}" for _, m in RETRIEVAL_COLUMNS) + " | "
                + " | ".join(f"{value:,.2f}" for value in cost) + " |")

    lines = ["| Data set | " + " | ".join(h for h, _ in RETRIEVAL_COLUMNS) + " | " + " | ".join(COST_COLUMNS) + " |",
             "|" + "---|" * (len(RETRIEVAL_COLUMNS) + len(COST_COLUMNS) + 1)]
    lines += [row(name, found, costs(found)) for name, found in scores.items()]
    average = {m: sum(s[m] for s in scores.values()) / len(scores) for _, m in RETRIEVAL_COLUMNS}
    lines.append(row("Average", average, np.mean([costs(found) for found in scores.values()], axis=0)))
    return lines, average


def retrieval_suite(init_from: str, directories: list[str], workdir: str, *, split: str = "test",
                    similarity: str | None = None, batch_size: int | None = None, ignore_identical_ids: bool = False,
                    k_values=retrieval_metrics.K_VALUES, rerank_with: str | None = None,
                    rerank_top: int | None = None) -> dict:
    """Each data set's split (a BEIR directory or save_to_disk datasets: tasks/retrieval_data.py) searched
    with the model's queries and passages as its representation makes them (first_stage: dense embeddings
    exactly over all devices, SPLADE's through the inverted index, ColBERT's by exact MaxSim); one table,
    printed and written to WORKDIR/retrieval.md and retrieval.json, with the index's size and the queries'
    milliseconds. rerank_with: a model scoring (query, passage) pairs (pair_scorer) rescoring each query's
    top rerank_top (default 100) passages, BEIR's Rerank; the table then has a row per data set and stage.
    Every data set, and the reranker, is read and checked before the embedder loads."""
    rerank_top = check_retrieval_flags(directories, similarity, rerank_with, rerank_top)
    batch_size = batch_size or 32
    data_sets = [retrieval_data.read_retrieval(d, split) for d in directories]
    names = [d.name for d in data_sets]
    if len(set(names)) != len(names):
        raise ValueError(f"--tasks: two data sets in directories of the same name ({', '.join(names)}): "
                         f"their rows in the table would be confused")
    reranker = pair_scorer(inference.load(rerank_with), rerank_with, batch_size) if rerank_with else None
    model = inference.load(init_from)
    stage, similarity = first_stage(model, init_from, similarity, batch_size, ignore_identical_ids)
    depth = max(k_values) if reranker is None else max(*k_values, rerank_top)  # the passages found per query
    files.make(workdir)
    scores, reranked = {}, {}
    for data in data_sets:
        print(f"--- {data.name}: {len(data.queries)} queries, {len(data.passages)} passages ({split})", flush=True)
        found = stage(data, depth)
        scores[data.name] = retrieval.stage_scores(data, found, k_values)
        if reranker is not None:
            reranked[data.name] = rerank_scores(reranker[0], data, found.run, rerank_top, k_values)
    out = {"suite": RETRIEVAL, "init_from": init_from, "split": split, "similarity": similarity,
           "ignore_identical_ids": ignore_identical_ids, "directories": list(map(str, directories)),
           "backend": jax.default_backend(), "scores": scores}
    if reranker is None:
        out["table"], out["average"] = retrieval_table(scores)
    else:
        out["table"], out["average"], out["average_reranked"] = rerank_table(scores, reranked, rerank_top)
        out.update(reranked=reranked, rerank_with=rerank_with, rerank_top=rerank_top, rerank_score=reranker[1])
    print("\n".join(out["table"]), flush=True)
    files.write_bytes(files.join(workdir, f"{RETRIEVAL}.json"), json.dumps(out, indent=1).encode())
    files.write_bytes(files.join(workdir, f"{RETRIEVAL}.md"), ("\n".join(out["table"]) + "\n").encode())
    return out


def first_stage(model, source: str, similarity: str | None, batch_size: int, ignore_identical_ids: bool):
    """(stage(data set, k) -> retrieval.FirstStage, what it scores by) for the model's representation (its
    embedding record's; dense without one): dense embeddings searched exactly over every device by
    `similarity` (default the model's own, cosine without a record); SPLADE's vectors through the inverted
    index by dot product, the index recording `source`; ColBERT's token vectors by exact MaxSim
    (model.embed_tokens). A similarity the representation does not score by is one line."""
    representation = model.embedding.representation if model.embedding is not None else "dense"
    if representation not in REPRESENTATIONS:
        raise ValueError(f"{source} makes {representation} embeddings: --suite=retrieval searches "
                         f"{', '.join(REPRESENTATIONS)} ones")
    scores_by = REPRESENTATIONS[representation]
    if scores_by is not None and similarity not in (None, scores_by):
        raise ValueError(f"--similarity={similarity}: {source} is a {representation} model, scored by "
                         f"{scores_by}; leave --similarity unset")
    task = lambda kind: "query" if kind == "query" else "document"
    # A query gets the model's "query" prompt and the query length it was trained with, a passage its passage
    # prompt: sentence-transformers' encode_query and encode_document.
    embed = lambda texts, kind: model.embed(texts, task=task(kind), batch_size=batch_size)
    if representation == "splade":
        return (lambda data, k: retrieval.sparse_first_stage(embed, data, k, batch_size, model=source,
                                                             ignore_identical_ids=ignore_identical_ids)), scores_by
    if representation == "colbert":
        embed_tokens = lambda texts, kind: model.embed_tokens(texts, task=task(kind), batch_size=batch_size)
        return (lambda data, k: retrieval.multivector_first_stage(
            embed_tokens, data, k, ignore_identical_ids=ignore_identical_ids)), scores_by
    similarity = similarity or (model.embedding.similarity if model.embedding else "cosine")
    mesh = sharding.make_mesh({"data": -1})  # the corpus split over every device
    return (lambda data, k: retrieval.dense_first_stage(embed, data, k, similarity, batch_size, mesh=mesh,
                                                        ignore_identical_ids=ignore_identical_ids)), similarity


def check_retrieval_flags(directories, similarity: str | None, rerank_with: str | None, rerank_top: int | None) -> int:
    """One line for what --suite=retrieval cannot run; the passages reranked per query."""
    if not directories:
        raise ValueError("--suite=retrieval needs --tasks=DIR,...: BEIR directories (corpus.jsonl, queries.jsonl, "
                         "qrels/) or save_to_disk ones (corpus/, queries/, qrels/)")
    if similarity is not None and similarity not in retrieval.SIMILARITIES:
        raise ValueError(f"--similarity={similarity}: choose one of {', '.join(retrieval.SIMILARITIES)}")
    if rerank_top is not None and not rerank_with:
        raise ValueError(f"--rerank_top={rerank_top}: how many passages --rerank_with's model rescores; give it too")
    rerank_top = RERANK_TOP if rerank_top is None else int(rerank_top)
    if rerank_top < 1:
        raise ValueError(f"--rerank_top={rerank_top}: rerank at least the first passage of each query")
    return rerank_top


def relevant_label(labels) -> int:
    """A two-class pair classifier's class that means relevant: its second (GLUE's and most sets' order:
    "not_duplicate", "duplicate"; "no", "yes"), or its first where the second's name is a negation (QNLI's
    and RTE's "entailment", "not_entailment")."""
    return 0 if str(labels[1]).lower().startswith(("not_", "not ", "non_", "non-")) else 1


def pair_scorer(model, source: str, batch_size: int):
    """(score_pairs(queries, passages) -> [n], what the score is) of a fine-tuned model that scores a text
    pair with one value: a rerank or regression head's logit; a two-class classifier's log-odds of its
    relevant class (relevant_label), which orders pairs as its probability does. The pairs are cut and
    padded as in fine-tuning (query as segment A), in batches of batch_size rows (the last padded: one
    compiled shape). Any other model is one line."""
    task = model.task
    if task is not None and task.kind in PAIR_SCORING_KINDS:
        column, what = (lambda logits: logits.reshape(len(logits), -1)[:, 0]), f"the {task.kind} head's logit"
    elif task is not None and task.kind == "classification" and len(task.labels) == 2:
        yes = relevant_label(task.labels)
        column = lambda logits: logits[:, yes] - logits[:, 1 - yes]
        what = f"logit[{task.labels[yes]}] - logit[{task.labels[1 - yes]}]"
    else:
        found = f"a fine-tuned {task.kind} model" + (f" of {len(task.labels)} classes" if task.labels else "") \
            if task is not None else "no fine-tuned model"
        raise ValueError(f"--rerank_with={source} is {found}: rerank with a model fine-tuned on (query, passage) "
                         f"pairs with one score each (kind {', '.join(PAIR_SCORING_KINDS)}), or a two-class pair "
                         f"classifier")

    def score_pairs(queries, passages):
        features = classification.encode_texts(model, list(queries), list(passages))
        count = len(features["input_ids"])
        extra = -count % batch_size
        if extra:
            features = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in features.items()}
        return column(model.task_logits(features, batch_size))[:count]

    return score_pairs, what


def rerank_scores(score_pairs, data, first: dict, rerank_top: int, k_values) -> dict:
    """The reranked metrics of one data set: the first stage's run (first_stage's) with its top rerank_top
    rescored (retrieval.rerank) and ranked as trec_eval ranks a run."""
    rescored = retrieval.rerank(score_pairs, dict(zip(data.query_ids, data.queries)),
                                dict(zip(data.corpus_ids, data.passages)), first, rerank_top)
    ranked = {query_id: retrieval_metrics.trec_ranking(found) for query_id, found in rescored.items()}
    return {**retrieval_metrics.retrieval_scores(data.qrels, ranked, k_values), "queries": len(data.queries),
            "passages": len(data.passages)}


def rerank_table(first: dict[str, dict], reranked: dict[str, dict], rerank_top: int) -> tuple[list[str], dict, dict]:
    """The markdown table (a row per data set and stage, then each stage's average) and the two stages'
    averages; first, reranked: data set -> retrieval_scores' metrics."""
    stages = (("first stage", first), (f"reranked (top {rerank_top})", reranked))
    row = lambda name, stage, metrics: (f"| {name} | {stage} | "
                                        + " | ".join(f"{100 * metrics[m]:.1f}" for _, m in RERANK_COLUMNS) + " |")
    lines = ["| Data set | Stage | " + " | ".join(h for h, _ in RERANK_COLUMNS) + " |",
             "|" + "---|" * (len(RERANK_COLUMNS) + 2)]
    lines += [row(name, stage, scores[name]) for name in first for stage, scores in stages]
    averages = [{m: sum(s[m] for s in scores.values()) / len(scores) for _, m in RERANK_COLUMNS}
                for _, scores in stages]
    lines += [row("Average", stage, average) for (stage, _), average in zip(stages, averages)]
    return lines, averages[0], averages[1]


# ----------------------------------------------------------------------------------------------------
# MTEB: the model's embeddings on MTEB's tasks, evaluated by mteb
# ----------------------------------------------------------------------------------------------------


def mteb_table(results: dict[str, dict]) -> tuple[list[str], float]:
    """The markdown table (a row per task: its type, main score's name and value times 100, then their
    average) and the average; results: interop/mteb.py's evaluate."""
    lines = ["| Task | Type | Main score | Value |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['type']} | {r['main_score']} | {100 * r['value']:.2f} |" for name, r in results.items()]
    average = sum(r["value"] for r in results.values()) / len(results)
    lines.append(f"| Average | | | {100 * average:.2f} |")
    return lines, average


def mteb_suite(init_from: str, tasks: list, workdir: str, *, batch_size: int | None = None) -> dict:
    """MTEB's tasks (names, as mteb.get_task takes them, or task objects of yours) evaluated by mteb.evaluate
    on the model (interop/mteb.py's Encoder: its prompts and similarity); one table of each task's main
    score, printed and written to WORKDIR/mteb.md and mteb.json, mteb's own result files under
    WORKDIR/mteb_results. The task names are checked before the model loads; mteb fetches each task's
    data from the Hugging Face Hub (or its cache) as it runs it."""
    if not tasks:
        raise ValueError("--suite=mteb needs --tasks=NAME,...: MTEB's task names (SciFact, STSBenchmark, "
                         "Banking77Classification, ...)")
    if files.is_remote(workdir):
        raise ValueError(f"--workdir={workdir}: mteb writes its result files on a local disk; give a local --workdir")
    chosen = bertjax_mteb.get_tasks(tasks)
    model = inference.load(init_from)
    encoder = bertjax_mteb.Encoder(model, name=f"bertjax/{os.path.basename(os.path.normpath(init_from))}")
    files.make(workdir)
    print(f"--- {len(chosen)} MTEB task(s): {', '.join(t.metadata.name for t in chosen)}", flush=True)
    results = bertjax_mteb.evaluate(encoder, chosen, files.join(workdir, MTEB_RESULTS), batch_size=batch_size or 32)
    lines, average = mteb_table(results)
    print("\n".join(lines), flush=True)
    out = {"suite": MTEB, "init_from": init_from, "model": encoder.mteb_model_meta.name, "tasks": results,
           "average": average, "results": files.join(workdir, MTEB_RESULTS), "table": lines}
    files.write_bytes(files.join(workdir, f"{MTEB}.json"), json.dumps(out, indent=1).encode())
    files.write_bytes(files.join(workdir, f"{MTEB}.md"), ("\n".join(lines) + "\n").encode())
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
