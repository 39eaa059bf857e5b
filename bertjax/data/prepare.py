"""python -m bertjax.data.prepare: tokenize and index a corpus once, into sharded files.

    python -m bertjax.data.prepare --config=configs/base.py \\
        --config.data.source=text --config.data.input_pattern='/data/wiki/*.txt' \\
        --config.data.vocab_path=/data/vocab.txt --output_dir=/data/wiki-prepared --num_shards=64

Then train with --config.data.source=prepared --config.data.prepared_dir=/data/wiki-prepared.

Output shard k holds the documents of input files j with j % num_shards == k (or, with fewer files
than shards, of documents i with i % num_shards == k; for TFDS, the k-th of num_shards even splits),
divided into train and eval by the same stable hash as the in-memory path. The shards are written by a
pool of worker processes; on many hosts each host writes the shards k with k % process_count ==
process_index, which are the shards it reads when training.
"""

import concurrent.futures
import multiprocessing
import os
import shutil
import time

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import console


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file (its data section is used)."),
        output_dir=flags.DEFINE_string("output_dir", None, "Where the shards and metadata.json go."),
        num_shards=flags.DEFINE_integer("num_shards", 16, "Output shards per split; a multiple of the training hosts."),
        num_workers=flags.DEFINE_integer("num_workers", os.cpu_count() or 1, "Worker processes on this host."),
        process_index=flags.DEFINE_integer("process_index", 0, "This host's index, when several hosts prepare."),
        process_count=flags.DEFINE_integer("process_count", 1, "How many hosts prepare (and will train)."),
    )


def prepare_shard(data_dict: dict, shard: int, num_shards: int, output_dir: str) -> dict:
    """Read, split, tokenize and write one output shard (both splits). Runs in a worker process."""
    import ml_collections

    from bertjax.data import prepared
    from bertjax.data import pretraining as pt
    from bertjax.data import sources
    from bertjax.text import tokenizers

    data = ml_collections.ConfigDict(data_dict)
    tokenizer = tokenizers.load_tokenizer(data.tokenizer, data.vocab_path, lower_case=data.lower_case)
    documents = sources.shard_documents(data, shard, num_shards)
    held_out = [sources.is_eval_document(d, data.eval_fraction) for d in documents]  # one hash per document
    counts = {}
    for split in prepared.SPLITS:
        docs = [d for d, e in zip(documents, held_out) if e == (split == "eval")]
        corpus = pt.tokenize_documents(docs, tokenizer) if docs else None
        prepared.write_shard(prepared.shard_path(output_dir, split, shard, num_shards), corpus)
        counts[split] = (corpus.num_documents, len(corpus.tokens)) if corpus is not None else (0, 0)
    return counts


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from bertjax.data import prepared
    from bertjax.text import sentences

    data = args.config.data
    output_dir, num_shards = args.output_dir, args.num_shards
    if not output_dir:
        console.fail("--output_dir is required")
    if not data.vocab_path:
        console.fail("prepare needs --config.data.vocab_path: learn one first with "
                 "python -m bertjax.vocab train --input=... --vocab_size=... --out=...")
    try:  # here, not in a worker: a missing package is one line, not a worker's traceback
        sentences.get_splitter(data.sentence_splitter)
    except ValueError as e:
        console.fail(str(e))
    if num_shards % args.process_count:
        console.fail(f"--num_shards={num_shards} must be a multiple of --process_count={args.process_count}")
    os.makedirs(output_dir, exist_ok=True)
    if args.process_index == 0:
        vocab_name = os.path.basename(data.vocab_path)
        shutil.copy(data.vocab_path, os.path.join(output_dir, vocab_name))
        prepared.write_metadata(output_dir, tokenizer=data.tokenizer, vocab_name=vocab_name,
                                lower_case=data.lower_case, num_shards=num_shards, eval_fraction=data.eval_fraction)
    shards = list(range(args.process_index, num_shards, args.process_count))
    start = time.time()
    # Spawned, not forked: TensorFlow's runtime does not survive a fork.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.num_workers, mp_context=context) as pool:
        futures = {pool.submit(prepare_shard, data.to_dict(), k, num_shards, output_dir): k for k in shards}
        totals = {"train": [0, 0], "eval": [0, 0]}
        for future in concurrent.futures.as_completed(futures):
            for split, (docs, tokens) in future.result().items():
                totals[split][0] += docs
                totals[split][1] += tokens
            logging.info("shard %d done", futures[future])
    for split, (docs, tokens) in totals.items():
        print(f"{split}: {docs} documents, {tokens} tokens in {len(shards)} shards")
    print(f"prepared {output_dir} in {time.time() - start:.1f}s")


def entry():
    """The console program `bertjax-prepare`, as `python -m bertjax.data.prepare`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
