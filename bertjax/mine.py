"""python -m bertjax.mine: hard negatives added to a pairs file, mined with a model's embeddings.

    python -m bertjax.mine --model=PATH --pairs=pairs.jsonl --out=pairs_mined.jsonl --relative_margin=0.05
    python -m bertjax.mine --model=PATH --pairs=pairs.jsonl --corpus=corpus.jsonl --out=OUT --range_min=10 \
        --range_max=50 --sampling=random --num_negatives=5
    python -m bertjax.mine --model=PATH --pairs=pairs.jsonl --out=rerank_train.jsonl --output_format=labeled-list

Each line of the pairs file ({"query", "positive"}) gets a `negatives` list: passages the model ranks close
to its query that are not its positives, chosen as sentence-transformers' mine_hard_negatives chooses
them (relative_margin=0.05 is NV-Retriever's TopK-PercPos 95%). The corpus (JSON lines with `text`, or
BEIR's corpus.jsonl) defaults to the pairs' own positives. --output_format=labeled-list writes a reranker's
training data instead (finetune's rerank kind; sentence-transformers' output_format="labeled-list"): a
line per query, {"query", "passages": its positives then its negatives, "labels": [1, ..., 0, ...]}.
A run stopped by Ctrl-C, SIGTERM or a crash continues where it stopped when the same command is run
again: the finished work (embeddings, searched queries) is kept in OUT.partial/ until OUT is written. The
run is bertjax/runs/mining.py.
"""

from absl import flags

from bertjax.runs import console, mining


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        model=flags.DEFINE_string("model", None, "The embedder: a bertjax workdir or checkpoint, a Hugging Face or "
                                  "sentence-transformers directory.", required=True),
        pairs=flags.DEFINE_string("pairs", None, "JSON lines of {\"query\", \"positive\"}.", required=True),
        corpus=flags.DEFINE_string("corpus", None, "JSON lines with `text` (or BEIR's _id, title, text) to mine "
                                   "from; the positives are always added. Unset: the pairs' positives."),
        out=flags.DEFINE_string("out", None, "The pairs file written with `negatives` (or the labeled lists).",
                                required=True),
        output_format=flags.DEFINE_enum("output_format", "pairs", mining.OUTPUT_FORMATS, "pairs: the pairs with "
                                        "`negatives`; labeled-list: a line per query of {\"query\", \"passages\", "
                                        "\"labels\"}, a reranker's training data."),
        num_negatives=flags.DEFINE_integer("num_negatives", 3, "Negatives per query at most."),
        range_min=flags.DEFINE_integer("range_min", 0, "Skip this many best candidates (likely unmarked positives)."),
        range_max=flags.DEFINE_integer("range_max", None, "Candidates considered per query; unset: num_negatives "
                                       "plus the positives after range_min (ten times num_negatives with a filter)."),
        absolute_margin=flags.DEFINE_float("absolute_margin", None, "Drop a candidate scoring above the query's "
                                           "lowest positive score minus this."),
        relative_margin=flags.DEFINE_float("relative_margin", None, "Drop a candidate scoring above the lowest "
                                           "positive score less this share of it (0.05: NV-Retriever's 95%)."),
        max_score=flags.DEFINE_float("max_score", None, "Drop a candidate whose cosine is above this."),
        min_score=flags.DEFINE_float("min_score", None, "Drop a candidate whose cosine is below this."),
        sampling=flags.DEFINE_enum("sampling", "top", ["top", "random"], "The best candidates, or a random choice."),
        seed=flags.DEFINE_integer("seed", 0, "The random sampling's seed."),
        batch_size=flags.DEFINE_integer("batch_size", 64, "Texts embedded per batch."),
    )


def main(argv, args):
    console.no_arguments(argv)
    console.finish(mining.mine, args.model, args.pairs, args.out, corpus_path=args.corpus,
                   num_negatives=args.num_negatives, range_min=args.range_min, range_max=args.range_max,
                   absolute_margin=args.absolute_margin, relative_margin=args.relative_margin,
                   max_score=args.max_score, min_score=args.min_score, sampling=args.sampling, seed=args.seed,
                   batch_size=args.batch_size, output_format=args.output_format)


def entry():
    """The console program `bertjax-mine`, as `python -m bertjax.mine`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
