"""python -m bertjax.data.preview: see exactly what the model will be fed.

    python -m bertjax.data.preview --config=configs/tiny.py --num_examples=3
    python -m bertjax.data.preview --config=configs/tiny.py --num_examples=100 --format=jsonl > examples.jsonl

The text form shows each pair as segments A and B with every masked position marked
[MASK→original] (or «replacement→original» for a random token, =original= for one left unchanged),
and the NSP or SOP label (data.objective=none: one segment, no label). The jsonl form writes one
example per line with every model input and the decoded tokens. --start_step shows the examples of a
later training step (as a resumed run would see them).

With data.packing, an "example" is a packed row: the text form shows each of its sequences on lines of
its own, numbered as its sequence_ids, with its row positions; jsonl rows carry the packed keys. Both
end with the packing efficiency (the share of positions that are real tokens; on stderr for jsonl).
"""

import json
import sys
import tempfile

from absl import app, flags
from ml_collections import config_flags

from bertjax.data import inputs, objectives, packing
from bertjax.runs import console


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file."),
        num_examples=flags.DEFINE_integer("num_examples", 5, "How many examples to show."),
        format=flags.DEFINE_enum("format", "text", ["text", "jsonl"], "text for people, jsonl for tools."),
        split=flags.DEFINE_enum("split", "train", ["train", "eval"], "The training stream or the held-out one."),
        start_step=flags.DEFINE_integer("start_step", 0, "Show the examples of this training step on (those of a "
                                        "one-host run: from example start_step x train.batch_size)."),
        workdir=flags.DEFINE_string("workdir", None, "Where a learned vocabulary is cached (as in training); a "
                                    "temporary folder if unset."),
    )


def example_record(tokenizer, ex: dict) -> dict:
    """One example as plain lists, with its decoded tokens, for the jsonl form."""
    record = {key: value.tolist() for key, value in ex.items()}
    n = int(sum(record["input_mask"]))
    record["tokens"] = tokenizer.convert_ids_to_tokens(record["input_ids"][:n])
    k = int(sum(record["masked_lm_weights"]))
    record["masked_lm_tokens"] = tokenizer.convert_ids_to_tokens(record["masked_lm_ids"][:k])
    return record


def format_text(tokenizer, ex: dict, number: int, objective: str = "nsp") -> str:
    record = example_record(tokenizer, ex)
    tokens = list(record["tokens"])
    originals = dict(zip(record["masked_lm_positions"], record["masked_lm_tokens"]))
    for position, original in originals.items():
        shown = tokens[position]
        if shown == "[MASK]":
            tokens[position] = f"[MASK→{original}]"
        elif shown == original:
            tokens[position] = f"={original}="
        else:
            tokens[position] = f"«{shown}→{original}»"
    n = len(tokens)
    segments = record["segment_ids"][:n]
    a = [t for t, s in zip(tokens, segments) if s == 0]
    b = [t for t, s in zip(tokens, segments) if s == 1]
    labels = objectives.get(objective).labels
    if labels is None:  # FULL-SENTENCES: one segment, documents separated by [SEP]
        return f"--- example {number}: {n} tokens, {len(originals)} to predict\n" + " ".join(tokens)
    label = labels[int(record["next_sentence_labels"])]
    return "\n".join([
        f"--- example {number}: {n} tokens, {len(originals)} to predict, {label}",
        "A: " + " ".join(a),
        "B: " + " ".join(b),
    ])


def format_packed_text(tokenizer, row: dict, number: int, objective: str = "nsp") -> str:
    """One packed row: a header, then each sequence (tokens marked as format_text marks them)."""
    record = example_record(tokenizer, row)
    n, s = len(record["tokens"]), len(record["input_ids"])
    count = int(sum(record["sentence_weights"]))
    lines = [f"--- row {number}: {count} sequence{'s' * (count != 1)}, {n} of {s} positions real "
             f"({n / s:.1%}), {len(record['masked_lm_tokens'])} to predict"]
    sequences = packing.unpack_row(row, pad_id=tokenizer.pad_id)
    labels = objectives.get(objective).labels
    for k, example in enumerate(sequences):
        start = int(row["sentence_positions"][k])
        length = int(example["input_mask"].sum())
        text = format_text(tokenizer, example, number, objective).split("\n")[1:]  # without its header
        label = "" if labels is None else ", " + labels[int(example["next_sentence_labels"])]
        lines.append(f"  [{k + 1}] positions {start}-{start + length - 1}{label}")
        lines += ["      " + line for line in text]
    return "\n".join(lines)


def efficiency_line(real: int, positions: int, stream, rows: int) -> str:
    """The packing efficiency of the rows shown and of the stream's first `rows` rows (from its plans)."""
    return (f"packing: {real / positions:.1%} of the positions shown are real tokens; the stream's first {rows:,} "
            f"rows: {stream.real_token_share(rows):.1%} (data.packing={stream.packing})")


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = args.config
    workdir = args.workdir or tempfile.mkdtemp(prefix="bertjax-preview-")
    try:
        data = inputs.build_inputs(config.data, workdir=workdir)
    except (ValueError, FileNotFoundError) as e:
        console.fail(str(e))
    stream = data.train if args.split == "train" else data.eval
    # The stream batched as training batches it, so that step N means the examples training sees at step N.
    batch_size = config.train.batch_size
    dataset = stream.dataset(batch_size, start_step=args.start_step).unbatch().take(args.num_examples)
    real = positions = 0
    for i, ex in enumerate(dataset.as_numpy_iterator()):
        real, positions = real + int(ex["input_mask"].sum()), positions + ex["input_mask"].size
        if args.format == "jsonl":
            print(json.dumps(example_record(data.tokenizer, ex)))
        else:
            show = format_packed_text if stream.packing else format_text
            print(show(data.tokenizer, ex, args.start_step * batch_size + i, objective=stream.objective), end="\n\n")
    if positions:
        line = efficiency_line(real, positions, stream, min(stream.rows_per_epoch, 100 * batch_size))
        print(line, file=sys.stderr if args.format == "jsonl" else sys.stdout)
    sys.stdout.flush()


def entry():
    """The console program `bertjax-preview`, as `python -m bertjax.data.preview`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
