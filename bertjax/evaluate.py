"""python -m bertjax.evaluate: fine-tune and score every task of a benchmark suite, one table.

    python -m bertjax.evaluate --init_from=path/to/bert-base-uncased --suite=glue --workdir=runs/glue
    python -m bertjax.evaluate --init_from=runs/base --suite=glue --tasks=sst2,mrpc --sweep --workdir=runs/glue
    python -m bertjax.evaluate --init_from=runs/base --suite=all --workdir=runs/eval   # glue, squad, conll
    python -m bertjax.evaluate --init_from=runs/embedder --suite=retrieval --tasks=beir/scifact,beir/nfcorpus \
        --workdir=runs/retrieval
    python -m bertjax.evaluate --init_from=runs/embedder --suite=retrieval --tasks=beir/scifact \
        --rerank_with=runs/reranker --rerank_top=100 --workdir=runs/rerank
    python -m bertjax.evaluate --init_from=runs/embedder --suite=mteb --tasks=SciFact,STSBenchmark --workdir=runs/mteb
    python -m bertjax.evaluate --init_from=runs/embedder --suite=sts --tasks=stsb,my_pairs.jsonl --workdir=runs/sts
    python -m bertjax.evaluate compress --task=dev.jsonl --teacher=runs/sst2 \
        --variant=int8=runs/sst2+int8 --variant=int4=runs/sst2+int4-g128 --variant=student=runs/sst2-distilled

Each task of the suite whose data TFDS has prepared (`tfds build glue/<task>`, `squad/v1.1`,
`conll2003`; nothing is downloaded here) is fine-tuned with its configs/finetune/<task>.py in
WORKDIR/<task>; the dev scores go into one table in the layout of the BERT paper's tables (Devlin et
al. 2018: GLUE table 1, SQuAD tables 2 and 3, CoNLL-2003 table 7), printed and written to
WORKDIR/<suite>.md and <suite>.json.

--suite=retrieval: no fine-tuning; --tasks names retrieval data sets (directories in BEIR's layout,
corpus.jsonl, queries.jsonl and qrels/<split>.tsv, or Hugging Face datasets written by save_to_disk as
corpus/, queries/ and qrels/<split>/), whose --split queries the model embeds (its query and passage
prompts, as sentence-transformers' encode_query and encode_document pick them) and searches the passages of
exactly, by --similarity (a SPLADE model's through an inverted index by dot product, a ColBERT model's by
MaxSim). One table, a row per data set: nDCG@10, Recall@100, MRR@10 and MAP@100 as BEIR computes them, the
index's MiB and the milliseconds a query takes (encoding and search), and their average, written to
WORKDIR/retrieval.md and retrieval.json (every metric at k = 1, 3, 5, 10, 100, 1000).
--rerank_with=MODEL: each query's first --rerank_top (default 100) passages rescored by MODEL, a
fine-tuned model scoring (query, passage) pairs (kind rerank or regression; a two-class pair classifier
by its log-odds of the relevant class), the rest dropped, as BEIR's Rerank does; the table then has a row
per data set and stage (first stage, reranked): nDCG@10, MRR@10, Recall@100.

--suite=mteb: --tasks names MTEB's tasks (SciFact, STSBenchmark, ...), which mteb itself fetches and
evaluates (`pip install bertjax[mteb]`) on the model's embeddings, its prompts and similarity
(bertjax/interop/mteb.py); one table of each task's main score, written to WORKDIR/mteb.md and mteb.json,
mteb's own result files under WORKDIR/mteb_results.

--suite=sts: no fine-tuning either; --tasks names STS sets (default stsb): `stsb` is GLUE's STS-B (its TFDS
validation split), anything else a JSON-lines file of {"text", "text_pair", "score"}. Both texts of each
pair are embedded (the model's default prompt, as sentence-transformers' encode), scored by --similarity,
and the Spearman and Pearson correlations with the gold scores make one table, a row per set and their
average, written to WORKDIR/sts.md and sts.json.

`compress`: the compression report (bertjax/runs/compression_report.py) of a fine-tuned --teacher and its
--variant=NAME=DIR (a fine-tuning workdir, a params export or a Hugging Face directory; DIR+int8,
DIR+int4-g128 or any other bertjax.load quantize mode quantises it on load) on the task's dev set:
--task is the dev file (the task's JSON lines) or a benchmark task's name (its
configs/finetune/<task>.py recipe's TFDS dev split). One table: parameters, size and its ratio, the
dense kernels' size and its ratio, dev score and the share of the teacher's retained, latency at batch
1 and 32 at one sequence length (the teacher's, or --max_seq_length) and the speed-up; --workdir
(optional) gets compression.md and compression.json.
"""

from absl import app, flags

from bertjax.runs import console, suite_evaluation

COMMANDS = ("compress",)


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        init_from=flags.DEFINE_string("init_from", None, "A bertjax workdir or checkpoint, or a Hugging Face BERT "
                                      "directory."),
        suite=flags.DEFINE_string("suite", "glue", "The benchmark suite: glue, squad, conll, or all of them; or "
                                  "retrieval, sts or mteb, of the data sets or tasks --tasks names."),
        workdir=flags.DEFINE_string("workdir", None, "Each task's fine-tuning workdir goes under it, and the table."),
        tasks=flags.DEFINE_list("tasks", None, "Only these tasks of the suite (default: all it has data for); "
                                "retrieval: the data sets' directories; sts: stsb or JSON-lines files; mteb: "
                                "MTEB's task names."),
        tfds_data_dir=flags.DEFINE_string("tfds_data_dir", None, "Where TFDS keeps the prepared data sets."),
        sweep=flags.DEFINE_bool("sweep", False, "The paper's learning-rate grid per task, the best dev score kept."),
        epochs=flags.DEFINE_float("epochs", None, "Override the recipe's epochs (e.g. for a quick look)."),
        batch_size=flags.DEFINE_integer("batch_size", None, "Override the recipe's batch size (retrieval, sts and "
                                        "mteb: texts embedded, and pairs reranked, at a time, default 32)."),
        max_seq_length=flags.DEFINE_integer("max_seq_length", None, "Override the recipe's sequence length "
                                            "(compress: the one every model is timed and scored at)."),
        task=flags.DEFINE_string("task", None, "compress: the dev set, a JSON-lines file of the task, or a "
                                 "benchmark task (sst2, mrpc, ...: its configs/finetune/ recipe's TFDS dev split)."),
        teacher=flags.DEFINE_string("teacher", None, "compress: the fine-tuned model the variants are compared with."),
        variant=flags.DEFINE_multi_string("variant", [], "compress: NAME=DIR, or NAME=DIR+int8 (+int4-g128, ...) to "
                                          "quantise on load (repeat the flag per variant)."),
        split=flags.DEFINE_string("split", "test", "retrieval: the split whose judgements are scored "
                                  "(qrels/<split>.tsv)."),
        similarity=flags.DEFINE_enum("similarity", None, ["cosine", "dot"], "retrieval and sts: how a query scores "
                                     "a passage, or two texts each other (unset: the embedder's own similarity, "
                                     "else cosine; SPLADE models score by dot, ColBERT ones by MaxSim)."),
        ignore_identical_ids=flags.DEFINE_bool("ignore_identical_ids", False, "retrieval: a query never "
                                               "retrieves the passage of its own id (BEIR's option for Quora, "
                                               "ArguAna)."),
        rerank_with=flags.DEFINE_string("rerank_with", None, "retrieval: a fine-tuned model scoring (query, "
                                        "passage) pairs (kind rerank or regression, or a two-class pair "
                                        "classifier) that rescores each query's first --rerank_top passages."),
        rerank_top=flags.DEFINE_integer("rerank_top", None, "retrieval with --rerank_with: the passages rescored "
                                        "per query (default 100); those after them are dropped."),
        repeats=flags.DEFINE_integer("repeats", 10, "compress: timed runs per latency (the median is reported)."),
    )


def main(argv, args):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] not in COMMANDS):
        raise app.UsageError(f"unexpected arguments: {argv[1:]} (the one command is: {', '.join(COMMANDS)})")
    if len(argv) == 2 or args.suite != suite_evaluation.RETRIEVAL:
        refuse_unused(args, ("rerank_with", "rerank_top"), "reranking is --suite=retrieval's (its first stage "
                      "rescored)")
    if len(argv) == 2:
        console.finish(suite_evaluation.compress, args.task, args.teacher, args.variant, workdir=args.workdir,
                       tfds_data_dir=args.tfds_data_dir, max_seq_length=args.max_seq_length, repeats=args.repeats)
        return
    if not args.init_from or not args.workdir:
        console.fail("--init_from and --workdir are required")
    if args.suite == suite_evaluation.RETRIEVAL:
        refuse_unused(args, ("epochs", "max_seq_length", "tfds_data_dir", "sweep"),
                      "fine-tuning's flags, which --suite=retrieval does not use")
        console.finish(suite_evaluation.retrieval_suite, args.init_from, args.tasks, args.workdir, split=args.split,
                       similarity=args.similarity, batch_size=args.batch_size,
                       ignore_identical_ids=args.ignore_identical_ids, rerank_with=args.rerank_with,
                       rerank_top=args.rerank_top)
        return
    if args.suite == suite_evaluation.MTEB:
        refuse_unused(args, ("epochs", "max_seq_length", "tfds_data_dir", "sweep", "ignore_identical_ids",
                             "similarity"), "flags that --suite=mteb does not use (mteb reads each task's own)")
        console.finish(suite_evaluation.mteb_suite, args.init_from, args.tasks, args.workdir,
                       batch_size=args.batch_size)
        return
    if args.suite == suite_evaluation.STS:
        refuse_unused(args, ("epochs", "max_seq_length", "sweep", "ignore_identical_ids"),
                      "flags that --suite=sts does not use")
        console.finish(suite_evaluation.sts_suite, args.init_from, args.tasks, args.workdir,
                       similarity=args.similarity, batch_size=args.batch_size, data_dir=args.tfds_data_dir)
        return
    console.finish(suite_evaluation.evaluate, args.init_from, args.suite, args.workdir, tasks=args.tasks,
                   data_dir=args.tfds_data_dir, sweep=args.sweep, epochs=args.epochs, batch_size=args.batch_size,
                   max_seq_length=args.max_seq_length)


def refuse_unused(args, names, why: str) -> None:
    """One line, and exit, where any of the flags `names` is set: they mean nothing to this suite."""
    unused = [f"--{name}" for name in names if getattr(args, name) not in (None, False)]
    if unused:
        console.fail(f"{', '.join(unused)}: {why}")


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
